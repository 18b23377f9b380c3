//! Rendering: the canonical form as a Converse request.

use super::*;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Body<'a> {
    pub(super) messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) system: Vec<SystemBlock<'a>>,
    #[serde(skip_serializing_if = "InferenceConfig::is_empty")]
    pub(super) inference_config: InferenceConfig<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tool_config: Option<ToolConfig<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) additional_model_request_fields: Option<Additional<'a>>,
    /// `["/stop_sequence"]` on Claude with stop sequences: Converse names the
    /// matched one only when asked.
    #[serde(skip_serializing_if = "<[&str]>::is_empty")]
    pub(super) additional_model_response_field_paths: &'static [&'static str],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) output_config: Option<OutputConfig<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum SystemBlock<'a> {
    Text(&'a str),
    CachePoint(CachePoint),
}

/// `{"type":"default"}`, the one kind of cache point.
#[derive(Serialize)]
pub(super) struct CachePoint {
    r#type: &'static str,
}

pub(super) const CACHE_POINT: CachePoint = CachePoint { r#type: "default" };

#[derive(Serialize)]
pub(super) struct WireMessage<'a> {
    pub(super) role: &'static str,
    pub(super) content: Vec<Block<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub(super) enum Block<'a> {
    Text(&'a str),
    Image {
        format: &'static str,
        source: Source<'a>,
    },
    Document {
        format: &'static str,
        name: String,
        source: Source<'a>,
    },
    ToolUse {
        tool_use_id: &'a str,
        name: &'a str,
        input: Args<'a>,
    },
    ToolResult {
        tool_use_id: &'a str,
        content: Vec<ResultBlock<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        status: Option<&'static str>,
    },
    ReasoningContent(Reasoning<'a>),
    CachePoint(CachePoint),
}

#[derive(Serialize)]
pub(super) struct Source<'a> {
    pub(super) bytes: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub(super) enum ResultBlock<'a> {
    Text(&'a str),
    Image {
        format: &'static str,
        source: Source<'a>,
    },
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
pub(super) enum Reasoning<'a> {
    ReasoningText {
        text: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        signature: Option<&'a str>,
    },
    RedactedContent(&'a str),
}

/// Tool-call input: the caller's JSON object, or `{}`.
#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum Args<'a> {
    Raw(&'a RawValue),
    Empty(Empty),
}

#[derive(Serialize)]
pub(super) struct Empty {}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct InferenceConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) top_p: Option<f64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub(super) stop_sequences: &'a [String],
}

impl InferenceConfig<'_> {
    pub(super) fn is_empty(&self) -> bool {
        self.max_tokens.is_none()
            && self.temperature.is_none()
            && self.top_p.is_none()
            && self.stop_sequences.is_empty()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ToolConfig<'a> {
    pub(super) tools: Vec<ToolEntry<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tool_choice: Option<Choice<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum ToolEntry<'a> {
    ToolSpec(ToolSpec<'a>),
    CachePoint(CachePoint),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ToolSpec<'a> {
    pub(super) name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) description: Option<&'a str>,
    pub(super) input_schema: InputSchema<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) strict: Option<bool>,
}

#[derive(Serialize)]
pub(super) struct InputSchema<'a> {
    pub(super) json: Schema<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum Schema<'a> {
    Raw(&'a RawValue),
    AnyObject(AnyObject),
}

/// `{"type":"object"}`.
#[derive(Serialize)]
pub(super) struct AnyObject {
    r#type: &'static str,
}

pub(super) const ANY_OBJECT: AnyObject = AnyObject { r#type: "object" };

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) enum Choice<'a> {
    Auto(Empty),
    Any(Empty),
    Tool { name: &'a str },
}

#[derive(Serialize)]
pub(super) struct Additional<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) thinking: Option<Thinking>,
    /// Beta flags of Claude on Bedrock (the 1M-token window).
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub(super) anthropic_beta: &'a [String],
}

#[derive(Serialize)]
pub(super) struct Thinking {
    r#type: &'static str,
    pub(super) budget_tokens: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct OutputConfig<'a> {
    pub(super) text_format: TextFormat<'a>,
}

#[derive(Serialize)]
pub(super) struct TextFormat<'a> {
    r#type: &'static str,
    pub(super) structure: Structure<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Structure<'a> {
    pub(super) json_schema: JsonSchemaDef<'a>,
}

#[derive(Serialize)]
pub(super) struct JsonSchemaDef<'a> {
    /// The schema as a JSON string, as Converse wants it.
    pub(super) schema: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) description: Option<&'a str>,
}

