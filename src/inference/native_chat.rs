//! The native chat-completions attempts: a chat client on an OpenAI-wire rung.
//! The client's body passes through with the rung's model id, and the answer is
//! rewritten in place (the `provider` member spliced in) without a parse of the
//! common text chunk: the fast path of the gateway.

use super::attempt::{
    json_header, open, read_before_commit, read_whole, ready_now, sse_header, write_whole, Attempt,
    Before, Post,
};
use super::tally::Tally;
use super::Engine;
use crate::deadline::{until, within};
use crate::downstream::answer;
use crate::downstream::listener::hold_next_flush;
use crate::upstream::{Failure, OutBody, Target};
use bytes::Bytes;
use pingora::proxy::Session;
use serde_json::json;
use sluice_filters::ir::{RefusalReason, Request, IGNORED_MEMBER};
use sluice_filters::json::edit::{set_member as splice_member, set_member_into, set_nested};
use sluice_filters::sse::{data_frame, SseDecoder};
use sluice_filters::upstream::openai_chat::{inspect, Inspection};
use sluice_filters::upstream::Wire;
use sluice_filters::usage::usage_json;
use sluice_filters::usage::Usage;
use sluice_filters::ApiError;
use std::time::{Duration, Instant};

/// The answer (or chunk) with `usage.cost` set in its own usage object.
fn with_cost(json: &[u8], cost_usd: f64) -> Option<Vec<u8>> {
    let cost = serde_json::to_vec(&cost_usd).ok()?;
    set_nested(json, &["usage"], "cost", &cost)
}

/// A refusal before any content: the refusal field, or an answer the provider's
/// filter stopped before it said anything (Azure's `content_filter` finish).
fn refused_before_content(info: &Inspection) -> bool {
    !info.has_content
        && (info.refusal.is_some() || info.finish_reason.as_deref() == Some("content_filter"))
}

pub(super) async fn plain_attempt(
    engine: &Engine,
    session: &mut Session,
    tally: &mut Tally,
    t: &Target,
    body: OutBody,
    req: &Request,
) -> Attempt {
    let post = Post {
        target: t,
        path: t.chat_path(),
        wire: Some(Wire::OpenAiChat),
        body,
        stream: false,
        headers: &[],
    };
    let (call, buf) = match read_whole(engine, session, tally, post).await {
        Ok(x) => x,
        Err(a) => return a,
    };
    let Some(info) = inspect(&buf) else {
        return Attempt::Failed(Failure::BadAnswer);
    };
    if info.error.is_some() {
        return Attempt::Failed(Failure::ErrorEvent);
    }
    if refused_before_content(&info) {
        return Attempt::Refused(RefusalReason::ContentPolicy);
    }
    // A budget spent before any content (a reasoning model's thinking) is an
    // answer, not an empty turn: it is served with its `length` finish.
    if !info.has_content && info.finish_reason.as_deref() != Some("length") {
        return Attempt::Empty(info.usage);
    }
    let (sent_usage, content_chars) = (info.usage, info.content_chars);
    drop(info);
    tally.usage = match sent_usage {
        Some(u) => u,
        // Never free unless its model is: a provider that reported no usage is
        // billed on the gateway's count, and the answer says so.
        None => {
            tally.count_prompt(req, None, &t.model_id).await;
            tally.estimated = true;
            tally.cut_usage(req, None, content_chars)
        }
    };
    tally.first_token = Some(tally.started.elapsed());
    let priced = tally.priced(tally.usage);
    let mut out = match (sent_usage, priced.cost_usd()) {
        (Some(_), Some(cost)) => with_cost(&buf, cost).unwrap_or(buf),
        _ => buf,
    };
    if sent_usage.is_none() {
        // Usage is always in the answer, even when the provider sent none.
        let mut usage = usage_json(&priced);
        usage["estimated"] = json!(true);
        let usage = serde_json::to_vec(&usage).unwrap_or_default();
        out = splice_member(&out, "usage", &usage);
    }
    out = splice_member(&out, "provider", &t.rung_json);
    let Some(h) = json_header(tally, &t.provider, "ok") else {
        return Attempt::Terminal(ApiError::internal());
    };
    let written = write_whole(session, tally, h, out).await;
    // The connection goes back to the pool once the client has its answer.
    call.finish().await;
    if !written {
        return Attempt::ClientGone;
    }
    Attempt::Served(200)
}

