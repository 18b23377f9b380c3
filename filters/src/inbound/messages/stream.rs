//! Streams: an answer as Anthropic's message events.

use super::*;

/// Writes a JSON string.
pub(super) fn put_str(out: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

pub(super) fn put_num(out: &mut Vec<u8>, n: u64) {
    let _ = write!(out, "{n}");
}

/// Opens a named SSE frame; the JSON data follows, then [`close_frame`].
pub(super) fn open_frame(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
}

pub(super) fn close_frame(out: &mut Vec<u8>) {
    out.extend_from_slice(b"\n\n");
}

pub(super) fn stop_frame(out: &mut Vec<u8>, index: u32) {
    open_frame(out, "content_block_stop");
    out.extend_from_slice(b"{\"type\":\"content_block_stop\",\"index\":");
    put_num(out, index.into());
    out.push(b'}');
    close_frame(out);
}

/// A stream's usage object, with the call's cost when it is known.
pub(crate) fn put_usage(out: &mut Vec<u8>, u: Usage) {
    let u = OutUsage::from(u);
    out.extend_from_slice(b"{\"input_tokens\":");
    put_num(out, u.input_tokens);
    out.extend_from_slice(b",\"cache_creation_input_tokens\":");
    put_num(out, u.cache_creation_input_tokens);
    out.extend_from_slice(b",\"cache_read_input_tokens\":");
    put_num(out, u.cache_read_input_tokens);
    out.extend_from_slice(b",\"output_tokens\":");
    put_num(out, u.output_tokens);
    if let Some(s) = u.server_tool_use {
        out.extend_from_slice(b",\"server_tool_use\":{\"web_search_requests\":");
        put_num(out, s.web_search_requests);
        out.extend_from_slice(b",\"web_fetch_requests\":");
        put_num(out, s.web_fetch_requests);
        out.push(b'}');
    }
    if let Some(cost) = u.cost {
        out.extend_from_slice(b",\"cost\":");
        let _ = serde_json::to_writer(&mut *out, &cost);
    }
    out.push(b'}');
}

/// The kind of the content block being streamed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Block {
    Text,
    Thinking,
    /// A tool_use block, with the canonical call index it carries.
    Tool(u32),
}

/// Encodes canonical events as the Messages SSE sequence: `message_start`, `ping`,
/// per block `content_block_start` / `content_block_delta` / `content_block_stop`,
/// then `message_delta` (stop reason, usage, receipt) and `message_stop`.
///
/// `message_start` waits for the first event that is not `Start` or `Usage`, so the
/// input usage an Anthropic rung reports up front is in it.
pub struct Encoder {
    pub(super) meta: Meta,
    pub(super) id: Option<String>,
    pub(super) model: Option<String>,
    pub(super) started: bool,
    /// The open block and its index.
    pub(super) open: Option<(Block, u32)>,
    /// The index the next block gets.
    pub(super) next: u32,
    /// Block index of each tool call, by call index.
    pub(super) calls: Vec<(u32, u32)>,
    pub(super) usage: Option<Usage>,
    pub(super) finish: Option<FinishReason>,
    pub(super) raw: Option<String>,
    /// The stop sequence the provider named.
    pub(super) stop_sequence: Option<String>,
    pub(super) refused: bool,
    /// The open thinking block got its signature: more thinking opens another.
    pub(super) signed: bool,
    /// The index of the last text block: citations go there.
    pub(super) last_text: Option<u32>,
}

impl Encoder {
    pub fn new(meta: Meta) -> Self {
        Encoder {
            meta,
            id: None,
            model: None,
            started: false,
            open: None,
            next: 0,
            calls: Vec::new(),
            usage: None,
            finish: None,
            raw: None,
            stop_sequence: None,
            refused: false,
            signed: false,
            last_text: None,
        }
    }

    /// A search run on the server side: its `server_tool_use` block (the query as
    /// input JSON) and its `web_search_tool_result` block.
    pub(super) fn search(&mut self, s: &ServerSearch, out: &mut Vec<u8>) {
        self.ensure_started(out);
        self.close(out);
        let [call, result] = search_blocks(s);
        let query = serde_json::to_string(&Query { query: &s.query }).unwrap_or_default();
        for (block, delta) in [(call, Some(query)), (result, None)] {
            let index = self.next;
            self.next += 1;
            open_frame(out, "content_block_start");
            out.extend_from_slice(b"{\"type\":\"content_block_start\",\"index\":");
            put_num(out, index.into());
            out.extend_from_slice(b",\"content_block\":");
            let start = match block {
                // The input streams as JSON, like a tool call's.
                OutBlock::ServerToolUse { id, name, .. } => {
                    serde_json::json!({"type": "server_tool_use", "id": id, "name": name, "input": {}})
                        .to_string()
                }
                other => serde_json::to_string(&other).unwrap_or_default(),
            };
            out.extend_from_slice(start.as_bytes());
            out.push(b'}');
            close_frame(out);
            if let Some(json) = delta {
                Self::delta(out, index, "input_json_delta", "partial_json", &json);
            }
            stop_frame(out, index);
        }
    }

