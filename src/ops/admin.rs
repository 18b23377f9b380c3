//! The HTTP admin API of the operating contract. Every route needs
//! `Authorization: Bearer <admin.token>`; an empty token disables `/admin` (404).
//! API keys never reach it.

use crate::accounts::admin as ops;
use crate::api::respond::{json, parse_body, ApiResult, Failure};
use crate::api::Shared;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use sha2::{Digest, Sha256};
use sluice_filters::ApiError;

pub(crate) fn router(state: Shared) -> Router<Shared> {
    Router::new()
        .route("/admin/orgs", post(create_org))
        .route("/admin/orgs/{org_id}", get(show_org))
        .route("/admin/orgs/{org_id}/keys", post(create_key))
        .route("/admin/keys/{key_id}", delete(revoke_key))
        .route("/admin/orgs/{org_id}/credits", post(credits))
        .route("/admin/orgs/{org_id}/verification", post(verification))
        .route("/admin/orgs/{org_id}/grants", put(grants))
        .route("/admin/orgs/{org_id}/review", post(review))
        .route("/admin/orgs/{org_id}/tier", post(tier))
        .route("/admin/orgs/{org_id}/settings", put(settings))
        .route("/admin/orgs/{org_id}/members", post(add_member))
        .route_layer(middleware::from_fn_with_state(state, guard))
}

/// Wrong admin tokens one client address may present per minute; past it the
/// address is answered 429 for the rest of the minute, whatever it presents.
const FAILURES_PER_MINUTE: u32 = 10;

/// Wrong tokens by client address: when its minute began, and how many.
type Failures = std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u32)>;

/// This process's count (bounded: a flood of addresses clears it rather than
/// growing it).
fn failures() -> std::sync::MutexGuard<'static, Failures> {
    static F: std::sync::OnceLock<std::sync::Mutex<Failures>> = std::sync::OnceLock::new();
    F.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Whether `ip` presented its minute's share of wrong tokens already.
fn locked_out(ip: std::net::IpAddr) -> bool {
    failures()
        .get(&ip)
        .is_some_and(|(at, n)| at.elapsed().as_secs() < 60 && *n >= FAILURES_PER_MINUTE)
}

fn count_failure(ip: std::net::IpAddr) {
    let mut map = failures();
    if map.len() >= 10_000 {
        map.retain(|_, (at, _)| at.elapsed().as_secs() < 60);
        if map.len() >= 10_000 {
            map.clear();
        }
    }
    let entry = map.entry(ip).or_insert((std::time::Instant::now(), 0));
    if entry.0.elapsed().as_secs() >= 60 {
        *entry = (std::time::Instant::now(), 0);
    }
    entry.1 += 1;
}

/// Checks the admin token in constant time (both sides hashed first). Guessing
/// is slowed: an address that presented [`FAILURES_PER_MINUTE`] wrong tokens is
/// refused until its minute ends.
async fn guard(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let token = &state.config.admin.token;
    if token.is_empty() {
        return Failure(ApiError::not_found(req.uri().path())).into_response();
    }
    let ip = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    if ip.is_some_and(locked_out) {
        let mut res = Failure(ApiError::new(
            sluice_filters::ErrorCode::RateLimited,
            "Too many wrong admin tokens from this address; retry in a minute.",
        ))
        .into_response();
        res.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("60"),
        );
        return res;
    }
    let presented = crate::accounts::presented_key(req.headers(), false).unwrap_or("");
    let a = Sha256::digest(presented.as_bytes());
    let b = Sha256::digest(token.as_bytes());
    let same = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0;
    if !same {
        if let Some(ip) = ip {
            count_failure(ip);
        }
        return Failure(ApiError::new(
            sluice_filters::ErrorCode::InvalidKey,
            "Invalid admin token.",
        ))
        .into_response();
    }
    next.run(req).await
}

async fn create_org(State(s): State<Shared>, body: Bytes) -> ApiResult {
    let v = ops::create_org(&s.db, Some(&s.directory), parse_body(&body)?).await?;
    Ok(json(StatusCode::CREATED, &v))
}

async fn show_org(State(s): State<Shared>, Path(org_id): Path<String>) -> ApiResult {
    Ok(json(StatusCode::OK, &ops::show_org(&s.db, &org_id).await?))
}

async fn create_key(State(s): State<Shared>, Path(org_id): Path<String>, body: Bytes) -> ApiResult {
    let req = if body.is_empty() {
        Default::default()
    } else {
        parse_body(&body)?
    };
    let v = ops::create_key(&s.db, Some(&s.directory), &org_id, req).await?;
    Ok(json(StatusCode::CREATED, &v))
}

async fn revoke_key(State(s): State<Shared>, Path(key_id): Path<String>) -> ApiResult {
    ops::revoke_key(&s.db, Some(&s.directory), &key_id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn credits(State(s): State<Shared>, Path(org_id): Path<String>, body: Bytes) -> ApiResult {
    let up = s.config.billing.tier_up_purchase_usd;
    let v = ops::credits(&s.db, Some(&s.directory), &org_id, parse_body(&body)?, up).await?;
    Ok(json(StatusCode::OK, &v))
}

async fn verification(
    State(s): State<Shared>,
    Path(org_id): Path<String>,
    body: Bytes,
) -> ApiResult {
    let v = ops::verification(&s.db, Some(&s.directory), &org_id, parse_body(&body)?).await?;
    Ok(json(StatusCode::OK, &v))
}

async fn grants(State(s): State<Shared>, Path(org_id): Path<String>, body: Bytes) -> ApiResult {
    let v = ops::grants(&s.db, Some(&s.directory), &org_id, parse_body(&body)?).await?;
    Ok(json(StatusCode::OK, &v))
}

async fn review(State(s): State<Shared>, Path(org_id): Path<String>, body: Bytes) -> ApiResult {
    let v = ops::review(&s.db, Some(&s.directory), &org_id, parse_body(&body)?).await?;
    Ok(json(StatusCode::OK, &v))
}

async fn tier(State(s): State<Shared>, Path(org_id): Path<String>, body: Bytes) -> ApiResult {
    let v = ops::tier(&s.db, Some(&s.directory), &org_id, parse_body(&body)?).await?;
    Ok(json(StatusCode::OK, &v))
}

async fn settings(State(s): State<Shared>, Path(org_id): Path<String>, body: Bytes) -> ApiResult {
    let default = s.config.responses.prompt_capture_default;
    let v = ops::settings(
        &s.db,
        Some(&s.directory),
        &org_id,
        parse_body(&body)?,
        default,
    )
    .await?;
    Ok(json(StatusCode::OK, &v))
}

async fn add_member(State(s): State<Shared>, Path(org_id): Path<String>, body: Bytes) -> ApiResult {
    let v = ops::add_member(&s.db, &org_id, parse_body(&body)?).await?;
    Ok(json(StatusCode::CREATED, &v))
}
