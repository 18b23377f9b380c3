//! The messages inbound format: clients of the Anthropic Messages API calling
//! `/v1/messages` (see the module contract in `inbound`).
//!
//! Parsing maps the body onto the canonical [`Request`]. Fields the canonical form
//! does not model stay verbatim in `extras` (they reach Anthropic rungs only):
//! unknown top-level fields, the `thinking` object (also read into
//! `Request::reasoning`), an `output_config` carrying more than `format`, and server
//! tools (tool entries whose `type` is not `custom`), each kept whole under the name
//! `tools.<type>` (see [`SERVER_TOOL_PREFIX`]).
//!
//! A user turn is split into runs: `tool_result` blocks become a canonical
//! [`Role::Tool`] turn, other blocks a [`Role::User`] turn, in their order.
//! `server_tool_use` and `web_search_tool_result` blocks of assistant history (what a
//! search turn left behind) are skipped: the canonical form has no place for them.
//! So are thinking blocks without a signature: only another maker's reasoning, as
//! this gateway renders it, lacks one, and no one can verify it.
//!
//! Rendering writes the `message` object, or the Messages SSE sequence. Anthropic's
//! `usage.input_tokens` excludes cache reads while the canonical `input_tokens`
//! includes them: `input_tokens = canonical input - cached`,
//! `cache_read_input_tokens = cached`.

use crate::error::{ApiError, ErrorCode, Format};
use crate::inbound::common::{check_description, invalid, malformed, refused_everywhere};
use crate::ir::{
    CacheBreak, Event, Extra, FinishReason, Message, Meta, Part, Reasoning, Request, Response,
    ResponseFormat, Role, SearchForm, SearchResult, ServerSearch, StreamEncoder, Tail, Tool,
    ToolChoice, ToolSearch, ToolSearchKind, UrlCitation,
};
use crate::json::{Member, Members};
use crate::usage::Usage;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
use std::io::Write;

/// Top-level members of Anthropic's messages API the canonical form does not
/// model: kept verbatim for Anthropic rungs (dropped and disclosed elsewhere).
const ANTHROPIC_ONLY: [&str; 5] = [
    "service_tier",
    "container",
    "mcp_servers",
    "context_management",
    "inference_geo",
];

/// The `extras` name prefix of a server tool (`tools.web_search_20250305`): the
/// whole tool entry is the value. Anthropic rungs append it to `tools`; other rungs
/// drop and disclose it under that name.
pub const SERVER_TOOL_PREFIX: &str = "tools.";

/// The smallest thinking budget Anthropic accepts.
pub const MIN_THINKING_BUDGET: u64 = 1024;

/// Every `stop_reason` of the Messages API: a provider's raw finish string among
/// these is rendered as is.
pub const STOP_REASONS: [&str; 7] = [
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
];

// ---------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------

/// The members of a body that must be a JSON object.
pub(crate) fn members(body: &[u8]) -> Result<Vec<Member<'_>>, ApiError> {
    match serde_json::from_slice::<Members>(body) {
        Ok(m) => Ok(m.0),
        Err(e) if e.is_data() => Err(malformed("The request body must be a JSON object.")),
        Err(e) => Err(ApiError::invalid_json(e)),
    }
}

/// Message text or content blocks: `"content": "..."` or `"content": [...]`. A
/// server tool result's content may be an object (a tool search's references, a
/// web search's error): read, and refused where only text or blocks may go.
enum Content<'a> {
    Text(String),
    Blocks(Vec<WireBlock<'a>>),
    Object,
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Content<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Content::Text(s.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(Content::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(4));
                while let Some(b) = seq.next_element()? {
                    out.push(b);
                }
                Ok(Content::Blocks(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Content::Object)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// Any content block, flat: each kind reads the members it needs. `cache_control`
/// becomes a [`CacheBreak`] (its `ttl` is not modelled); members such as
/// `citations` are accepted and not modelled.
#[derive(Deserialize)]
struct WireBlock<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, borrow)]
    input: Option<&'a RawValue>,
    #[serde(default)]
    tool_use_id: Option<String>,
    #[serde(default, borrow)]
    content: Option<Content<'a>>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    cache_control: Option<IgnoredAny>,
}

