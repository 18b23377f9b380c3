//! Attempts on a rung whose answer must be read to find the commit point: a rung
//! of another wire than the client's format, whose answer is rewritten through the
//! canonical form, and a native responses or messages rung, whose answer is read
//! the same way but reaches the client as the provider sent it (`filters::relay`:
//! only the gateway's own members are set).
//!
//! Before commit the decoded events are held (a role chunk, thinking, usage); the
//! first content commits the rung, and from then on every upstream read is decoded,
//! written in the client's format (encoded, or relayed) and sent at once.

use super::attempt::{
    json_header, open, read_before_commit, read_whole, ready_now, sse_header, write_whole, Attempt,
    Before, Post,
};
use super::plan::{ParsedRequest, PlannedRung};
use super::tally::Tally;
use super::Engine;
use crate::deadline::{until, within};
use crate::downstream::answer;
use crate::downstream::listener::hold_next_flush;
use crate::upstream::{Failure, OutBody};
use bytes::Bytes;
use pingora::proxy::Session;
use sluice_filters::inbound::Inbound;
use sluice_filters::ir::watch::Watch;
use sluice_filters::ir::{
    Event, FinishReason, Meta, RefusalReason, Response, StreamDecoder, StreamEncoder, Tail,
};
use sluice_filters::relay::{self, Owned, Relay};
use sluice_filters::upstream::Framer;
use sluice_filters::usage::Usage;
use sluice_filters::ApiError;
use std::time::{Duration, Instant};

/// Runs one attempt with a rendered body.
pub(crate) async fn run(
    engine: &Engine,
    session: &mut Session,
    tally: &mut Tally,
    planned: &PlannedRung,
    parsed: &ParsedRequest<'_>,
    body: OutBody,
) -> Attempt {
    if parsed.stream {
        let run = Box::pin(stream(engine, session, tally, planned, parsed, body));
        run.await
    } else {
        let run = Box::pin(plain(engine, session, tally, planned, parsed, body));
        run.await
    }
}

/// What a messages stream's `message_start` reports as `input_tokens` before the
/// provider's count comes: the quick approximation (counted only for that
/// stream; a tokenizer's count would hold the first token back), which the
/// provider's count in `message_delta` replaces.
pub(super) fn message_start_estimate(parsed: &ParsedRequest) -> u64 {
    if parsed.inbound == Inbound::Messages && parsed.stream {
        parsed.req.estimated_prompt_tokens()
    } else {
        0
    }
}

fn meta(tally: &Tally, planned: &PlannedRung, parsed: &ParsedRequest) -> Meta {
    // `created` is when the request arrived, not when the answer was rendered.
    let age = tally.started.elapsed().as_secs() as i64;
    Meta {
        provider: planned.target.rung_id.clone(),
        slug: parsed.req.model.clone(),
        created: crate::store::now_ms() / 1000 - age,
        fallback_id: crate::store::new_id("gen"),
        include_usage: parsed.req.include_usage,
        stop_sequence: parsed.req.only_stop(),
        prompt_estimate: message_start_estimate(parsed),
        echo: match parsed.inbound {
            Inbound::Responses => sluice_filters::inbound::responses::echo(
                &parsed.object,
                tally
                    .turn
                    .as_ref()
                    .map(|t| (t.store, t.previous.as_deref())),
            ),
            _ => String::new(),
        },
        search: parsed.search(),
        hide_reasoning: parsed.inbound == Inbound::Messages && parsed.req.reasoning.is_none(),
    }
}

/// What the gateway sets in a native rung's answer.
fn owned<'a>(
    tally: &'a Tally,
    planned: &'a PlannedRung,
    usage: Option<Usage>,
    receipt: &'a [u8],
) -> Owned<'a> {
    Owned {
        provider: &planned.target.rung_json,
        usage: usage.map(|u| tally.priced(u)),
        receipt,
        ignored: tally.ignored.as_deref(),
        count_searches: planned.wire == sluice_filters::upstream::Wire::OpenAiResponses,
        turn: tally.turn.as_ref(),
    }
}