/// Whether the model is one of Anthropic's (extended thinking, signed reasoning).
pub(super) fn is_claude(model_id: &str) -> bool {
    let m = model_id.to_ascii_lowercase();
    m.contains("anthropic") || m.contains("claude")
}

/// Adds `name` to the disclosed drops once.
pub(super) fn drop_field(dropped: &mut Vec<String>, name: &str) {
    if !dropped.iter().any(|d| d == name) {
        dropped.push(name.to_string());
    }
}

/// The body for a Bedrock rung. The model id goes in the URL (see [`path`]); it
/// decides only whether reasoning can be carried.
pub fn render(req: &Request, model_id: &str, _stream: bool) -> Rendered {
    let claude = is_claude(model_id);
    let caches = claude || model_id.to_ascii_lowercase().contains("amazon.nova");
    let breaks: &[CacheBreak] = if caches { &req.cache_breaks } else { &[] };
    let mut dropped = Vec::new();
    let body = Body {
        messages: messages(&req.messages, claude, breaks, &mut dropped),
        system: system(req, breaks),
        inference_config: InferenceConfig {
            max_tokens: req.max_tokens,
            temperature: req.temperature,
            top_p: req.top_p,
            stop_sequences: &req.stop,
        },
        tool_config: tool_config(req, caches, &mut dropped),
        additional_model_request_fields: additional(req, claude, &mut dropped),
        additional_model_response_field_paths: if claude && !req.stop.is_empty() {
            &["/stop_sequence"]
        } else {
            &[]
        },
        output_config: output_config(req),
    };
    disclose_unsupported(req, &mut dropped);
    Rendered {
        // Every RawValue in the body is valid JSON: serializing cannot fail.
        body: serde_json::to_vec(&body).unwrap_or_default(),
        dropped,
    }
}

/// Request fields no Converse body carries, by their inbound names.
pub(super) fn disclose_unsupported(req: &Request, dropped: &mut Vec<String>) {
    let unsupported = [
        ("top_k", req.top_k.is_some()),
        ("frequency_penalty", req.frequency_penalty.is_some()),
        ("presence_penalty", req.presence_penalty.is_some()),
        ("parallel_tool_calls", req.parallel_tool_calls.is_some()),
        ("user", req.user.is_some()),
        ("include", !req.include.is_empty()),
        // Bedrock's Converse has no search of its own.
        ("web_search", req.web_search.is_some()),
        ("tool_search", req.tool_search.is_some()),
    ];
    for (name, set) in unsupported {
        if set {
            drop_field(dropped, name);
        }
    }
    for e in &req.extras {
        drop_field(dropped, &e.name);
    }
}

/// The Claude-only members: thinking and beta flags.
pub(super) fn additional<'a>(
    req: &'a Request,
    claude: bool,
    dropped: &mut Vec<String>,
) -> Option<Additional<'a>> {
    let thinking = thinking(req, claude, dropped);
    let anthropic_beta: &[String] = if claude { &req.anthropic_beta } else { &[] };
    (thinking.is_some() || !anthropic_beta.is_empty()).then_some(Additional {
        thinking,
        anthropic_beta,
    })
}

pub(super) fn thinking(req: &Request, claude: bool, dropped: &mut Vec<String>) -> Option<Thinking> {
    let r = req.reasoning.as_ref()?;
    if !claude {
        drop_field(dropped, "reasoning");
        return None;
    }
    let budget = match (r.budget_tokens, r.effort.as_deref()) {
        (Some(b), _) => b,
        (None, Some(effort)) => {
            let Some(b) = effort_budget(effort) else {
                drop_field(dropped, "reasoning.effort");
                return None;
            };
            if b == 0 {
                // Effort `none`: thinking stays off, which is Anthropic's default.
                return None;
            }
            let b = b.max(MIN_CLAUDE_BUDGET);
            match req.max_tokens {
                // The budget must stay below the output budget.
                Some(max) if max <= MIN_CLAUDE_BUDGET => {
                    drop_field(dropped, "reasoning");
                    return None;
                }
                Some(max) => b.min(max - 1),
                None => b,
            }
        }
        // A summary alone: Claude's thinking is summarized already.
        (None, None) => return None,
    };
    // Claude refuses thinking next to a tool turn without its signed reasoning.
    if req.tool_turn_without_signed_reasoning() {
        drop_field(dropped, "reasoning");
        return None;
    }
    Some(Thinking {
        r#type: "enabled",
        budget_tokens: budget,
    })
}

