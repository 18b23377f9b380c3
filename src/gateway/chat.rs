//! The chat-completions attempt loop over the waterfall, for OpenAI-wire rungs.
//!
//! Each rung is tried in order until one commits. The commit point is the first
//! content (a non-empty text or tool-call delta): before it, nothing has reached the
//! client, so an error status, a throttle, a connect failure, a timeout, an in-band
//! error event or a stall moves on to the next rung. A rung that accepted the request
//! and died before any output is retried once on the same rung. After commit the
//! answer streams from that rung, event by event, as it arrives.

use super::breaker::Admit;
use super::exchange::{Exchange, Outcome};
use super::upstream::{speaks_openai_chat, Failure, Target};
use super::Gateway;
use crate::catalog::Model;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::time::fast_timeout::fast_timeout;
use serde_json::json;
use sluice_filters::sse::{data_frame, SseDecoder, KEEPALIVE};
use sluice_filters::upstream::openai_chat::{
    append_member, client_wants_stream_usage, inspect, quick_content_len, render_request,
    splice_member, splice_member_into, usage_json, Inspection, RawObject,
};
use sluice_filters::usage::Usage;
use sluice_filters::{ApiError, ErrorCode};
use std::time::{Duration, Instant};

/// How one attempt ended.
enum Attempt {
    /// The answer went to the client (status written).
    Served(u16),
    /// The model ended its turn with no content.
    Empty(Option<Usage>),
    /// The provider refused before any content.
    Refused,
    Failed(Failure),
    /// The request cannot be served by any rung (e.g. output over the limit).
    Terminal(ApiError),
    ClientGone,
}

/// Serves `/v1/chat/completions` for a model whose route the caller may use.
pub async fn serve(
    gw: &Gateway,
    session: &mut Session,
    ex: &mut Exchange,
    model: &Model,
    body: RawObject,
) -> Outcome {
    let stream = match body.get("stream").map(|v| v.get()) {
        None | Some("false") | Some("null") => false,
        Some("true") => true,
        Some(_) => {
            return Outcome::Error(ApiError::invalid_parameter(
                "stream",
                "stream must be a boolean",
            ))
        }
    };
    let wants_usage = stream && client_wants_stream_usage(&body);
    let targets: Vec<std::sync::Arc<Target>> = model
        .spec
        .rungs
        .iter()
        .filter(|r| speaks_openai_chat(&r.provider))
        .filter_map(|r| gw.upstreams.target(r))
        .collect();
    if targets.is_empty() {
        return Outcome::Error(
            ApiError::new(
                ErrorCode::UnavailableRoute,
                "No rung of this model is served on the chat-completions route yet.",
            )
            .with_status(503),
        );
    }
    // Admission is asked only of a rung about to be tried: a half-open probe slot
    // taken for a rung that is never reached would keep it closed off.
    let healthy = targets
        .iter()
        .filter(|t| gw.breaker.would_admit(&t.breaker_key))
        .count();
    if healthy == 0 {
        return Outcome::Error(
            ApiError::new(
                ErrorCode::UnavailableRoute,
                "Every rung of this model is cooling down after repeated failures; retry with backoff.",
            )
            .with_status(503),
        );
    }
    let single = healthy == 1;
    let mut died = 0u32;
    let mut empty: Option<Usage> = None;
    let mut reasons: Vec<String> = Vec::new();
    let mut tried = 0usize;
    for target in &targets {
        if gw.breaker.admit(&target.breaker_key) == Admit::No {
            continue;
        }
        if tried > 0 {
            gw.state
                .metrics
                .failovers
                .with_label_values(&["chat"])
                .inc();
        }
        tried += 1;
        for try_no in 0..2 {
            let rendered = Bytes::from(render_request(&body, &target.model_id, stream));
            let result = if stream {
                Box::pin(stream_attempt(
                    gw,
                    session,
                    ex,
                    target,
                    rendered,
                    wants_usage,
                ))
                .await
            } else {
                Box::pin(plain_attempt(gw, session, ex, target, rendered)).await
            };
            let label = match &result {
                Attempt::Served(_) => "ok".to_string(),
                Attempt::Empty(_) => "empty".to_string(),
                Attempt::Refused => "refused".to_string(),
                Attempt::Failed(f) => f.label(),
                Attempt::Terminal(_) => "terminal".to_string(),
                Attempt::ClientGone => "client_gone".to_string(),
            };
            gw.state
                .metrics
                .upstream_attempts
                .with_label_values(&[target.provider.as_str(), label.as_str()])
                .inc();
            ex.attempt(&target.provider, &label);
            match result {
                Attempt::Served(status) => {
                    gw.breaker.success(&target.breaker_key);
                    ex.rung = Some(target.rung_id.clone());
                    return Outcome::Written(status);
                }
                Attempt::Refused => {
                    gw.breaker.success(&target.breaker_key);
                    ex.rung = Some(target.rung_id.clone());
                    return Outcome::Error(refusal());
                }
                Attempt::Empty(u) => {
                    gw.breaker.success(&target.breaker_key);
                    ex.empty_attempts += 1;
                    empty.get_or_insert(u.unwrap_or_default());
                    ex.rung = Some(target.rung_id.clone());
                    break;
                }
                Attempt::Terminal(e) => {
                    gw.breaker.abandon(&target.breaker_key);
                    return Outcome::Error(e);
                }
                Attempt::ClientGone => {
                    gw.breaker.abandon(&target.breaker_key);
                    return Outcome::ClientGone;
                }
                Attempt::Failed(Failure::Deadline) => {
                    gw.breaker.abandon(&target.breaker_key);
                    return Outcome::Error(ApiError::new(
                        ErrorCode::DeadlineExceeded,
                        "The request ran past its deadline before any rung answered.",
                    ));
                }
                Attempt::Failed(f) => {
                    gw.breaker.failure(&target.breaker_key);
                    reasons.push(format!("{} ({})", target.rung_id, describe(&f)));
                    if f == Failure::DiedBeforeOutput {
                        died += 1;
                        if try_no == 0 {
                            continue;
                        }
                    }
                    break;
                }
            }
        }
    }
    if let Some(u) = empty {
        ex.usage = u;
        return empty_completion(session, ex, model, stream).await;
    }
    if single && died == 2 {
        return Outcome::Error(ApiError::new(
            ErrorCode::ProviderInternal,
            format!(
                "The provider accepted the request and died before any output, twice: {}.",
                reasons.join("; ")
            ),
        ));
    }
    Outcome::Error(ApiError::new(
        ErrorCode::AllRoutesFailed,
        format!("Every rung failed: {}.", reasons.join("; ")),
    ))
}

