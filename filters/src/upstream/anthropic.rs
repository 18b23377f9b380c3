//! The Anthropic Messages wire (`POST {base}/v1/messages`), spoken by rungs of
//! provider `anthropic` (see the module contract in `upstream`).
//!
//! Rendering from the canonical form:
//! - `system` (and any stray system turn) becomes the top-level `system`;
//!   canonical tool turns become user turns of `tool_result` blocks; consecutive
//!   turns of one role are merged (Anthropic requires alternation), with a merged
//!   user turn's `tool_result` blocks first (Anthropic requires that too).
//! - `max_tokens` is required by Anthropic: without one the request gets
//!   [`DEFAULT_MAX_TOKENS`] (plus the thinking budget when thinking is on).
//! - `reasoning.budget_tokens`, else `reasoning.effort` through [`effort_budget`],
//!   becomes `thinking: {type: enabled, budget_tokens}`. Anthropic refuses sampling
//!   changes and forced tool use next to thinking, so those combinations drop
//!   `temperature` / `top_p` / `top_k` (with thinking on) or the thinking (with a
//!   forced tool), and say so in `dropped`; recent Claude models also refuse
//!   `temperature` with `top_p`, so `top_p` gives way.
//! - `response_format` json_schema becomes `output_config.format` (Anthropic's
//!   structured outputs); json_object has no Anthropic form and is dropped.
//! - The caller's cache breakpoints ([`CacheBreak`]) become `cache_control:
//!   {type: ephemeral}` on the marked system block, content block or tool (a
//!   messages body translated for Claude on Vertex keeps its caching).
//! - `extras` are forwarded only when they are Anthropic request fields (the
//!   messages inbound keeps those; another format's extras are dropped and
//!   disclosed); server tools kept as `tools.<type>` extras join `tools`.
//!
//! When the client itself spoke the Messages API, [`render_native`] forwards its
//! body instead, only swapping `model` and `stream`.
//!
//! Decoding reads a whole `message` or the named SSE events. Anthropic reports
//! `input_tokens` without cache reads and writes; the canonical input is their sum.

use crate::inbound::messages::{members, Input, MIN_THINKING_BUDGET, SERVER_TOOL_PREFIX};
use crate::ir::{
    CacheBreak, DecodeError, Event, FinishReason, Part, RefusalReason, Request, ResponseFormat,
    Role, StreamDecoder, ToolChoice,
};
use crate::upstream::Rendered;
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The output budget sent when the request names none: Anthropic requires one, and
/// 4096 is within the output limit of every Claude model still served.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Request fields of the Messages API that an extra may carry to an Anthropic rung.
const ANTHROPIC_FIELDS: [&str; 6] = [
    "thinking",
    "output_config",
    "service_tier",
    "container",
    "mcp_servers",
    "context_management",
];

/// Fields the gateway owns: never sent, never disclosed.
const GATEWAY_OWNED: [&str; 3] = ["prompt_cache_key", "store", "previous_response_id"];

