//! `/api/*` on the gateway listener, dispatched in-process to the management router.
//! Management bodies are small JSON, so we read the body (capped), call the axum
//! router directly, and write its answer: no loopback hop, no second socket.

use crate::downstream::answer::{send, send_error};
use crate::downstream::body::{read_capped, BodyError};
use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use pingora::proxy::Session;
use sluice_filters::{ApiError, Format};
use tower::ServiceExt;

/// The largest management answer we relay (catalog pages are far smaller).
const MAX_ANSWER: usize = 16 * 1024 * 1024;

pub(crate) async fn dispatch(
    router: &Router,
    session: &mut Session,
    cap: usize,
    read_within: std::time::Duration,
) -> pingora::Result<u16> {
    let until = std::time::Instant::now() + read_within;
    let body = match read_capped(session, cap, until).await {
        Ok(b) => b,
        Err(BodyError::TooLarge(e)) => {
            send_error(session, &e, Format::OpenAi).await?;
            return Ok(e.status);
        }
        Err(BodyError::Io(e)) => return Err(e),
    };
    let head = session.req_header();
    let mut req = http::Request::builder()
        .method(head.method.clone())
        .uri(head.uri.clone());
    if let Some(h) = req.headers_mut() {
        *h = head.headers.clone();
    }
    let req = match req.body(Body::from(body)) {
        Ok(r) => r,
        Err(_) => {
            let e = ApiError::new(
                sluice_filters::ErrorCode::InvalidRequest,
                "Malformed request.",
            );
            send_error(session, &e, Format::OpenAi).await?;
            return Ok(e.status);
        }
    };
    // The router's error type is Infallible.
    let resp = match router.clone().oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let (parts, body) = resp.into_parts();
    let bytes: Bytes = axum::body::to_bytes(body, MAX_ANSWER)
        .await
        .unwrap_or_default();
    let status = parts.status.as_u16();
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    // A route that answers 429 says when to come back (a trace pull a source
    // rate-limited).
    let extra: Vec<(&'static str, String)> = parts
        .headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(|v| ("retry-after", v.to_string()))
        .into_iter()
        .collect();
    send(session, status, &content_type, bytes, &extra).await?;
    Ok(status)
}