pub(super) fn output_config(req: &Request) -> Option<OutputConfig<'_>> {
    let def = match req.response_format.as_ref()? {
        ResponseFormat::Text => return None,
        ResponseFormat::JsonObject => JsonSchemaDef {
            schema: r#"{"type":"object"}"#,
            name: None,
            description: None,
        },
        ResponseFormat::JsonSchema {
            name,
            description,
            schema,
            ..
        } => JsonSchemaDef {
            schema: schema.get(),
            name: Some(name),
            description: description.as_deref(),
        },
    };
    Some(OutputConfig {
        text_format: TextFormat {
            r#type: "json_schema",
            structure: Structure { json_schema: def },
        },
    })
}

/// Whether any turn carries a tool call or result.
pub(super) fn history_has_tools(messages: &[Message]) -> bool {
    messages.iter().any(|m| {
        m.parts
            .iter()
            .any(|p| matches!(p, Part::ToolCall { .. } | Part::ToolResult { .. }))
    })
}

/// The names called in the history, in order of first call.
pub(super) fn called_names(messages: &[Message]) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for p in messages.iter().flat_map(|m| m.parts.iter()) {
        if let Part::ToolCall { name, .. } = p {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    names
}

pub(super) fn tool_config<'a>(
    req: &'a Request,
    caches: bool,
    dropped: &mut Vec<String>,
) -> Option<ToolConfig<'a>> {
    let needed = history_has_tools(&req.messages);
    if req.tools.is_empty() {
        // Converse refuses tool blocks without a toolConfig: declare what was called.
        let names = called_names(&req.messages);
        if !needed || names.is_empty() {
            return None;
        }
        let tools = names
            .into_iter()
            .map(|name| {
                ToolEntry::ToolSpec(ToolSpec {
                    name,
                    description: None,
                    input_schema: InputSchema {
                        json: Schema::AnyObject(ANY_OBJECT),
                    },
                    strict: None,
                })
            })
            .collect();
        return Some(ToolConfig {
            tools,
            tool_choice: None,
        });
    }
    let tool_choice = match &req.tool_choice {
        None => None,
        Some(ToolChoice::Auto) => Some(Choice::Auto(Empty {})),
        Some(ToolChoice::Required) => Some(Choice::Any(Empty {})),
        Some(ToolChoice::Tool { name }) => Some(Choice::Tool { name }),
        Some(ToolChoice::None) if !needed => return None,
        Some(ToolChoice::None) => {
            drop_field(dropped, "tool_choice");
            None
        }
    };
    let mut tools = Vec::with_capacity(req.tools.len() + 1);
    for (i, t) in req.tools.iter().enumerate() {
        tools.push(ToolEntry::ToolSpec(ToolSpec {
            name: &t.name,
            description: t.description.as_deref(),
            input_schema: InputSchema {
                json: Schema::Raw(&t.parameters),
            },
            strict: t.strict,
        }));
        if caches && req.cache_breaks.contains(&CacheBreak::Tool(i)) {
            tools.push(ToolEntry::CachePoint(CACHE_POINT));
        }
    }
    Some(ToolConfig { tools, tool_choice })
}

/// The Converse image format of a media type.
pub(super) fn image_format(mime: &str) -> Option<&'static str> {
    Some(match mime {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpeg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        _ => return None,
    })
}

/// The Converse document format of a media type.
pub(super) fn document_format(mime: &str) -> Option<&'static str> {
    Some(match mime {
        "application/pdf" => "pdf",
        "text/csv" => "csv",
        "application/msword" => "doc",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document" => "docx",
        "application/vnd.ms-excel" => "xls",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet" => "xlsx",
        "text/html" => "html",
        "text/plain" => "txt",
        "text/markdown" => "md",
        _ => return None,
    })
}

/// A document name Converse accepts: letters, digits, single spaces, hyphens,
/// parentheses and square brackets.
pub(super) fn document_name(name: Option<&str>, n: usize) -> String {
    let mut out = String::new();
    for c in name.unwrap_or_default().chars() {
        let keep = c.is_ascii_alphanumeric() || matches!(c, '-' | '(' | ')' | '[' | ']');
        if keep {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with(' ') {
            out.push(' ');
        }
    }
    let trimmed = out.trim_end();
    if trimmed.is_empty() {
        format!("document-{n}")
    } else {
        trimmed.to_string()
    }
}

pub(super) fn image_block(url: &str) -> Option<(&'static str, Source<'_>)> {
    let (mime, bytes) = data_url(url)?;
    Some((image_format(mime)?, Source { bytes }))
}

pub(super) fn call_input(arguments: &str) -> Args<'_> {
    match serde_json::from_str::<&RawValue>(arguments) {
        Ok(raw) if raw.get().starts_with('{') => Args::Raw(raw),
        _ => Args::Empty(Empty {}),
    }
}