fn tail(tally: &Tally, planned: &PlannedRung, usage: Usage, cut: bool) -> Tail {
    Tail {
        usage: tally.priced(usage),
        cut,
        receipt: String::from_utf8(tally.receipt_json(&planned.target.provider, "ok"))
            .unwrap_or_default(),
        ignored: tally.ignored.clone(),
    }
}

async fn plain(
    engine: &Engine,
    session: &mut Session,
    tally: &mut Tally,
    planned: &PlannedRung,
    parsed: &ParsedRequest<'_>,
    body: OutBody,
) -> Attempt {
    let t = &planned.target;
    let path = t.path(planned.wire, false);
    let post = Post {
        target: t,
        path: &path,
        wire: Some(planned.wire),
        body,
        stream: false,
        headers: &planned.headers,
    };
    let (call, buf) = match read_whole(engine, session, tally, post).await {
        Ok(x) => x,
        Err(a) => return a,
    };
    let Ok(mut events) = planned.wire.decode(&buf) else {
        return Attempt::Failed(Failure::BadAnswer);
    };
    // Tool search the gateway serves: `tool_search` calls are the gateway's.
    let mut watch = parsed.watch();
    if let Some(w) = watch.as_mut() {
        w.filter(&mut events);
    }
    let mut resp = Response::from_events(&events);
    if resp.error.is_some() {
        return Attempt::Failed(Failure::ErrorEvent);
    }
    // The whole answer is in hand before anything reaches the client: a refusal
    // is a refusal even when some text preceded it.
    if let Some((reason, _)) = resp.refusal {
        return Attempt::Refused(reason);
    }
    if let Some(w) = watch.filter(Watch::round) {
        call.finish().await;
        return round(tally, w, None);
    }
    // An answer filtered before any content is a refusal, not an empty turn.
    if !resp.has_content() && resp.finish == Some(FinishReason::ContentFilter) {
        return Attempt::Refused(RefusalReason::ContentPolicy);
    }
    // A budget spent before any content is an answer (`length`), not an empty turn.
    if !resp.has_content() && resp.finish != Some(FinishReason::Length) {
        return Attempt::Empty(resp.usage);
    }
    call.finish().await;
    tally.usage = resp.usage.unwrap_or_default();
    resp.usage = Some(tally.priced(tally.usage));
    tally.first_token = Some(tally.started.elapsed());
    let out = if planned.native {
        let receipt = tally.receipt_json(&t.provider, "ok");
        let owned = owned(tally, planned, Some(tally.usage), &receipt);
        relay::whole(&buf, &owned)
    } else {
        parsed.inbound.render(
            &resp,
            &meta(tally, planned, parsed),
            &tail(tally, planned, tally.usage, false),
        )
    };
    let Some(h) = json_header(tally, &t.provider, "ok") else {
        return Attempt::Terminal(ApiError::internal());
    };
    if !write_whole(session, tally, h, out).await {
        return Attempt::ClientGone;
    }
    Attempt::Served(200)
}

/// A model call that asked for a tool search round: billed with its usage, and
/// handed to the round loop (with the stream it began, if any).
fn round(tally: &mut Tally, watch: Watch, encoder: Option<Box<dyn StreamEncoder>>) -> Attempt {
    let response = watch.turn();
    tally.usage = response.usage.unwrap_or_default();
    tally
        .first_token
        .get_or_insert_with(|| tally.started.elapsed());
    Attempt::Round(Box::new(crate::hooks::Turn { response, encoder }))
}

/// What the pre-commit phase found in a batch of events.
enum Seen {
    Nothing,
    Content,
    Fail(Attempt),
}

