//! What one attempt on one rung can end in, and the waiting and writing helpers
//! every attempt uses (deadlines, the client going away, whole answers, the SSE
//! header).

use super::tally::Tally;
use super::Engine;
use crate::deadline::until;
use crate::downstream::listener::hold_next_flush;
use crate::upstream::{Call, Failure, OutBody, Target};
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use sluice_filters::ir::RefusalReason;
use sluice_filters::sse::KEEPALIVE;
use sluice_filters::upstream::{rejection, Rejection, Wire};
use sluice_filters::usage::Usage;
use sluice_filters::{ApiError, ErrorCode};
use std::time::{Duration, Instant};

/// How one attempt ended.
pub(crate) enum Attempt {
    /// The answer went to the client (status written).
    Served(u16),
    /// The model ended its turn with no content.
    Empty(Option<Usage>),
    /// The provider refused before any content.
    Refused(RefusalReason),
    /// The provider refused the request itself as malformed (400, 413, 422): the
    /// next rung is tried, and when none serves it this is the answer.
    Rejected(ApiError),
    Failed(Failure),
    /// The request cannot be served by any rung (e.g. output over the limit).
    Terminal(ApiError),
    ClientGone,
    /// The model called `tool_search` (tool search the gateway serves): the call
    /// is billed and a search round follows.
    Round(Box<crate::hooks::Turn>),
}

impl Attempt {
    /// The outcome label of `x-gateway-attempts` and of metrics.
    pub(crate) fn label(&self) -> String {
        match self {
            Attempt::Served(_) => "ok".to_string(),
            Attempt::Empty(_) => "empty_completion".to_string(),
            Attempt::Refused(_) => "refused".to_string(),
            Attempt::Rejected(e) => e.status.to_string(),
            Attempt::Failed(f) => f.label(),
            Attempt::Terminal(_) => "terminal".to_string(),
            Attempt::ClientGone => "client_gone".to_string(),
            Attempt::Round(_) => "tool_search".to_string(),
        }
    }
}

impl Attempt {
    /// The outcome class of metrics and traces; `cut`: a served stream ended
    /// early.
    pub(crate) fn class(&self, cut: bool) -> &'static str {
        match self {
            Attempt::Served(_) if cut => "cut",
            // A tool search round is a served model call.
            Attempt::Served(_) | Attempt::Round(_) => "ok",
            Attempt::Empty(_) => "empty_completion",
            Attempt::Refused(_) => "refused",
            Attempt::Rejected(_) => "http_4xx",
            Attempt::Failed(f) => f.class(),
            Attempt::Terminal(_) => "terminal",
            Attempt::ClientGone => "client_gone",
        }
    }
}

