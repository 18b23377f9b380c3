//! Answers: a whole message or its named SSE events decoded into the canonical
//! form.

use super::*;

/// Usage as Anthropic reports it; a stream's `message_delta` may carry only some
/// members, which update those of `message_start`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub(super) struct WireUsage {
    #[serde(default)]
    pub(super) input_tokens: Option<u64>,
    #[serde(default)]
    pub(super) output_tokens: Option<u64>,
    #[serde(default)]
    pub(super) cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    pub(super) cache_creation_input_tokens: Option<u64>,
    /// The split of the writes by lifetime.
    #[serde(default)]
    pub(super) cache_creation: Option<CacheCreation>,
    /// Server tools Claude ran (its web searches).
    #[serde(default)]
    pub(super) server_tool_use: Option<ServerToolUse>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub(super) struct ServerToolUse {
    #[serde(default)]
    pub(super) web_search_requests: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub(super) struct CacheCreation {
    #[serde(default)]
    pub(super) ephemeral_1h_input_tokens: Option<u64>,
}

impl WireUsage {
    pub(super) fn merge(&mut self, o: &WireUsage) {
        let pairs = [
            (&mut self.input_tokens, o.input_tokens),
            (&mut self.output_tokens, o.output_tokens),
            (&mut self.cache_read_input_tokens, o.cache_read_input_tokens),
            (
                &mut self.cache_creation_input_tokens,
                o.cache_creation_input_tokens,
            ),
        ];
        for (mine, theirs) in pairs {
            if theirs.is_some() {
                *mine = theirs;
            }
        }
        if o.cache_creation.is_some() {
            self.cache_creation = o.cache_creation;
        }
        if o.server_tool_use.is_some() {
            self.server_tool_use = o.server_tool_use;
        }
    }

    pub(super) fn canonical(&self) -> Usage {
        let read = self.cache_read_input_tokens.unwrap_or(0);
        let write = self.cache_creation_input_tokens.unwrap_or(0);
        Usage {
            // Provider-supplied counts: saturate rather than wrap.
            input_tokens: self
                .input_tokens
                .unwrap_or(0)
                .saturating_add(read)
                .saturating_add(write),
            cached_tokens: read,
            cache_write_tokens: write,
            cache_write_1h_tokens: self
                .cache_creation
                .and_then(|c| c.ephemeral_1h_input_tokens)
                .unwrap_or(0),
            output_tokens: self.output_tokens.unwrap_or(0),
            // Anthropic counts thinking inside output_tokens without a split.
            reasoning_tokens: 0,
            web_search_requests: self
                .server_tool_use
                .and_then(|s| s.web_search_requests)
                .unwrap_or(0),
            cost_micro_usd: None,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct WireError {
    #[serde(rename = "type", default)]
    pub(super) kind: Option<String>,
    #[serde(default)]
    pub(super) message: Option<String>,
}

/// A content block of an answer, flat (`content_block` of a stream too).
#[derive(Deserialize)]
pub(super) struct WireBlock<'a> {
    #[serde(rename = "type", borrow)]
    pub(super) kind: Cow<'a, str>,
    #[serde(default)]
    pub(super) text: Option<String>,
    #[serde(default)]
    pub(super) thinking: Option<String>,
    #[serde(default)]
    pub(super) signature: Option<String>,
    #[serde(default)]
    pub(super) data: Option<String>,
    #[serde(default)]
    pub(super) id: Option<String>,
    #[serde(default)]
    pub(super) name: Option<String>,
    #[serde(default, borrow)]
    pub(super) input: Option<&'a RawValue>,
    /// A text block's sources.
    #[serde(default)]
    pub(super) citations: Option<Vec<WireCitation>>,
    /// A server tool result's call.
    #[serde(default)]
    pub(super) tool_use_id: Option<String>,
    /// A web search result block's results (or its error object).
    #[serde(default, borrow)]
    pub(super) content: Option<&'a RawValue>,
}

/// A text block's citation of a search result.
#[derive(Clone, Deserialize)]
pub(super) struct WireCitation {
    #[serde(rename = "type", default)]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) url: Option<String>,
    #[serde(default)]
    pub(super) title: Option<String>,
    #[serde(default)]
    pub(super) cited_text: Option<String>,
}

impl WireCitation {
    /// The citation over the answer's characters `start..end`.
    pub(super) fn event(&self, start: u32, end: u32) -> Option<Event> {
        let url = self.url.clone()?;
        (self.kind == "web_search_result_location").then(|| {
            Event::Citation(Box::new(crate::ir::UrlCitation {
                url,
                title: self.title.clone().unwrap_or_default(),
                content: self.cited_text.clone(),
                start_index: start,
                end_index: end,
            }))
        })
    }
}

/// One `web_search_result` of a `web_search_tool_result` block.
#[derive(Deserialize)]
pub(super) struct WireResult {
    #[serde(default)]
    pub(super) url: String,
    #[serde(default)]
    pub(super) title: String,
    #[serde(default)]
    pub(super) page_age: Option<String>,
}

/// The query of a `web_search` server tool call's input.
pub(super) fn query_of(input: &str) -> String {
    #[derive(Deserialize)]
    struct Q {
        #[serde(default)]
        query: String,
    }
    serde_json::from_str::<Q>(input)
        .map(|q| q.query)
        .unwrap_or_default()
}

/// A finished web search: its call's id and query, and the results the
/// `web_search_tool_result` block holds (an error object holds none).
pub(super) fn search_event(id: String, query: String, content: Option<&RawValue>) -> Event {
    let results: Vec<WireResult> = content
        .and_then(|c| serde_json::from_str(c.get()).ok())
        .unwrap_or_default();
    Event::ServerSearch(Box::new(crate::ir::ServerSearch {
        id,
        query,
        results: results
            .into_iter()
            .map(|r| crate::ir::SearchResult {
                title: r.title,
                url: r.url,
                snippet: String::new(),
                page_age: r.page_age,
            })
            .collect(),
    }))
}

/// A whole answer (a `message`, or an `error` object), or a stream's
/// `message_start` message.
#[derive(Deserialize)]
pub(super) struct WireMessage<'a> {
    #[serde(rename = "type", default, borrow)]
    pub(super) kind: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) id: Option<String>,
    #[serde(default)]
    pub(super) model: Option<String>,
    #[serde(default, borrow)]
    pub(super) content: Vec<WireBlock<'a>>,
    #[serde(default)]
    pub(super) stop_reason: Option<String>,
    #[serde(default)]
    pub(super) stop_sequence: Option<String>,
    #[serde(default)]
    pub(super) usage: Option<WireUsage>,
    #[serde(default)]
    pub(super) error: Option<WireError>,
}

/// The canonical reason for a `stop_reason`. `pause_turn` (a server tool paused
/// the turn) ends the turn like `end_turn`; `refusal` is the provider filtering
/// its output; an exceeded context window is a length stop.
pub(super) fn finish_reason(raw: &str) -> FinishReason {
    match raw {
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "tool_use" => FinishReason::ToolCalls,
        "stop_sequence" => FinishReason::StopSequence,
        "refusal" => FinishReason::ContentFilter,
        _ => FinishReason::Stop,
    }
}

/// The refusal reason of a `refusal` stop. Anthropic's streaming safety
/// classifiers give no category, so none is claimed.
pub(super) const STOP_REFUSAL: RefusalReason = RefusalReason::Unspecified;

/// The error Anthropic answers when its output filter blocks an answer (400
/// `invalid_request_error`, in band or as the whole answer).
pub(super) const FILTER_BLOCKED: &str = "content filtering policy";

/// Events for an error object: the output filter is a refusal, anything else an
/// in-band error.
pub(super) fn error_event(e: &WireError) -> Event {
    let message = e.message.as_deref().unwrap_or("");
    if message.contains(FILTER_BLOCKED) {
        return Event::Refusal {
            reason: RefusalReason::ContentPolicy,
            text: None,
        };
    }
    Event::Error {
        message: match &e.kind {
            Some(kind) => format!("{kind}: {message}"),
            None => message.to_owned(),
        },
    }
}

/// Events that close an answer: refusal, finish (with the matched stop sequence),
/// usage.
pub(super) fn finish_events(
    stop: Option<&str>,
    stop_sequence: Option<String>,
    usage: Option<Usage>,
    out: &mut Vec<Event>,
) {
    if let Some(raw) = stop {
        if raw == "refusal" {
            out.push(Event::Refusal {
                reason: STOP_REFUSAL,
                text: None,
            });
        }
        out.push(Event::Finish {
            reason: finish_reason(raw),
            raw: Some(raw.to_owned()),
            stop_sequence,
        });
    }
    if let Some(u) = usage {
        out.push(Event::Usage(u));
    }
}

/// A whole answer as the event sequence its stream would give.
pub fn decode(body: &[u8]) -> Result<Vec<Event>, DecodeError> {
    let m: WireMessage = serde_json::from_slice(body)
        .map_err(|e| DecodeError(format!("unreadable Anthropic answer: {e}")))?;
    if m.kind.as_deref() == Some("error") {
        let e = m.error.unwrap_or(WireError {
            kind: None,
            message: None,
        });
        return Ok(vec![error_event(&e)]);
    }
    let mut out = Vec::with_capacity(m.content.len() * 2 + 3);
    out.push(Event::Start {
        id: m.id,
        model: m.model,
    });
    let mut calls = 0u32;
    // Characters of answer text so far: a text block's citations cover its span.
    let mut chars = 0u32;
    // Web search calls whose result block has not come yet: (id, query).
    let mut searching: Vec<(String, String)> = Vec::new();
    for b in m.content {
        match b.kind.as_ref() {
            "text" => {
                let start = chars;
                if let Some(text) = b.text.filter(|t| !t.is_empty()) {
                    chars += text.chars().count() as u32;
                    out.push(Event::Text { text });
                }
                for c in b.citations.iter().flatten() {
                    out.extend(c.event(start, chars));
                }
            }
            "server_tool_use" if b.name.as_deref() == Some("web_search") => {
                let query = b.input.map(|i| query_of(i.get())).unwrap_or_default();
                searching.push((b.id.unwrap_or_default(), query));
            }
            "web_search_tool_result" => {
                let id = b.tool_use_id.unwrap_or_default();
                let query = searching
                    .iter()
                    .find(|(i, _)| *i == id)
                    .map(|(_, q)| q.clone())
                    .unwrap_or_default();
                out.push(search_event(id, query, b.content));
            }
            "thinking" => thinking_events(b.thinking, b.signature, &mut out),
            "redacted_thinking" => {
                if let Some(data) = b.data {
                    out.push(Event::EncryptedReasoning { data, id: None });
                }
            }
            "tool_use" => {
                out.push(Event::ToolCallStart {
                    index: calls,
                    id: b.id.unwrap_or_default(),
                    name: b.name.unwrap_or_default(),
                });
                out.push(Event::ToolCallArgs {
                    index: calls,
                    arguments: b
                        .input
                        .map_or_else(|| "{}".to_owned(), |r| r.get().to_owned()),
                });
                calls += 1;
            }
            // server_tool_use, web_search_tool_result and future kinds.
            _ => {}
        }
    }
    finish_events(
        m.stop_reason.as_deref(),
        m.stop_sequence,
        m.usage.as_ref().map(WireUsage::canonical),
        &mut out,
    );
    Ok(out)
}

pub(super) fn thinking_events(
    text: Option<String>,
    signature: Option<String>,
    out: &mut Vec<Event>,
) {
    if let Some(text) = text.filter(|t| !t.is_empty()) {
        out.push(Event::Thinking { text });
    }
    if let Some(signature) = signature.filter(|s| !s.is_empty()) {
        out.push(Event::ThinkingSignature { signature });
    }
}

/// One stream event's data, flat.
#[derive(Deserialize)]
pub(super) struct StreamEvent<'a> {
    #[serde(rename = "type", default, borrow)]
    pub(super) kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(super) message: Option<WireMessage<'a>>,
    #[serde(default)]
    pub(super) index: Option<u32>,
    #[serde(default, borrow)]
    pub(super) content_block: Option<WireBlock<'a>>,
    #[serde(default)]
    pub(super) delta: Option<Delta>,
    #[serde(default)]
    pub(super) usage: Option<WireUsage>,
    #[serde(default)]
    pub(super) error: Option<WireError>,
}