/// How a committed stream reaches the client.
enum Output {
    /// Decoded events encoded in the client's format (the encoder made at the
    /// commit: a stream an earlier tool search round began is continued).
    Encode(Option<Box<dyn StreamEncoder>>),
    /// The provider's own frames, relayed (a native rung), and the rewritten frames
    /// not yet written.
    Relay(Box<Relay>, Vec<u8>),
}

/// The state of one streamed answer, before and after commit.
struct Flow {
    output: Output,
    framer: Framer,
    decoder: Box<dyn StreamDecoder>,
    events: Vec<Event>,
    held: Vec<Event>,
    usage: Option<Usage>,
    finish_seen: bool,
    content_chars: usize,
    /// The first content went to the client.
    committed: bool,
    /// Tool search the gateway serves: what the model's `tool_search` calls are.
    watch: Option<Watch>,
}

impl Flow {
    /// Decodes every complete frame into `events`.
    /// Before the commit an unreadable frame fails the attempt; after it, the frame
    /// is dropped and the answer goes on (a broken framing still ends it).
    /// A relayed frame is rewritten as it is read, with the usage so far (a
    /// finishing event carries its cost).
    fn decode(&mut self, tally: &Tally, planned: &PlannedRung) -> Result<(), Failure> {
        let receipt = match self.output {
            Output::Relay(..) => tally.receipt_json(&planned.target.provider, "ok"),
            Output::Encode(_) => Vec::new(),
        };
        while let Some(frame) = self.framer.next() {
            let frame = frame.map_err(|_| Failure::BadAnswer)?;
            let before = self.events.len();
            let read = self
                .decoder
                .frame(frame.name.as_deref(), &frame.data, &mut self.events);
            if read.is_err() && !self.committed {
                return Err(Failure::BadAnswer);
            }
            if let Some(w) = self.watch.as_mut() {
                let mut fresh = self.events.split_off(before);
                w.filter(&mut fresh);
                self.events.append(&mut fresh);
            }
            if let Output::Relay(relay, relayed) = &mut self.output {
                for ev in &self.events[before..] {
                    if let Event::Usage(u) = ev {
                        self.usage = Some(*u);
                    }
                    relay.observe(ev);
                }
                let owned = owned(tally, planned, self.usage, &receipt);
                relay.frame(frame.name.as_deref(), &frame.data, &owned, relayed);
            }
        }
        Ok(())
    }

    fn track(&mut self, ev: &Event) {
        match ev {
            Event::Usage(u) => self.usage = Some(*u),
            Event::Finish { .. } => self.finish_seen = true,
            Event::Text { text } => self.content_chars += text.len(),
            Event::ToolCallArgs { arguments, .. } => self.content_chars += arguments.len(),
            _ => {}
        }
    }

    /// Before commit: holds events until the first content.
    fn precommit(&mut self) -> Seen {
        let events = std::mem::take(&mut self.events);
        let mut iter = events.into_iter();
        while let Some(ev) = iter.next() {
            match &ev {
                Event::Error { .. } => return Seen::Fail(Attempt::Failed(Failure::ErrorEvent)),
                Event::Refusal { reason, .. } => return Seen::Fail(Attempt::Refused(*reason)),
                // Filtered before any content: a refusal, not an empty turn.
                Event::Finish {
                    reason: FinishReason::ContentFilter,
                    ..
                } => return Seen::Fail(Attempt::Refused(RefusalReason::ContentPolicy)),
                _ => {}
            }
            self.track(&ev);
            // A `length` finish before any content commits like content would: the
            // budget ran out (a reasoning model's thinking), the turn did not end.
            let content = ev.is_content()
                || matches!(
                    ev,
                    Event::Finish {
                        reason: FinishReason::Length,
                        ..
                    }
                );
            self.held.push(ev);
            if content {
                // The rest of this batch is written right after the commit.
                self.events.extend(iter);
                return Seen::Content;
            }
        }
        Seen::Nothing
    }

