//! Whole answers: a response rendered as an Anthropic message.

use super::*;

/// A tool call's `input`: the arguments text when it is a JSON object, else `{}`.
pub(crate) struct Input<'a>(Option<&'a RawValue>);

impl<'a> Input<'a> {
    pub(crate) fn of(arguments: &'a str) -> Self {
        let raw = serde_json::from_str::<&RawValue>(arguments)
            .ok()
            .filter(|r| r.get().trim_start().starts_with('{'));
        Input(raw)
    }
}

impl Serialize for Input<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        match self.0 {
            Some(raw) => raw.serialize(s),
            None => s.serialize_map(Some(0))?.end(),
        }
    }
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum OutBlock<'a> {
    Text {
        text: &'a str,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        citations: Vec<CitationOut<'a>>,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Input<'a>,
    },
    ServerToolUse {
        id: String,
        name: &'static str,
        input: Query<'a>,
    },
    WebSearchToolResult {
        tool_use_id: String,
        content: Vec<ResultOut<'a>>,
    },
}

/// A web search's input.
#[derive(Serialize)]
pub(super) struct Query<'a> {
    pub(super) query: &'a str,
}

/// One result of a `web_search_tool_result` block.
#[derive(Serialize)]
pub(super) struct ResultOut<'a> {
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    pub(super) url: &'a str,
    pub(super) title: &'a str,
    /// Anthropic's opaque copy of the page for later turns; a search the gateway
    /// ran gives the snippet it found.
    pub(super) encrypted_content: &'a str,
    pub(super) page_age: Option<&'a str>,
}

/// A text block's citation of a web search result.
#[derive(Serialize)]
pub(super) struct CitationOut<'a> {
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    pub(super) url: &'a str,
    pub(super) title: &'a str,
    /// Where the source sits among the results, opaque to the client.
    pub(super) encrypted_index: String,
    pub(super) cited_text: &'a str,
}

impl<'a> CitationOut<'a> {
    pub(super) fn of(c: &'a UrlCitation, span: &'a str) -> Self {
        CitationOut {
            kind: "web_search_result_location",
            url: &c.url,
            title: &c.title,
            encrypted_index: format!("{}:{}", c.start_index, c.end_index),
            cited_text: c.content.as_deref().unwrap_or(span),
        }
    }
}

/// The id of a search's `server_tool_use` block.
pub(super) fn search_id(s: &ServerSearch) -> String {
    if s.id.starts_with("srvtoolu_") {
        s.id.clone()
    } else {
        format!("srvtoolu_{}", s.id)
    }
}

/// The two blocks that show a search run on the server side.
pub(super) fn search_blocks(s: &ServerSearch) -> [OutBlock<'_>; 2] {
    let id = search_id(s);
    [
        OutBlock::ServerToolUse {
            id: id.clone(),
            name: "web_search",
            input: Query { query: &s.query },
        },
        OutBlock::WebSearchToolResult {
            tool_use_id: id,
            content: s.results.iter().map(result_out).collect(),
        },
    ]
}

pub(super) fn result_out(r: &SearchResult) -> ResultOut<'_> {
    ResultOut {
        kind: "web_search_result",
        url: &r.url,
        title: &r.title,
        encrypted_content: &r.snippet,
        page_age: r.page_age.as_deref(),
    }
}