/// The thinking budget for a reasoning effort (OpenAI's names, plus `max`):
/// minimal 1024, low 2048, medium 8192, high 16384, xhigh and max 32000.
/// `None` for an effort this wire has no budget for.
pub fn effort_budget(effort: &str) -> Option<u64> {
    Some(match effort {
        "minimal" => 1024,
        "low" => 2048,
        "medium" => 8192,
        "high" => 16384,
        "xhigh" | "max" => 32000,
        _ => return None,
    })
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

#[derive(Serialize)]
#[serde(untagged)]
enum Content<'a> {
    Text(&'a str),
    Blocks(Vec<Block<'a>>),
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
    },
    Image {
        source: Source<'a>,
    },
    Document {
        source: Source<'a>,
        #[serde(skip_serializing_if = "Option::is_none")]
        title: Option<&'a str>,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Input<'a>,
    },
    ToolResult {
        tool_use_id: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<Content<'a>>,
        #[serde(skip_serializing_if = "is_false")]
        is_error: bool,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Source<'a> {
    Base64 { media_type: &'a str, data: &'a str },
    Url { url: &'a str },
    Text { media_type: &'a str, data: String },
}

/// `{"type":"ephemeral"}`: the caller's cache breakpoint (its `ttl` is not kept).
#[derive(Clone, Copy, Serialize)]
struct CacheControl {
    r#type: &'static str,
}

const EPHEMERAL: CacheControl = CacheControl {
    r#type: "ephemeral",
};

/// A turn's block, with the caller's cache breakpoint when it has one.
#[derive(Serialize)]
struct Marked<'a> {
    #[serde(flatten)]
    block: Block<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum TurnContent<'a> {
    Text(&'a str),
    Blocks(Vec<Marked<'a>>),
}

#[derive(Serialize)]
struct Turn<'a> {
    role: &'static str,
    content: TurnContent<'a>,
}

#[derive(Serialize)]
struct OutTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    input_schema: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
    /// Withheld until Claude's own tool search loads it.
    #[serde(skip_serializing_if = "is_false")]
    defer_loading: bool,
}

/// Anthropic's web search server tool, as the gateway declares it.
const WEB_SEARCH_TOOL: &str = r#"{"type":"web_search_20250305","name":"web_search"}"#;

/// Anthropic's tool search server tools.
const TOOL_SEARCH_BM25: &str =
    r#"{"type":"tool_search_tool_bm25_20251119","name":"tool_search_tool_bm25"}"#;
const TOOL_SEARCH_REGEX: &str =
    r#"{"type":"tool_search_tool_regex_20251119","name":"tool_search_tool_regex"}"#;

#[derive(Serialize)]
struct OutChoice<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "is_false")]
    disable_parallel_tool_use: bool,
}

/// `data:<media type>;base64,<data>`, split.
fn data_url(url: &str) -> Option<(&str, &str)> {
    url.strip_prefix("data:")?.split_once(";base64,")
}

fn image_source(url: &str) -> Source<'_> {
    match data_url(url) {
        Some((media_type, data)) => Source::Base64 { media_type, data },
        None => Source::Url { url },
    }
}

/// A document: PDF (or other binary) data as base64, plain text as a text source.
fn document_source(url: &str) -> Source<'_> {
    match data_url(url) {
        Some((media_type, data)) if media_type.starts_with("text/") => match unbase64(data) {
            Some(text) => Source::Text {
                media_type,
                data: text,
            },
            None => Source::Base64 { media_type, data },
        },
        Some((media_type, data)) => Source::Base64 { media_type, data },
        None => Source::Url { url },
    }
}

/// Decodes standard base64 (padding optional) into UTF-8 text.
fn unbase64(s: &str) -> Option<String> {
    String::from_utf8(crate::codec::decode_base64(s)?).ok()
}

/// A tool result's content: one text as a string, several parts as blocks.
fn result_content(parts: &[Part]) -> Option<Content<'_>> {
    if let [Part::Text { text }] = parts {
        return Some(Content::Text(text));
    }
    let blocks: Vec<Block> = parts.iter().filter_map(block).collect();
    (!blocks.is_empty()).then_some(Content::Blocks(blocks))
}

/// A canonical part as a content block. Left out: empty text (Anthropic refuses
/// it), thinking without a signature and encrypted reasoning with an item id (both
/// another maker's, which Anthropic cannot verify).
fn block(p: &Part) -> Option<Block<'_>> {
    Some(match p {
        Part::Text { text } if !text.is_empty() => Block::Text { text },
        Part::Text { .. } => return None,
        Part::Image { url, .. } => Block::Image {
            source: image_source(url),
        },
        Part::Document { url, name } => Block::Document {
            source: document_source(url),
            title: name.as_deref(),
        },
        Part::ToolCall {
            id,
            name,
            arguments,
        } => Block::ToolUse {
            id,
            name,
            input: Input::of(arguments),
        },
        Part::ToolResult {
            call_id,
            content,
            is_error,
        } => Block::ToolResult {
            tool_use_id: call_id,
            content: result_content(content),
            is_error: *is_error,
        },
        Part::Thinking {
            text,
            signature: Some(signature),
        } => Block::Thinking {
            thinking: text,
            signature,
        },
        Part::Thinking { .. } => return None,
        Part::EncryptedReasoning { data, id: None } => Block::RedactedThinking { data },
        Part::EncryptedReasoning { .. } => return None,
    })
}

