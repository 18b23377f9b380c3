//! One inference request's life, admit to settle, as DESIGN.md's request path
//! gives it: admit (key, body, model, route, gates), plan the rungs, walk the
//! waterfall until one commits, then settle (cost, usage event, idempotency).
//! Each step is a file of this folder; `handle` reads as the list of them.

mod admit;
mod attempt;
mod embeddings;
pub mod idempotency;
mod native_chat;
mod plan;
mod rounds;
mod settle;
mod tally;
mod translated;
mod waterfall;

pub use admit::{authenticate, granted};

use crate::downstream::pending::Place;
use crate::downstream::Handled;
use crate::state::AppState;
use crate::trace::Trail;
use crate::upstream::breaker::Breaker;
use crate::upstream::Upstreams;
use bytes::Bytes;
use idempotency::Claim;
use pingora::proxy::Session;
use plan::{ParsedRequest, CACHEABLE_BYTES};
use settle::Settling;
use sluice_filters::inbound::Inbound;
use sluice_filters::json::{with_long_strings, RawObject};
use sluice_filters::Route;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tally::Tally;

/// What serving inference needs beyond the shared state: the provider client and
/// the health of every rung it calls.
pub struct Engine {
    pub state: Arc<AppState>,
    upstreams: Upstreams,
    breaker: Breaker,
    /// Web search and tool search (`[search]`, `[tool_search]`).
    searcher: crate::search::Searcher,
}

impl Engine {
    pub fn new(state: Arc<AppState>) -> Engine {
        let upstreams = Upstreams::new(&state.config);
        let b = &state.config.breaker;
        let breaker = Breaker::new(b.failure_threshold, Duration::from_millis(b.cooldown_ms));
        let searcher = crate::search::Searcher::new(&state.config);
        Engine {
            state,
            upstreams,
            breaker,
            searcher,
        }
    }