/// A `content_block_delta`'s delta, or a `message_delta`'s.
#[derive(Deserialize)]
pub(super) struct Delta {
    #[serde(rename = "type", default)]
    pub(super) kind: Option<String>,
    #[serde(default)]
    pub(super) text: Option<String>,
    #[serde(default)]
    pub(super) thinking: Option<String>,
    #[serde(default)]
    pub(super) signature: Option<String>,
    #[serde(default)]
    pub(super) partial_json: Option<String>,
    #[serde(default)]
    pub(super) stop_reason: Option<String>,
    #[serde(default)]
    pub(super) stop_sequence: Option<String>,
    #[serde(default)]
    pub(super) citation: Option<WireCitation>,
}

/// What a stream's content block is, by its index.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Text,
    Thinking,
    /// A tool_use block, its call index (tool_use blocks counted from 0), and
    /// whether any of its input arrived (a call without arguments streams an
    /// empty `partial_json`, or none: its input is `{}`).
    Tool(u32, bool),
    /// A `web_search` server tool call, by its place in `searches`.
    Search(usize),
    /// Other server tool blocks and unknown kinds: their deltas are skipped.
    Other,
}

/// A text block's citations, held until the block ends (its span is known
/// then).
pub(super) struct Cited {
    pub(super) index: u32,
    pub(super) start: u32,
    pub(super) citations: Vec<WireCitation>,
}