pub(super) async fn stream_attempt(
    engine: &Engine,
    session: &mut Session,
    tally: &mut Tally,
    t: &Target,
    body: OutBody,
    req: &Request,
) -> Attempt {
    let wants_usage = req.include_usage;
    let post = Post {
        target: t,
        path: t.chat_path(),
        wire: Some(Wire::OpenAiChat),
        body,
        stream: true,
        headers: &[],
    };
    let mut call = match open(engine, session, tally, post).await {
        Ok(c) => c,
        Err(a) => return a,
    };
    let first_deadline = tally.deadline.min(Instant::now() + t.first_token_timeout);
    let provider_json = &t.rung_json;
    let mut decoder = SseDecoder::new();
    let mut held: Vec<u8> = Vec::new();
    // What the preamble said so far: usage, and whether a finish came.
    let mut last_usage = None;
    let mut finished = false;
    let early = engine.state.config.limits.early_header_ms;
    let max = engine.state.config.limits.max_response_bytes;
    let mut received = 0usize;
    // Pre-commit: hold everything until the first content.
    loop {
        let chunk = match read_before_commit(
            session,
            tally,
            &mut call,
            &t.provider,
            first_deadline,
            early,
        )
        .await
        {
            Before::Piece(b) => b,
            Before::Over(a) => return a,
            Before::End => {
                return if finished {
                    Attempt::Empty(last_usage)
                } else {
                    Attempt::Failed(Failure::DiedBeforeOutput)
                }
            }
        };
        received += chunk.len();
        decoder.push(&chunk);
        // The preamble is held in memory: a rung that sends more than an answer may
        // hold before any content, or an endless event, is abandoned.
        if received > max || decoder.too_large() {
            return Attempt::Failed(Failure::BadAnswer);
        }
        while let Some(ev) = decoder.next_event() {
            if ev.data.is_empty() {
                continue;
            }
            if ev.data == "[DONE]" {
                return Attempt::Empty(last_usage);
            }
            let Some(info) = inspect(ev.data.as_bytes()) else {
                return Attempt::Failed(Failure::BadAnswer);
            };
            if info.error.is_some() {
                return Attempt::Failed(Failure::ErrorEvent);
            }
            if refused_before_content(&info) {
                return Attempt::Refused(RefusalReason::ContentPolicy);
            }
            // A `length` finish before any content commits like content would.
            if !info.has_content && info.finish_reason.as_deref() != Some("length") {
                if info.usage.is_some() {
                    last_usage = info.usage;
                }
                finished |= info.finish_reason.is_some();
                if !info.usage_only {
                    held.extend_from_slice(&data_frame(&splice_member(
                        ev.data.as_bytes(),
                        "provider",
                        provider_json,
                    )));
                }
                continue;
            }
            // Commit: the request no longer counts as pending.
            tally.pending = None;
            tally.first_token = Some(tally.started.elapsed());
            if !tally.header_sent {
                let Some(mut h) = sse_header(tally, &t.provider, "ok") else {
                    return Attempt::Terminal(ApiError::internal());
                };
                tally.header_out(&mut h);
                // The committing event is written right after: one write for both.
                hold_next_flush(session);
                if session.write_response_header(h, false).await.is_err() {
                    return Attempt::ClientGone;
                }
                tally.header_sent = true;
            }
            let mut pump = Pump {
                req,
                model_id: &t.model_id,
                provider_json,
                provider: &t.provider,
                wants_usage,
                usage: None,
                usage_sent: false,
                estimated: false,
                content_chars: 0,
                finish_seen: false,
                last_id: info.id.as_deref().map(str::to_owned),
                last_model: info.model.as_deref().map(str::to_owned),
                created: info.created,
                out: std::mem::take(&mut held),
            };
            pump.event(tally, ev.data.as_bytes(), &info);
            let idle = t.stream_idle_timeout;
            let result = pump
                .run(engine, session, tally, &mut call, &mut decoder, idle)
                .await;
            call.finish().await;
            return result;
        }
    }
}

/// The committed stream: every event is rewritten as it arrives and written at once.
struct Pump<'a> {
    /// The request as sent: a missing usage is estimated from it, with the
    /// tokenizer of the rung's model (`model_id`) where the gateway holds it.
    req: &'a Request,
    model_id: &'a str,
    provider_json: &'a [u8],
    provider: &'a str,
    wants_usage: bool,
    usage: Option<Usage>,
    content_chars: usize,
    finish_seen: bool,
    /// The usage chunk the client asked for went out.
    usage_sent: bool,
    /// The provider reported no usage (or only part): the gateway counted it.
    estimated: bool,
    last_id: Option<String>,
    last_model: Option<String>,
    created: Option<i64>,
    /// Frames not yet written.
    out: Vec<u8>,
}

