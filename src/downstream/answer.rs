//! Writing whole answers to a downstream Pingora session: JSON bodies and the error
//! envelope of the route's format.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use sluice_filters::{ApiError, Format};

/// Writes a complete answer with a body and extra headers.
pub async fn send(
    session: &mut Session,
    status: u16,
    content_type: &str,
    body: Bytes,
    extra: &[(&'static str, String)],
) -> pingora::Result<()> {
    let mut h = ResponseHeader::build_no_case(status, Some(2 + extra.len()))?;
    h.insert_header(http::header::CONTENT_TYPE, content_type)?;
    h.insert_header(http::header::CONTENT_LENGTH, body.len())?;
    for (k, v) in extra {
        h.insert_header(*k, v.as_str())?;
    }
    let empty = body.is_empty();
    session.write_response_header(Box::new(h), empty).await?;
    if !empty {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(())
}

/// Writes a piece of a streamed answer; the last one (`end`) leaves in one write
/// with the terminating chunk that follows it.
pub async fn write_stream_body(
    session: &mut Session,
    body: Bytes,
    end: bool,
) -> pingora::Result<()> {
    if end && !body.is_empty() {
        super::listener::hold_next_flush(session);
    }
    session.write_response_body(Some(body), end).await
}

pub async fn send_json(session: &mut Session, status: u16, body: Vec<u8>) -> pingora::Result<()> {
    send(session, status, "application/json", Bytes::from(body), &[]).await
}

pub async fn send_error(
    session: &mut Session,
    err: &ApiError,
    format: Format,
) -> pingora::Result<()> {
    send_json(session, err.status, err.to_body(format)).await
}
