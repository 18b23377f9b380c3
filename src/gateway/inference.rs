//! The front half of every inference route: authenticate, read the body under the
//! cap, check it is a JSON object naming a model slug the org may call from where it
//! is, then hand over to the route's attempt loop and record the usage event.

use super::body::{read_capped, BodyError};
use super::exchange::{Exchange, Outcome};
use super::idempotency::{self, Claim};
use super::models::{authenticate, granted, Handled};
use super::plan::{Job, CACHEABLE_BYTES};
use super::respond::send;
use super::waterfall;
use super::wire;
use super::Gateway;
use crate::accounts::OrgRecord;
use crate::billing::gate;
use crate::byok::{route, Lane, RouteRung};
use crate::catalog::{Model, ModelKind};
use crate::state::AppState;
use crate::store::usage::UsageEvent;
use bytes::Bytes;
use pingora::proxy::Session;
use sluice_filters::json::RawObject;
use sluice_filters::json::{split_object as split, Member};
use sluice_filters::policy::Inbound;
use sluice_filters::slug::split_suffixes;
use sluice_filters::sse::data_frame;
use sluice_filters::{ApiError, ErrorCode, Format, Route};
use std::time::{Duration, Instant};

/// Splits the body into its top-level members (values unparsed), once: the native
/// rungs forward them and the chat format validates them without a second read.
fn split_object(body: &[u8]) -> Result<Vec<Member<'_>>, ApiError> {
    let not_object = || {
        ApiError::new(
            ErrorCode::InvalidRequest,
            "The request body must be a JSON object.",
        )
    };
    let starts_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    match std::str::from_utf8(body) {
        Ok(text) if starts_object => split(text).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => not_object(),
            _ => ApiError::invalid_json(e),
        }),
        // Valid JSON of another shape is a malformed request; anything else
        // (bytes that are not UTF-8 among them) is not JSON.
        _ => Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Ok(_) => not_object(),
                Err(e) => ApiError::invalid_json(e),
            },
        ),
    }
}