/// One message; an unknown member is remembered (the first one) to be refused
/// with its name.
struct WireMessage<'a> {
    role: Option<String>,
    content: Option<Content<'a>>,
    unknown: Option<String>,
}

impl<'de> Deserialize<'de> for WireMessage<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = WireMessage<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a message object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut m = WireMessage {
                    role: None,
                    content: None,
                    unknown: None,
                };
                while let Some(k) = map.next_key::<String>()? {
                    match k.as_str() {
                        "role" => m.role = map.next_value()?,
                        "content" => m.content = map.next_value()?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            m.unknown.get_or_insert(k);
                        }
                    }
                }
                Ok(m)
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct WireTool<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default, borrow)]
    input_schema: Option<&'a RawValue>,
    #[serde(default)]
    strict: Option<bool>,
    #[serde(default)]
    cache_control: Option<IgnoredAny>,
    #[serde(default, borrow)]
    defer_loading: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct WireToolChoice<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    disable_parallel_tool_use: Option<bool>,
}

#[derive(Deserialize)]
struct WireThinking<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    budget_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireFormat<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    schema: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct WireMetadata {
    #[serde(default)]
    user_id: Option<String>,
}

/// Reads one member's value as `T`, or names it in a 400.
fn field<'a, T: Deserialize<'a>>(name: &str, raw: &'a RawValue, what: &str) -> Result<T, ApiError> {
    serde_json::from_str(raw.get()).map_err(|_| invalid(name, format!("`{name}` must be {what}.")))
}

/// A sampling value Anthropic bounds to [0, 1].
fn unit(name: &str, raw: &RawValue) -> Result<f64, ApiError> {
    let v: f64 = field(name, raw, "a number")?;
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid(name, format!("`{name}` must be between 0 and 1.")));
    }
    Ok(v)
}

/// Top-level members that need more than one step to read.
#[derive(Default)]
struct Slots<'a> {
    max_tokens: Option<&'a RawValue>,
    messages: Option<&'a RawValue>,
    system: Option<&'a RawValue>,
    tools: Option<&'a RawValue>,
    tool_choice: Option<&'a RawValue>,
    thinking: Option<&'a RawValue>,
    output_config: Option<&'a RawValue>,
    output_format: Option<&'a RawValue>,
}

/// Parses and validates a Messages API body.
pub fn parse(body: &[u8]) -> Result<Request, ApiError> {
    let mut req = Request::default();
    let mut slots = Slots::default();
    let mut model = None;
    for (key, raw) in members(body)? {
        // An explicit null means the field was not set.
        if raw.get() == "null" {
            continue;
        }
        match key.as_ref() {
            "model" => model = Some(field::<String>("model", raw, "a string")?),
            "max_tokens" => slots.max_tokens = Some(raw),
            "messages" => slots.messages = Some(raw),
            "system" => slots.system = Some(raw),
            "tools" => slots.tools = Some(raw),
            "tool_choice" => slots.tool_choice = Some(raw),
            "thinking" => slots.thinking = Some(raw),
            "output_config" => slots.output_config = Some(raw),
            "output_format" => slots.output_format = Some(raw),
            "stop_sequences" => req.stop = field(&key, raw, "an array of strings")?,
            "stream" => req.stream = field(&key, raw, "a boolean")?,
            "temperature" => req.temperature = Some(unit(&key, raw)?),
            "top_p" => req.top_p = Some(unit(&key, raw)?),
            "top_k" => req.top_k = Some(field(&key, raw, "a non-negative integer")?),
            "metadata" => {
                req.user = field::<WireMetadata>(&key, raw, "an object")?.user_id;
            }
            "plugins" => crate::inbound::common::parse_plugins(raw, &mut req)?,
            k => {
                if let Some(e) = refused_everywhere(k) {
                    return Err(e);
                }
                // Anthropic's own members the canonical form does not model reach
                // its rungs verbatim; anything else is a client's mistake, refused
                // at once rather than by every rung in turn.
                if !ANTHROPIC_ONLY.contains(&k) {
                    return Err(invalid(
                        k.to_string(),
                        format!("{k}: Extra inputs are not permitted"),
                    ));
                }
                req.extras.push(Extra {
                    name: key.into_owned(),
                    value: raw.to_owned(),
                });
            }
        }
    }
    req.model = model.ok_or_else(|| invalid("model", "`model` is required."))?;
    let max_tokens = slots
        .max_tokens
        .ok_or_else(|| invalid("max_tokens", "`max_tokens` is required."))?;
    let max_tokens: u64 = field("max_tokens", max_tokens, "a positive integer")?;
    if max_tokens == 0 {
        return Err(invalid("max_tokens", "`max_tokens` must be at least 1."));
    }
    req.max_tokens = Some(max_tokens);
    let messages = slots
        .messages
        .ok_or_else(|| invalid("messages", "`messages` is required."))?;
    parse_messages(messages, &mut req.messages, &mut req.cache_breaks)?;
    if let Some(raw) = slots.system {
        req.system = parse_system(raw, &mut req.cache_breaks)?;
    }
    if let Some(raw) = slots.tools {
        parse_tools(raw, &mut req)?;
    }
    if let Some(raw) = slots.tool_choice {
        parse_tool_choice(raw, &mut req)?;
    }
    if let Some(raw) = slots.thinking {
        parse_thinking(raw, &mut req)?;
    }
    if let Some(raw) = slots.output_format {
        req.response_format = Some(parse_format("output_format", raw)?);
    }
    if let Some(raw) = slots.output_config {
        parse_output_config(raw, &mut req)?;
    }
    crate::inbound::common::check_tool_search(&req)?;
    Ok(req)
}