/// `text` (starting `offset` characters into the answer) as text blocks: the
/// spans its citations cover become blocks of their own that carry them.
pub(super) fn text_blocks<'a>(
    text: &'a str,
    offset: u32,
    citations: &'a [UrlCitation],
    out: &mut Vec<OutBlock<'a>>,
) {
    let len = text.chars().count() as u32;
    let mut mine: Vec<&UrlCitation> = citations
        .iter()
        .filter(|c| c.start_index >= offset && c.start_index < offset + len)
        .collect();
    if mine.is_empty() {
        out.push(OutBlock::Text {
            text,
            citations: Vec::new(),
        });
        return;
    }
    mine.sort_by_key(|c| (c.start_index, c.end_index));
    // Byte offset of every character boundary (and the end).
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(b, _)| b)
        .chain([text.len()])
        .collect();
    let at = |ch: u32| bounds[(ch.saturating_sub(offset)).min(len) as usize];
    let mut done = 0usize;
    let mut i = 0;
    while i < mine.len() {
        let (start, end) = (
            at(mine[i].start_index),
            at(mine[i].end_index.max(mine[i].start_index)),
        );
        let start = start.max(done);
        let end = end.max(start);
        if start > done {
            out.push(OutBlock::Text {
                text: &text[done..start],
                citations: Vec::new(),
            });
        }
        let span = &text[start..end];
        let mut cites = Vec::new();
        // Citations of the same span share its block.
        while i < mine.len() && at(mine[i].start_index).max(done) == start {
            cites.push(CitationOut::of(mine[i], span));
            i += 1;
        }
        if !span.is_empty() {
            out.push(OutBlock::Text {
                text: span,
                citations: cites,
            });
        }
        done = end;
    }
    if done < text.len() {
        out.push(OutBlock::Text {
            text: &text[done..],
            citations: Vec::new(),
        });
    }
}

/// The count of web searches in the Messages API's names.
#[derive(Serialize)]
pub(super) struct ServerToolUse {
    pub(super) web_search_requests: u64,
    /// The gateway fetches no pages on a client's behalf: always 0, present
    /// because the anthropic SDK's types require it.
    pub(super) web_fetch_requests: u64,
}

/// Usage in the Messages API's names.
#[derive(Serialize)]
pub(super) struct OutUsage {
    pub(super) input_tokens: u64,
    pub(super) cache_creation_input_tokens: u64,
    pub(super) cache_read_input_tokens: u64,
    pub(super) output_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) server_tool_use: Option<ServerToolUse>,
    /// What the call cost, in USD.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cost: Option<f64>,
}

impl From<Usage> for OutUsage {
    fn from(u: Usage) -> Self {
        OutUsage {
            // Anthropic's input_tokens excludes both cache reads and writes.
            input_tokens: u.fresh_input(),
            cache_creation_input_tokens: u.cache_write_tokens,
            cache_read_input_tokens: u.cached_tokens,
            output_tokens: u.output_tokens,
            server_tool_use: (u.web_search_requests > 0).then_some(ServerToolUse {
                web_search_requests: u.web_search_requests,
                web_fetch_requests: 0,
            }),
            cost: u.cost_usd(),
        }
    }
}

#[derive(Serialize)]
pub(super) struct OutMessage<'a> {
    pub(super) id: &'a str,
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    pub(super) role: &'static str,
    pub(super) model: &'a str,
    pub(super) content: Vec<OutBlock<'a>>,
    pub(super) stop_reason: &'a str,
    pub(super) stop_sequence: Option<&'a str>,
    pub(super) usage: OutUsage,
    pub(super) provider: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) x_gateway: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(rename = "x-service-ignored-parameters")]
    pub(super) x_service_ignored_parameters: Option<&'a str>,
}

/// An answer part as a content block. Thinking without a signature (another maker's
/// reasoning) gets an empty one, as a stream would show it.
pub(super) fn out_block(p: &Part) -> Option<OutBlock<'_>> {
    Some(match p {
        Part::Text { text } if !text.is_empty() => OutBlock::Text {
            text,
            citations: Vec::new(),
        },
        Part::Thinking { text, signature } => OutBlock::Thinking {
            thinking: text,
            signature: signature.as_deref().unwrap_or(""),
        },
        Part::EncryptedReasoning { data, .. } => OutBlock::RedactedThinking { data },
        Part::ToolCall {
            id,
            name,
            arguments,
        } => OutBlock::ToolUse {
            id,
            name,
            input: Input::of(arguments),
        },
        _ => return None,
    })
}

/// The answer's id: the provider's when it is a message id, else one made from the
/// gateway's fallback.
pub(super) fn message_id<'a>(id: Option<&'a str>, meta: &'a Meta) -> Cow<'a, str> {
    match id {
        Some(id) if id.starts_with("msg_") => Cow::Borrowed(id),
        _ if meta.fallback_id.starts_with("msg_") => Cow::Borrowed(&meta.fallback_id),
        _ if !meta.fallback_id.is_empty() => Cow::Owned(format!("msg_{}", meta.fallback_id)),
        _ => Cow::Owned(format!("msg_{}", id.unwrap_or_default())),
    }
}