/// Decodes the Messages SSE stream.
#[derive(Default)]
pub struct Decoder {
    pub(super) done: bool,
    pub(super) blocks: Vec<Kind>,
    pub(super) calls: u32,
    pub(super) usage: WireUsage,
    /// Characters of answer text so far.
    pub(super) chars: u32,
    /// The open text block, where its citations gather.
    pub(super) cited: Option<Cited>,
    /// Web search calls: id and the input JSON streamed so far.
    pub(super) searches: Vec<(String, String)>,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub(super) fn block_start(&mut self, index: Option<u32>, b: WireBlock, out: &mut Vec<Event>) {
        let kind = match b.kind.as_ref() {
            "text" => {
                self.cited = Some(Cited {
                    index: index.unwrap_or(0),
                    start: self.chars,
                    citations: b.citations.clone().unwrap_or_default(),
                });
                if let Some(text) = b.text.filter(|t| !t.is_empty()) {
                    self.chars += text.chars().count() as u32;
                    out.push(Event::Text { text });
                }
                Kind::Text
            }
            "server_tool_use" if b.name.as_deref() == Some("web_search") => {
                let input = b.input.map(|i| i.get()).filter(|i| *i != "{}");
                self.searches.push((
                    b.id.unwrap_or_default(),
                    input.unwrap_or_default().to_string(),
                ));
                Kind::Search(self.searches.len() - 1)
            }
            "web_search_tool_result" => {
                let id = b.tool_use_id.unwrap_or_default();
                let query = self
                    .searches
                    .iter()
                    .find(|(i, _)| *i == id)
                    .map(|(_, input)| query_of(input))
                    .unwrap_or_default();
                out.push(search_event(id, query, b.content));
                Kind::Other
            }
            "thinking" => {
                thinking_events(b.thinking, b.signature, out);
                Kind::Thinking
            }
            "redacted_thinking" => {
                if let Some(data) = b.data {
                    out.push(Event::EncryptedReasoning { data, id: None });
                }
                Kind::Other
            }
            "tool_use" => {
                let call = self.calls;
                self.calls += 1;
                out.push(Event::ToolCallStart {
                    index: call,
                    id: b.id.unwrap_or_default(),
                    name: b.name.unwrap_or_default(),
                });
                Kind::Tool(call, false)
            }
            _ => Kind::Other,
        };
        let at = index.map_or(self.blocks.len(), |i| i as usize);
        if self.blocks.len() <= at {
            self.blocks.resize(at + 1, Kind::Other);
        }
        self.blocks[at] = kind;
    }

