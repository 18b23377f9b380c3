//! What one attempt on one rung can end in, and the waiting and writing helpers
//! every attempt uses (deadlines, the client going away, whole answers, the SSE
//! header).

use super::tally::Tally;
use crate::upstream::{Call, Failure};
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::time::fast_timeout::fast_timeout;
use sluice_filters::ir::RefusalReason;
use sluice_filters::sse::KEEPALIVE;
use sluice_filters::upstream::Wire;
use sluice_filters::usage::Usage;
use sluice_filters::{ApiError, ErrorCode};
use std::time::{Duration, Instant};

/// How one attempt ended.
pub enum Attempt {
    /// The answer went to the client (status written).
    Served(u16),
    /// The model ended its turn with no content.
    Empty(Option<Usage>),
    /// The provider refused before any content.
    Refused(RefusalReason),
    Failed(Failure),
    /// The request cannot be served by any rung (e.g. output over the limit).
    Terminal(ApiError),
    ClientGone,
}

impl Attempt {
    /// The outcome label of `x-gateway-attempts` and of metrics.
    pub fn label(&self) -> String {
        match self {
            Attempt::Served(_) => "ok".to_string(),
            Attempt::Empty(_) => "empty".to_string(),
            Attempt::Refused(_) => "refused".to_string(),
            Attempt::Failed(f) => f.label(),
            Attempt::Terminal(_) => "terminal".to_string(),
            Attempt::ClientGone => "client_gone".to_string(),
        }
    }
}

/// Why a rung failed, in words for the `all_routes_failed` message.
pub fn describe(f: &Failure) -> String {
    match f {
        Failure::Connect(why) => format!("connect failed: {why}"),
        Failure::HeaderTimeout => "timed out waiting for response headers".into(),
        Failure::Status(429) => "throttled (429)".into(),
        Failure::Status(s) => format!("status {s}"),
        Failure::DiedBeforeOutput => "died before any output".into(),
        Failure::FirstTokenTimeout => "timed out waiting for the first token".into(),
        Failure::ErrorEvent => "error event before any output".into(),
        Failure::BadAnswer => "unreadable answer".into(),
        Failure::Deadline => "the request deadline passed".into(),
    }
}

/// The 400 `refusal`: `provider refused the request: <fixed phrase>` and the
/// spec's `refusal_reason`.
pub fn refusal(reason: RefusalReason) -> ApiError {
    ApiError::new(
        ErrorCode::Refusal,
        format!("provider refused the request: {}", reason.phrase()),
    )
    .with_extra("refusal_reason", reason.as_str())
}

/// Waits for `fut` until `deadline`. Pingora's fast timeout: coarse (10 ms) and
/// free of the per-timer driver wake-ups of Tokio's, which cost a syscall each
/// on this path.
pub fn until<F: std::future::Future>(
    deadline: Instant,
    fut: F,
) -> impl std::future::Future<Output = Result<F::Output, pingora::time::Elapsed>> {
    // Not an async fn: that would move `fut` into its own state and then again
    // into the timeout's, a copy of the whole future each time.
    fast_timeout(deadline.saturating_duration_since(Instant::now()), fut)
}

/// Polls a future once: its output if it is ready now, else `None` (and the future
/// is dropped). Used only on reads that are safe to abandon while pending.
pub fn ready_now<F: std::future::Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// Waits for `fut` unless the client goes away first.
pub async fn unless_gone<F: std::future::Future>(
    session: &mut Session,
    fut: F,
) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = fut => Some(out),
        _ = session.as_downstream_mut().read_body_or_idle(true) => None,
    }
}

/// Writes a whole answer (header with its content length, then the body); false
/// when the client is gone.
pub async fn write_whole(
    session: &mut Session,
    tally: &mut Tally,
    mut h: ResponseHeader,
    body: Vec<u8>,
) -> bool {
    // Lower-case names are taken as they are; a `HeaderName` would be title-cased
    // and parsed again on insert.
    let _ = h.insert_header("content-length", body.len());
    if tally.tape.is_some() {
        tally.tape_header(&h);
        tally.tape_body(&body);
    }
    session
        .write_response_header(Box::new(h), false)
        .await
        .is_ok()
        && session
            .write_response_body(Some(Bytes::from(body)), true)
            .await
            .is_ok()
}

