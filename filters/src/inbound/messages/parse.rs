//! Parsing: a messages body read member by member and validated into the canonical
//! Request (Anthropic's closed schema, its content blocks and tools).

use super::*;

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
pub(super) enum Content<'a> {
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
pub(super) struct WireBlock<'a> {
    #[serde(rename = "type", borrow)]
    pub(super) kind: Cow<'a, str>,
    #[serde(default)]
    pub(super) text: Option<String>,
    #[serde(default)]
    pub(super) id: Option<String>,
    #[serde(default)]
    pub(super) name: Option<String>,
    #[serde(default, borrow)]
    pub(super) input: Option<&'a RawValue>,
    #[serde(default)]
    pub(super) tool_use_id: Option<String>,
    #[serde(default, borrow)]
    pub(super) content: Option<Content<'a>>,
    #[serde(default)]
    pub(super) is_error: Option<bool>,
    #[serde(default)]
    pub(super) thinking: Option<String>,
    #[serde(default)]
    pub(super) signature: Option<String>,
    #[serde(default)]
    pub(super) data: Option<String>,
    #[serde(default)]
    pub(super) cache_control: Option<IgnoredAny>,
}

/// One message; an unknown member is remembered (the first one) to be refused
/// with its name.
pub(super) struct WireMessage<'a> {
    pub(super) role: Option<String>,
    pub(super) content: Option<Content<'a>>,
    pub(super) unknown: Option<String>,
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
pub(super) struct WireTool<'a> {
    #[serde(rename = "type", default, borrow)]
    pub(super) kind: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) description: Option<String>,
    #[serde(default, borrow)]
    pub(super) input_schema: Option<&'a RawValue>,
    #[serde(default)]
    pub(super) strict: Option<bool>,
    #[serde(default)]
    pub(super) cache_control: Option<IgnoredAny>,
    #[serde(default, borrow)]
    pub(super) defer_loading: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(super) struct WireToolChoice<'a> {
    #[serde(rename = "type", borrow)]
    pub(super) kind: Cow<'a, str>,
    #[serde(default)]
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) disable_parallel_tool_use: Option<bool>,
}

#[derive(Deserialize)]
pub(super) struct WireThinking<'a> {
    #[serde(rename = "type", borrow)]
    pub(super) kind: Cow<'a, str>,
    #[serde(default)]
    pub(super) budget_tokens: Option<u64>,
}

#[derive(Deserialize)]
pub(super) struct WireFormat<'a> {
    #[serde(rename = "type", borrow)]
    pub(super) kind: Cow<'a, str>,
    #[serde(default, borrow)]
    pub(super) schema: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(super) struct WireMetadata {
    #[serde(default)]
    pub(super) user_id: Option<String>,
}

/// Reads one member's value as `T`, or names it in a 400.
pub(super) fn field<'a, T: Deserialize<'a>>(
    name: &str,
    raw: &'a RawValue,
    what: &str,
) -> Result<T, ApiError> {
    serde_json::from_str(raw.get()).map_err(|_| invalid(name, format!("`{name}` must be {what}.")))
}

/// A sampling value Anthropic bounds to [0, 1].
pub(super) fn unit(name: &str, raw: &RawValue) -> Result<f64, ApiError> {
    let v: f64 = field(name, raw, "a number")?;
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid(name, format!("`{name}` must be between 0 and 1.")));
    }
    Ok(v)
}

/// Top-level members that need more than one step to read.
#[derive(Default)]
pub(super) struct Slots<'a> {
    pub(super) max_tokens: Option<&'a RawValue>,
    pub(super) messages: Option<&'a RawValue>,
    pub(super) system: Option<&'a RawValue>,
    pub(super) tools: Option<&'a RawValue>,
    pub(super) tool_choice: Option<&'a RawValue>,
    pub(super) thinking: Option<&'a RawValue>,
    pub(super) output_config: Option<&'a RawValue>,
    pub(super) output_format: Option<&'a RawValue>,
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
    parse_messages(
        messages,
        &mut req.messages,
        &mut req.cache_breaks,
        &mut req.origins,
    )?;
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