fn describe(f: &Failure) -> String {
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

/// The 400 `refusal`. Its reason is `content_policy` until the translation layer
/// classifies providers' refusal texts into the spec's finer reasons.
fn refusal() -> ApiError {
    ApiError::new(
        ErrorCode::Refusal,
        "provider refused the request: content policy",
    )
    .with_extra("refusal_reason", "content_policy")
}

/// Waits for `fut` until `deadline`. Pingora's fast timeout: coarse (10 ms) and
/// free of the per-timer driver wake-ups of Tokio's, which cost a syscall each
/// on this path.
async fn until<F: std::future::Future>(deadline: Instant, fut: F) -> Result<F::Output, Elapsed> {
    fast_timeout(deadline.saturating_duration_since(Instant::now()), fut)
        .await
        .map_err(|_| Elapsed)
}

/// A wait that ran out.
struct Elapsed;

/// Polls a future once: its output if it is ready now, else `None` (and the future
/// is dropped). Used only on reads that are safe to abandon while pending.
fn ready_now<F: std::future::Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// Waits for `fut` unless the client goes away first.
async fn unless_gone<F: std::future::Future>(session: &mut Session, fut: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = fut => Some(out),
        _ = session.as_downstream_mut().read_body_or_idle(true) => None,
    }
}

async fn plain_attempt(
    gw: &Gateway,
    session: &mut Session,
    ex: &mut Exchange,
    t: &Target,
    body: Bytes,
) -> Attempt {
    let path = t.chat_path();
    let waited = Instant::now();
    let limit = ex
        .deadline
        .min(Instant::now() + t.header_timeout + t.first_token_timeout);
    let max = gw.state.config.limits.max_response_bytes;
    let call = async {
        let mut call = until(ex.deadline, gw.upstreams.post(t, &path, body, false))
            .await
            .map_err(|_| Failure::Deadline)??;
        let status = call.status();
        if !(200..300).contains(&status) {
            return Err(Failure::Status(status));
        }
        let mut buf = Vec::new();
        loop {
            match until(limit, call.read()).await {
                Err(_) if Instant::now() >= ex.deadline => return Err(Failure::Deadline),
                Err(_) => return Err(Failure::FirstTokenTimeout),
                Ok(Err(_)) => return Err(Failure::DiedBeforeOutput),
                Ok(Ok(None)) => break,
                Ok(Ok(Some(b))) => {
                    if buf.len() + b.len() > max {
                        return Ok((call, None));
                    }
                    buf.extend_from_slice(&b);
                }
            }
        }
        Ok((call, Some(buf)))
    };
    let result = unless_gone(session, call).await;
    ex.upstream_wait += waited.elapsed();
    let (call, buf) = match result {
        None => return Attempt::ClientGone,
        Some(Err(f)) => return Attempt::Failed(f),
        Some(Ok(x)) => x,
    };
    let Some(buf) = buf else {
        return Attempt::Terminal(ApiError::new(
            ErrorCode::ProviderOutputTooLarge,
            format!("The provider's answer exceeded the response limit of {max} bytes."),
        ));
    };
    let Some(info) = inspect(&buf) else {
        return Attempt::Failed(Failure::BadAnswer);
    };
    if info.error.is_some() {
        return Attempt::Failed(Failure::ErrorEvent);
    }
    if !info.has_content {
        if info.refusal.is_some() {
            return Attempt::Refused;
        }
        return Attempt::Empty(info.usage);
    }
    call.finish().await;
    ex.usage = info.usage.unwrap_or_default();
    ex.first_token = Some(ex.started.elapsed());
    let provider = serde_json::to_vec(&t.rung_id).unwrap_or_default();
    let mut out = buf;
    append_member(&mut out, 0, "provider", &provider);
    let mut h = match ResponseHeader::build_no_case(200, Some(4)) {
        Ok(h) => h,
        Err(_) => return Attempt::Terminal(ApiError::internal()),
    };
    let _ = h.insert_header(http::header::CONTENT_TYPE, "application/json");
    ex.receipt_headers(&mut h, &t.provider, "ok");
    if !write_whole(session, h, out).await {
        return Attempt::ClientGone;
    }
    Attempt::Served(200)
}