    /// A block ended: a tool call that streamed no input gets `{}`, a text
    /// block's citations cover the text it held.
    pub(super) fn block_stop(&mut self, index: Option<u32>, out: &mut Vec<Event>) {
        let block = index.and_then(|i| self.blocks.get_mut(i as usize));
        if let Some(Kind::Tool(call, args @ false)) = block {
            *args = true;
            out.push(Event::ToolCallArgs {
                index: *call,
                arguments: "{}".into(),
            });
        }
        if let Some(c) = self.cited.take() {
            if Some(c.index) != index {
                self.cited = Some(c);
                return;
            }
            for cite in &c.citations {
                out.extend(cite.event(c.start, self.chars));
            }
        }
    }

    pub(super) fn block_delta(&mut self, index: Option<u32>, d: Delta, out: &mut Vec<Event>) {
        let kind = index
            .and_then(|i| self.blocks.get(i as usize).copied())
            .unwrap_or(Kind::Other);
        match (d.kind.as_deref(), kind) {
            (Some("text_delta"), _) => {
                if let Some(text) = d.text.filter(|t| !t.is_empty()) {
                    self.chars += text.chars().count() as u32;
                    out.push(Event::Text { text });
                }
            }
            (Some("citations_delta"), _) => {
                if let (Some(c), Some(cited)) = (d.citation, self.cited.as_mut()) {
                    cited.citations.push(c);
                }
            }
            (Some("input_json_delta"), Kind::Search(at)) => {
                if let (Some(json), Some((_, input))) = (d.partial_json, self.searches.get_mut(at))
                {
                    input.push_str(&json);
                }
            }
            (Some("thinking_delta"), _) => {
                if let Some(text) = d.thinking.filter(|t| !t.is_empty()) {
                    out.push(Event::Thinking { text });
                }
            }
            (Some("signature_delta"), _) => {
                if let Some(signature) = d.signature.filter(|s| !s.is_empty()) {
                    out.push(Event::ThinkingSignature { signature });
                }
            }
            (Some("input_json_delta"), Kind::Tool(call, _)) => {
                if let Some(arguments) = d.partial_json.filter(|a| !a.is_empty()) {
                    if let Some(b) = index.and_then(|i| self.blocks.get_mut(i as usize)) {
                        *b = Kind::Tool(call, true);
                    }
                    out.push(Event::ToolCallArgs {
                        index: call,
                        arguments,
                    });
                }
            }
            // citations_delta, server tool input and future kinds.
            _ => {}
        }
    }
}