fn parse_system(raw: &RawValue, breaks: &mut Vec<CacheBreak>) -> Result<Vec<String>, ApiError> {
    let content: Content = field("system", raw, "a string or an array of text blocks")?;
    match content {
        Content::Object => Err(invalid(
            "system",
            "`system` must be a string or an array of text blocks.",
        )),
        Content::Text(s) => Ok(if s.is_empty() { Vec::new() } else { vec![s] }),
        Content::Blocks(blocks) => {
            let mut out = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.into_iter().enumerate() {
                if b.kind != "text" {
                    return Err(invalid(
                        format!("system[{j}].type"),
                        "System blocks must be of type `text`.",
                    ));
                }
                let text = b
                    .text
                    .ok_or_else(|| invalid(format!("system[{j}].text"), "`text` is required."))?;
                if !text.is_empty() {
                    out.push(text);
                }
                // A mark on an empty block holds for what came before it.
                if b.cache_control.is_some() && !out.is_empty() {
                    breaks.push(CacheBreak::System(out.len() - 1));
                }
            }
            Ok(out)
        }
    }
}

fn parse_messages(
    raw: &RawValue,
    out: &mut Vec<Message>,
    breaks: &mut Vec<CacheBreak>,
) -> Result<(), ApiError> {
    let msgs: Vec<WireMessage> = match serde_json::from_str(raw.get()) {
        Ok(m) => m,
        Err(_) => return Err(locate_message_error(raw)),
    };
    if msgs.is_empty() {
        return Err(invalid(
            "messages",
            "`messages` must hold at least one message.",
        ));
    }
    out.reserve(msgs.len());
    for (i, m) in msgs.into_iter().enumerate() {
        push_message(i, m, out, breaks)?;
    }
    Ok(())
}

/// The slow path for a body that failed the one-pass read: finds the message or
/// block at fault to name it.
fn locate_message_error(raw: &RawValue) -> ApiError {
    #[derive(Deserialize)]
    struct Loose<'a> {
        #[serde(default, borrow)]
        role: Option<&'a RawValue>,
        #[serde(default, borrow)]
        content: Option<&'a RawValue>,
    }
    let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(raw.get()) else {
        return invalid(
            "messages",
            "`messages` must be an array of message objects.",
        );
    };
    for (i, m) in items.iter().enumerate() {
        if serde_json::from_str::<WireMessage>(m.get()).is_ok() {
            continue;
        }
        let Ok(loose) = serde_json::from_str::<Loose>(m.get()) else {
            return invalid(format!("messages[{i}]"), "Each message must be an object.");
        };
        if loose.role.is_some_and(|r| !r.get().starts_with('"')) {
            return invalid(format!("messages[{i}].role"), "`role` must be a string.");
        }
        if let Some(c) = loose.content {
            let Ok(blocks) = serde_json::from_str::<Vec<&RawValue>>(c.get()) else {
                return invalid(
                    format!("messages[{i}].content"),
                    "`content` must be a string or an array of content blocks.",
                );
            };
            for (j, b) in blocks.iter().enumerate() {
                if serde_json::from_str::<WireBlock>(b.get()).is_err() {
                    return invalid(
                        format!("messages[{i}].content[{j}]"),
                        "The content block is malformed.",
                    );
                }
            }
        }
        return invalid(format!("messages[{i}]"), "The message is malformed.");
    }
    invalid("messages", "`messages` is malformed.")
}