/// Writes a whole answer (header with its content length, then the body); false
/// when the client is gone.
async fn write_whole(session: &mut Session, mut h: ResponseHeader, body: Vec<u8>) -> bool {
    let _ = h.insert_header(http::header::CONTENT_LENGTH, body.len());
    session
        .write_response_header(Box::new(h), false)
        .await
        .is_ok()
        && session
            .write_response_body(Some(Bytes::from(body)), true)
            .await
            .is_ok()
}

/// The SSE response header.
fn sse_header(ex: &Exchange, provider: &str, outcome: &str) -> Option<Box<ResponseHeader>> {
    let mut h = ResponseHeader::build_no_case(200, Some(6)).ok()?;
    let _ = h.insert_header(http::header::CONTENT_TYPE, "text/event-stream");
    let _ = h.insert_header(http::header::CACHE_CONTROL, "no-cache");
    let _ = h.insert_header(http::header::TRANSFER_ENCODING, "chunked");
    ex.receipt_headers(&mut h, provider, outcome);
    Some(Box::new(h))
}

async fn stream_attempt(
    gw: &Gateway,
    session: &mut Session,
    ex: &mut Exchange,
    t: &Target,
    body: Bytes,
    wants_usage: bool,
) -> Attempt {
    let path = t.chat_path();
    let waited = Instant::now();
    let deadline = ex.deadline;
    let posted = unless_gone(
        session,
        until(deadline, gw.upstreams.post(t, &path, body, true)),
    )
    .await;
    ex.upstream_wait += waited.elapsed();
    let mut call = match posted {
        None => return Attempt::ClientGone,
        Some(Err(_)) => return Attempt::Failed(Failure::Deadline),
        Some(Ok(Err(f))) => return Attempt::Failed(f),
        Some(Ok(Ok(c))) => c,
    };
    let status = call.status();
    if !(200..300).contains(&status) {
        return Attempt::Failed(Failure::Status(status));
    }
    let first_deadline = ex.deadline.min(Instant::now() + t.first_token_timeout);
    let provider_json = serde_json::to_vec(&t.rung_id).unwrap_or_default();
    let mut decoder = SseDecoder::new();
    let mut held: Vec<u8> = Vec::new();
    let mut last = Inspection::default();
    let early = gw.state.config.limits.early_header_ms;
    // Pre-commit: hold the preamble until the first content.
    loop {
        let next_keepalive = if early == 0 {
            None
        } else if ex.header_sent {
            Some(Instant::now() + Duration::from_millis(early.clamp(1000, 15_000)))
        } else {
            Some(ex.started + Duration::from_millis(early))
        };
        let wait_until = next_keepalive.map_or(first_deadline, |k| k.min(first_deadline));
        let waited = Instant::now();
        let read = unless_gone(session, until(wait_until, call.read())).await;
        ex.upstream_wait += waited.elapsed();
        let chunk = match read {
            None => return Attempt::ClientGone,
            Some(Err(_)) if Instant::now() >= ex.deadline => {
                return Attempt::Failed(Failure::Deadline)
            }
            Some(Err(_)) if Instant::now() >= first_deadline => {
                return Attempt::Failed(Failure::FirstTokenTimeout)
            }
            Some(Err(_)) => {
                // A keep-alive tick: the first content is slow.
                if !ex.header_sent {
                    let Some(h) = sse_header(ex, &t.provider, "pending") else {
                        return Attempt::Terminal(ApiError::internal());
                    };
                    if session.write_response_header(h, false).await.is_err() {
                        return Attempt::ClientGone;
                    }
                    ex.header_sent = true;
                }
                if session
                    .write_response_body(Some(Bytes::from_static(KEEPALIVE)), false)
                    .await
                    .is_err()
                {
                    return Attempt::ClientGone;
                }
                continue;
            }
            Some(Ok(Err(_))) => return Attempt::Failed(Failure::DiedBeforeOutput),
            Some(Ok(Ok(None))) => {
                return if last.finish_reason.is_some() {
                    Attempt::Empty(last.usage)
                } else {
                    Attempt::Failed(Failure::DiedBeforeOutput)
                }
            }
            Some(Ok(Ok(Some(b)))) => b,
        };
        decoder.push(&chunk);
        while let Some(ev) = decoder.next_event() {
            if ev.data.is_empty() {
                continue;
            }
            if ev.data == "[DONE]" {
                return Attempt::Empty(last.usage);
            }
            let Some(info) = inspect(ev.data.as_bytes()) else {
                return Attempt::Failed(Failure::BadAnswer);
            };
            if info.error.is_some() {
                return Attempt::Failed(Failure::ErrorEvent);
            }
            if !info.has_content {
                if info.refusal.is_some() {
                    return Attempt::Refused;
                }
                if info.usage.is_some() {
                    last.usage = info.usage;
                }
                if info.finish_reason.is_some() {
                    last.finish_reason = info.finish_reason;
                }
                if !info.usage_only {
                    held.extend_from_slice(&data_frame(&splice_member(
                        ev.data.as_bytes(),
                        "provider",
                        &provider_json,
                    )));
                }
                continue;
            }
            // Commit.
            ex.first_token = Some(ex.started.elapsed());
            if !ex.header_sent {
                let Some(h) = sse_header(ex, &t.provider, "ok") else {
                    return Attempt::Terminal(ApiError::internal());
                };
                if session.write_response_header(h, false).await.is_err() {
                    return Attempt::ClientGone;
                }
                ex.header_sent = true;
            }
            let mut pump = Pump {
                provider_json: &provider_json,
                provider: &t.provider,
                wants_usage,
                usage: None,
                content_chars: 0,
                finish_seen: false,
                last_id: info.id.clone(),
                last_model: info.model.clone(),
                created: info.created,
                out: std::mem::take(&mut held),
            };
            pump.event(ex, ev.data.as_bytes(), &info);
            let result = pump.run(gw, session, ex, &mut call, &mut decoder).await;
            call.finish().await;
            return result;
        }
    }
}