/// The turns in Anthropic's shape, and the texts of stray system turns.
fn turns<'a>(req: &'a Request, system: &mut Vec<(&'a str, bool)>) -> Vec<Turn<'a>> {
    let mut merged: Vec<(&'static str, Vec<Marked<'a>>)> = Vec::with_capacity(req.messages.len());
    for (message, m) in req.messages.iter().enumerate() {
        let role = match m.role {
            Role::System => {
                system.extend(m.parts.iter().filter_map(|p| match p {
                    Part::Text { text } if !text.is_empty() => Some((text.as_str(), false)),
                    _ => None,
                }));
                continue;
            }
            Role::Assistant => "assistant",
            Role::User | Role::Tool => "user",
        };
        let mut blocks: Vec<Marked> = Vec::with_capacity(m.parts.len());
        for (part, p) in m.parts.iter().enumerate() {
            blocks.extend(block(p).map(|block| Marked {
                block,
                cache_control: None,
            }));
            // A mark on a part not carried holds for the block before it.
            if req
                .cache_breaks
                .contains(&CacheBreak::Part { message, part })
            {
                if let Some(last) = blocks.last_mut() {
                    last.cache_control = Some(EPHEMERAL);
                }
            }
        }
        match merged.last_mut() {
            Some((r, b)) if *r == role => b.extend(blocks),
            _ if !blocks.is_empty() => merged.push((role, blocks)),
            _ => {}
        }
    }
    merged
        .into_iter()
        .map(|(role, mut blocks)| {
            if role == "user" {
                // Stable: tool results first, each group in its order.
                blocks.sort_by_key(|b| !matches!(b.block, Block::ToolResult { .. }));
            }
            let content = match blocks.as_slice() {
                [Marked {
                    block: Block::Text { text },
                    cache_control: None,
                }] => TurnContent::Text(text),
                _ => TurnContent::Blocks(blocks),
            };
            Turn { role, content }
        })
        .collect()
}

/// The body's members in order; a later `set` of a key replaces its value.
#[derive(Default)]
struct Body {
    members: Vec<(Cow<'static, str>, Vec<u8>)>,
}

impl Body {
    fn set(&mut self, key: impl Into<Cow<'static, str>>, value: Vec<u8>) {
        let key = key.into();
        match self.members.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.members.push((key, value)),
        }
    }

    fn json<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) {
        // Serializing strings, numbers and raw JSON cannot fail.
        self.set(key, serde_json::to_vec(value).unwrap_or_default());
    }

    fn finish(self) -> Vec<u8> {
        let size: usize = self
            .members
            .iter()
            .map(|(k, v)| k.len() + v.len() + 4)
            .sum();
        let mut out = Vec::with_capacity(size + 2);
        out.push(b'{');
        for (i, (k, v)) in self.members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let _ = serde_json::to_writer(&mut out, k.as_ref());
            out.push(b':');
            out.extend_from_slice(v);
        }
        out.push(b'}');
        out
    }
}

/// The thinking budget the canonical reasoning asks for, if any.
fn thinking_budget(req: &Request, dropped: &mut Vec<String>) -> Option<u64> {
    // `summary` needs nothing: Anthropic's thinking blocks are its summaries.
    let r = req.reasoning.as_ref()?;
    let budget = match (r.budget_tokens, r.effort.as_deref()) {
        (Some(b), _) => b,
        (None, None | Some("none")) => return None,
        (None, Some(e)) => match effort_budget(e) {
            Some(b) => b,
            None => {
                dropped.push("reasoning.effort".into());
                return None;
            }
        },
    };
    Some(budget.max(MIN_THINKING_BUDGET))
}