    /// A citation of the text block being written (or the last one).
    pub(super) fn cite(&mut self, c: &UrlCitation, out: &mut Vec<u8>) {
        let index = match self.open {
            Some((Block::Text, index)) => index,
            _ => match self.last_text {
                Some(index) => index,
                None => return,
            },
        };
        let citation = CitationOut::of(c, "");
        open_frame(out, "content_block_delta");
        out.extend_from_slice(b"{\"type\":\"content_block_delta\",\"index\":");
        put_num(out, index.into());
        out.extend_from_slice(b",\"delta\":{\"type\":\"citations_delta\",\"citation\":");
        let _ = serde_json::to_writer(&mut *out, &citation);
        out.extend_from_slice(b"}}");
        close_frame(out);
    }

    pub(super) fn ensure_started(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let id = message_id(self.id.as_deref(), &self.meta);
        open_frame(out, "message_start");
        out.extend_from_slice(b"{\"type\":\"message_start\",\"message\":{\"id\":");
        put_str(out, &id);
        out.extend_from_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        put_str(out, self.model.as_deref().unwrap_or(&self.meta.slug));
        out.extend_from_slice(
            b",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":",
        );
        // Anthropic's own stream counts the input up front; a rung of another maker
        // reports it only at the end, so the gateway's count stands in until then.
        let mut usage = self.usage.unwrap_or_default();
        if usage.input_tokens == 0 {
            usage.input_tokens = self.meta.prompt_estimate;
        }
        put_usage(out, usage);
        out.extend_from_slice(b",\"provider\":");
        put_str(out, &self.meta.provider);
        out.extend_from_slice(b"}}");
        close_frame(out);
        out.extend_from_slice(b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
    }

    pub(super) fn close(&mut self, out: &mut Vec<u8>) {
        if let Some((_, index)) = self.open.take() {
            stop_frame(out, index);
        }
    }

    /// Makes `kind` the open block, closing another one first. `start` writes the
    /// `content_block` object. Returns the block's index.
    pub(super) fn open(
        &mut self,
        kind: Block,
        out: &mut Vec<u8>,
        start: impl FnOnce(&mut Vec<u8>),
    ) -> u32 {
        if let Some((k, index)) = self.open {
            if k == kind {
                return index;
            }
        }
        self.ensure_started(out);
        self.close(out);
        let index = self.next;
        self.next += 1;
        open_frame(out, "content_block_start");
        out.extend_from_slice(b"{\"type\":\"content_block_start\",\"index\":");
        put_num(out, index.into());
        out.extend_from_slice(b",\"content_block\":");
        start(out);
        out.push(b'}');
        close_frame(out);
        self.open = Some((kind, index));
        self.signed = false;
        index
    }

    /// One `content_block_delta`: `delta_type` with its `field` set to `value`.
    pub(super) fn delta(out: &mut Vec<u8>, index: u32, delta_type: &str, field: &str, value: &str) {
        open_frame(out, "content_block_delta");
        out.extend_from_slice(b"{\"type\":\"content_block_delta\",\"index\":");
        put_num(out, index.into());
        out.extend_from_slice(b",\"delta\":{\"type\":\"");
        out.extend_from_slice(delta_type.as_bytes());
        out.extend_from_slice(b"\",\"");
        out.extend_from_slice(field.as_bytes());
        out.extend_from_slice(b"\":");
        put_str(out, value);
        out.extend_from_slice(b"}}");
        close_frame(out);
    }

    pub(super) fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() {
            return;
        }
        let index = self.open(Block::Text, out, |o| {
            o.extend_from_slice(br#"{"type":"text","text":""}"#)
        });
        self.last_text = Some(index);
        Self::delta(out, index, "text_delta", "text", text);
    }

    pub(super) fn open_thinking(&mut self, out: &mut Vec<u8>) -> u32 {
        self.open(Block::Thinking, out, |o| {
            o.extend_from_slice(br#"{"type":"thinking","thinking":"","signature":""}"#)
        })
    }

    pub(super) fn tool_start(&mut self, call: u32, id: &str, name: &str, out: &mut Vec<u8>) {
        // A new call always opens a new block, even right after another call.
        self.close(out);
        let index = self.open(Block::Tool(call), out, |o| {
            o.extend_from_slice(br#"{"type":"tool_use","id":"#);
            put_str(o, id);
            o.extend_from_slice(br#","name":"#);
            put_str(o, name);
            o.extend_from_slice(br#","input":{}}"#);
        });
        self.calls.push((call, index));
    }

    pub(super) fn tool_args(&mut self, call: u32, arguments: &str, out: &mut Vec<u8>) {
        if arguments.is_empty() {
            return;
        }
        // Arguments of a call whose block was closed still go to its index.
        let Some(&(_, index)) = self.calls.iter().rev().find(|(c, _)| *c == call) else {
            return;
        };
        Self::delta(out, index, "input_json_delta", "partial_json", arguments);
    }

    pub(super) fn redacted(&mut self, data: &str, out: &mut Vec<u8>) {
        self.ensure_started(out);
        self.close(out);
        let index = self.next;
        self.next += 1;
        open_frame(out, "content_block_start");
        out.extend_from_slice(b"{\"type\":\"content_block_start\",\"index\":");
        put_num(out, index.into());
        out.extend_from_slice(br#","content_block":{"type":"redacted_thinking","data":"#);
        put_str(out, data);
        out.extend_from_slice(b"}}");
        close_frame(out);
        stop_frame(out, index);
    }
}

impl StreamEncoder for Encoder {
    fn event(&mut self, ev: &Event, out: &mut Vec<u8>) {
        match ev {
            Event::Start { id, model } => {
                if self.id.is_none() {
                    self.id.clone_from(id);
                }
                if self.model.is_none() {
                    self.model.clone_from(model);
                }
            }
            Event::Usage(u) => self.usage = Some(*u),
            Event::Thinking { .. }
            | Event::ThinkingSignature { .. }
            | Event::EncryptedReasoning { .. }
                if self.meta.hide_reasoning => {}
            Event::Text { text } => self.text(text, out),
            Event::Thinking { text } => {
                if !text.is_empty() {
                    if self.signed {
                        self.close(out);
                    }
                    let index = self.open_thinking(out);
                    Self::delta(out, index, "thinking_delta", "thinking", text);
                }
            }
            Event::ThinkingSignature { signature } => {
                let index = self.open_thinking(out);
                Self::delta(out, index, "signature_delta", "signature", signature);
                self.signed = true;
            }
            Event::EncryptedReasoning { data, .. } => self.redacted(data, out),
            Event::ToolCallStart { index, id, name } => self.tool_start(*index, id, name, out),
            Event::ToolCallArgs { index, arguments } => self.tool_args(*index, arguments, out),
            Event::Refusal { text, .. } => {
                self.refused = true;
                if let Some(t) = text {
                    self.text(t, out);
                }
            }
            Event::Finish {
                reason,
                raw,
                stop_sequence,
            } => {
                self.finish = Some(*reason);
                self.raw.clone_from(raw);
                self.stop_sequence.clone_from(stop_sequence);
            }
            // The gateway ends a failed stream itself (`error_frame`, or a cut).
            Event::Error { .. } => {}
            Event::ServerSearch(s) => self.search(s, out),
            Event::Citation(c) => self.cite(c, out),
        }
    }

    fn end(&mut self, tail: &Tail, out: &mut Vec<u8>) {
        self.ensure_started(out);
        self.close(out);
        let stop = stop_reason(
            self.finish,
            self.raw.as_deref(),
            self.refused,
            tail.cut,
            !self.calls.is_empty(),
        );
        open_frame(out, "message_delta");
        out.extend_from_slice(br#"{"type":"message_delta","delta":{"stop_reason":""#);
        out.extend_from_slice(stop.as_bytes());
        out.extend_from_slice(br#"","stop_sequence":"#);
        match stop_sequence(stop, self.stop_sequence.as_deref(), &self.meta) {
            Some(seq) => put_str(out, seq),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(br#"},"usage":"#);
        put_usage(out, final_usage(tail, self.usage));
        if let Some(r) = receipt(tail) {
            out.extend_from_slice(br#","x_gateway":"#);
            out.extend_from_slice(r.get().as_bytes());
        }
        if let Some(ignored) = &tail.ignored {
            out.extend_from_slice(br#","x-service-ignored-parameters":"#);
            put_str(out, ignored);
        }
        out.push(b'}');
        close_frame(out);
        out.extend_from_slice(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    }
}

/// The `error` event that ends a stream whose header already went out.
pub fn error_frame(err: &ApiError) -> Vec<u8> {
    crate::sse::named_frame("error", &err.to_body(Format::Anthropic))
}