/// The committed stream: every event is rewritten as it arrives and written at once.
struct Pump<'a> {
    provider_json: &'a [u8],
    provider: &'a str,
    wants_usage: bool,
    usage: Option<Usage>,
    content_chars: usize,
    finish_seen: bool,
    last_id: Option<String>,
    last_model: Option<String>,
    created: Option<i64>,
    /// Frames not yet written.
    out: Vec<u8>,
}

impl Pump<'_> {
    /// Rewrites one committed event into `out`.
    fn event(&mut self, ex: &Exchange, data: &[u8], info: &Inspection) {
        self.content_chars += info.content_chars;
        if info.id.is_some() {
            self.last_id.clone_from(&info.id);
        }
        if info.model.is_some() {
            self.last_model.clone_from(&info.model);
        }
        if let Some(u) = info.usage {
            self.usage = Some(u);
        }
        if info.usage_only && !self.wants_usage {
            return;
        }
        let mut frame = splice_member(data, "provider", self.provider_json);
        if info.finish_reason.is_some() && !self.finish_seen {
            self.finish_seen = true;
            frame = splice_member(&frame, "x_gateway", &ex.receipt_json(self.provider, "ok"));
        }
        self.out.extend_from_slice(&data_frame(&frame));
    }

    async fn flush(&mut self, session: &mut Session, end: bool) -> bool {
        if self.out.is_empty() && !end {
            return true;
        }
        // The next burst is likely as large: start it at this one's capacity, so
        // it is written without a chain of reallocations.
        let cap = self.out.capacity();
        let bytes = Bytes::from(std::mem::replace(&mut self.out, Vec::with_capacity(cap)));
        session.write_response_body(Some(bytes), end).await.is_ok()
    }

    async fn run(
        mut self,
        gw: &Gateway,
        session: &mut Session,
        ex: &mut Exchange,
        call: &mut super::upstream::Call<'_>,
        decoder: &mut SseDecoder,
    ) -> Attempt {
        // Events already decoded in the committing read.
        let mut done = self.drain(ex, decoder);
        if !self.flush(session, false).await {
            return Attempt::ClientGone;
        }
        let max = gw.state.config.limits.max_response_bytes;
        let mut received = 0usize;
        while !done {
            let waited = Instant::now();
            let read = until(ex.deadline, call.read()).await;
            ex.upstream_wait += waited.elapsed();
            match read {
                Ok(Ok(Some(b))) => {
                    received += b.len();
                    decoder.push(&b);
                    // Pieces that already arrived join this write: one syscall for a
                    // burst instead of one per event, and no event waits for it.
                    let mut ended = false;
                    while received <= max {
                        match ready_now(call.read()) {
                            Some(Ok(Some(more))) => {
                                received += more.len();
                                decoder.push(&more);
                            }
                            Some(_) => {
                                ended = true;
                                break;
                            }
                            None => break,
                        }
                    }
                    if received > max {
                        break;
                    }
                    done = self.drain(ex, decoder);
                    if !self.flush(session, false).await {
                        return Attempt::ClientGone;
                    }
                    if ended && !done {
                        break;
                    }
                }
                // A clean end without [DONE], a broken connection, or the deadline:
                // all settle as the provider's cut.
                _ => break,
            }
        }
        if done {
            // Read the upstream body to its end so the connection can be reused.
            while let Ok(Ok(Some(_))) = fast_timeout(Duration::from_millis(50), call.read()).await {
            }
        } else {
            self.cut(ex);
            ex.incomplete = true;
        }
        ex.usage = self.usage.unwrap_or_default();
        if !self.flush(session, true).await {
            return Attempt::ClientGone;
        }
        Attempt::Served(200)
    }

    /// Handles every complete event in the decoder; true once `[DONE]` was written.
    fn drain(&mut self, ex: &Exchange, decoder: &mut SseDecoder) -> bool {
        while let Some(ev) = decoder.next_event() {
            if ev.data.is_empty() {
                continue;
            }
            if ev.data == "[DONE]" {
                if !self.finish_seen {
                    // A stream that ends without a finish chunk still gets the receipt.
                    self.synthesize_finish(ex, "stop", false);
                }
                self.out.extend_from_slice(b"data: [DONE]\n\n");
                return true;
            }
            let data = ev.data.as_bytes();
            if let Some(n) = quick_content_len(data) {
                // The common chunk: a text delta. Rewritten without a parse.
                self.content_chars += n;
                self.out.extend_from_slice(b"data: ");
                splice_member_into(&mut self.out, data, "provider", self.provider_json);
                self.out.extend_from_slice(b"\n\n");
                continue;
            }
            match inspect(data) {
                Some(info) => self.event(ex, data, &info),
                // Unknown frames pass through untouched.
                None => self.out.extend_from_slice(&data_frame(data)),
            }
        }
        false
    }

    fn synthesize_finish(&mut self, ex: &Exchange, reason: &str, with_usage: bool) {
        let usage = self.usage.unwrap_or_default();
        let mut chunk = json!({
            "id": self.last_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.last_model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": reason}],
        });
        if with_usage {
            chunk["usage"] = usage_json(&usage);
        }
        let bytes = serde_json::to_vec(&chunk).unwrap_or_default();
        let bytes = splice_member(&bytes, "provider", self.provider_json);
        let bytes = splice_member(&bytes, "x_gateway", &ex.receipt_json(self.provider, "ok"));
        self.finish_seen = true;
        self.out.extend_from_slice(&data_frame(&bytes));
    }

    /// Settles a stream that died after output: a finish chunk with
    /// finish_reason `length` and usage, then `[DONE]`. Never a silent truncation.
    fn cut(&mut self, ex: &Exchange) {
        let mut usage = self.usage.unwrap_or_default();
        if usage.output_tokens == 0 {
            usage.output_tokens = self.content_chars.div_ceil(4) as u64;
        }
        self.usage = Some(usage);
        // The cut chunk always carries usage: the client must see what it got.
        self.synthesize_finish(ex, "length", true);
        self.out.extend_from_slice(b"data: [DONE]\n\n");
    }
}