/// `max_tokens` and the thinking budget that fits under it (Anthropic wants the
/// budget below `max_tokens`).
fn budgets(req: &Request, budget: Option<u64>, dropped: &mut Vec<String>) -> (u64, Option<u64>) {
    match (req.max_tokens, budget) {
        (Some(m), Some(b)) if b >= m => {
            if m > MIN_THINKING_BUDGET {
                (m, Some(m - 1))
            } else {
                dropped.push("reasoning.effort".into());
                (m, None)
            }
        }
        (Some(m), b) => (m, b),
        (None, Some(b)) => (b + DEFAULT_MAX_TOKENS, Some(b)),
        (None, None) => (DEFAULT_MAX_TOKENS, None),
    }
}

/// Whether an extra may go to an Anthropic rung as is.
fn forwardable(name: &str, value: &RawValue) -> bool {
    match name {
        // OpenAI has a service_tier too, with other values.
        "service_tier" => matches!(value.get(), r#""auto""# | r#""standard_only""#),
        _ => ANTHROPIC_FIELDS.contains(&name),
    }
}

fn render_tools(req: &Request) -> Option<Vec<u8>> {
    let servers = req
        .extras
        .iter()
        .filter(|e| e.name.starts_with(SERVER_TOOL_PREFIX));
    let searches = req.web_search.is_some() || req.tool_search.is_some();
    if req.tools.is_empty() && servers.clone().next().is_none() && !searches {
        return None;
    }
    let mut out = vec![b'['];
    let deferred = req
        .tool_search
        .as_ref()
        .map_or(&[][..], |_| &req.deferred[..]);
    let tools = req.tools.iter().map(|t| (t, false));
    for (i, (t, deferred)) in tools.chain(deferred.iter().map(|t| (t, true))).enumerate() {
        if out.len() > 1 {
            out.push(b',');
        }
        let tool = OutTool {
            name: &t.name,
            description: t.description.as_deref(),
            input_schema: &t.parameters,
            strict: t.strict,
            cache_control: req
                .cache_breaks
                .contains(&CacheBreak::Tool(i))
                .then_some(EPHEMERAL),
            defer_loading: deferred,
        };
        let _ = serde_json::to_writer(&mut out, &tool);
    }
    let mut put = |json: &[u8]| {
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(json);
    };
    for e in servers {
        put(e.value.get().as_bytes());
    }
    // Claude's own searches, when the request asks for them here: a messages
    // client's own server tool as it sent it, else the gateway's declaration.
    if let Some(ws) = &req.web_search {
        match (&ws.raw, ws.form) {
            (Some(raw), crate::ir::SearchForm::MessagesTool) => put(raw.get().as_bytes()),
            _ => put(WEB_SEARCH_TOOL.as_bytes()),
        }
    }
    if let Some(ts) = &req.tool_search {
        put(match ts.kind {
            crate::ir::ToolSearchKind::Bm25 => TOOL_SEARCH_BM25.as_bytes(),
            crate::ir::ToolSearchKind::Regex => TOOL_SEARCH_REGEX.as_bytes(),
        });
    }
    out.push(b']');
    Some(out)
}

fn tool_choice(req: &Request) -> Option<OutChoice<'_>> {
    let no_parallel = req.parallel_tool_calls == Some(false);
    let (kind, name) = match &req.tool_choice {
        Some(ToolChoice::Auto) => ("auto", None),
        // `none` takes no other member.
        Some(ToolChoice::None) => {
            return Some(OutChoice {
                kind: "none",
                name: None,
                disable_parallel_tool_use: false,
            })
        }
        Some(ToolChoice::Required) => ("any", None),
        Some(ToolChoice::Tool { name }) => ("tool", Some(name.as_str())),
        None if no_parallel => ("auto", None),
        None => return None,
    };
    Some(OutChoice {
        kind,
        name,
        disable_parallel_tool_use: no_parallel,
    })
}

