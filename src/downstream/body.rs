//! Reading a request body whole, under the configured cap and within a total time.
//! A body over the cap is refused as soon as its declared length or its running
//! size passes the cap, and a body that has not arrived in time (a client that
//! dribbles it to hold the connection) is refused with 408; either way the
//! connection is not reused (the rest of the body is never read).

use bytes::{Bytes, BytesMut};
use pingora::proxy::Session;
use sluice_filters::{ApiError, ErrorCode};
use std::time::Instant;

pub(crate) enum BodyError {
    TooLarge(ApiError),
    Io(Box<pingora::Error>),
}

fn too_slow() -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequest,
        "The request body did not arrive in time.",
    )
    .with_status(408)
}

fn too_large(cap: usize) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequest,
        format!("The request body exceeds the limit of {cap} bytes."),
    )
    .with_status(400)
}

pub(crate) async fn read_capped(
    session: &mut Session,
    cap: usize,
    until: Instant,
) -> Result<Bytes, BodyError> {
    match crate::deadline::until(until, read_all(session, cap)).await {
        Ok(r) => r,
        Err(_) => {
            session.set_keepalive(None);
            Err(BodyError::TooLarge(too_slow()))
        }
    }
}

async fn read_all(session: &mut Session, cap: usize) -> Result<Bytes, BodyError> {
    let declared = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > cap) {
        session.set_keepalive(None);
        return Err(BodyError::TooLarge(too_large(cap)));
    }
    let mut buf = BytesMut::with_capacity(declared.unwrap_or(4096).min(cap));
    while let Some(chunk) = session.read_request_body().await.map_err(BodyError::Io)? {
        if buf.len() + chunk.len() > cap {
            session.set_keepalive(None);
            return Err(BodyError::TooLarge(too_large(cap)));
        }
        if buf.is_empty() && declared.is_none_or(|n| n == chunk.len()) {
            // The common case: one chunk is the whole body; keep it without a copy.
            if session.is_body_done() {
                return Ok(chunk);
            }
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}
