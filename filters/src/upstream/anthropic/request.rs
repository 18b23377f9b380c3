//! Requests: the canonical form (or a messages client's own body) rendered for the
//! Messages API.

use super::*;

#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum Content<'a> {
    Text(&'a str),
    Blocks(Vec<Block<'a>>),
}

pub(super) fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Block<'a> {
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
pub(super) enum Source<'a> {
    Base64 { media_type: &'a str, data: &'a str },
    Url { url: &'a str },
    Text { media_type: &'a str, data: String },
}

/// `{"type":"ephemeral"}`: the caller's cache breakpoint (its `ttl` is not kept).
#[derive(Clone, Copy, Serialize)]
pub(super) struct CacheControl {
    r#type: &'static str,
}

pub(super) const EPHEMERAL: CacheControl = CacheControl {
    r#type: "ephemeral",
};

/// A turn's block, with the caller's cache breakpoint when it has one.
#[derive(Serialize)]
pub(super) struct Marked<'a> {
    #[serde(flatten)]
    pub(super) block: Block<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cache_control: Option<CacheControl>,
}

#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum TurnContent<'a> {
    Text(&'a str),
    Blocks(Vec<Marked<'a>>),
}

#[derive(Serialize)]
pub(super) struct Turn<'a> {
    pub(super) role: &'static str,
    pub(super) content: TurnContent<'a>,
}

#[derive(Serialize)]
pub(super) struct OutTool<'a> {
    pub(super) name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) description: Option<&'a str>,
    pub(super) input_schema: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) strict: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cache_control: Option<CacheControl>,
    /// Withheld until Claude's own tool search loads it.
    #[serde(skip_serializing_if = "is_false")]
    pub(super) defer_loading: bool,
}

/// Anthropic's web search server tool, as the gateway declares it.
pub(super) const WEB_SEARCH_TOOL: &str = r#"{"type":"web_search_20250305","name":"web_search"}"#;

/// Anthropic's tool search server tools.
pub(super) const TOOL_SEARCH_BM25: &str =
    r#"{"type":"tool_search_tool_bm25_20251119","name":"tool_search_tool_bm25"}"#;
pub(super) const TOOL_SEARCH_REGEX: &str =
    r#"{"type":"tool_search_tool_regex_20251119","name":"tool_search_tool_regex"}"#;

#[derive(Serialize)]
pub(super) struct OutChoice<'a> {
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) name: Option<&'a str>,
    #[serde(skip_serializing_if = "is_false")]
    pub(super) disable_parallel_tool_use: bool,
}

/// `data:<media type>;base64,<data>`, split.
pub(super) fn data_url(url: &str) -> Option<(&str, &str)> {
    url.strip_prefix("data:")?.split_once(";base64,")
}

pub(super) fn image_source(url: &str) -> Source<'_> {
    match data_url(url) {
        Some((media_type, data)) => Source::Base64 { media_type, data },
        None => Source::Url { url },
    }
}

/// A document: PDF (or other binary) data as base64, plain text as a text source.
pub(super) fn document_source(url: &str) -> Source<'_> {
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
pub(super) fn unbase64(s: &str) -> Option<String> {
    String::from_utf8(crate::codec::decode_base64(s)?).ok()
}

/// A tool result's content: one text as a string, several parts as blocks.
pub(super) fn result_content(parts: &[Part]) -> Option<Content<'_>> {
    if let [Part::Text { text }] = parts {
        return Some(Content::Text(text));
    }
    let blocks: Vec<Block> = parts.iter().filter_map(block).collect();
    (!blocks.is_empty()).then_some(Content::Blocks(blocks))
}

/// A canonical part as a content block. Left out: empty text (Anthropic refuses
/// it), thinking without a signature and encrypted reasoning with an item id (both
/// another maker's, which Anthropic cannot verify).
pub(super) fn block(p: &Part) -> Option<Block<'_>> {
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
pub(super) fn turns<'a>(req: &'a Request, system: &mut Vec<(&'a str, bool)>) -> Vec<Turn<'a>> {
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
pub(super) struct Body {
    pub(super) members: Vec<(Cow<'static, str>, Vec<u8>)>,
}

impl Body {
    pub(super) fn set(&mut self, key: impl Into<Cow<'static, str>>, value: Vec<u8>) {
        let key = key.into();
        match self.members.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => self.members.push((key, value)),
        }
    }

    pub(super) fn json<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) {
        // Serializing strings, numbers and raw JSON cannot fail.
        self.set(key, serde_json::to_vec(value).unwrap_or_default());
    }

    pub(super) fn finish(self) -> Vec<u8> {
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
pub(super) fn thinking_budget(req: &Request, dropped: &mut Vec<String>) -> Option<u64> {
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
pub(super) fn budgets(
    req: &Request,
    budget: Option<u64>,
    dropped: &mut Vec<String>,
) -> (u64, Option<u64>) {
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
pub(super) fn forwardable(name: &str, value: &RawValue) -> bool {
    match name {
        // OpenAI has a service_tier too, with other values.
        "service_tier" => matches!(value.get(), r#""auto""# | r#""standard_only""#),
        _ => ANTHROPIC_FIELDS.contains(&name),
    }
}

pub(super) fn render_tools(req: &Request) -> Option<Vec<u8>> {
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

pub(super) fn tool_choice(req: &Request) -> Option<OutChoice<'_>> {
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
    // Thinking is refused with a forced tool, and next to a tool turn whose
    // signed reasoning the client did not send back: the request goes without.
    if budget.is_some() && (forced_tool || req.tool_turn_without_signed_reasoning()) {
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
pub(super) fn sampling(req: &Request, thinking: bool, body: &mut Body, dropped: &mut Vec<String>) {
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