pub(super) fn parse_system(
    raw: &RawValue,
    breaks: &mut Vec<CacheBreak>,
) -> Result<Vec<String>, ApiError> {
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

pub(super) fn parse_messages(
    raw: &RawValue,
    out: &mut Vec<Message>,
    breaks: &mut Vec<CacheBreak>,
    origins: &mut Vec<Origin>,
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
        push_message(i, m, out, breaks, origins)?;
    }
    Ok(())
}

/// The slow path for a body that failed the one-pass read: finds the message or
/// block at fault to name it.
pub(super) fn locate_message_error(raw: &RawValue) -> ApiError {
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
pub(super) struct At {
    pub(super) i: usize,
    pub(super) j: usize,
    /// The position inside a tool_result's content.
    pub(super) k: Option<usize>,
}

impl At {
    pub(super) fn param(self, member: &str) -> String {
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
pub(super) fn break_after_last(out: &[Message]) -> Option<CacheBreak> {
    let message = out.len().checked_sub(1)?;
    let part = out[message].parts.len().checked_sub(1)?;
    Some(CacheBreak::Part { message, part })
}

pub(super) fn push_message(
    i: usize,
    m: WireMessage,
    out: &mut Vec<Message>,
    breaks: &mut Vec<CacheBreak>,
    origins: &mut Vec<Origin>,
) -> Result<(), ApiError> {
    let at = |j: usize| Origin {
        message: i as u32,
        block: j as u32,
    };
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
            origins.push(at(0));
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
                origins.push(at(j));
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
        origins.push(at(j));
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

pub(super) fn wrong_turn(at: At, kind: &str, turn: &str) -> ApiError {
    invalid(
        at.param(".type"),
        format!("A `{kind}` block may not appear in a {turn} turn."),
    )
}

pub(super) fn required(at: At, member: &str) -> ApiError {
    invalid(
        at.param(&format!(".{member}")),
        format!("`{member}` is required."),
    )
}

pub(super) fn text_block(at: At, b: WireBlock) -> Result<Part, ApiError> {
    let text = b.text.ok_or_else(|| required(at, "text"))?;
    Ok(Part::Text { text })
}

pub(super) fn assistant_block(at: At, b: WireBlock) -> Result<Option<Part>, ApiError> {
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
            // Unsigned (another maker's reasoning) is kept so that the route's
            // policy can refuse it where thinking is not served; Claude rungs
            // leave it out (it cannot be verified).
            Part::Thinking {
                text,
                signature: b.signature.filter(|s| !s.is_empty()),
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

pub(super) fn unknown_block(at: At, kind: &str) -> ApiError {
    invalid(
        at.param(".type"),
        format!("Unknown content block type `{kind}`."),
    )
}

pub(super) fn user_block(at: At, b: WireBlock) -> Result<Part, ApiError> {
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
pub(super) fn result_block(at: At, b: WireBlock) -> Result<Part, ApiError> {
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
pub(super) fn media_block(at: At, kind: &str) -> ApiError {
    ApiError::new(
        ErrorCode::UnsupportedCapability,
        format!(
            "{}: the messages route takes text only; `{kind}` blocks are not served.",
            at.param("")
        ),
    )
    .param(at.param(""))
}

pub(super) fn parse_tools(raw: &RawValue, req: &mut Request) -> Result<(), ApiError> {
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
pub(super) fn tool_search_kind(kind: &str) -> Option<ToolSearchKind> {
    if kind.starts_with("tool_search_tool_bm25") {
        Some(ToolSearchKind::Bm25)
    } else if kind.starts_with("tool_search_tool_regex") {
        Some(ToolSearchKind::Regex)
    } else {
        None
    }
}

pub(super) fn parse_tool_choice(raw: &RawValue, req: &mut Request) -> Result<(), ApiError> {
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
pub(super) fn parse_thinking(raw: &RawValue, req: &mut Request) -> Result<(), ApiError> {
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

pub(super) fn parse_format(param: &str, raw: &RawValue) -> Result<ResponseFormat, ApiError> {
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
pub(super) fn parse_output_config(raw: &RawValue, req: &mut Request) -> Result<(), ApiError> {
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