    /// After commit: encodes held and decoded events into `out`. Returns false when
    /// the provider reported an error mid-stream (settled as a cut).
    fn encode(&mut self, out: &mut Vec<u8>) -> bool {
        let held = std::mem::take(&mut self.held);
        if let Output::Encode(Some(enc)) = &mut self.output {
            for ev in &held {
                enc.event(ev, out);
            }
        }
        let events = std::mem::take(&mut self.events);
        let mut healthy = true;
        for ev in events {
            match ev {
                Event::Error { .. } => {
                    healthy = false;
                    break;
                }
                // A refusal after content cannot be taken back; the finish says so.
                Event::Refusal { .. } => continue,
                _ => {}
            }
            self.track(&ev);
            if let Output::Encode(Some(enc)) = &mut self.output {
                enc.event(&ev, out);
            }
        }
        if let Output::Relay(_, relayed) = &mut self.output {
            // The relay already left the error event out.
            out.append(relayed);
        }
        healthy
    }
}

async fn stream(
    engine: &Engine,
    session: &mut Session,
    tally: &mut Tally,
    planned: &PlannedRung,
    parsed: &ParsedRequest<'_>,
    body: OutBody,
) -> Attempt {
    let t = &planned.target;
    let path = t.path(planned.wire, true);
    let post = Post {
        target: t,
        path: &path,
        wire: Some(planned.wire),
        body,
        stream: true,
        headers: &planned.headers,
    };
    let mut call = match open(engine, session, tally, post).await {
        Ok(c) => c,
        Err(a) => return a,
    };
    let first_deadline = tally.deadline.min(Instant::now() + t.first_token_timeout);
    let output = if planned.native {
        let kind = match parsed.inbound {
            Inbound::Messages => relay::Kind::Messages,
            _ => relay::Kind::Responses,
        };
        Output::Relay(Box::new(Relay::new(kind)), Vec::new())
    } else {
        Output::Encode(None)
    };
    let mut flow = Flow {
        output,
        framer: Framer::new(planned.wire),
        decoder: planned.wire.decoder(),
        events: Vec::new(),
        held: Vec::new(),
        usage: None,
        finish_seen: false,
        content_chars: 0,
        committed: false,
        watch: parsed.watch(),
    };
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
                if let Some(w) = flow.watch.take().filter(|w| w.round() && w.finished()) {
                    return round(tally, w, None);
                }
                return if flow.finish_seen {
                    Attempt::Empty(flow.usage)
                } else {
                    Attempt::Failed(Failure::DiedBeforeOutput)
                };
            }
        };
        received += chunk.len();
        flow.framer.push(&chunk);
        // The preamble is held in memory: past the answer cap it is abandoned.
        if received > max {
            return Attempt::Failed(Failure::BadAnswer);
        }
        if let Err(f) = flow.decode(tally, planned) {
            return Attempt::Failed(f);
        }
        match flow.precommit() {
            Seen::Fail(a) => return a,
            Seen::Content => break,
            Seen::Nothing if flow.decoder.done() => {
                if let Some(w) = flow.watch.take().filter(Watch::round) {
                    // Read to the end so the connection can be reused.
                    while let Ok(Ok(Some(_))) = within(Duration::from_millis(50), call.read()).await
                    {
                    }
                    call.finish().await;
                    return round(tally, w, None);
                }
                return Attempt::Empty(flow.usage);
            }
            Seen::Nothing => {}
        }
    }
    // Commit: the request no longer counts as pending.
    flow.committed = true;
    tally.pending = None;
    if let Output::Encode(slot @ None) = &mut flow.output {
        *slot = Some(match tally.take_resume() {
            Some(enc) => enc,
            None => parsed.inbound.encoder(meta(tally, planned, parsed)),
        });
    }
    tally.first_token = Some(tally.started.elapsed());
    let mut out = Vec::new();
    let mut healthy = flow.encode(&mut out);
    if !tally.header_sent {
        let Some(mut h) = sse_header(tally, &t.provider, "ok") else {
            return Attempt::Terminal(ApiError::internal());
        };
        tally.header_out(&mut h);
        if !out.is_empty() {
            // The first events are written right after: one write for both.
            hold_next_flush(session);
        }
        if session.write_response_header(h, false).await.is_err() {
            return Attempt::ClientGone;
        }
        tally.header_sent = true;
    }
    while healthy && !flow.decoder.done() {
        if !out.is_empty() {
            let cap = out.capacity();
            let next = std::mem::replace(&mut out, Vec::with_capacity(cap));
            let bytes = Bytes::from(tally.outgoing(next, true));
            if session
                .write_response_body(Some(bytes), false)
                .await
                .is_err()
            {
                return Attempt::ClientGone;
            }
        }
        let waited = Instant::now();
        // Silence past the idle bound settles as a cut, like a broken connection.
        let read = until(
            tally.deadline.min(Instant::now() + t.stream_idle_timeout),
            call.read(),
        )
        .await;
        tally.upstream_wait += waited.elapsed();
        let Ok(Ok(Some(b))) = read else {
            // A clean end without the end marker, a broken connection, or the
            // deadline: all settle as the provider's cut.
            break;
        };
        received += b.len();
        flow.framer.push(&b);
        // Pieces that already arrived join this write: one syscall for a burst.
        let mut ended = false;
        while received <= max {
            match ready_now(call.read()) {
                Some(Ok(Some(more))) => {
                    received += more.len();
                    flow.framer.push(&more);
                }
                Some(_) => {
                    ended = true;
                    break;
                }
                None => break,
            }
        }
        if received > max || flow.decode(tally, planned).is_err() {
            break;
        }
        healthy = flow.encode(&mut out);
        if ended {
            break;
        }
    }
    let whole = flow.decoder.done();
    if whole {
        // Read the upstream body to its end so the connection can be reused.
        while let Ok(Ok(Some(_))) = within(Duration::from_millis(50), call.read()).await {}
        call.finish().await;
    }
    // A `tool_search` call after text already went out: the stream goes on with
    // the next model call (a call cut short settles as a cut instead).
    if let Some(w) = flow
        .watch
        .take()
        .filter(|w| w.round() && (whole || w.finished()))
    {
        tally.body_out(&out);
        if !out.is_empty()
            && session
                .write_response_body(Some(Bytes::from(out)), false)
                .await
                .is_err()
        {
            return Attempt::ClientGone;
        }
        let encoder = match std::mem::replace(&mut flow.output, Output::Encode(None)) {
            Output::Encode(enc) => enc,
            Output::Relay(..) => None,
        };
        return round(tally, w, encoder);
    }
    // A stream that ended after its finish is whole even without the end marker.
    let cut = !whole && !flow.finish_seen;
    let usage = if cut || flow.usage.is_none() {
        let model_id = &planned.target.model_id;
        tally.count_prompt(&parsed.req, flow.usage, model_id).await;
        tally.cut_usage(&parsed.req, flow.usage, flow.content_chars)
    } else {
        flow.usage.unwrap_or_default()
    };
    tally.incomplete = cut;
    tally.estimated = usage != flow.usage.unwrap_or_default();
    tally.usage = usage;
    match &mut flow.output {
        Output::Encode(Some(enc)) => enc.end(&tail(tally, planned, usage, cut), &mut out),
        Output::Encode(None) => {}
        Output::Relay(relay, _) => {
            let receipt = tally.receipt_json(&t.provider, "ok");
            let owned = owned(tally, planned, Some(usage), &receipt);
            relay.end(&owned, &meta(tally, planned, parsed), cut, &mut out);
        }
    }
    let out = tally.outgoing(out, true);
    if answer::write_stream_body(session, Bytes::from(out), true)
        .await
        .is_err()
    {
        return Attempt::ClientGone;
    }
    Attempt::Served(200)
}