/// The body for an Anthropic rung, from the canonical request.
pub fn render(req: &Request, model_id: &str, stream: bool) -> Rendered {
    let mut dropped = Vec::new();
    let mut body = Body::default();
    let forced_tool = matches!(
        req.tool_choice,
        Some(ToolChoice::Required | ToolChoice::Tool { .. })
    ) && !req.tools.is_empty();
    let mut budget = thinking_budget(req, &mut dropped);
    if forced_tool && budget.is_some() {
        budget = None;
        dropped.push("reasoning.effort".into());
    }
    let (max_tokens, budget) = budgets(req, budget, &mut dropped);
    body.json("model", model_id);
    body.json("max_tokens", &max_tokens);
    let mut system: Vec<(&str, bool)> = req
        .system
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.is_empty())
        .map(|(i, s)| {
            (
                s.as_str(),
                req.cache_breaks.contains(&CacheBreak::System(i)),
            )
        })
        .collect();
    let turns = turns(req, &mut system);
    match system.as_slice() {
        [] => {}
        [(one, false)] => body.json("system", one),
        many => {
            let blocks: Vec<Marked> = many
                .iter()
                .map(|&(text, marked)| Marked {
                    block: Block::Text { text },
                    cache_control: marked.then_some(EPHEMERAL),
                })
                .collect();
            body.json("system", &blocks);
        }
    }
    body.json("messages", &turns);
    if let Some(tools) = render_tools(req) {
        body.set("tools", tools);
        if let Some(choice) = tool_choice(req) {
            body.json("tool_choice", &choice);
        }
    }
    if !req.stop.is_empty() {
        body.json("stop_sequences", &req.stop);
    }
    sampling(req, budget.is_some(), &mut body, &mut dropped);
    if let Some(b) = budget {
        let thinking = format!(r#"{{"type":"enabled","budget_tokens":{b}}}"#);
        body.set("thinking", thinking.into_bytes());
    }
    match &req.response_format {
        Some(ResponseFormat::JsonSchema { schema, .. }) => {
            let mut v = br#"{"format":{"type":"json_schema","schema":"#.to_vec();
            v.extend_from_slice(schema.get().as_bytes());
            v.extend_from_slice(b"}}");
            body.set("output_config", v);
        }
        Some(ResponseFormat::JsonObject) => dropped.push("response_format".into()),
        Some(ResponseFormat::Text) | None => {}
    }
    if let Some(user) = &req.user {
        #[derive(Serialize)]
        struct Metadata<'a> {
            user_id: &'a str,
        }
        body.json("metadata", &Metadata { user_id: user });
    }
    if req.frequency_penalty.is_some() {
        dropped.push("frequency_penalty".into());
    }
    if req.presence_penalty.is_some() {
        dropped.push("presence_penalty".into());
    }
    if !req.include.is_empty() {
        dropped.push("include".into());
    }
    for e in &req.extras {
        let name = e.name.as_str();
        if name.starts_with(SERVER_TOOL_PREFIX) || GATEWAY_OWNED.contains(&name) {
            continue;
        }
        if forwardable(name, &e.value) {
            body.set(e.name.clone(), e.value.get().as_bytes().to_vec());
        } else {
            dropped.push(e.name.clone());
        }
    }
    if stream {
        body.set("stream", b"true".to_vec());
    }
    let mut seen = std::collections::HashSet::new();
    dropped.retain(|d| seen.insert(d.clone()));
    Rendered {
        body: body.finish(),
        dropped,
    }
}

/// temperature (Anthropic's range is 0 to 1: clamped), top_p and top_k. All three
/// are dropped next to thinking, which refuses them; top_p is dropped next to
/// temperature, which recent Claude models refuse together.
fn sampling(req: &Request, thinking: bool, body: &mut Body, dropped: &mut Vec<String>) {
    let fields = [
        ("temperature", req.temperature.map(|t| t.clamp(0.0, 1.0))),
        ("top_p", req.top_p),
        ("top_k", req.top_k.map(|k| k as f64)),
    ];
    for (name, value) in fields {
        match value {
            Some(_) if thinking => dropped.push(name.into()),
            Some(_) if name == "top_p" && req.temperature.is_some() => dropped.push(name.into()),
            Some(_) if name == "top_k" => body.json(name, &req.top_k),
            Some(v) => body.json(name, &v),
            None => {}
        }
    }
}