impl Pump<'_> {
    /// Rewrites one committed event into `out`.
    fn event(&mut self, tally: &Tally, data: &[u8], info: &Inspection) {
        self.content_chars += info.content_chars;
        // Every chunk names the same id and model: kept once, not copied per chunk.
        if let Some(id) = info
            .id
            .as_deref()
            .filter(|id| self.last_id.as_deref() != Some(id))
        {
            self.last_id = Some(id.to_owned());
        }
        if let Some(model) = info
            .model
            .as_deref()
            .filter(|m| self.last_model.as_deref() != Some(m))
        {
            self.last_model = Some(model.to_owned());
        }
        if let Some(u) = info.usage {
            self.usage = Some(u);
        }
        if info.usage_only {
            if !self.wants_usage {
                return;
            }
            self.usage_sent = true;
        }
        let finishing = info.finish_reason.is_some() && !self.finish_seen;
        let cost = info.usage.and_then(|u| tally.priced(u).cost_usd());
        if !finishing && cost.is_none() {
            // The common chunk (a delta): rewritten straight into the pending write.
            self.out.extend_from_slice(b"data: ");
            set_member_into(&mut self.out, data, "provider", self.provider_json);
            self.out.extend_from_slice(b"\n\n");
            return;
        }
        let mut frame = splice_member(data, "provider", self.provider_json);
        if let Some(cost) = cost {
            frame = with_cost(&frame, cost).unwrap_or(frame);
        }
        if finishing {
            self.finish_seen = true;
            frame = splice_member(
                &frame,
                "x_gateway",
                &tally.receipt_json(self.provider, "ok"),
            );
            if let Some(ignored) = &tally.ignored {
                let v = serde_json::to_vec(ignored).unwrap_or_default();
                frame = splice_member(&frame, IGNORED_MEMBER, &v);
            }
        }
        self.out.extend_from_slice(&data_frame(&frame));
    }

    async fn flush(&mut self, session: &mut Session, tally: &mut Tally, end: bool) -> bool {
        if self.out.is_empty() && !end {
            return true;
        }
        tally.body_out(&self.out);
        // The next burst is likely as large: start it at this one's capacity, so
        // it is written without a chain of reallocations.
        let cap = self.out.capacity();
        let bytes = Bytes::from(std::mem::replace(&mut self.out, Vec::with_capacity(cap)));
        answer::write_stream_body(session, bytes, end).await.is_ok()
    }

    async fn run(
        mut self,
        engine: &Engine,
        session: &mut Session,
        tally: &mut Tally,
        call: &mut crate::upstream::Call<'_>,
        decoder: &mut SseDecoder,
        idle: Duration,
    ) -> Attempt {
        // The committing event (with the preamble held before it) goes out at
        // once: the first token does not wait while the rest of its read is
        // rewritten (a provider's burst can hold the whole answer). Then the
        // events already decoded in that read, in one more write.
        if !self.flush(session, tally, false).await {
            return Attempt::ClientGone;
        }
        // Once `[DONE]` is in, what is left goes out with the terminating chunk.
        let mut done = self.drain(tally, decoder);
        if !done && !self.flush(session, tally, false).await {
            return Attempt::ClientGone;
        }
        let max = engine.state.config.limits.max_response_bytes;
        let mut received = 0usize;
        while !done {
            let waited = Instant::now();
            // Silence past the idle bound settles as a cut, like a broken connection.
            let read = until(tally.deadline.min(Instant::now() + idle), call.read()).await;
            tally.upstream_wait += waited.elapsed();
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
                    if received > max || decoder.too_large() {
                        break;
                    }
                    done = self.drain(tally, decoder);
                    if !done && !self.flush(session, tally, false).await {
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
        if done || self.finish_seen {
            // `[DONE]` came, or the finish arrived before the connection ended:
            // the answer is whole, only the end marker (and maybe the usage
            // chunk) is left to write.
            self.end(tally).await;
        } else {
            self.cut(tally).await;
            tally.incomplete = true;
        }
        tally.usage = self.usage.unwrap_or_default();
        tally.estimated = self.estimated;
        if !self.flush(session, tally, true).await {
            return Attempt::ClientGone;
        }
        if done {
            // Read the upstream body to its end so the connection can be reused
            // (after the client has its end: a provider slow to close its body
            // does not hold the client's).
            while let Ok(Ok(Some(_))) = within(Duration::from_millis(50), call.read()).await {}
        }
        Attempt::Served(200)
    }

    /// Handles every complete event in the decoder; true once `[DONE]` came (the
    /// stream's end is written by [`Pump::end`]).
    fn drain(&mut self, tally: &Tally, decoder: &mut SseDecoder) -> bool {
        while let Some(ev) = decoder.next_event() {
            if ev.data.is_empty() {
                continue;
            }
            if ev.data == "[DONE]" {
                if !self.finish_seen {
                    // A stream that ends without a finish chunk still gets the receipt.
                    self.synthesize_finish(tally, "stop");
                }
                return true;
            }
            let data = ev.data.as_bytes();
            // A frame that is not a JSON object is dropped: the client's parser
            // would fail on it, and the rest of the answer still comes.
            if let Some(info) = inspect(data) {
                self.event(tally, data, &info);
            }
        }
        false
    }

    /// A chunk of the gateway's own in the stream's shape: `usage: null` on it when
    /// the client asked for the usage chunk, as on the provider's.
    fn own_chunk(&self, choices: serde_json::Value) -> serde_json::Value {
        let mut chunk = json!({
            "id": self.last_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.last_model,
            "choices": choices,
        });
        if self.wants_usage {
            chunk["usage"] = serde_json::Value::Null;
        }
        chunk
    }

    /// The usage chunk (`choices: []`), when the client asked for one and the
    /// provider's did not come.
    fn usage_chunk(&mut self, tally: &Tally) {
        if !self.wants_usage || self.usage_sent {
            return;
        }
        let mut chunk = self.own_chunk(json!([]));
        chunk["usage"] = usage_json(&tally.priced(self.usage.unwrap_or_default()));
        if self.estimated {
            // Disclosed: these are the gateway's counts, not the provider's.
            chunk["usage"]["estimated"] = json!(true);
        }
        let bytes = serde_json::to_vec(&chunk).unwrap_or_default();
        let bytes = splice_member(&bytes, "provider", self.provider_json);
        self.usage_sent = true;
        self.out.extend_from_slice(&data_frame(&bytes));
    }

    /// A served answer is never free unless its model is: what the provider did
    /// not report (OpenAI-compatible servers that ignore
    /// `stream_options.include_usage`) is counted by the gateway, and marked so.
    async fn estimate_missing(&mut self, tally: &mut Tally) {
        tally
            .count_prompt(self.req, self.usage, self.model_id)
            .await;
        let seen = self.usage.unwrap_or_default();
        let counted = tally.cut_usage(self.req, self.usage, self.content_chars);
        if counted != seen {
            self.usage = Some(counted);
            self.estimated = true;
        }
    }

    fn synthesize_finish(&mut self, tally: &Tally, reason: &str) {
        let chunk = self.own_chunk(json!([{"index": 0, "delta": {}, "finish_reason": reason}]));
        let bytes = serde_json::to_vec(&chunk).unwrap_or_default();
        let bytes = splice_member(&bytes, "provider", self.provider_json);
        let mut bytes = splice_member(
            &bytes,
            "x_gateway",
            &tally.receipt_json(self.provider, "ok"),
        );
        if let Some(ignored) = &tally.ignored {
            let v = serde_json::to_vec(ignored).unwrap_or_default();
            bytes = splice_member(&bytes, IGNORED_MEMBER, &v);
        }
        self.finish_seen = true;
        self.out.extend_from_slice(&data_frame(&bytes));
    }

    /// The end of a whole answer: the usage chunk when the provider's did not
    /// come (estimated when it reported none), then `[DONE]`.
    async fn end(&mut self, tally: &mut Tally) {
        self.estimate_missing(tally).await;
        self.usage_chunk(tally);
        self.out.extend_from_slice(b"data: [DONE]\n\n");
    }

    /// Settles a stream that died after output: a finish chunk with
    /// finish_reason `length` and usage, then `[DONE]`. Never a silent truncation.
    async fn cut(&mut self, tally: &mut Tally) {
        self.estimate_missing(tally).await;
        self.synthesize_finish(tally, "length");
        self.usage_chunk(tally);
        self.out.extend_from_slice(b"data: [DONE]\n\n");
    }
}