/// Where a block sits, for naming it in errors (built only when one occurs).
#[derive(Clone, Copy)]
struct At {
    i: usize,
    j: usize,
    /// The position inside a tool_result's content.
    k: Option<usize>,
}

impl At {
    fn param(self, member: &str) -> String {
        match self.k {
            Some(k) => format!(
                "messages[{}].content[{}].content[{k}]{member}",
                self.i, self.j
            ),
            None => format!("messages[{}].content[{}]{member}", self.i, self.j),
        }
    }
}

/// The break after the last part of the last message, if there is a part.
fn break_after_last(out: &[Message]) -> Option<CacheBreak> {
    let message = out.len().checked_sub(1)?;
    let part = out[message].parts.len().checked_sub(1)?;
    Some(CacheBreak::Part { message, part })
}

fn push_message(
    i: usize,
    m: WireMessage,
    out: &mut Vec<Message>,
    breaks: &mut Vec<CacheBreak>,
) -> Result<(), ApiError> {
    if let Some(key) = m.unknown {
        return Err(invalid(
            format!("messages[{i}].{key}"),
            format!("Unknown message field `{key}`."),
        ));
    }
    let assistant = match m.role.as_deref() {
        Some("user") => false,
        Some("assistant") => true,
        _ => {
            return Err(invalid(
                format!("messages[{i}].role"),
                "`role` must be `user` or `assistant`.",
            ))
        }
    };
    let role = if assistant {
        Role::Assistant
    } else {
        Role::User
    };
    let blocks = match m.content {
        None => {
            return Err(invalid(
                format!("messages[{i}].content"),
                "`content` is required.",
            ))
        }
        Some(Content::Text(s)) => {
            out.push(Message {
                role,
                parts: vec![Part::Text { text: s }],
            });
            return Ok(());
        }
        Some(Content::Blocks(b)) => b,
        Some(Content::Object) => {
            return Err(invalid(
                format!("messages[{i}].content"),
                "`content` must be a string or an array of content blocks.",
            ))
        }
    };
    if assistant {
        let mut parts = Vec::with_capacity(blocks.len());
        for (j, b) in blocks.into_iter().enumerate() {
            let marked = b.cache_control.is_some();
            if let Some(p) = assistant_block(At { i, j, k: None }, b)? {
                parts.push(p);
            }
            // A mark on a block not carried holds for the part before it.
            if marked && !parts.is_empty() {
                breaks.push(CacheBreak::Part {
                    message: out.len(),
                    part: parts.len() - 1,
                });
            }
        }
        out.push(Message { role, parts });
        return Ok(());
    }
    // A user turn: runs of tool results become tool turns.
    let start = out.len();
    for (j, b) in blocks.into_iter().enumerate() {
        let marked = b.cache_control.is_some();
        let p = user_block(At { i, j, k: None }, b)?;
        let want = if matches!(p, Part::ToolResult { .. }) {
            Role::Tool
        } else {
            Role::User
        };
        let joins = out.len() > start && out.last().is_some_and(|m| m.role == want);
        match out.last_mut() {
            Some(last) if joins => last.parts.push(p),
            _ => out.push(Message {
                role: want,
                parts: vec![p],
            }),
        }
        if marked {
            breaks.extend(break_after_last(out));
        }
    }
    if out.len() == start {
        out.push(Message {
            role: Role::User,
            parts: Vec::new(),
        });
    }
    Ok(())
}

fn wrong_turn(at: At, kind: &str, turn: &str) -> ApiError {
    invalid(
        at.param(".type"),
        format!("A `{kind}` block may not appear in a {turn} turn."),
    )
}

