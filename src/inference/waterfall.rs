//! The attempt loop over a model's waterfall, for every inference format.
//!
//! The policy first decides which rungs may serve the request and what each drops
//! (or refuses it with a 400 before anything is sent). Then each rung is tried in
//! order until one commits. The commit point is the first content (a non-empty text
//! or tool-call delta): before it, nothing has reached the client, so an error
//! status, a throttle, a connect failure, a timeout, an in-band error event or a
//! stall moves on to the next rung. A rung that accepted the request and died
//! before any output is retried once on the same rung.

use super::attempt::{describe, refusal, write_whole, Attempt};
use super::plan::{plan, ParsedRequest, PlannedRung};
use super::tally::{Outcome, Tally};
use super::Engine;
use crate::byok::Lane;
use crate::catalog::Model;
use crate::trace::AttemptFacts;
use crate::upstream::breaker::{Admit, Series};
use crate::upstream::Failure;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use sluice_filters::inbound::Inbound;
use sluice_filters::ir::{Event, FinishReason, Meta, Response, Tail};
use sluice_filters::usage::Usage;
use sluice_filters::{ApiError, ErrorCode};

/// How long a conversation stays with the rung that served it (provider prompt
/// caches live minutes).
const AFFINITY_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// Serves an inference request for a model whose route the caller may use.
pub(crate) async fn serve(
    engine: &Engine,
    session: &mut Session,
    tally: &mut Tally,
    model: &Model,
    parsed: &ParsedRequest<'_>,
) -> Outcome {
    let mut chain = match plan(engine, model, parsed) {
        Ok(l) => l,
        Err(e) => return Outcome::Error(e),
    };
    // A conversation whose prompt cache is warm on a rung goes there first.
    let keyed = parsed.req.prompt_cache_key.is_some();
    let affinity = if chain.len() > 1 && (parsed.cacheable || keyed) {
        parsed.affinity_key()
    } else {
        None
    };
    let mut warm: Option<String> = None;
    if let Some(k) = &affinity {
        if let Ok(Some(rung)) = engine.state.counters.get_marker(k).await {
            if let Some(pos) = chain.iter().position(|l| l.target.rung_id == rung) {
                let planned = chain.remove(pos);
                chain.insert(0, planned);
                warm = Some(rung);
            }
        }
    }
    // Admission is asked only of a rung about to be tried: a half-open probe slot
    // taken for a rung that is never reached would keep it closed off.
    let healthy = chain
        .iter()
        .filter(|l| engine.breaker.would_admit(&l.target.breaker_key))
        .count();
    if healthy == 0 {
        return Outcome::Error(
            ApiError::new(
                ErrorCode::UnavailableRoute,
                "Every rung of this model is cooling down after repeated failures; retry with backoff.",
            )
            .with_status(503),
        );
    }
    let label = parsed.inbound_label();
    let single = healthy == 1;
    let mut died = 0u32;
    let mut empty: Option<Usage> = None;
    let mut reasons: Vec<String> = Vec::new();
    // The last rung's answer when it refused the request itself as malformed: the
    // caller's to fix, not a failure to retry.
    let mut rejected: Option<ApiError> = None;
    // The provider and outcome of the last attempt: why the next rung is tried.
    let mut last: Option<(&str, &'static str)> = None;
    for planned in &chain {
        let target = &planned.target;
        if engine.breaker.admit(&target.breaker_key) == Admit::No {
            continue;
        }
        if let Some((provider, reason)) = last {
            engine.state.metrics.failover(label, provider, reason);
        }
        let series = Series {
            provider: &target.provider,
            rung: match planned.lane {
                Lane::Platform => &target.rung_id,
                Lane::PassThrough => "byok",
            },
        };
        // Only a platform rung draws credits; the org's own account costs nothing here.
        tally.price = match planned.lane {
            Lane::Platform => tally.platform_price,
            Lane::PassThrough => Default::default(),
        };
        tally.lane = planned.lane;
        for try_no in 0..2 {
            tally.trace.begin();
            let result = attempt(engine, session, tally, planned, parsed).await;
            let outcome = result.label();
            let class = result.class(tally.incomplete);
            engine
                .state
                .metrics
                .attempt(series.provider, series.rung, class);
            tally.trace.end(AttemptFacts {
                provider: series.provider,
                model_id: &target.model_id,
                host: target.host(),
                port: target.port(),
                rung: series.rung,
                outcome: class,
            });
            last = Some((series.provider, class));
            tally.attempt(&target.provider, &outcome);
            match result {
                Attempt::Served(status) => {
                    engine.breaker.success(&target.breaker_key, series);
                    tally.rung = Some(target.rung_id.clone());
                    tally.billable = true;
                    if let Some(k) = &affinity {
                        let c = &engine.state.counters;
                        let _ = c.put_marker(k, &target.rung_id, AFFINITY_TTL, false).await;
                    }
                    return Outcome::Written(status);
                }
                Attempt::Round(turn) => {
                    // A model call that asked for a tool search round: served and
                    // billed; the round loop calls the model again.
                    engine.breaker.success(&target.breaker_key, series);
                    tally.rung = Some(target.rung_id.clone());
                    tally.billable = true;
                    return Outcome::Round(turn);
                }
                Attempt::Refused(reason) => {
                    engine.breaker.success(&target.breaker_key, series);
                    tally.rung = Some(target.rung_id.clone());
                    return Outcome::Error(refusal(reason));
                }
                Attempt::Empty(u) => {
                    engine.breaker.success(&target.breaker_key, series);
                    tally.empty_attempts += 1;
                    empty.get_or_insert(u.unwrap_or_default());
                    tally.rung = Some(target.rung_id.clone());
                    break;
                }
                Attempt::Rejected(e) => {
                    // The caller's request, not the rung's health: the breaker
                    // forgets the attempt, and the next rung may still serve it.
                    engine.breaker.abandon(&target.breaker_key);
                    reasons.push(format!("{} (refused the request)", target.rung_id));
                    rejected = Some(e);
                    break;
                }
                Attempt::Terminal(e) => {
                    engine.breaker.abandon(&target.breaker_key);
                    return Outcome::Error(e);
                }
                Attempt::ClientGone => {
                    engine.breaker.abandon(&target.breaker_key);
                    return Outcome::ClientGone;
                }
                Attempt::Failed(Failure::Deadline) => {
                    engine.breaker.abandon(&target.breaker_key);
                    return Outcome::Error(ApiError::new(
                        ErrorCode::DeadlineExceeded,
                        "The request ran past its deadline before any rung answered.",
                    ));
                }
                Attempt::Failed(Failure::Status(429)) if warm.as_ref() == Some(&target.rung_id) => {
                    // Moving a warm conversation to a cold rung would pay its whole
                    // prompt again: the throttle goes back to the caller instead.
                    engine.breaker.failure(&target.breaker_key, series);
                    return Outcome::Error(
                        ApiError::new(
                            ErrorCode::UnavailableRoute,
                            format!(
                                "The rung holding this conversation's prompt cache ({}) is throttled; retry shortly.",
                                target.rung_id
                            ),
                        )
                        .with_status(429),
                    );
                }
                Attempt::Failed(f) => {
                    rejected = None;
                    if f.trips_breaker(parsed.stream) {
                        engine.breaker.failure(&target.breaker_key, series);
                    } else {
                        engine.breaker.abandon(&target.breaker_key);
                    }
                    reasons.push(format!("{} ({})", target.rung_id, describe(&f)));
                    if f == Failure::DiedBeforeOutput {
                        died += 1;
                        if try_no == 0 {
                            continue;
                        }
                    }
                    break;
                }
            }
        }
    }
    if let Some(u) = empty {
        tally.usage = u;
        // Boxed: rare, and inline it would nearly double every request's state.
        let answer = Box::pin(empty_completion(session, tally, model, parsed));
        return answer.await;
    }
    if let Some(e) = rejected {
        return Outcome::Error(e);
    }
    if single && died == 2 {
        return Outcome::Error(ApiError::new(
            ErrorCode::ProviderInternal,
            format!(
                "The provider accepted the request and died before any output, twice: {}.",
                reasons.join("; ")
            ),
        ));
    }
    Outcome::Error(ApiError::new(
        ErrorCode::AllRoutesFailed,
        format!("Every rung failed: {}.", reasons.join("; ")),
    ))
}

/// One attempt on one rung: the native chat fast path when the rung speaks the
/// chat format, else an attempt that reads the answer to find the commit point.
async fn attempt(
    engine: &Engine,
    session: &mut Session,
    tally: &mut Tally,
    planned: &PlannedRung,
    parsed: &ParsedRequest<'_>,
) -> Attempt {
    let rendered = planned.render(parsed);
    tally.ignored = rendered.ignored;
    tally.replay_repaired = rendered.repaired;
    let body = rendered.body;
    let t = &planned.target;
    // Each kind of attempt is boxed on its own: a box sized for the largest
    // (a translated stream) would be copied whole on every plain request.
    if planned.native && parsed.inbound == Inbound::Chat {
        if parsed.stream {
            let run = Box::pin(super::native_chat::stream_attempt(
                engine,
                session,
                tally,
                t,
                body,
                &parsed.req,
            ));
            return run.await;
        }
        let run = Box::pin(super::native_chat::plain_attempt(
            engine,
            session,
            tally,
            t,
            body,
            &parsed.req,
        ));
        return run.await;
    }
    super::translated::run(engine, session, tally, planned, parsed, body).await
}

/// Every reachable rung ended its turn with no content: 200 with the warning header
/// and the format's empty shape (a terminal frame when the header already went out).
async fn empty_completion(
    session: &mut Session,
    tally: &mut Tally,
    model: &Model,
    parsed: &ParsedRequest<'_>,
) -> Outcome {
    let meta = Meta {
        provider: tally.rung.clone().unwrap_or_default(),
        slug: model.spec.slug.clone(),
        created: crate::store::now_ms() / 1000,
        fallback_id: crate::store::new_id("empty"),
        include_usage: parsed.req.include_usage,
        stop_sequence: None,
        prompt_estimate: super::translated::message_start_estimate(parsed),
        echo: match parsed.inbound {
            Inbound::Responses => sluice_filters::inbound::responses::echo(
                &parsed.object,
                tally
                    .turn
                    .as_ref()
                    .map(|t| (t.store, t.previous.as_deref())),
            ),
            _ => String::new(),
        },
        search: parsed.search(),
        hide_reasoning: false,
    };
    let tail = Tail {
        usage: tally.priced(Usage::default()),
        cut: false,
        receipt: String::from_utf8(tally.receipt_json("", "")).unwrap_or_default(),
        ignored: tally.ignored.clone(),
    };
    let body = if parsed.stream {
        // A stream an earlier tool search round began ends in its own terms.
        let mut enc = match tally.take_resume() {
            Some(enc) => enc,
            None => parsed.inbound.encoder(meta),
        };
        let mut out = Vec::new();
        enc.event(
            &Event::Start {
                id: None,
                model: None,
            },
            &mut out,
        );
        enc.event(
            &Event::Finish {
                reason: FinishReason::Stop,
                raw: None,
                stop_sequence: None,
            },
            &mut out,
        );
        enc.end(&tail, &mut out);
        out
    } else {
        let resp = Response {
            finish: Some(FinishReason::Stop),
            usage: Some(tally.priced(Usage::default())),
            ..Response::default()
        };
        parsed.inbound.render(&resp, &meta, &tail)
    };
    if tally.header_sent {
        tally.body_out(&body);
        let ok = session
            .write_response_body(Some(Bytes::from(body)), true)
            .await
            .is_ok();
        return if ok {
            Outcome::Written(200)
        } else {
            Outcome::ClientGone
        };
    }
    let mut h = match ResponseHeader::build_no_case(200, Some(6)) {
        Ok(h) => h,
        Err(_) => return Outcome::Error(ApiError::internal()),
    };
    let _ = h.insert_header("x-gateway-warning", "empty_completion");
    if parsed.stream {
        let _ = h.insert_header(http::header::CONTENT_TYPE, "text/event-stream");
        let _ = h.insert_header(http::header::CACHE_CONTROL, "no-cache");
    } else {
        let _ = h.insert_header(http::header::CONTENT_TYPE, "application/json");
    }
    tally.receipt_headers(&mut h, "", "");
    if !write_whole(session, tally, h, body).await {
        return Outcome::ClientGone;
    }
    Outcome::Written(200)
}