/// Renders turns; `claude` decides whether reasoning blocks replay.
pub(super) struct Turns<'d> {
    pub(super) claude: bool,
    pub(super) documents: usize,
    pub(super) dropped: &'d mut Vec<String>,
}

impl<'d> Turns<'d> {
    pub(super) fn result<'a>(&mut self, content: &'a [Part]) -> Vec<ResultBlock<'a>> {
        let mut out = Vec::with_capacity(content.len());
        for p in content {
            match p {
                Part::Text { text } if !text.is_empty() => out.push(ResultBlock::Text(text)),
                Part::Image { url, .. } => match image_block(url) {
                    Some((format, source)) => out.push(ResultBlock::Image { format, source }),
                    None => drop_field(self.dropped, "image_url"),
                },
                Part::Document { .. } => drop_field(self.dropped, "file"),
                _ => {}
            }
        }
        out
    }

    pub(super) fn block<'a>(&mut self, p: &'a Part) -> Option<Block<'a>> {
        Some(match p {
            Part::Text { text } if text.is_empty() => return None,
            Part::Text { text } => Block::Text(text),
            Part::Image { url, .. } => match image_block(url) {
                Some((format, source)) => Block::Image { format, source },
                None => {
                    drop_field(self.dropped, "image_url");
                    return None;
                }
            },
            Part::Document { url, name } => {
                let doc = data_url(url)
                    .and_then(|(mime, bytes)| Some((document_format(mime)?, Source { bytes })));
                let Some((format, source)) = doc else {
                    drop_field(self.dropped, "file");
                    return None;
                };
                self.documents += 1;
                Block::Document {
                    format,
                    name: document_name(name.as_deref(), self.documents),
                    source,
                }
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => Block::ToolUse {
                tool_use_id: id,
                name,
                input: call_input(arguments),
            },
            Part::ToolResult {
                call_id,
                content,
                is_error,
            } => Block::ToolResult {
                tool_use_id: call_id,
                content: self.result(content),
                status: (*is_error && self.claude).then_some("error"),
            },
            Part::Thinking {
                text,
                signature: Some(signature),
            } if self.claude => Block::ReasoningContent(Reasoning::ReasoningText {
                text,
                signature: Some(signature),
            }),
            // Only Anthropic's own redacted thinking (no item id); an OpenAI
            // encrypted item means nothing to Claude.
            Part::EncryptedReasoning { data, id: None } if self.claude => {
                Block::ReasoningContent(Reasoning::RedactedContent(data))
            }
            Part::Thinking { .. } | Part::EncryptedReasoning { .. } => return None,
        })
    }
}

/// The system blocks, each marked one followed by a cache point.
pub(super) fn system<'a>(req: &'a Request, breaks: &[CacheBreak]) -> Vec<SystemBlock<'a>> {
    let mut out = Vec::with_capacity(req.system.len() + breaks.len());
    for (i, s) in req.system.iter().enumerate() {
        if !s.is_empty() {
            out.push(SystemBlock::Text(s));
        }
        let after_text = matches!(out.last(), Some(SystemBlock::Text(_)));
        if after_text && breaks.contains(&CacheBreak::System(i)) {
            out.push(SystemBlock::CachePoint(CACHE_POINT));
        }
    }
    out
}

pub(super) fn messages<'a>(
    messages: &'a [Message],
    claude: bool,
    breaks: &[CacheBreak],
    dropped: &mut Vec<String>,
) -> Vec<WireMessage<'a>> {
    let mut turns = Turns {
        claude,
        documents: 0,
        dropped,
    };
    let mut out: Vec<WireMessage> = Vec::with_capacity(messages.len());
    for (message, m) in messages.iter().enumerate() {
        let role = match m.role {
            Role::Assistant => "assistant",
            Role::User | Role::Tool | Role::System => "user",
        };
        let mut content: Vec<Block> = Vec::with_capacity(m.parts.len());
        for (part, p) in m.parts.iter().enumerate() {
            content.extend(turns.block(p));
            // Never first in a turn nor twice in a row: a cache point closes
            // what precedes it.
            let after_block = content
                .last()
                .is_some_and(|b| !matches!(b, Block::CachePoint(_)));
            if after_block && breaks.contains(&CacheBreak::Part { message, part }) {
                content.push(Block::CachePoint(CACHE_POINT));
            }
        }
        if content.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.role == role => last.content.extend(content),
            _ => out.push(WireMessage { role, content }),
        }
    }
    out
}