/// Every reachable rung ended its turn with no content: 200 with the warning header
/// and the spec's empty shape.
async fn empty_completion(
    session: &mut Session,
    ex: &mut Exchange,
    model: &Model,
    stream: bool,
) -> Outcome {
    let created = crate::store::now_ms() / 1000;
    let id = format!("chatcmpl-{}", crate::store::new_id("empty"));
    let provider = ex.rung.clone().unwrap_or_default();
    let mut h = match ResponseHeader::build_no_case(200, Some(6)) {
        Ok(h) => h,
        Err(_) => return Outcome::Error(ApiError::internal()),
    };
    let _ = h.insert_header("x-gateway-warning", "empty_completion");
    let body = if stream {
        let chunk = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model.spec.slug,
            "provider": provider,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": null}, "finish_reason": "stop"}],
            "usage": usage_json(&Usage::default()),
        });
        let mut b = data_frame(&serde_json::to_vec(&chunk).unwrap_or_default());
        b.extend_from_slice(b"data: [DONE]\n\n");
        b
    } else {
        serde_json::to_vec(&json!({
            "id": id, "object": "chat.completion", "created": created, "model": model.spec.slug,
            "provider": provider,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "refusal": null}, "finish_reason": "stop"}],
            "usage": usage_json(&Usage::default()),
        }))
        .unwrap_or_default()
    };
    if ex.header_sent {
        // Terminal frames on a stream whose header already went out.
        let ok = session
            .write_response_body(Some(Bytes::from(body)), true)
            .await
            .is_ok();
        return if ok {
            Outcome::Written(200)
        } else {
            Outcome::ClientGone
        };
    }
    if stream {
        let _ = h.insert_header(http::header::CONTENT_TYPE, "text/event-stream");
        let _ = h.insert_header(http::header::CACHE_CONTROL, "no-cache");
    } else {
        let _ = h.insert_header(http::header::CONTENT_TYPE, "application/json");
    }
    ex.receipt_headers(&mut h, "", "");
    if !write_whole(session, h, body).await {
        return Outcome::ClientGone;
    }
    Outcome::Written(200)
}