    /// Serves one request of an inference route (chat, responses, messages,
    /// embeddings); returns the status the client saw. `trail` learns what the
    /// operator's metrics, access line and trace report.
    pub async fn handle(
        &self,
        session: &mut Session,
        route: Route,
        started: Instant,
        trail: &mut Trail,
        place: Option<Place>,
    ) -> Handled {
        let state = &self.state;
        // A batch line from this instance's runner names its key by the internal
        // credential (the key itself is never stored); every other step is alike.
        let (key, org, batch_line) = match admit::batch_caller(state, session) {
            Some(found) => {
                let ((key, org), line) = found?;
                (key, org, Some(line))
            }
            None => {
                let (key, org) =
                    admit::authenticate(state, session, route == Route::Messages).await?;
                (key, org, None)
            }
        };
        trail.identify(&key, &org);
        admit::not_under_review(&org)?;
        let read = admit::read_body(state, session, route, started).await?;
        let (mut members, mut long) = admit::split_object(&read)?;
        let mut body = &read;
        // The responses store: a continued conversation is rebuilt in front of the
        // request's own input, before anything else reads the body.
        let continued: Bytes;
        let mut keeping = None;
        let mut history_repaired = false;
        if route == Route::Responses {
            let capture = org.captures_prompts(state.config.responses.prompt_capture_default);
            let begun = Box::pin(state.responses.begin(&org.id, capture, &members)).await?;
            keeping = begun.keeping;
            history_repaired = begun.repaired;
            if let Some(b) = begun.body {
                continued = Bytes::from(b);
                body = &continued;
                (members, long) = admit::split_object(body)?;
            }
        }
        let asked = admit::model(state, session, &org, &members, route)?;
        let model = &asked.model;
        trail.model(model);
        let mut rungs = admit::active_route(state, session, &org, model)?;

        let mut tally = Tally::new(
            started,
            Duration::from_millis(state.config.limits.request_deadline_ms),
        );
        tally.pending = place;
        tally.platform_price = model.spec.price;
        tally.batch_line = batch_line;
        tally.prompt_estimate = (body.len() / 4) as u64;
        if keeping.is_some() {
            tally.capture = Some(Vec::new());
        }
        tally.history_repaired = history_repaired;
        tally.trace = std::mem::take(&mut trail.attempts);
        let inbound = match route {
            Route::Chat => Some(Inbound::Chat),
            Route::Responses => Some(Inbound::Responses),
            Route::Messages => Some(Inbound::Messages),
            _ => None,
        };
        let ask = |worst, platform| crate::billing::gate::Ask {
            key: &key,
            org: &org,
            model: &model.spec,
            worst,
            platform,
        };
        let admission;
        let mut ticket = None;
        let mut streamed = false;
        let outcome = match inbound {
            Some(inbound) => {
                // Structural validation before anything is charged or sent.
                // The body's long strings were found by the split: the parse
                // jumps over them instead of looking through them again.
                let mut req = with_long_strings(&long, || inbound.parse(body, &members))?;
                req.model = asked.name.clone();
                streamed = req.stream;
                trail.streaming(streamed);
                // Encrypted reasoning reaches a responses client only when it asks;
                // the store keeps it either way.
                let asked_encrypted = req
                    .include
                    .iter()
                    .any(|i| i == "reasoning.encrypted_content");
                tally.hide_encrypted = inbound == Inbound::Responses && !asked_encrypted;
                let keep_reasoning = keeping.is_some() && !asked_encrypted;
                if asked.online {
                    sluice_filters::inbound::common::want_web_search(
                        &mut req,
                        sluice_filters::ir::SearchForm::Online,
                    );
                }
                if inbound != Inbound::Messages {
                    if let Some(k) = idempotency::key_of(session)? {
                        // Rare paths are boxed: inline, their database futures would
                        // enlarge every request's state.
                        let claim = Box::pin(idempotency::claim(
                            state,
                            &org.id,
                            &k,
                            route.label(),
                            body,
                            tally.deadline,
                        ));
                        let claimed = claim.await;
                        let result = match &claimed {
                            Ok(Claim::Fresh(_)) => "fresh",
                            Ok(Claim::Replay(_)) => "replay",
                            Err(_) => "refused",
                        };
                        state.metrics.idempotency.with_label_values(&[result]).inc();
                        match claimed? {
                            Claim::Replay(tape) => {
                                let replay = Box::pin(idempotency::replay(session, tape));
                                return Ok(replay.await);
                            }
                            Claim::Fresh(t) => {
                                tally.tape = Some(Box::default());
                                tally.tape_cap = state.config.limits.idempotency_max_tape_bytes;
                                ticket = Some(t);
                            }
                        }
                    }
                }
                let mut worst = admit::worst_case(model, &req, body.len());
                if req.orchestrated() {
                    worst = self.searcher.hold(worst, &req, &model.spec.price);
                }
                admission = match admit::admit_lanes(state, &mut rungs, |p| ask(worst, p)).await {
                    Ok(a) => a,
                    Err(e) => {
                        if let Some(t) = ticket {
                            let finish = Box::pin(idempotency::finish(state, t, &tally, e.status));
                            finish.await;
                        }
                        return Err(e);
                    }
                };
                if admission.free {
                    tally.platform_price = Default::default();
                }
                let mut parsed = ParsedRequest {
                    inbound,
                    stream: req.stream,
                    req,
                    object: RawObject::from_members(&members),
                    source: body.clone(),
                    long_context: asked.long_context,
                    rungs,
                    org_id: org.id.clone(),
                    cacheable: body.len() >= CACHEABLE_BYTES,
                    keep_reasoning,
                    prep: Default::default(),
                };
                if parsed.req.orchestrated() {
                    // Web search and tool search: the one service-run search runs
                    // here, before the first attempt (never again on fail-over).
                    let prepare = Box::pin(self.searcher.prepare(
                        &self.upstreams,
                        &mut parsed.req,
                        inbound,
                        &parsed.rungs,
                        tally.deadline,
                    ));
                    parsed.prep = prepare.await;
                    tally.orch = parsed.prep.spent(!admission.free);
                    if let Some(us) = tally.orch.as_ref().and_then(|o| o.search_us) {
                        // The vendor's time is not the gateway's overhead.
                        tally.upstream_wait += Duration::from_micros(us);
                    }
                }
                let serve = Box::pin(rounds::serve(self, session, &mut tally, model, parsed));
                serve.await
            }
            None => {
                let req = sluice_filters::inbound::embeddings::parse(body)?;
                let worst = crate::billing::gate::worst_case(&model.spec.price, body.len(), 0);
                admission = admit::admit_lanes(state, &mut rungs, |p| ask(worst, p)).await?;
                if admission.free {
                    tally.platform_price = Default::default();
                }
                let serve = Box::pin(embeddings::serve(self, session, &mut tally, &rungs, req));
                serve.await
            }
        };
        let who = Settling {
            route,
            inbound,
            model,
            key_id: &key.id,
            org_id: &org.id,
        };
        let served = matches!(outcome, tally::Outcome::Written(200));
        let status = settle::settle(
            state, session, &mut tally, who, admission, ticket, outcome, trail,
        )
        .await;
        // The turn is kept once its answer is whole at the client (a cut stream
        // as incomplete); a client gone mid-stream leaves nothing.
        if let (Some(k), Some(answer), true) = (keeping, tally.capture.take(), served) {
            let slug = &model.spec.slug;
            state.responses.finish(&org.id, slug, k, &answer, streamed);
        }
        Ok(status)
    }
}