fn required(at: At, member: &str) -> ApiError {
    invalid(
        at.param(&format!(".{member}")),
        format!("`{member}` is required."),
    )
}

fn text_block(at: At, b: WireBlock) -> Result<Part, ApiError> {
    let text = b.text.ok_or_else(|| required(at, "text"))?;
    Ok(Part::Text { text })
}

fn assistant_block(at: At, b: WireBlock) -> Result<Option<Part>, ApiError> {
    let part = match b.kind.as_ref() {
        "text" => text_block(at, b)?,
        "tool_use" => {
            let id = b.id.ok_or_else(|| required(at, "id"))?;
            let name = b.name.ok_or_else(|| required(at, "name"))?;
            let arguments = b
                .input
                .map_or_else(|| "{}".to_owned(), |r| r.get().to_owned());
            Part::ToolCall {
                id,
                name,
                arguments,
            }
        }
        "thinking" => {
            let text = b.thinking.ok_or_else(|| required(at, "thinking"))?;
            match b.signature.filter(|s| !s.is_empty()) {
                Some(signature) => Part::Thinking {
                    text,
                    signature: Some(signature),
                },
                // Unsigned (another maker's reasoning, as rendered here):
                // unverifiable, so not carried back.
                None => return Ok(None),
            }
        }
        "redacted_thinking" => Part::EncryptedReasoning {
            data: b.data.ok_or_else(|| required(at, "data"))?,
            id: None,
        },
        // What a search turn left in history: nothing canonical to carry.
        "server_tool_use" | "web_search_tool_result" | "tool_search_tool_result" => {
            return Ok(None)
        }
        k @ ("image" | "document" | "tool_result") => return Err(wrong_turn(at, k, "assistant")),
        _ => return Err(unknown_block(at, &b.kind)),
    };
    Ok(Some(part))
}

fn unknown_block(at: At, kind: &str) -> ApiError {
    invalid(
        at.param(".type"),
        format!("Unknown content block type `{kind}`."),
    )
}

fn user_block(at: At, b: WireBlock) -> Result<Part, ApiError> {
    match b.kind.as_ref() {
        "text" => text_block(at, b),
        k @ ("image" | "document") => Err(media_block(at, k)),
        "tool_result" => {
            let call_id = b.tool_use_id.ok_or_else(|| required(at, "tool_use_id"))?;
            let content = match b.content {
                None => Vec::new(),
                Some(Content::Text(text)) => vec![Part::Text { text }],
                Some(Content::Blocks(blocks)) => {
                    let mut parts = Vec::with_capacity(blocks.len());
                    for (k, inner) in blocks.into_iter().enumerate() {
                        parts.push(result_block(At { k: Some(k), ..at }, inner)?);
                    }
                    parts
                }
                Some(Content::Object) => {
                    return Err(invalid(
                        at.param(".content"),
                        "A tool result's `content` must be a string or an array of blocks.",
                    ))
                }
            };
            Ok(Part::ToolResult {
                call_id,
                content,
                is_error: b.is_error.unwrap_or(false),
            })
        }
        k @ ("tool_use" | "thinking" | "redacted_thinking" | "server_tool_use") => {
            Err(wrong_turn(at, k, "user"))
        }
        _ => Err(unknown_block(at, &b.kind)),
    }
}

/// A block inside a tool_result's content: text, image or document.
fn result_block(at: At, b: WireBlock) -> Result<Part, ApiError> {
    match b.kind.as_ref() {
        "text" => text_block(at, b),
        k @ ("image" | "document") => Err(media_block(at, k)),
        _ => Err(invalid(
            at.param(".type"),
            format!("A tool result may not hold a `{}` block.", b.kind),
        )),
    }
}

/// Image and document blocks: the messages route serves text only (SPEC,
/// messages route limits), whatever the rung; refused before anything is sent.
fn media_block(at: At, kind: &str) -> ApiError {
    ApiError::new(
        ErrorCode::UnsupportedCapability,
        format!(
            "{}: the messages route takes text only; `{kind}` blocks are not served.",
            at.param("")
        ),
    )
    .param(at.param(""))
}