/// The header of a whole JSON answer, with the receipt.
pub fn json_header(tally: &Tally, provider: &str, outcome: &str) -> Option<ResponseHeader> {
    // Room for ours and the two Pingora adds (date, connection): no regrowth.
    let mut h = ResponseHeader::build_no_case(200, Some(8)).ok()?;
    let _ = h.insert_header(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    tally.receipt_headers(&mut h, provider, outcome);
    Some(h)
}

/// The SSE response header, with the receipt.
pub fn sse_header(tally: &Tally, provider: &str, outcome: &str) -> Option<Box<ResponseHeader>> {
    let mut h = ResponseHeader::build_no_case(200, Some(10)).ok()?;
    let _ = h.insert_header("content-type", "text/event-stream");
    let _ = h.insert_header("cache-control", "no-cache");
    let _ = h.insert_header("transfer-encoding", "chunked");
    tally.receipt_headers(&mut h, provider, outcome);
    Some(Box::new(h))
}

/// What waiting for the next upstream piece before the commit point gave.
pub enum Before {
    Piece(Bytes),
    /// The upstream body ended cleanly.
    End,
    /// The attempt is over: a timeout, a broken connection, the client gone.
    Over(Attempt),
}

/// Reads the next upstream piece before the commit point. While the first content
/// is slow (`limits.early_header_ms`), the 200 header and SSE keep-alive comments go
/// out so the client's own timeouts do not fire; fail-over stays invisible behind
/// them. The request deadline, the first-token deadline, a broken connection and a
/// departed client end the attempt.
pub async fn read_before_commit(
    session: &mut Session,
    tally: &mut Tally,
    call: &mut Call<'_>,
    provider: &str,
    first_deadline: Instant,
    early_ms: u64,
) -> Before {
    loop {
        let next_keepalive = if early_ms == 0 {
            None
        } else if tally.header_sent {
            Some(Instant::now() + Duration::from_millis(early_ms.clamp(1000, 15_000)))
        } else {
            Some(tally.started + Duration::from_millis(early_ms))
        };
        let wait_until = next_keepalive.map_or(first_deadline, |k| k.min(first_deadline));
        let waited = Instant::now();
        let read = unless_gone(session, until(wait_until, call.read())).await;
        tally.upstream_wait += waited.elapsed();
        return match read {
            None => Before::Over(Attempt::ClientGone),
            Some(Err(_)) if Instant::now() >= tally.deadline => {
                Before::Over(Attempt::Failed(Failure::Deadline))
            }
            Some(Err(_)) if Instant::now() >= first_deadline => {
                Before::Over(Attempt::Failed(Failure::FirstTokenTimeout))
            }
            Some(Err(_)) => {
                // A keep-alive tick: the first content is slow.
                if !tally.header_sent {
                    let Some(h) = sse_header(tally, provider, "pending") else {
                        return Before::Over(Attempt::Terminal(ApiError::internal()));
                    };
                    tally.tape_header(&h);
                    if session.write_response_header(h, false).await.is_err() {
                        return Before::Over(Attempt::ClientGone);
                    }
                    tally.header_sent = true;
                }
                if session
                    .write_response_body(Some(Bytes::from_static(KEEPALIVE)), false)
                    .await
                    .is_err()
                {
                    return Before::Over(Attempt::ClientGone);
                }
                continue;
            }
            Some(Ok(Err(_))) => Before::Over(Attempt::Failed(Failure::DiedBeforeOutput)),
            Some(Ok(Ok(None))) => Before::End,
            Some(Ok(Ok(Some(b)))) => Before::Piece(b),
        };
    }
}

/// Reads an error answer's body (bounded, briefly) to tell a refusal from a
/// failure. The connection is not reused either way.
pub async fn failed_status(wire: Wire, mut call: Call<'_>, status: u16) -> Attempt {
    let mut buf = Vec::new();
    if (400..500).contains(&status) && status != 429 {
        let deadline = Instant::now() + Duration::from_millis(500);
        while buf.len() < 64 * 1024 {
            match until(deadline, call.read()).await {
                Ok(Ok(Some(b))) => buf.extend_from_slice(&b),
                _ => break,
            }
        }
    }
    match wire.refusal(status, &buf) {
        Some(reason) => Attempt::Refused(reason),
        None => Attempt::Failed(Failure::Status(status)),
    }
}