pub async fn handle(
    gw: &Gateway,
    session: &mut Session,
    route: Route,
    started: Instant,
) -> Handled {
    let state = &gw.state;
    let (key, org) = authenticate(state, session, route == Route::Messages).await?;
    if org.under_review {
        // Every lane, BYOK included.
        return Err(ApiError::new(
            ErrorCode::OrgUnderReview,
            review_message(org.review_reason.as_deref()),
        ));
    }
    let limits = &state.config.limits;
    let read_until = started + Duration::from_millis(limits.request_read_timeout_ms);
    let body = match read_capped(session, limits.max_request_bytes, read_until).await {
        Ok(b) => b,
        Err(BodyError::TooLarge(e)) => return Err(e),
        Err(BodyError::Io(_)) => {
            return Err(ApiError::new(
                ErrorCode::RequestCancelled,
                "The client went away.",
            ))
        }
    };
    if route == Route::Embeddings && !is_json(session) {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "The embeddings route takes a JSON body: send Content-Type: application/json.",
        ));
    }
    let members = split_object(&body)?;
    // The last of repeated members wins, as in the forwarded object.
    let model_name: String = match members
        .iter()
        .rev()
        .find(|(k, _)| k == "model")
        .map(|m| m.1)
    {
        None => {
            return Err(
                ApiError::new(ErrorCode::InvalidRequest, "model is required.").param("model"),
            )
        }
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|_| ApiError::invalid_parameter("model", "model must be a string slug"))?,
    };
    let wanted = split_suffixes(&model_name);
    let catalog = state.catalog.snapshot();
    let model = catalog
        .lookup(Some(&org.id), wanted.slug)
        .filter(|m| granted(&org, m))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::ModelNotGranted,
                format!(
                    "This key cannot call {:?}: use a slug from GET /v1/models.",
                    model_name.chars().take(128).collect::<String>()
                ),
            )
            .param("model")
        })?
        .clone();
    drop(catalog);
    let country = client_country(state, session);
    if !model.spec.serves_country(country.as_deref()) {
        return Err(ApiError::new(
            ErrorCode::ModelLocationNotSupported,
            "This model is not offered where the request comes from, or the location could not be verified.",
        ));
    }
    let wants_embedding = route == Route::Embeddings;
    if wants_embedding != (model.spec.kind == ModelKind::Embedding) {
        return Err(ApiError::new(
            ErrorCode::UnsupportedCapability,
            if wants_embedding {
                "This model does not serve embeddings."
            } else {
                "This model serves embeddings only."
            },
        )
        .param("model"));
    }

    let mut rungs = active_route(state, session, &org, &model)?;

    let mut ex = Exchange::new(
        started,
        Duration::from_millis(state.config.limits.request_deadline_ms),
    );
    ex.platform_price = model.spec.price;
    ex.prompt_estimate = (body.len() / 4) as u64;
    let inbound = match route {
        Route::Chat => Some(Inbound::Chat),
        Route::Responses => Some(Inbound::Responses),
        Route::Messages => Some(Inbound::Messages),
        _ => None,
    };
    let counters = state.counters.as_ref();
    let ask = |worst, platform| gate::Ask {
        key: &key,
        org: &org,
        model: &model.spec,
        worst,
        platform,
    };
    let admission;
    let mut ticket = None;
    let outcome = match inbound {
        Some(inbound) => {
            // Structural validation before anything is charged or sent.
            let mut req = wire::parse(inbound, &body, &members)?;
            req.model = model_name.clone();
            if inbound != Inbound::Messages {
                if let Some(k) = idempotency::key_of(session)? {
                    let label = route.label();
                    // Rare paths are boxed: inline, their database futures would
                    // enlarge every request's state.
                    let claim = Box::pin(idempotency::claim(
                        state,
                        &org.id,
                        &k,
                        label,
                        &body,
                        ex.deadline,
                    ));
                    match claim.await? {
                        Claim::Replay(tape) => {
                            let replay = Box::pin(idempotency::replay(session, tape));
                            return Ok(replay.await);
                        }
                        Claim::Fresh(t) => {
                            ex.tape = Some(Box::default());
                            ex.tape_cap = state.config.limits.idempotency_max_tape_bytes;
                            ticket = Some(t);
                        }
                    }
                }
            }
            let budget = gate::output_budget(req.max_tokens, model.spec.max_output_tokens);
            let worst = if req.cache_breaks.is_empty() {
                gate::worst_case(&model.spec.price, body.len(), budget)
            } else {
                gate::worst_case_caching(&model.spec.price, body.len(), budget)
            };
            admission = match admit_lanes(state, &mut rungs, |p| ask(worst, p)).await {
                Ok(a) => a,
                Err(e) => {
                    if let Some(t) = ticket {
                        let finish = Box::pin(idempotency::finish(state, t, &ex, e.status));
                        finish.await;
                    }
                    return Err(e);
                }
            };
            if admission.free {
                ex.platform_price = Default::default();
            }
            let job = Job {
                inbound,
                stream: req.stream,
                req,
                object: RawObject::from_members(&members),
                long_context: wanted.long_context,
                rungs,
                org_id: org.id.clone(),
                cacheable: body.len() >= CACHEABLE_BYTES,
            };
            let serve = Box::pin(waterfall::serve(gw, session, &mut ex, &model, job));
            serve.await
        }
        None => {
            let req = sluice_filters::inbound::embeddings::parse(&body)?;
            let worst = gate::worst_case(&model.spec.price, body.len(), 0);
            admission = admit_lanes(state, &mut rungs, |p| ask(worst, p)).await?;
            if admission.free {
                ex.platform_price = Default::default();
            }
            let serve = Box::pin(super::embeddings::serve(gw, session, &mut ex, &rungs, req));
            serve.await
        }
    };
    let list = &model.spec.price;
    let platform = ex.lane == Lane::Platform;
    let used = if ex.billable {
        gate::Used {
            billed_micro_usd: billed_cost(&ex),
            list_micro_usd: i64::try_from(crate::billing::cost_micro_usd(list, &ex.usage))
                .unwrap_or(i64::MAX),
            tokens: gate::weighted_tokens(list, &ex.usage),
            platform,
        }
    } else {
        gate::Used {
            platform,
            ..gate::Used::default()
        }
    };
    gate::settle(counters, admission.hold, used).await;
    let free = admission.free;
    let format = inbound.map_or(Format::OpenAi, wire::format_of);
    let (status, error_class) = match outcome {
        Outcome::Written(s) => (s, None),
        Outcome::ClientGone => (499, Some(ErrorCode::RequestCancelled.as_str().to_string())),
        Outcome::Error(e) => {
            let class = Some(e.code.as_str().to_string());
            if ex.header_sent {
                // The 200 header already went out: the stream ends with an in-band error.
                let frame = match inbound {
                    Some(i) => wire::error_frame(i, &e),
                    None => data_frame(&e.to_body(format)),
                };
                ex.tape_body(&frame);
                // The error writes are boxed: rare, and inline they would enlarge
                // (and be copied with) every request's state.
                let write = Box::pin(session.write_response_body(Some(Bytes::from(frame)), true));
                let _ = write.await;
            } else {
                let extra = [
                    ("x-gateway-attempts", ex.attempts.clone()),
                    ("x-gateway-overhead-us", ex.overhead_us().to_string()),
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
    if let Some(t) = ticket {
        let finish = Box::pin(idempotency::finish(state, t, &ex, status));
        finish.await;
    }
    record(
        state,
        &ex,
        route,
        &model,
        &key.id,
        &org.id,
        status,
        error_class,
        (used, free),
    );
    Ok(if status == 499 {
        499
    } else if ex.header_sent {
        200
    } else {
        status
    })
}

#[allow(clippy::too_many_arguments)]
fn record(
    state: &AppState,
    ex: &Exchange,
    route: Route,
    model: &Model,
    key_id: &str,
    org_id: &str,
    status: u16,
    error_class: Option<String>,
    (used, free): (gate::Used, bool),
) {
    let m = &state.metrics;
    let label = route.label();
    if let Some(t) = ex.first_token {
        m.ttft.with_label_values(&[label]).observe(t.as_secs_f64());
    }
    m.overhead
        .with_label_values(&[label])
        .observe(ex.overhead_us() as f64 / 1e6);
    let u = ex.usage;
    for (kind, n) in [
        ("input", u.input_tokens),
        ("cached", u.cached_tokens),
        ("cache_write", u.cache_write_tokens),
        ("output", u.output_tokens),
    ] {
        if n > 0 {
            m.tokens.with_label_values(&[label, kind]).inc_by(n);
        }
    }
    state.usage.record(UsageEvent {
        id: String::new(),
        org_id: org_id.to_string(),
        key_id: key_id.to_string(),
        route: label.into(),
        model: model.spec.slug.clone(),
        rung: ex.rung.clone(),
        lane: ex.lane.as_str().into(),
        input_tokens: u.input_tokens,
        cached_tokens: u.cached_tokens,
        cache_write_tokens: u.cache_write_tokens,
        output_tokens: u.output_tokens,
        reasoning_tokens: u.reasoning_tokens,
        cost_micro_usd: billed_cost(ex),
        status,
        error_class,
        incomplete: ex.incomplete,
        attempts: ex.attempts.clone(),
        empty_attempts: ex.empty_attempts,
        latency_ms: ex.started.elapsed().as_millis() as u64,
        // What the windows keep, so a restart can rebuild them from the ledger.
        free: free && ex.billable && ex.lane == Lane::Platform,
        weighted_tokens: used.tokens,
        list_micro_usd: used.list_micro_usd,
        at_ms: crate::store::now_ms(),
    });
}

/// The org's active route for the model: its own order and accounts, the
/// require-ZDR policy, and a per-request `x-gateway-route` choice of one rung.
fn active_route(
    state: &AppState,
    session: &Session,
    org: &OrgRecord,
    model: &Model,
) -> Result<Vec<RouteRung>, ApiError> {
    let routing = state.byok.snapshot();
    let mut rungs = route::effective(model, org, &routing);
    drop(routing);
    static ROUTE: http::HeaderName = http::HeaderName::from_static("x-gateway-route");
    if let Some(v) = session.req_header().headers.get(&ROUTE) {
        let want = v.to_str().unwrap_or_default().trim();
        rungs.retain(|r| route::route_id(&org.id, &model.spec.slug, &r.id) == want);
        if rungs.is_empty() {
            return Err(ApiError::invalid_parameter(
                "x-gateway-route",
                "x-gateway-route is not a route of this model for this organization: use a route_id from GET /api/models/{slug}/providers",
            ));
        }
    }
    if rungs.is_empty() {
        return Err(ApiError::new(
            ErrorCode::UnavailableRoute,
            "No rung of this model meets the organization's zero-retention policy.",
        )
        .with_status(503));
    }
    Ok(rungs)
}

/// Takes the gates for the lanes the route can use. Platform gates refuse only
/// platform rungs: when they do and the org's own accounts are on the route, the
/// request goes on there alone. An unverified email refuses credit-drawing rungs
/// the same way.
async fn admit_lanes<'a>(
    state: &AppState,
    rungs: &mut Vec<RouteRung>,
    ask: impl Fn(bool) -> gate::Ask<'a>,
) -> Result<gate::Admission, ApiError> {
    let counters = state.counters.as_ref();
    let billing = &state.config.billing;
    let has_own = rungs.iter().any(|r| !r.is_platform());
    let has_platform = rungs.iter().any(RouteRung::is_platform);
    let platform_ask = ask(true);
    let refusal = if !has_platform {
        None
    } else if !platform_ask.org.email_verified {
        Some(ApiError::new(
            ErrorCode::InsufficientQuota,
            "email_unverified: verify the organization's email address to draw platform credits; calls on your own provider keys work meanwhile.",
        )
        .with_extra("reason", "email_unverified"))
    } else {
        match gate::admit(counters, billing, &platform_ask).await {
            Ok(a) => return Ok(a),
            Err(e) => Some(e),
        }
    };
    if let Some(e) = refusal {
        // Key rate guardrails refuse every lane; the daily spend cap and anything
        // else only the platform's.
        let key_limit = e.message.starts_with("key_") && !e.message.starts_with("key_daily_cap");
        if !has_own || key_limit || e.code != ErrorCode::InsufficientQuota {
            return Err(e);
        }
        rungs.retain(|r| !r.is_platform());
    }
    gate::admit(counters, billing, &ask(false)).await
}

/// The one sentence an org under review is told: the operator's reason cut to its
/// first sentence, without counts (digits are never echoed), or a plain default.
fn review_message(reason: Option<&str>) -> String {
    let first = reason
        .map(|r| r.split_inclusive(['.', '!', '?']).next().unwrap_or(r))
        .unwrap_or_default();
    let words: Vec<&str> = first
        .split_whitespace()
        .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
        .collect();
    let mut text = words.join(" ");
    if text
        .trim_end_matches(['.', '!', '?', ':', ',', ';'])
        .is_empty()
    {
        return "This organization is under review; contact support to have it released.".into();
    }
    if !text.ends_with(['.', '!', '?']) {
        text = text.trim_end_matches([':', ',', ';']).to_string();
        text.push('.');
    }
    text
}

/// What the request is billed: its usage at list price when a rung served it;
/// failed and empty attempts cost nothing.
fn billed_cost(ex: &Exchange) -> i64 {
    if !ex.billable {
        return 0;
    }
    i64::try_from(crate::billing::cost_micro_usd(&ex.price, &ex.usage)).unwrap_or(i64::MAX)
}

/// Whether the request says its body is JSON (`application/json`, any parameters).
fn is_json(session: &Session) -> bool {
    session
        .req_header()
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

/// The client's ISO country from the trusted edge header, if configured and present.
fn client_country(state: &AppState, session: &Session) -> Option<String> {
    let name = &state.config.server.client_country_header;
    if name.is_empty() {
        return None;
    }
    let v = session
        .req_header()
        .headers
        .get(name.as_str())?
        .to_str()
        .ok()?
        .trim();
    (v.len() == 2 && v.bytes().all(|b| b.is_ascii_alphabetic())).then(|| v.to_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::review_message;

    #[test]
    fn review_messages_are_one_sentence_without_counts() {
        assert_eq!(
            review_message(Some(
                "Unusual traffic from 3 countries. We will reach out within 24 hours."
            )),
            "Unusual traffic from countries."
        );
        assert_eq!(
            review_message(Some("Payment disputed")),
            "Payment disputed."
        );
        assert!(review_message(None).contains("under review"));
        assert!(review_message(Some("1234.")).contains("under review"));
    }
}