fn parse_tools(raw: &RawValue, req: &mut Request) -> Result<(), ApiError> {
    let items: Vec<&RawValue> = field("tools", raw, "an array of tools")?;
    req.tools.reserve(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let t: WireTool = serde_json::from_str(item.get())
            .map_err(|_| invalid(format!("tools[{i}]"), "The tool is malformed."))?;
        if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
            if kind.starts_with("web_search_") {
                let ws = crate::inbound::common::want_web_search(req, SearchForm::MessagesTool);
                ws.raw = Some(item.to_owned());
            } else if let Some(search) = tool_search_kind(kind) {
                req.tool_search = Some(Box::new(ToolSearch {
                    kind: search,
                    max_results: None,
                }));
            } else {
                req.extras.push(Extra {
                    name: format!("{SERVER_TOOL_PREFIX}{kind}"),
                    value: item.to_owned(),
                });
            }
            continue;
        }
        let name = t
            .name
            .filter(|n| !n.is_empty())
            .ok_or_else(|| invalid(format!("tools[{i}].name"), "`name` is required."))?;
        let schema = t.input_schema.ok_or_else(|| {
            invalid(
                format!("tools[{i}].input_schema"),
                "`input_schema` is required.",
            )
        })?;
        if let Some(d) = &t.description {
            check_description(format!("tools[{i}].description"), d)?;
        }
        let tool = Tool {
            name,
            description: t.description,
            parameters: schema.to_owned(),
            strict: t.strict,
        };
        if crate::inbound::common::defer_loading(
            t.defer_loading,
            format!("tools[{i}].defer_loading"),
        )? {
            req.deferred.push(tool);
            continue;
        }
        req.tools.push(tool);
        if t.cache_control.is_some() {
            req.cache_breaks.push(CacheBreak::Tool(req.tools.len() - 1));
        }
    }
    Ok(())
}

/// The tool search of a messages server tool type (`tool_search_tool_bm25_…`,
/// `tool_search_tool_regex_…`).
fn tool_search_kind(kind: &str) -> Option<ToolSearchKind> {
    if kind.starts_with("tool_search_tool_bm25") {
        Some(ToolSearchKind::Bm25)
    } else if kind.starts_with("tool_search_tool_regex") {
        Some(ToolSearchKind::Regex)
    } else {
        None
    }
}

fn parse_tool_choice(raw: &RawValue, req: &mut Request) -> Result<(), ApiError> {
    let c: WireToolChoice = field("tool_choice", raw, "an object with a `type`")?;
    req.tool_choice = Some(match c.kind.as_ref() {
        "auto" => ToolChoice::Auto,
        "any" => ToolChoice::Required,
        "none" => ToolChoice::None,
        "tool" => ToolChoice::Tool {
            name: c
                .name
                .ok_or_else(|| invalid("tool_choice.name", "`name` is required."))?,
        },
        _ => {
            return Err(invalid(
                "tool_choice.type",
                "`type` must be `auto`, `any`, `tool` or `none`.",
            ))
        }
    });
    if c.disable_parallel_tool_use == Some(true) {
        req.parallel_tool_calls = Some(false);
    }
    Ok(())
}

/// `thinking` sets `reasoning` and stays verbatim in `extras` for Anthropic rungs.
fn parse_thinking(raw: &RawValue, req: &mut Request) -> Result<(), ApiError> {
    let t: WireThinking = field("thinking", raw, "an object with a `type`")?;
    match t.kind.as_ref() {
        "enabled" => {
            let budget = t
                .budget_tokens
                .ok_or_else(|| invalid("thinking.budget_tokens", "`budget_tokens` is required."))?;
            if budget < MIN_THINKING_BUDGET {
                return Err(invalid(
                    "thinking.budget_tokens",
                    format!("`budget_tokens` must be at least {MIN_THINKING_BUDGET}."),
                ));
            }
            req.reasoning = Some(Reasoning {
                budget_tokens: Some(budget),
                ..Reasoning::default()
            });
        }
        // The model picks its own budget.
        "adaptive" => req.reasoning = Some(Reasoning::default()),
        "disabled" => return Ok(()),
        _ => {
            return Err(invalid(
                "thinking.type",
                "`type` must be `enabled`, `adaptive` or `disabled`.",
            ))
        }
    }
    req.extras.push(Extra {
        name: "thinking".into(),
        value: raw.to_owned(),
    });
    Ok(())
}