/// The client's own Messages API body for an Anthropic rung: `model` becomes the
/// rung's id and `stream` is forced; every other member is forwarded byte for byte.
pub fn render_native(body: &[u8], model_id: &str, stream: bool) -> Vec<u8> {
    let Ok(members) = members(body) else {
        // Parsed before it got here; forward as is if not.
        return body.to_vec();
    };
    let mut out = Vec::with_capacity(body.len() + model_id.len() + 16);
    out.push(b'{');
    let mut seen_stream = false;
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut out, k);
        out.push(b':');
        match k.as_ref() {
            "model" => {
                let _ = serde_json::to_writer(&mut out, model_id);
            }
            "stream" => {
                seen_stream = true;
                out.extend_from_slice(if stream { b"true" } else { b"false" });
            }
            _ => out.extend_from_slice(v.get().as_bytes()),
        }
    }
    if stream && !seen_stream {
        if !members.is_empty() {
            out.push(b',');
        }
        out.extend_from_slice(br#""stream":true"#);
    }
    out.push(b'}');
    out
}

// ---------------------------------------------------------------------------
// Answers
// ---------------------------------------------------------------------------

/// Usage as Anthropic reports it; a stream's `message_delta` may carry only some
/// members, which update those of `message_start`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    /// The split of the writes by lifetime.
    #[serde(default)]
    cache_creation: Option<CacheCreation>,
    /// Server tools Claude ran (its web searches).
    #[serde(default)]
    server_tool_use: Option<ServerToolUse>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
struct ServerToolUse {
    #[serde(default)]
    web_search_requests: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
struct CacheCreation {
    #[serde(default)]
    ephemeral_1h_input_tokens: Option<u64>,
}

impl WireUsage {
    fn merge(&mut self, o: &WireUsage) {
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

    fn canonical(&self) -> Usage {
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
struct WireError {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// A content block of an answer, flat (`content_block` of a stream too).
#[derive(Deserialize)]
struct WireBlock<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, borrow)]
    input: Option<&'a RawValue>,
    /// A text block's sources.
    #[serde(default)]
    citations: Option<Vec<WireCitation>>,
    /// A server tool result's call.
    #[serde(default)]
    tool_use_id: Option<String>,
    /// A web search result block's results (or its error object).
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
}

/// A text block's citation of a search result.
#[derive(Clone, Deserialize)]
struct WireCitation {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    cited_text: Option<String>,
}

impl WireCitation {
    /// The citation over the answer's characters `start..end`.
    fn event(&self, start: u32, end: u32) -> Option<Event> {
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
struct WireResult {
    #[serde(default)]
    url: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    page_age: Option<String>,
}

/// The query of a `web_search` server tool call's input.
fn query_of(input: &str) -> String {
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
fn search_event(id: String, query: String, content: Option<&RawValue>) -> Event {
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
struct WireMessage<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default, borrow)]
    content: Vec<WireBlock<'a>>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    stop_sequence: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<WireError>,
}

/// The canonical reason for a `stop_reason`. `pause_turn` (a server tool paused
/// the turn) ends the turn like `end_turn`; `refusal` is the provider filtering
/// its output; an exceeded context window is a length stop.
fn finish_reason(raw: &str) -> FinishReason {
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
const STOP_REFUSAL: RefusalReason = RefusalReason::Unspecified;

/// The error Anthropic answers when its output filter blocks an answer (400
/// `invalid_request_error`, in band or as the whole answer).
const FILTER_BLOCKED: &str = "content filtering policy";

/// Events for an error object: the output filter is a refusal, anything else an
/// in-band error.
fn error_event(e: &WireError) -> Event {
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
fn finish_events(
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

fn thinking_events(text: Option<String>, signature: Option<String>, out: &mut Vec<Event>) {
    if let Some(text) = text.filter(|t| !t.is_empty()) {
        out.push(Event::Thinking { text });
    }
    if let Some(signature) = signature.filter(|s| !s.is_empty()) {
        out.push(Event::ThinkingSignature { signature });
    }
}

/// One stream event's data, flat.
#[derive(Deserialize)]
struct StreamEvent<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<WireMessage<'a>>,
    #[serde(default)]
    index: Option<u32>,
    #[serde(default, borrow)]
    content_block: Option<WireBlock<'a>>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<WireError>,
}

/// A `content_block_delta`'s delta, or a `message_delta`'s.
#[derive(Deserialize)]
struct Delta {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(default)]
    partial_json: Option<String>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    stop_sequence: Option<String>,
    #[serde(default)]
    citation: Option<WireCitation>,
}

/// What a stream's content block is, by its index.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Thinking,
    /// A tool_use block and its call index (tool_use blocks counted from 0).
    Tool(u32),
    /// A `web_search` server tool call, by its place in `searches`.
    Search(usize),
    /// Other server tool blocks and unknown kinds: their deltas are skipped.
    Other,
}

/// A text block's citations, held until the block ends (its span is known
/// then).
struct Cited {
    index: u32,
    start: u32,
    citations: Vec<WireCitation>,
}

/// Decodes the Messages SSE stream.
#[derive(Default)]
pub struct Decoder {
    done: bool,
    blocks: Vec<Kind>,
    calls: u32,
    usage: WireUsage,
    /// Characters of answer text so far.
    chars: u32,
    /// The open text block, where its citations gather.
    cited: Option<Cited>,
    /// Web search calls: id and the input JSON streamed so far.
    searches: Vec<(String, String)>,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    fn block_start(&mut self, index: Option<u32>, b: WireBlock, out: &mut Vec<Event>) {
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
                Kind::Tool(call)
            }
            _ => Kind::Other,
        };
        let at = index.map_or(self.blocks.len(), |i| i as usize);
        if self.blocks.len() <= at {
            self.blocks.resize(at + 1, Kind::Other);
        }
        self.blocks[at] = kind;
    }

