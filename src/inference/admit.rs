//! Admission: the steps before anything is sent upstream or charged. Who is
//! asking (the key and its org), whether the org may be served at all, the body
//! read under its limits, the model it names (granted to the org, offered where the
//! request comes from, of the route's kind), the org's active route for it, and
//! the gates of the lanes that route can use.

use crate::accounts::{Caller, OrgRecord};
use crate::billing::gate;
use crate::byok::{active_route, RouteRung};
use crate::catalog::{Model, ModelKind};
use crate::downstream::body::{read_capped, BodyError};
use crate::state::AppState;
use bytes::Bytes;
use pingora::proxy::Session;
use sluice_filters::json::{split_object_bytes as split, Member, Split};
use sluice_filters::slug::split_suffixes;
use sluice_filters::{ApiError, ErrorCode, Route};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Who asks: the presented key (an Anthropic client's `x-api-key` too on the
/// messages route), or the batch line this instance's runner sends.
pub(crate) async fn caller(
    state: &AppState,
    session: &Session,
    route: Route,
) -> Result<Caller, ApiError> {
    if let Some(found) = batch_caller(state, session) {
        return found;
    }
    let headers = &session.req_header().headers;
    let messages = route == Route::Messages;
    crate::accounts::authenticate(&state.directory, &state.db, headers, messages)
        .await?
        .ok_or_else(ApiError::invalid_key)
}

/// The internal credential of this instance's batch runner (`x-sluice-batch:
/// <process token> <key hash> <batch id>:<line>`): `None` when the header is
/// absent; else the key it names, which must still be live (a revoked key fails
/// its lines with 401 `invalid_key`), and the line. The token is random per
/// process and never leaves it, so no client can present it.
fn batch_caller(state: &AppState, session: &Session) -> Option<Result<Caller, ApiError>> {
    let v = session
        .req_header()
        .headers
        .get(crate::state::BATCH_HEADER)?;
    let found = v
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(token, _)| state.internal_token_matches(token))
        .and_then(|(_, rest)| rest.split_once(' '))
        .and_then(|(hash, line)| {
            let (key, org) = state.directory.authenticate_hash(hash)?;
            Some(Caller {
                key,
                org,
                batch_line: Some(line.into()),
            })
        });
    Some(found.ok_or_else(ApiError::invalid_key))
}

/// Whether the org may call the model at all (restricted models need a grant).
pub(crate) fn granted(org: &OrgRecord, model: &Model) -> bool {
    !model.spec.restricted || model.owner.is_some() || org.grants.contains(&model.spec.slug)
}

/// An org under review is refused on every lane, BYOK included.
pub(crate) fn not_under_review(org: &OrgRecord) -> Result<(), ApiError> {
    if org.under_review {
        return Err(ApiError::new(
            ErrorCode::OrgUnderReview,
            review_message(org.review_reason.as_deref()),
        ));
    }
    Ok(())
}

/// The request body, whole, within the size cap and the read deadline; the
/// embeddings route also needs it declared as JSON.
pub(crate) async fn read_body(
    state: &AppState,
    session: &mut Session,
    route: Route,
    started: Instant,
) -> Result<Bytes, ApiError> {
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
    Ok(body)
}

/// The model a request names, as the org may call it.
pub(crate) struct Asked {
    /// The `model` member as the client wrote it (suffixes included).
    pub(crate) name: String,
    /// The `[1m]` suffix asked for the 1M-token window.
    pub(crate) long_context: bool,
    /// The `:online` suffix asked for web search.
    pub(crate) online: bool,
    pub(crate) model: Arc<Model>,
    /// Messages: the client's `anthropic-version` and `anthropic-beta` headers,
    /// where they ask for more than the format the gateway speaks.
    pub(crate) anthropic: Option<Box<AnthropicHeaders>>,
}

/// The Anthropic headers a messages client sent: forwarded to Anthropic's own
/// rungs, disclosed as ignored where a rung cannot use them.
#[derive(Clone, Debug, Default)]
pub(crate) struct AnthropicHeaders {
    /// A version other than the one the gateway speaks (`2023-06-01`).
    pub(crate) version: Option<String>,
    /// Beta flags, comma-separated as sent.
    pub(crate) beta: Option<String>,
}

/// The version of the messages format the gateway itself reads and writes.
pub(crate) const SPOKEN_ANTHROPIC_VERSION: &str = "2023-06-01";

/// Reads a messages client's `anthropic-version` and `anthropic-beta`.
fn anthropic_headers(session: &Session) -> Result<Option<Box<AnthropicHeaders>>, ApiError> {
    let headers = &session.req_header().headers;
    let read = |name: &'static str| -> Result<Option<String>, ApiError> {
        let Some(v) = headers.get(name) else {
            return Ok(None);
        };
        let v = v
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic() || b == b' '))
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("The {name} header must be visible ASCII."),
                )
                .param(name)
            })?;
        Ok(Some(v.to_string()))
    };
    let version = read("anthropic-version")?.filter(|v| v != SPOKEN_ANTHROPIC_VERSION);
    let beta = read("anthropic-beta")?;
    Ok((version.is_some() || beta.is_some()).then(|| Box::new(AnthropicHeaders { version, beta })))
}

