//! Files and batches (issue 26): OpenAI's Files API (`/v1/files`) over the object
//! store of `[storage] objects`, and its Batch API (`/v1/batches`) whose lines are
//! served by [`runner`] through this instance's own gateway ([`Lines`]), so each line
//! meets the same validation, waterfall, gates and prices as a live request.
//!
//! The doors: the proxy's dispatch hands `/v1/files*` and `/v1/batches*` (and the
//! unprefixed twins) to [`serve`]; `server.rs` starts [`runner::run`] with
//! the [`Lines`] that serve a line's connection. Nothing
//! here imports `proxy` or `inference`.

mod batch;
mod claims;
mod files;
pub(crate) mod jsonl;
mod recorder;
pub(crate) mod runner;
mod wake;
mod wire;
pub(crate) use wire::Lines;

use crate::downstream::answer::{send_error, send_json};
use crate::downstream::body::{read_capped, BodyError};
use crate::state::AppState;
use pingora::proxy::Session;
use sluice_filters::{ApiError, ErrorCode, Format, Route};
use std::time::{Duration, Instant};

pub(crate) use crate::accounts::Caller;

/// A database failure as the client sees it (the cause goes to the log).
pub(crate) fn db_err(what: &'static str) -> impl Fn(sqlx::Error) -> ApiError {
    move |e| {
        tracing::error!(error = %e, what, "batches: database failure");
        ApiError::internal()
    }
}

/// An object store failure as the client sees it.
pub(crate) fn store_err(e: impl std::fmt::Display) -> ApiError {
    tracing::error!(error = %e, "batches: object store failure");
    ApiError::internal()
}

pub(crate) fn not_found(what: &str, param: &'static str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("No such {what}.")).param(param)
}

/// One query parameter, percent-decoded.
pub(crate) fn query_param(query: &str, name: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// `limit` of a list: 1..=max, `default` when absent.
pub(crate) fn limit_param(query: &str, default: i64, max: i64) -> Result<i64, ApiError> {
    match query_param(query, "limit") {
        None => Ok(default),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| {
                ApiError::invalid_parameter("limit", format!("limit must be 1 to {max}"))
            }),
    }
}

/// A list page in OpenAI's shape.
pub(crate) fn page(data: Vec<serde_json::Value>, has_more: bool) -> serde_json::Value {
    let id = |v: Option<&serde_json::Value>| v.and_then(|v| v.get("id")).cloned();
    serde_json::json!({
        "object": "list",
        "first_id": id(data.first()),
        "last_id": id(data.last()),
        "has_more": has_more,
        "data": data,
    })
}

/// The small JSON body of a POST, under `[limits] max_request_bytes`.
pub(crate) async fn json_body(
    state: &AppState,
    session: &mut Session,
) -> Result<serde_json::Value, ApiError> {
    let limits = &state.config.limits;
    let until = Instant::now() + Duration::from_millis(limits.request_read_timeout_ms);
    let body = match read_capped(session, limits.max_request_bytes, until).await {
        Ok(b) => b,
        Err(BodyError::TooLarge(e)) => return Err(e),
        Err(BodyError::Io(_)) => {
            return Err(ApiError::new(
                ErrorCode::RequestCancelled,
                "The client went away.",
            ))
        }
    };
    if body.is_empty() {
        return Ok(serde_json::json!({}));
    }
    serde_json::from_slice(&body).map_err(ApiError::invalid_json)
}

async fn authenticate(state: &AppState, session: &Session) -> Result<Caller, ApiError> {
    let headers = &session.req_header().headers;
    crate::accounts::authenticate(&state.directory, &state.db, headers, false)
        .await?
        .ok_or_else(ApiError::invalid_key)
}

/// Serves one request of `/v1/files*` or `/v1/batches*` (or an unprefixed twin);
/// returns the status written. The one door from the gateway's dispatch.
pub(crate) async fn serve(
    state: &AppState,
    session: &mut Session,
    route: Route,
) -> pingora::Result<u16> {
    match answer(state, session, route).await {
        Ok(Some(body)) => {
            send_json(session, 200, body.to_string().into_bytes()).await?;
            Ok(200)
        }
        // Written already (a file's content).
        Ok(None) => Ok(200),
        Err(e) => {
            send_error(session, &e, Format::OpenAi).await?;
            Ok(e.status)
        }
    }
}

async fn answer(
    state: &AppState,
    session: &mut Session,
    route: Route,
) -> Result<Option<serde_json::Value>, ApiError> {
    let caller = authenticate(state, session).await?;
    let method = session.req_header().method.clone();
    let path = session.req_header().uri.path().to_string();
    let path = path.strip_prefix("/v1").unwrap_or(&path);
    let query = session.req_header().uri.query().unwrap_or("").to_string();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    use http::Method as M;
    match (route, parts.as_slice()) {
        (Route::Files, ["files"]) => match method {
            M::POST => files::upload(state, session, &caller).await.map(Some),
            M::GET => files::list(state, &caller, &query).await.map(Some),
            m => Err(ApiError::method_not_allowed(&m, "GET or POST")),
        },
        (Route::Files, ["files", id]) => match method {
            M::GET => files::get(state, &caller, id).await.map(Some),
            M::DELETE => files::delete(state, &caller, id).await.map(Some),
            m => Err(ApiError::method_not_allowed(&m, "GET or DELETE")),
        },
        (Route::Files, ["files", id, "content"]) => match method {
            M::GET => files::content(state, session, &caller, id)
                .await
                .map(|()| None),
            m => Err(ApiError::method_not_allowed(&m, "GET")),
        },
        (Route::Batches, ["batches"]) => match method {
            M::POST => {
                let body = json_body(state, session).await?;
                batch::create(state, &caller, body).await.map(Some)
            }
            M::GET => batch::list(state, &caller, &query).await.map(Some),
            m => Err(ApiError::method_not_allowed(&m, "GET or POST")),
        },
        (Route::Batches, ["batches", id]) => match method {
            M::GET => batch::get(state, &caller, id).await.map(Some),
            m => Err(ApiError::method_not_allowed(&m, "GET")),
        },
        (Route::Batches, ["batches", id, "cancel"]) => match method {
            M::POST => batch::cancel(state, &caller, id).await.map(Some),
            m => Err(ApiError::method_not_allowed(&m, "POST")),
        },
        _ => Err(ApiError::not_found(session.req_header().uri.path())),
    }
}
