//! Writing whole answers to a downstream Pingora session: JSON bodies and the error
//! envelope of the route's format.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use sluice_filters::{ApiError, Format};

/// An answer as the client received it: status, the headers worth replaying, and
/// the body bytes (a stream's frames in order).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Tape {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

/// Sends a stored answer again, marked `idempotent-replayed: true`; returns its
/// status (499 when the client is gone).
pub(crate) async fn replay(session: &mut Session, tape: Tape) -> u16 {
    let Ok(mut h) = ResponseHeader::build_no_case(tape.status, Some(tape.headers.len() + 2)) else {
        return 500;
    };
    for (n, v) in &tape.headers {
        if !n.eq_ignore_ascii_case("transfer-encoding") {
            let _ = h.append_header(n.clone(), v.as_str());
        }
    }
    let _ = h.insert_header("idempotent-replayed", "true");
    let _ = h.insert_header(http::header::CONTENT_LENGTH, tape.body.len());
    let ok = session
        .write_response_header(Box::new(h), false)
        .await
        .is_ok()
        && session
            .write_response_body(Some(Bytes::from(tape.body)), true)
            .await
            .is_ok();
    if ok {
        tape.status
    } else {
        499
    }
}

/// Writes a complete answer with a body and extra headers.
pub(crate) async fn send(
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
pub(crate) async fn write_stream_body(
    session: &mut Session,
    body: Bytes,
    end: bool,
) -> pingora::Result<()> {
    if end && !body.is_empty() {
        super::listener::hold_next_flush(session);
    }
    session.write_response_body(Some(body), end).await
}

pub(crate) async fn send_json(
    session: &mut Session,
    status: u16,
    body: Vec<u8>,
) -> pingora::Result<()> {
    send(session, status, "application/json", Bytes::from(body), &[]).await
}

pub(crate) async fn send_error(
    session: &mut Session,
    err: &ApiError,
    format: Format,
) -> pingora::Result<()> {
    send_json(session, err.status, err.to_body(format)).await
}
