//! Settlement, after the answer (or its error) is decided: the real cost replaces
//! the reservation, an error not yet written reaches the client in its format
//! (in-band when a stream's header already went out), and the request's usage
//! event and metrics are recorded. The features' own records follow (`after`).

use super::tally::{Outcome, Tally};
use crate::accounts::Caller;
use crate::billing::gate;
use crate::byok::Lane;
use crate::catalog::Model;
use crate::downstream::answer::send;
use crate::state::AppState;
use crate::store::usage::UsageEvent;
use crate::trace::Trail;
use bytes::Bytes;
use pingora::proxy::Session;
use sluice_filters::inbound::Inbound;
use sluice_filters::sse::data_frame;
use sluice_filters::{ErrorCode, Format, Route};
use std::time::Duration;

/// What settlement records the request under, and the gates it took.
pub(crate) struct Settling<'a> {
    pub(crate) route: Route,
    /// The client's format; `None` for embeddings.
    pub(crate) inbound: Option<Inbound>,
    pub(crate) model: &'a Model,
    pub(crate) caller: &'a Caller,
    pub(crate) admission: gate::Admission,
}

/// Settles a served (or failed) request; returns the status the client saw.
pub(crate) async fn settle(
    state: &AppState,
    session: &mut Session,
    tally: &mut Tally,
    who: Settling<'_>,
    outcome: Outcome,
    trail: &mut Trail,
) -> u16 {
    let list = &who.model.spec.price;
    let platform = tally.platform_served();
    let mut used = if tally.billable {
        gate::Used {
            billed_micro_usd: billed_cost(tally),
            list_micro_usd: i64::try_from(crate::billing::cost_micro_usd(list, &tally.usage))
                .unwrap_or(i64::MAX),
            tokens: gate::weighted_tokens(list, &tally.usage),
            platform,
        }
    } else {
        gate::Used {
            platform,
            ..gate::Used::default()
        }
    };
    if let Some(o) = &tally.extra {
        // Earlier tool search rounds were model calls too.
        used.billed_micro_usd = billed_cost(tally);
        used.list_micro_usd += o.rounds_list;
        used.tokens += o.rounds_tokens;
    }
    let free = who.admission.free;
    let format = who.inbound.map_or(Format::OpenAi, Inbound::format);
    let (status, code) = match outcome {
        Outcome::Written(s) => (s, None),
        Outcome::ClientGone => (499, Some(ErrorCode::RequestCancelled.as_str())),
        // The round loop answers every round; one reaching here is a bug, said so.
        Outcome::Round(_) => {
            let e = sluice_filters::ApiError::internal();
            let write = Box::pin(send(
                session,
                e.status,
                "application/json",
                Bytes::from(e.to_body(format)),
                &[],
            ));
            let _ = write.await;
            (e.status, Some(e.code.as_str()))
        }
        Outcome::Error(e) => {
            let class = Some(e.code.as_str());
            if tally.header_sent {
                // The 200 header already went out: the stream ends with an in-band error.
                let frame = match who.inbound {
                    Some(i) => i.error_frame(&e),
                    None => data_frame(&e.to_body(format)),
                };
                tally.body_out(&frame);
                // The error writes are boxed: rare, and inline they would enlarge
                // (and be copied with) every request's state.
                let write = Box::pin(session.write_response_body(Some(Bytes::from(frame)), true));
                let _ = write.await;
            } else {
                let extra = [
                    ("x-gateway-attempts", tally.attempts.clone()),
                    ("x-gateway-overhead-us", tally.overhead_us().to_string()),
                ];
                let write = Box::pin(send(
                    session,
                    e.status,
                    "application/json",
                    Bytes::from(e.to_body(format)),
                    &extra,
                ));
                let _ = write.await;
            }
            (e.status, class)
        }
    };
    // The usage goes to the journal first (one write, no wait): the holds and
    // the idempotency row may wait on the stores, a served answer's bill may not.
    record(state, tally, &who, status, code, (used, free));
    let fee = tally.search_fee();
    if fee > 0 {
        state.metrics.search_fees.inc_by(fee);
    }
    gate::settle(state.counters.as_ref(), who.admission.hold, used).await;
    let times = (
        tally.first_token,
        Duration::from_micros(tally.overhead_us()),
        tally.upstream_wait,
    );
    trail.settled(
        tally.lane.as_str(),
        code,
        &tally.attempts,
        tally.rung.as_deref(),
        &tally.total_usage(),
        billed_cost(tally),
        times,
        tally.incomplete,
    );
    trail.attempts = std::mem::take(&mut tally.trace);
    if status == 499 {
        499
    } else if tally.header_sent {
        200
    } else {
        status
    }
}

/// What the request is billed: its usage at list price when a rung served it;
/// failed and empty attempts cost nothing. Earlier tool search rounds and the
/// search fee (`Tally::billed_extra`) come on top.
fn billed_cost(tally: &Tally) -> i64 {
    let extra = tally.billed_extra();
    if !tally.billable {
        return extra;
    }
    i64::try_from(crate::billing::cost_micro_usd(&tally.price, &tally.usage))
        .unwrap_or(i64::MAX)
        .saturating_add(extra)
}

fn record(
    state: &AppState,
    tally: &Tally,
    who: &Settling,
    status: u16,
    code: Option<&'static str>,
    (used, free): (gate::Used, bool),
) {
    let (route, model) = (who.route, who.model);
    let (key_id, org_id) = (&who.caller.key.id, &who.caller.org.id);
    let label = route.label();
    // With tool search rounds: every round's tokens.
    let u = tally.total_usage();
    let error_class = code.map(str::to_string);
    state.usage.record(UsageEvent {
        id: String::new(),
        org_id: org_id.to_string(),
        key_id: key_id.to_string(),
        route: label.into(),
        model: model.spec.slug.clone(),
        rung: tally.rung.clone(),
        lane: if tally.platform_served() {
            Lane::Platform.as_str().into()
        } else {
            tally.lane.as_str().into()
        },
        input_tokens: u.input_tokens,
        cached_tokens: u.cached_tokens,
        cache_write_tokens: u.cache_write_tokens,
        output_tokens: u.output_tokens,
        reasoning_tokens: u.reasoning_tokens,
        web_search_requests: u.web_search_requests,
        cost_micro_usd: billed_cost(tally),
        status,
        error_class,
        incomplete: tally.incomplete,
        estimated: tally.estimated && tally.billable,
        attempts: tally.attempts.clone(),
        empty_attempts: tally.empty_attempts,
        latency_ms: tally.started.elapsed().as_millis() as u64,
        // What the windows keep, so a restart can rebuild them from the ledger.
        free: free && tally.billable && tally.lane == Lane::Platform,
        weighted_tokens: used.tokens,
        list_micro_usd: used.list_micro_usd,
        at_ms: crate::store::now_ms(),
        batch: who.caller.batch_line.is_some(),
        batch_line: who.caller.batch_line.as_deref().map(str::to_string),
    });
}