    /// A text block ended: its citations cover the text it held.
    fn block_stop(&mut self, index: Option<u32>, out: &mut Vec<Event>) {
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

    fn block_delta(&mut self, index: Option<u32>, d: Delta, out: &mut Vec<Event>) {
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
            (Some("input_json_delta"), Kind::Tool(call)) => {
                if let Some(arguments) = d.partial_json.filter(|a| !a.is_empty()) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unbase64_round_trips_text() {
        assert_eq!(unbase64("Zm9vYmFy").as_deref(), Some("foobar"));
        assert_eq!(unbase64("Zm8=").as_deref(), Some("fo"));
        assert_eq!(unbase64("Zg==").as_deref(), Some("f"));
        assert_eq!(unbase64("").as_deref(), Some(""));
        assert_eq!(unbase64("Z"), None);
        assert_eq!(unbase64("Zm9v!"), None);
    }

    #[test]
    fn refusal_only_for_the_output_filter() {
        let blocked = br#"{"type":"error","error":{"type":"invalid_request_error","message":"Output blocked by content filtering policy"}}"#;
        assert_eq!(refusal(400, blocked), Some(RefusalReason::ContentPolicy));
        assert_eq!(refusal(500, blocked), None);
        let other = br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too large"}}"#;
        assert_eq!(refusal(400, other), None);
        assert_eq!(refusal(400, b"not json"), None);
    }

    #[test]
    fn effort_map_is_monotonic() {
        let b: Vec<u64> = ["minimal", "low", "medium", "high", "xhigh"]
            .iter()
            .filter_map(|e| effort_budget(e))
            .collect();
        assert_eq!(b.len(), 5);
        assert!(b.windows(2).all(|w| w[0] < w[1]));
        assert!(b[0] >= MIN_THINKING_BUDGET);
        assert_eq!(effort_budget("ultra"), None);
    }
}