/// Reads `model` from the body's members and finds the model: granted to the
/// org, offered where the request comes from, and of the route's kind.
pub(crate) fn model(
    state: &AppState,
    session: &Session,
    org: &OrgRecord,
    members: &[Member<'_>],
    route: Route,
) -> Result<Asked, ApiError> {
    // The last of repeated members wins, as in the forwarded object.
    let name: String = match members
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
    let wanted = split_suffixes(&name);
    let long_context = wanted.long_context;
    let online = wanted.online;
    let catalog = state.catalog.snapshot();
    let model = catalog
        .lookup(Some(&org.id), wanted.slug)
        .filter(|m| granted(org, m))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::ModelNotGranted,
                format!(
                    "This key cannot call {:?}: use a slug from GET /v1/models.",
                    name.chars().take(128).collect::<String>()
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
    let anthropic = match route {
        Route::Messages => anthropic_headers(session)?,
        _ => None,
    };
    Ok(Asked {
        name,
        long_context,
        online,
        model,
        anthropic,
    })
}

/// The most a request can cost, which the gates hold until it settles: its body as
/// input, its output budget clamped to the model's maximum, at the dearest price
/// the request can be billed (cache writes when it marks breakpoints).
pub(crate) fn worst_case(
    model: &Model,
    req: &sluice_filters::ir::Request,
    body_len: usize,
) -> gate::WorstCase {
    let budget = gate::output_budget(req.max_tokens, model.spec.max_output_tokens);
    if req.cache_breaks.is_empty() {
        gate::worst_case(&model.spec.price, body_len, budget)
    } else {
        gate::worst_case_caching(&model.spec.price, body_len, budget)
    }
}

/// Splits the body into its top-level members (values unparsed), once: the native
/// rungs forward them and the chat format validates them without a second read.
/// The long strings it found come along (`with_long_strings`).
pub(crate) fn split_object(body: &[u8]) -> Result<Split<'_>, ApiError> {
    let not_object = || {
        ApiError::new(
            ErrorCode::InvalidRequest,
            "The request body must be a JSON object.",
        )
    };
    let starts_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if starts_object {
        // One pass checks the JSON and its UTF-8 together; bytes that are not
        // UTF-8 are a syntax error, so not JSON.
        return split(body).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => not_object(),
            _ => ApiError::invalid_json(e),
        });
    }
    // Valid JSON of another shape is a malformed request; anything else is not
    // JSON.
    Err(
        match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
            Ok(_) => not_object(),
            Err(e) => ApiError::invalid_json(e),
        },
    )
}

/// The org's active route for the model: its own order and accounts, the
/// require-ZDR policy, and a per-request `x-gateway-route` choice of one rung.
pub(crate) fn active_route(
    state: &AppState,
    session: &Session,
    org: &OrgRecord,
    model: &Model,
) -> Result<Vec<RouteRung>, ApiError> {
    let routing = state.byok.snapshot();
    let mut rungs = active_route::effective(model, org, &routing);
    drop(routing);
    static ROUTE: http::HeaderName = http::HeaderName::from_static("x-gateway-route");
    if let Some(v) = session.req_header().headers.get(&ROUTE) {
        let want = v.to_str().unwrap_or_default().trim();
        rungs.retain(|r| active_route::route_id(&org.id, &model.spec.slug, &r.id) == want);
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
pub(crate) async fn admit_lanes<'a>(
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
    use super::{review_message, split_object};
    use sluice_filters::ErrorCode;

    /// A body's bytes are checked as UTF-8 by the same pass that splits it: a
    /// string that is not UTF-8 is not JSON, wherever it sits and however long
    /// the body; text past ASCII is split as written.
    #[test]
    fn a_body_that_is_not_utf8_is_invalid_json_and_one_that_is_splits() {
        let long = "x".repeat(200);
        for bad in [
            b"{\"model\":\"m\xff\"}".to_vec(),
            [
                format!("{{\"model\":\"m\",\"a\":\"{long}").into_bytes(),
                b"\xc3\"}".to_vec(),
            ]
            .concat(),
            [
                b"{\"a\":\"".to_vec(),
                long.clone().into_bytes(),
                vec![0xe9, b'"', b'}'],
            ]
            .concat(),
        ] {
            let code = split_object(&bad).err().map(|e| e.code);
            assert_eq!(code, Some(ErrorCode::InvalidJson), "{bad:?}");
        }
        let good = format!("{{\"model\":\"caf\u{e9}\",\"a\":\"{long}\u{1F600}\"}}");
        let (members, _) = split_object(good.as_bytes())
            .map_err(|e| e.message)
            .unwrap();
        assert_eq!(members[0].1.get(), "\"caf\u{e9}\"");
        assert_eq!(members[1].1.get().len(), 200 + 4 + 2);
        let code = split_object(b"[1]").err().map(|e| e.code);
        assert_eq!(code, Some(ErrorCode::InvalidRequest));
    }

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