impl StreamDecoder for Decoder {
    fn frame(
        &mut self,
        name: Option<&str>,
        data: &[u8],
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        if data.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let ev: StreamEvent = serde_json::from_slice(data)
            .map_err(|e| DecodeError(format!("unreadable Anthropic stream event: {e}")))?;
        let kind = ev.kind.as_deref().or(name).unwrap_or("");
        match kind {
            "message_start" => {
                if let Some(m) = ev.message {
                    out.push(Event::Start {
                        id: m.id,
                        model: m.model,
                    });
                    if let Some(u) = &m.usage {
                        self.usage.merge(u);
                        out.push(Event::Usage(self.usage.canonical()));
                    }
                }
            }
            "content_block_start" => {
                if let Some(b) = ev.content_block {
                    self.block_start(ev.index, b, out);
                }
            }
            "content_block_delta" => {
                if let Some(d) = ev.delta {
                    self.block_delta(ev.index, d, out);
                }
            }
            "message_delta" => {
                if let Some(u) = &ev.usage {
                    self.usage.merge(u);
                }
                let (stop, sequence) = ev
                    .delta
                    .map_or((None, None), |d| (d.stop_reason, d.stop_sequence));
                let usage = ev.usage.is_some().then(|| self.usage.canonical());
                finish_events(stop.as_deref(), sequence, usage, out);
            }
            "content_block_stop" => self.block_stop(ev.index, out),
            "message_stop" => self.done = true,
            "error" => {
                if let Some(e) = &ev.error {
                    out.push(error_event(e));
                }
            }
            // ping, content_block_stop and future event kinds.
            _ => {}
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }
}

/// Whether an error answer is a policy refusal: Anthropic's output filter answers
/// 400 `invalid_request_error` "Output blocked by content filtering policy". Other
/// errors (bad requests, auth, rate limits, overload) are not refusals and fail
/// over as usual.
pub fn refusal(status: u16, body: &[u8]) -> Option<RefusalReason> {
    #[derive(Deserialize)]
    struct Envelope {
        #[serde(default)]
        error: Option<WireError>,
    }
    if status != 400 {
        return None;
    }
    let env: Envelope = serde_json::from_slice(body).ok()?;
    let message = env.error?.message?;
    message
        .contains(FILTER_BLOCKED)
        .then_some(RefusalReason::ContentPolicy)
}

/// Claude on Vertex: the model is in the URL and the API version in the body.
pub fn for_vertex(body: &[u8]) -> Vec<u8> {
    const VERSION: &str = "vertex-2023-10-16";
    let Ok(mut o) = serde_json::from_slice::<
        std::collections::BTreeMap<String, Box<serde_json::value::RawValue>>,
    >(body) else {
        return body.to_vec();
    };
    o.remove("model");
    if let Ok(v) = serde_json::value::RawValue::from_string(format!("{VERSION:?}")) {
        o.insert("anthropic_version".into(), v);
    }
    serde_json::to_vec(&o).unwrap_or_else(|_| body.to_vec())
}