/// The `stop_reason`: a cut stream is `max_tokens`; a refusal is `refusal`; a raw
/// reason that is already a Messages one is kept; else the canonical reason maps.
pub(super) fn stop_reason(
    finish: Option<FinishReason>,
    raw: Option<&str>,
    refused: bool,
    cut: bool,
    tool_calls: bool,
) -> &'static str {
    if cut {
        return "max_tokens";
    }
    if refused {
        return "refusal";
    }
    if let Some(r) = raw.and_then(|r| STOP_REASONS.iter().find(|s| **s == r)) {
        return r;
    }
    match finish {
        Some(FinishReason::Stop) => "end_turn",
        Some(FinishReason::Length) => "max_tokens",
        Some(FinishReason::ToolCalls) => "tool_use",
        Some(FinishReason::StopSequence) => "stop_sequence",
        Some(FinishReason::ContentFilter) => "refusal",
        None if tool_calls => "tool_use",
        None => "end_turn",
    }
}

/// `stop_sequence`: on a `stop_sequence` stop, the sequence the provider named,
/// else the caller's only one (a provider that does not name the match); null
/// otherwise, and when several were given and none is named.
pub(super) fn stop_sequence<'a>(
    stop: &str,
    named: Option<&'a str>,
    meta: &'a Meta,
) -> Option<&'a str> {
    if stop != "stop_sequence" {
        return None;
    }
    named.or(meta.stop_sequence.as_deref())
}

/// The gateway's final usage when it has one, else what the provider reported.
pub(super) fn final_usage(tail: &Tail, seen: Option<Usage>) -> Usage {
    if tail.usage != Usage::default() {
        tail.usage
    } else {
        seen.unwrap_or_default()
    }
}

/// The receipt as raw JSON, when it is some.
pub(super) fn receipt(tail: &Tail) -> Option<&RawValue> {
    serde_json::from_str::<&RawValue>(&tail.receipt).ok()
}

/// One whole `message` object.
pub fn render(resp: &Response, meta: &Meta, tail: &Tail) -> Vec<u8> {
    let id = message_id(resp.id.as_deref(), meta);
    let mut content: Vec<OutBlock> = resp.searches.iter().flat_map(search_blocks).collect();
    let mut offset = 0u32;
    for p in &resp.parts {
        match p {
            Part::Text { text } if !resp.citations.is_empty() => {
                text_blocks(text, offset, &resp.citations, &mut content);
                offset += text.chars().count() as u32;
            }
            Part::Thinking { .. } | Part::EncryptedReasoning { .. } if meta.hide_reasoning => {}
            p => content.extend(out_block(p)),
        }
    }
    let refusal_text = resp.refusal.as_ref().and_then(|(_, t)| t.as_deref());
    if let Some(text) = refusal_text.filter(|t| !t.is_empty()) {
        content.push(OutBlock::Text {
            text,
            citations: Vec::new(),
        });
    }
    let tool_calls = resp
        .parts
        .iter()
        .any(|p| matches!(p, Part::ToolCall { .. }));
    let stop = stop_reason(
        resp.finish,
        resp.finish_raw.as_deref(),
        resp.refusal.is_some(),
        tail.cut,
        tool_calls,
    );
    let msg = OutMessage {
        id: &id,
        kind: "message",
        role: "assistant",
        model: resp.model.as_deref().unwrap_or(&meta.slug),
        content,
        stop_reason: stop,
        stop_sequence: stop_sequence(stop, resp.stop_sequence.as_deref(), meta),
        usage: final_usage(tail, resp.usage).into(),
        provider: &meta.provider,
        x_gateway: receipt(tail),
        x_service_ignored_parameters: tail.ignored.as_deref(),
    };
    // Serializing borrowed strings and raw JSON cannot fail.
    serde_json::to_vec(&msg).unwrap_or_default()
}