fn parse_format(param: &str, raw: &RawValue) -> Result<ResponseFormat, ApiError> {
    let f: WireFormat = field(param, raw, "an object with a `type`")?;
    if f.kind != "json_schema" {
        return Err(invalid(
            format!("{param}.type"),
            "`type` must be `json_schema`.",
        ));
    }
    let schema = f
        .schema
        .ok_or_else(|| invalid(format!("{param}.schema"), "`schema` is required."))?;
    Ok(ResponseFormat::JsonSchema {
        name: "response".into(),
        description: None,
        schema: schema.to_owned(),
        // Anthropic always enforces the schema (constrained decoding).
        strict: Some(true),
    })
}

/// `output_config.format` is structured output; any other member (e.g. `effort`)
/// keeps the whole object verbatim in `extras`.
fn parse_output_config(raw: &RawValue, req: &mut Request) -> Result<(), ApiError> {
    let members = members(raw.get().as_bytes())
        .map_err(|_| invalid("output_config", "`output_config` must be an object."))?;
    let mut other = false;
    for (key, value) in &members {
        match key.as_ref() {
            "format" if value.get() != "null" => {
                req.response_format = Some(parse_format("output_config.format", value)?);
            }
            "format" => {}
            _ => other = true,
        }
    }
    if other {
        req.extras.push(Extra {
            name: "output_config".into(),
            value: raw.to_owned(),
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Whole answers
// ---------------------------------------------------------------------------

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
enum OutBlock<'a> {
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
struct Query<'a> {
    query: &'a str,
}

/// One result of a `web_search_tool_result` block.
#[derive(Serialize)]
struct ResultOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    url: &'a str,
    title: &'a str,
    /// Anthropic's opaque copy of the page for later turns; a search the gateway
    /// ran gives the snippet it found.
    encrypted_content: &'a str,
    page_age: Option<&'a str>,
}

/// A text block's citation of a web search result.
#[derive(Serialize)]
struct CitationOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    url: &'a str,
    title: &'a str,
    /// Where the source sits among the results, opaque to the client.
    encrypted_index: String,
    cited_text: &'a str,
}

impl<'a> CitationOut<'a> {
    fn of(c: &'a UrlCitation, span: &'a str) -> Self {
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
fn search_id(s: &ServerSearch) -> String {
    if s.id.starts_with("srvtoolu_") {
        s.id.clone()
    } else {
        format!("srvtoolu_{}", s.id)
    }
}

/// The two blocks that show a search run on the server side.
fn search_blocks(s: &ServerSearch) -> [OutBlock<'_>; 2] {
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

fn result_out(r: &SearchResult) -> ResultOut<'_> {
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
fn text_blocks<'a>(
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
struct ServerToolUse {
    web_search_requests: u64,
}

/// Usage in the Messages API's names.
#[derive(Serialize)]
struct OutUsage {
    input_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
    output_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_tool_use: Option<ServerToolUse>,
    /// What the call cost, in USD.
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<f64>,
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
            }),
            cost: u.cost_usd(),
        }
    }
}

#[derive(Serialize)]
struct OutMessage<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<OutBlock<'a>>,
    stop_reason: &'a str,
    stop_sequence: Option<&'a str>,
    usage: OutUsage,
    provider: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    x_gateway: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(rename = "x-service-ignored-parameters")]
    x_service_ignored_parameters: Option<&'a str>,
}

/// An answer part as a content block. Thinking without a signature (another maker's
/// reasoning) gets an empty one, as a stream would show it.
fn out_block(p: &Part) -> Option<OutBlock<'_>> {
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
fn message_id<'a>(id: Option<&'a str>, meta: &'a Meta) -> Cow<'a, str> {
    match id {
        Some(id) if id.starts_with("msg_") => Cow::Borrowed(id),
        _ if meta.fallback_id.starts_with("msg_") => Cow::Borrowed(&meta.fallback_id),
        _ if !meta.fallback_id.is_empty() => Cow::Owned(format!("msg_{}", meta.fallback_id)),
        _ => Cow::Owned(format!("msg_{}", id.unwrap_or_default())),
    }
}