/// Why a rung failed, in words for the `all_routes_failed` message.
pub(crate) fn describe(f: &Failure) -> String {
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
pub(crate) fn refusal(reason: RefusalReason) -> ApiError {
    ApiError::new(
        ErrorCode::Refusal,
        format!("provider refused the request: {}", reason.phrase()),
    )
    .with_extra("refusal_reason", reason.as_str())
}

/// Polls a future once: its output if it is ready now, else `None` (and the future
/// is dropped). Used only on reads that are safe to abandon while pending.
pub(crate) fn ready_now<F: std::future::Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// Waits for `fut` unless the client goes away first.
pub(crate) async fn unless_gone<F: std::future::Future>(
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
pub(crate) async fn write_whole(
    session: &mut Session,
    tally: &mut Tally,
    mut h: ResponseHeader,
    body: Vec<u8>,
) -> bool {
    let body = tally.outgoing(body, false);
    // Lower-case names are taken as they are; a `HeaderName` would be title-cased
    // and parsed again on insert.
    let _ = h.insert_header("content-length", body.len());
    tally.header_out(&mut h);
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
pub(crate) fn json_header(tally: &Tally, provider: &str, outcome: &str) -> Option<ResponseHeader> {
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
pub(crate) fn sse_header(
    tally: &Tally,
    provider: &str,
    outcome: &str,
) -> Option<Box<ResponseHeader>> {
    let mut h = ResponseHeader::build_no_case(200, Some(10)).ok()?;
    let _ = h.insert_header("content-type", "text/event-stream");
    let _ = h.insert_header("cache-control", "no-cache");
    let _ = h.insert_header("transfer-encoding", "chunked");
    tally.receipt_headers(&mut h, provider, outcome);
    Some(Box::new(h))
}

/// What waiting for the next upstream piece before the commit point gave.
pub(crate) enum Before {
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
pub(crate) async fn read_before_commit(
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
                    let Some(mut h) = sse_header(tally, provider, "pending") else {
                        return Before::Over(Attempt::Terminal(ApiError::internal()));
                    };
                    tally.header_out(&mut h);
                    // The keep-alive is written right after: one write for both.
                    hold_next_flush(session);
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

/// Reads an error answer's body (bounded, briefly) to tell a refusal, a
/// rejected request and a failure apart. The connection is not reused either way.
pub(crate) async fn failed_status(
    wire: Option<Wire>,
    target: &Target,
    mut call: Call<'_>,
    status: u16,
) -> Attempt {
    let Some(wire) = wire else {
        return Attempt::Failed(Failure::Status(status));
    };
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
    if let Some(reason) = wire.refusal(status, &buf) {
        return Attempt::Refused(reason);
    }
    if matches!(status, 400 | 413 | 422) {
        if let Some(r) = rejection(&buf) {
            return Attempt::Rejected(rejected(target, status, r));
        }
    }
    Attempt::Failed(Failure::Status(status))
}

/// The client's 400 for a request a provider refused as malformed: the field it
/// named (`invalid_parameter`) or none (`invalid_request`), with its message, the
/// rung's credential blanked out and its length bounded.
fn rejected(target: &Target, status: u16, r: Rejection) -> ApiError {
    let mut message = target.redact(&r.message);
    if message.len() > 1000 {
        let mut cut = 1000;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push('…');
    }
    let e = match r.param {
        Some(p) => ApiError::new(ErrorCode::InvalidParameter, message).param(p),
        None => ApiError::new(ErrorCode::InvalidRequest, message),
    };
    e.with_status(if status == 413 { 413 } else { 400 })
}

/// Where and how one attempt posts: the rung, its path and wire, the body and the
/// headers this request needs there.
pub(crate) struct Post<'a> {
    pub(crate) target: &'a Target,
    pub(crate) path: &'a str,
    /// The wire whose error answers may be refusals (`None`: embeddings, whose
    /// error answers are failures only).
    pub(crate) wire: Option<Wire>,
    pub(crate) body: OutBody,
    pub(crate) stream: bool,
    pub(crate) headers: &'a [(&'static str, String)],
}

/// Posts to the rung and waits for its answer's header, within the request's
/// deadline and unless the client goes away first. A non-2xx answer ends the
/// attempt (a refusal, or a failure the waterfall judges).
pub(crate) async fn open<'e>(
    engine: &'e Engine,
    session: &mut Session,
    tally: &mut Tally,
    post: Post<'_>,
) -> Result<Call<'e>, Attempt> {
    let waited = Instant::now();
    let traceparent = tally.trace.header();
    let send = engine.upstreams.post_traced(
        post.target,
        post.path,
        post.body,
        post.stream,
        post.headers,
        traceparent.as_ref().map(|h| h.as_str()),
    );
    let posted = unless_gone(session, until(tally.deadline, send)).await;
    tally.upstream_wait += waited.elapsed();
    let call = match posted {
        None => return Err(Attempt::ClientGone),
        Some(Err(_)) => return Err(Attempt::Failed(Failure::Deadline)),
        Some(Ok(Err(f))) => return Err(Attempt::Failed(f)),
        Some(Ok(Ok(c))) => c,
    };
    let status = call.status();
    if !(200..300).contains(&status) {
        return Err(failed_status(post.wire, post.target, call, status).await);
    }
    Ok(call)
}

/// Posts a whole (not streamed) request and reads the whole answer, which must
/// come within the rung's header and first-token times and within
/// `limits.max_response_bytes`. The client going away ends the wait.
pub(crate) async fn read_whole<'e>(
    engine: &'e Engine,
    session: &mut Session,
    tally: &mut Tally,
    post: Post<'_>,
) -> Result<(Call<'e>, Vec<u8>), Attempt> {
    let t = post.target;
    let deadline = tally.deadline;
    let limit = deadline.min(Instant::now() + t.header_timeout + t.first_token_timeout);
    let max = engine.state.config.limits.max_response_bytes;
    let waited = Instant::now();
    let traceparent = tally.trace.header();
    let read = async {
        let send = engine.upstreams.post_traced(
            t,
            post.path,
            post.body,
            false,
            post.headers,
            traceparent.as_ref().map(|h| h.as_str()),
        );
        let mut call = until(deadline, send)
            .await
            .map_err(|_| Failure::Deadline)??;
        let status = call.status();
        if !(200..300).contains(&status) {
            return Ok(Err((call, status)));
        }
        let mut buf = Vec::new();
        loop {
            match until(limit, call.read()).await {
                Err(_) if Instant::now() >= deadline => return Err(Failure::Deadline),
                Err(_) => return Err(Failure::FirstTokenTimeout),
                Ok(Err(_)) => return Err(Failure::DiedBeforeOutput),
                Ok(Ok(None)) => break,
                Ok(Ok(Some(b))) => {
                    if buf.len() + b.len() > max {
                        return Ok(Ok((call, None)));
                    }
                    buf.extend_from_slice(&b);
                }
            }
        }
        Ok(Ok((call, Some(buf))))
    };
    let result = unless_gone(session, read).await;
    tally.upstream_wait += waited.elapsed();
    match result {
        None => Err(Attempt::ClientGone),
        Some(Err(f)) => Err(Attempt::Failed(f)),
        Some(Ok(Err((call, status)))) => {
            Err(failed_status(post.wire, post.target, call, status).await)
        }
        Some(Ok(Ok((call, Some(buf))))) => Ok((call, buf)),
        Some(Ok(Ok((_, None)))) => Err(Attempt::Terminal(ApiError::new(
            ErrorCode::ProviderOutputTooLarge,
            format!("The provider's answer exceeded the response limit of {max} bytes."),
        ))),
    }
}