/// The `stop_reason`: a cut stream is `max_tokens`; a refusal is `refusal`; a raw
/// reason that is already a Messages one is kept; else the canonical reason maps.
fn stop_reason(
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
fn stop_sequence<'a>(stop: &str, named: Option<&'a str>, meta: &'a Meta) -> Option<&'a str> {
    if stop != "stop_sequence" {
        return None;
    }
    named.or(meta.stop_sequence.as_deref())
}

/// The gateway's final usage when it has one, else what the provider reported.
fn final_usage(tail: &Tail, seen: Option<Usage>) -> Usage {
    if tail.usage != Usage::default() {
        tail.usage
    } else {
        seen.unwrap_or_default()
    }
}

/// The receipt as raw JSON, when it is some.
fn receipt(tail: &Tail) -> Option<&RawValue> {
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

// ---------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------

/// Writes a JSON string.
fn put_str(out: &mut Vec<u8>, s: &str) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn put_num(out: &mut Vec<u8>, n: u64) {
    let _ = write!(out, "{n}");
}

/// Opens a named SSE frame; the JSON data follows, then [`close_frame`].
fn open_frame(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
}

fn close_frame(out: &mut Vec<u8>) {
    out.extend_from_slice(b"\n\n");
}

fn stop_frame(out: &mut Vec<u8>, index: u32) {
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
enum Block {
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
    meta: Meta,
    id: Option<String>,
    model: Option<String>,
    started: bool,
    /// The open block and its index.
    open: Option<(Block, u32)>,
    /// The index the next block gets.
    next: u32,
    /// Block index of each tool call, by call index.
    calls: Vec<(u32, u32)>,
    usage: Option<Usage>,
    finish: Option<FinishReason>,
    raw: Option<String>,
    /// The stop sequence the provider named.
    stop_sequence: Option<String>,
    refused: bool,
    /// The open thinking block got its signature: more thinking opens another.
    signed: bool,
    /// The index of the last text block: citations go there.
    last_text: Option<u32>,
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
    fn search(&mut self, s: &ServerSearch, out: &mut Vec<u8>) {
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
    fn cite(&mut self, c: &UrlCitation, out: &mut Vec<u8>) {
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

    fn ensure_started(&mut self, out: &mut Vec<u8>) {
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

    fn close(&mut self, out: &mut Vec<u8>) {
        if let Some((_, index)) = self.open.take() {
            stop_frame(out, index);
        }
    }

    /// Makes `kind` the open block, closing another one first. `start` writes the
    /// `content_block` object. Returns the block's index.
    fn open(&mut self, kind: Block, out: &mut Vec<u8>, start: impl FnOnce(&mut Vec<u8>)) -> u32 {
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
    fn delta(out: &mut Vec<u8>, index: u32, delta_type: &str, field: &str, value: &str) {
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

    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() {
            return;
        }
        let index = self.open(Block::Text, out, |o| {
            o.extend_from_slice(br#"{"type":"text","text":""}"#)
        });
        self.last_text = Some(index);
        Self::delta(out, index, "text_delta", "text", text);
    }

    fn open_thinking(&mut self, out: &mut Vec<u8>) -> u32 {
        self.open(Block::Thinking, out, |o| {
            o.extend_from_slice(br#"{"type":"thinking","thinking":"","signature":""}"#)
        })
    }

    fn tool_start(&mut self, call: u32, id: &str, name: &str, out: &mut Vec<u8>) {
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

    fn tool_args(&mut self, call: u32, arguments: &str, out: &mut Vec<u8>) {
        if arguments.is_empty() {
            return;
        }
        // Arguments of a call whose block was closed still go to its index.
        let Some(&(_, index)) = self.calls.iter().rev().find(|(c, _)| *c == call) else {
            return;
        };
        Self::delta(out, index, "input_json_delta", "partial_json", arguments);
    }

    fn redacted(&mut self, data: &str, out: &mut Vec<u8>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_message_ids() {
        let meta = Meta {
            fallback_id: "abc".into(),
            ..Meta::default()
        };
        assert_eq!(message_id(Some("msg_1"), &meta), "msg_1");
        assert_eq!(message_id(Some("chatcmpl-1"), &meta), "msg_abc");
        assert_eq!(message_id(None, &Meta::default()), "msg_");
    }
}
