//! The Bedrock Converse wire, spoken by the bedrock rungs: `POST
//! {base}/model/{modelId}/converse`, streamed as `/converse-stream` in the AWS
//! event-stream binary framing (SigV4 signing is the gateway's). See the module
//! contract in `upstream`; this module also holds the event-stream framing
//! ([`FrameDecoder`], [`encode_frame`]).
//!
//! Rendering notes:
//! - The model id goes in the path ([`path`] percent-encodes it), never the body.
//! - Adjacent turns of one role are merged (Converse wants user and assistant to
//!   alternate); empty text is left out (Converse refuses blank text blocks).
//! - Images and documents travel as bytes (`source.bytes`, the data URL's base64);
//!   an `https:` URL cannot be carried (Converse reads only bytes or S3) and the part
//!   is dropped and disclosed as `image_url` / `file`.
//! - Converse refuses tool blocks in the history without a `toolConfig`: when the
//!   request declares no tools, the called names are declared with an open object
//!   schema. Tool choice `none` has no Converse form: the tools are left out (so
//!   nothing can be called), or, when the history needs them, kept and `tool_choice`
//!   disclosed as dropped.
//! - A tool result's `status` is sent only for errors (`error`) and only to
//!   Anthropic models: Converse documents the field for them alone.
//! - Reasoning reaches only Anthropic models (a model id naming `anthropic` or
//!   `claude`), through `additionalModelRequestFields.thinking {type: enabled,
//!   budget_tokens}`: `budget_tokens` as given, or an effort's budget (at least
//!   Anthropic's 1024, below `max_tokens`). Elsewhere it is dropped and disclosed.
//!   Signed thinking and redacted thinking replay as `reasoningContent` blocks on
//!   Anthropic models; unsigned thinking is not replayed.
//! - Prompt-cache breakpoints (the caller's `cache_control` marks) become
//!   `{"cachePoint":{"type":"default"}}` blocks after the marked system block,
//!   content block or tool, on the models that cache (Claude, Nova); other
//!   models get none (a cachePoint there is a validation error) and cache
//!   nothing, as they would on their own.
//! - Structured output uses `outputConfig.textFormat` (`json_schema`, the schema as
//!   a JSON string); `json_object` asks for the schema `{"type":"object"}`.
//!
//! Decoding notes: stop reasons `end_turn` stop, `tool_use` tool_calls,
//! `max_tokens` / `model_context_window_exceeded` length, `stop_sequence`
//! stop_sequence (the matched sequence read from
//! `additionalModelResponseFields.stop_sequence`, which Claude rungs are asked
//! for through `additionalModelResponseFieldPaths`), `guardrail_intervened` / `content_filtered` a content_policy
//! refusal before any content (a content_filter finish after it),
//! `malformed_model_output` / `malformed_tool_use` an error. Usage: `inputTokens`
//! excludes cache reads and writes, so canonical input adds both; cached tokens are
//! `cacheReadInputTokens`.

use super::gemini::{data_url, effort_budget};
use super::Rendered;
use crate::ir::{
    CacheBreak, DecodeError, Event, FinishReason, Message, Part, RefusalReason, Request,
    ResponseFormat, Role, StreamDecoder, ToolChoice,
};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Anthropic's smallest thinking budget.
const MIN_CLAUDE_BUDGET: u64 = 1024;

/// The path for a model: `/model/{modelId}/converse` or `/converse-stream`, the id
/// percent-encoded (ids hold `:`, and ARNs `/`).
pub fn path(model_id: &str, stream: bool) -> String {
    let mut out = String::with_capacity(model_id.len() * 3 + 24);
    out.push_str("/model/");
    for b in model_id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out.push_str(if stream {
        "/converse-stream"
    } else {
        "/converse"
    });
    out
}

// ---------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<SystemBlock<'a>>,
    #[serde(skip_serializing_if = "InferenceConfig::is_empty")]
    inference_config: InferenceConfig<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<ToolConfig<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    additional_model_request_fields: Option<Additional>,
    /// `["/stop_sequence"]` on Claude with stop sequences: Converse names the
    /// matched one only when asked.
    #[serde(skip_serializing_if = "<[&str]>::is_empty")]
    additional_model_response_field_paths: &'static [&'static str],
    #[serde(skip_serializing_if = "Option::is_none")]
    output_config: Option<OutputConfig<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum SystemBlock<'a> {
    Text(&'a str),
    CachePoint(CachePoint),
}

/// `{"type":"default"}`, the one kind of cache point.
#[derive(Serialize)]
struct CachePoint {
    r#type: &'static str,
}

const CACHE_POINT: CachePoint = CachePoint { r#type: "default" };

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
enum Block<'a> {
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
struct Source<'a> {
    bytes: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
enum ResultBlock<'a> {
    Text(&'a str),
    Image {
        format: &'static str,
        source: Source<'a>,
    },
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
enum Reasoning<'a> {
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
enum Args<'a> {
    Raw(&'a RawValue),
    Empty(Empty),
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct InferenceConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
}

impl InferenceConfig<'_> {
    fn is_empty(&self) -> bool {
        self.max_tokens.is_none()
            && self.temperature.is_none()
            && self.top_p.is_none()
            && self.stop_sequences.is_empty()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig<'a> {
    tools: Vec<ToolEntry<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Choice<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum ToolEntry<'a> {
    ToolSpec(ToolSpec<'a>),
    CachePoint(CachePoint),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolSpec<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    input_schema: InputSchema<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
}

#[derive(Serialize)]
struct InputSchema<'a> {
    json: Schema<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Schema<'a> {
    Raw(&'a RawValue),
    AnyObject(AnyObject),
}

/// `{"type":"object"}`.
#[derive(Serialize)]
struct AnyObject {
    r#type: &'static str,
}

const ANY_OBJECT: AnyObject = AnyObject { r#type: "object" };

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Choice<'a> {
    Auto(Empty),
    Any(Empty),
    Tool { name: &'a str },
}

#[derive(Serialize)]
struct Additional {
    thinking: Thinking,
}

#[derive(Serialize)]
struct Thinking {
    r#type: &'static str,
    budget_tokens: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OutputConfig<'a> {
    text_format: TextFormat<'a>,
}

#[derive(Serialize)]
struct TextFormat<'a> {
    r#type: &'static str,
    structure: Structure<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Structure<'a> {
    json_schema: JsonSchemaDef<'a>,
}

#[derive(Serialize)]
struct JsonSchemaDef<'a> {
    /// The schema as a JSON string, as Converse wants it.
    schema: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
}

/// Whether the model is one of Anthropic's (extended thinking, signed reasoning).
fn is_claude(model_id: &str) -> bool {
    let m = model_id.to_ascii_lowercase();
    m.contains("anthropic") || m.contains("claude")
}

/// Adds `name` to the disclosed drops once.
fn drop_field(dropped: &mut Vec<String>, name: &str) {
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
        additional_model_request_fields: thinking(req, claude, &mut dropped),
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
fn disclose_unsupported(req: &Request, dropped: &mut Vec<String>) {
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

fn thinking(req: &Request, claude: bool, dropped: &mut Vec<String>) -> Option<Additional> {
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
    Some(Additional {
        thinking: Thinking {
            r#type: "enabled",
            budget_tokens: budget,
        },
    })
}

fn output_config(req: &Request) -> Option<OutputConfig<'_>> {
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
fn history_has_tools(messages: &[Message]) -> bool {
    messages.iter().any(|m| {
        m.parts
            .iter()
            .any(|p| matches!(p, Part::ToolCall { .. } | Part::ToolResult { .. }))
    })
}

/// The names called in the history, in order of first call.
fn called_names(messages: &[Message]) -> Vec<&str> {
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

fn tool_config<'a>(
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
fn image_format(mime: &str) -> Option<&'static str> {
    Some(match mime {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpeg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        _ => return None,
    })
}

/// The Converse document format of a media type.
fn document_format(mime: &str) -> Option<&'static str> {
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
fn document_name(name: Option<&str>, n: usize) -> String {
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

fn image_block(url: &str) -> Option<(&'static str, Source<'_>)> {
    let (mime, bytes) = data_url(url)?;
    Some((image_format(mime)?, Source { bytes }))
}

fn call_input(arguments: &str) -> Args<'_> {
    match serde_json::from_str::<&RawValue>(arguments) {
        Ok(raw) if raw.get().starts_with('{') => Args::Raw(raw),
        _ => Args::Empty(Empty {}),
    }
}

/// Renders turns; `claude` decides whether reasoning blocks replay.
struct Turns<'d> {
    claude: bool,
    documents: usize,
    dropped: &'d mut Vec<String>,
}

impl<'d> Turns<'d> {
    fn result<'a>(&mut self, content: &'a [Part]) -> Vec<ResultBlock<'a>> {
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

    fn block<'a>(&mut self, p: &'a Part) -> Option<Block<'a>> {
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
fn system<'a>(req: &'a Request, breaks: &[CacheBreak]) -> Vec<SystemBlock<'a>> {
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

fn messages<'a>(
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

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer<'a> {
    #[serde(default, borrow)]
    output: Option<Output<'a>>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    additional_model_response_fields: Option<ResponseFields>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Output<'a> {
    #[serde(default, borrow)]
    message: Option<OutMessage<'a>>,
}

#[derive(Deserialize)]
struct OutMessage<'a> {
    #[serde(default, borrow)]
    content: Vec<OutBlock<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OutBlock<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_use: Option<OutToolUse<'a>>,
    #[serde(default)]
    reasoning_content: Option<OutReasoning>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OutToolUse<'a> {
    tool_use_id: String,
    name: String,
    #[serde(default, borrow)]
    input: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OutReasoning {
    #[serde(default)]
    reasoning_text: Option<ReasoningText>,
    #[serde(default)]
    redacted_content: Option<String>,
}

#[derive(Deserialize)]
struct ReasoningText {
    #[serde(default)]
    text: String,
    #[serde(default)]
    signature: Option<String>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: u64,
    #[serde(default)]
    cache_write_input_tokens: u64,
}

impl WireUsage {
    fn usage(self) -> Usage {
        Usage {
            // Provider-supplied counts: saturate rather than wrap.
            input_tokens: self
                .input_tokens
                .saturating_add(self.cache_read_input_tokens)
                .saturating_add(self.cache_write_input_tokens),
            cached_tokens: self.cache_read_input_tokens,
            cache_write_tokens: self.cache_write_input_tokens,
            output_tokens: self.output_tokens,
            reasoning_tokens: 0,
            cache_write_1h_tokens: 0,
            web_search_requests: 0,
            cost_micro_usd: None,
        }
    }
}

// Stream event payloads (each carries a `p` padding member, ignored).

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockStart {
    #[serde(default)]
    content_block_index: u32,
    #[serde(default)]
    start: Option<StartKind>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartKind {
    #[serde(default)]
    tool_use: Option<ToolUseStart>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolUseStart {
    tool_use_id: String,
    name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BlockDelta<'a> {
    #[serde(default)]
    content_block_index: u32,
    #[serde(borrow)]
    delta: Delta<'a>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Delta<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_use: Option<ToolUseDelta<'a>>,
    #[serde(default)]
    reasoning_content: Option<ReasoningDelta>,
}

#[derive(Deserialize)]
struct ToolUseDelta<'a> {
    #[serde(default, borrow)]
    input: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReasoningDelta {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(default)]
    redacted_content: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageStop {
    #[serde(default)]
    stop_reason: String,
    #[serde(default)]
    additional_model_response_fields: Option<ResponseFields>,
}

/// The model's own answer fields we asked for (`/stop_sequence` on Claude).
#[derive(Deserialize)]
struct ResponseFields {
    #[serde(default)]
    stop_sequence: Option<String>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct ErrorPayload {
    #[serde(default, alias = "Message")]
    message: Option<String>,
}

/// A stateful reader of Converse answers: stream events, or one whole answer.
#[derive(Default)]
pub struct Decoder {
    started: bool,
    /// The next tool call's index.
    calls: u32,
    /// Content block index to tool-call index, for the open tool blocks.
    blocks: Vec<(u32, u32)>,
    /// Text or a tool call was emitted.
    content: bool,
    done: bool,
}

fn parse<'a, T: Deserialize<'a>>(what: &str, data: &'a [u8]) -> Result<T, DecodeError> {
    serde_json::from_slice(data).map_err(|e| DecodeError(format!("bedrock {what}: {e}")))
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    fn start(&mut self, out: &mut Vec<Event>) {
        if !std::mem::replace(&mut self.started, true) {
            // Converse reports neither an answer id nor a model id.
            out.push(Event::Start {
                id: None,
                model: None,
            });
        }
    }

    fn text(&mut self, text: &str, out: &mut Vec<Event>) {
        if !text.is_empty() {
            self.content = true;
            out.push(Event::Text {
                text: text.to_string(),
            });
        }
    }

    fn tool_start(&mut self, block: u32, id: String, name: String, out: &mut Vec<Event>) -> u32 {
        let index = self.calls;
        self.calls += 1;
        self.content = true;
        self.blocks.push((block, index));
        out.push(Event::ToolCallStart { index, id, name });
        index
    }

    fn reasoning(&mut self, r: ReasoningDelta, out: &mut Vec<Event>) {
        if let Some(text) = r.text.filter(|t| !t.is_empty()) {
            out.push(Event::Thinking { text });
        }
        if let Some(signature) = r.signature {
            out.push(Event::ThinkingSignature { signature });
        }
        if let Some(data) = r.redacted_content {
            out.push(Event::EncryptedReasoning { data, id: None });
        }
    }

    fn finish(&mut self, reason: String, fields: Option<ResponseFields>, out: &mut Vec<Event>) {
        let canonical = match reason.as_str() {
            "end_turn" => FinishReason::Stop,
            "tool_use" => FinishReason::ToolCalls,
            "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
            "stop_sequence" => FinishReason::StopSequence,
            "guardrail_intervened" | "content_filtered" => {
                if !self.content {
                    out.push(Event::Refusal {
                        reason: RefusalReason::ContentPolicy,
                        text: None,
                    });
                }
                FinishReason::ContentFilter
            }
            "malformed_model_output" | "malformed_tool_use" => {
                out.push(Event::Error {
                    message: format!("Bedrock ended the answer with {reason}"),
                });
                return;
            }
            _ => FinishReason::Stop,
        };
        out.push(Event::Finish {
            reason: canonical,
            raw: Some(reason),
            stop_sequence: fields.and_then(|f| f.stop_sequence),
        });
    }

    fn whole(&mut self, a: Answer<'_>, out: &mut Vec<Event>) {
        self.start(out);
        let blocks = a.output.and_then(|o| o.message).map(|m| m.content);
        for (i, b) in blocks.into_iter().flatten().enumerate() {
            if let Some(t) = b.text {
                self.text(&t, out);
            }
            if let Some(t) = b.tool_use {
                let block = u32::try_from(i).unwrap_or(u32::MAX);
                let index = self.tool_start(block, t.tool_use_id, t.name, out);
                let arguments = t.input.map_or("{}", RawValue::get).to_string();
                out.push(Event::ToolCallArgs { index, arguments });
            }
            if let Some(r) = b.reasoning_content {
                let (text, signature) = match r.reasoning_text {
                    Some(t) => (Some(t.text), t.signature),
                    None => (None, None),
                };
                self.reasoning(
                    ReasoningDelta {
                        text,
                        signature,
                        redacted_content: r.redacted_content,
                    },
                    out,
                );
            }
        }
        if let Some(reason) = a.stop_reason {
            self.finish(reason, a.additional_model_response_fields, out);
        }
        if let Some(u) = a.usage {
            out.push(Event::Usage(u.usage()));
        }
        self.done = true;
    }

    fn delta(&mut self, d: BlockDelta<'_>, out: &mut Vec<Event>) {
        let BlockDelta {
            content_block_index: block,
            delta,
        } = d;
        if let Some(t) = delta.text {
            self.text(&t, out);
        }
        if let Some(t) = delta.tool_use {
            let index = match self.blocks.iter().rev().find(|(b, _)| *b == block) {
                Some(&(_, index)) => index,
                // Input before its start: open the call nameless rather than lose it.
                None => self.tool_start(block, String::new(), String::new(), out),
            };
            if !t.input.is_empty() {
                out.push(Event::ToolCallArgs {
                    index,
                    arguments: t.input.into_owned(),
                });
            }
        }
        if let Some(r) = delta.reasoning_content {
            self.reasoning(r, out);
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
        let name = name.ok_or_else(|| DecodeError("bedrock frame without a type".into()))?;
        match name {
            "messageStart" => self.start(out),
            "contentBlockStart" => {
                let s: BlockStart = parse(name, data)?;
                self.start(out);
                if let Some(t) = s.start.and_then(|k| k.tool_use) {
                    self.tool_start(s.content_block_index, t.tool_use_id, t.name, out);
                }
            }
            "contentBlockDelta" => {
                let d: BlockDelta = parse(name, data)?;
                self.start(out);
                self.delta(d, out);
            }
            "contentBlockStop" => {}
            "messageStop" => {
                let s: MessageStop = parse(name, data)?;
                self.start(out);
                self.finish(s.stop_reason, s.additional_model_response_fields, out);
            }
            "metadata" => {
                let m: Metadata = parse(name, data)?;
                if let Some(u) = m.usage {
                    out.push(Event::Usage(u.usage()));
                }
                self.done = true;
            }
            exception if exception.ends_with("Exception") => {
                let p: ErrorPayload =
                    serde_json::from_slice(data).unwrap_or(ErrorPayload { message: None });
                let detail = p.message.map(|m| format!(": {m}")).unwrap_or_default();
                out.push(Event::Error {
                    message: format!("{exception}{detail}"),
                });
            }
            // Event kinds added later are not ours to fail on.
            _ => {}
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }
}

/// A whole ConverseResponse as the events its stream would give.
pub fn decode(body: &[u8]) -> Result<Vec<Event>, DecodeError> {
    let a: Answer = parse("answer", body)?;
    let mut out = Vec::new();
    Decoder::new().whole(a, &mut out);
    Ok(out)
}

/// Whether an error answer is a policy refusal: Bedrock answers a blocked output
/// with a 4xx whose message names the content filtering policy.
pub fn refusal(status: u16, body: &[u8]) -> Option<RefusalReason> {
    if !(400..500).contains(&status) {
        return None;
    }
    let p: ErrorPayload = serde_json::from_slice(body).ok()?;
    let msg = p.message?.to_ascii_lowercase();
    let filtered = msg.contains("content filtering policy")
        || (msg.contains("blocked") && msg.contains("guardrail"));
    filtered.then_some(RefusalReason::ContentPolicy)
}

// ---------------------------------------------------------------------------
// Event-stream framing
// ---------------------------------------------------------------------------

/// The largest message accepted (AWS caps payloads at 16 MiB and headers at
/// 128 KiB).
const MAX_MESSAGE: usize = (16 << 20) + (128 << 10) + 16;

/// Prelude (total length, headers length, prelude CRC) plus the message CRC.
const OVERHEAD: usize = 16;

/// One event-stream message. `event_type` is the `:event-type` header for events,
/// the `:exception-type` for exceptions and the `:error-code` for errors, so it can
/// be handed to [`Decoder`] as the frame's name; an error message's
/// `:error-message` becomes a `{"message": …}` payload.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    pub event_type: String,
    /// `event`, `exception` or `error`.
    pub message_type: String,
    pub payload: Vec<u8>,
}

/// Splits an event-stream byte stream into messages, checking both CRCs. Bytes
/// arrive in arbitrary pieces; only the unfinished tail is kept between pushes.
/// After a framing error the stream cannot be resynchronized: the error is
/// reported once, then nothing more.
#[derive(Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Where the next message starts.
    pos: usize,
    failed: bool,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// The string headers a frame needs.
#[derive(Default)]
struct Headers {
    message_type: Option<String>,
    event_type: Option<String>,
    exception_type: Option<String>,
    error_code: Option<String>,
    error_message: Option<String>,
}

fn bad_header() -> DecodeError {
    DecodeError("event-stream: malformed header".into())
}

/// Splits `n` bytes off the front of `h`.
fn take<'a>(h: &mut &'a [u8], n: usize) -> Result<&'a [u8], DecodeError> {
    if h.len() < n {
        return Err(bad_header());
    }
    let (head, rest) = h.split_at(n);
    *h = rest;
    Ok(head)
}

fn parse_headers(mut h: &[u8]) -> Result<Headers, DecodeError> {
    let mut out = Headers::default();
    while !h.is_empty() {
        let name_len = usize::from(take(&mut h, 1)?[0]);
        let name = take(&mut h, name_len)?;
        let kind = take(&mut h, 1)?[0];
        let len = match kind {
            0 | 1 => 0,
            2 => 1,
            3 => 2,
            4 => 4,
            5 | 8 => 8,
            9 => 16,
            6 | 7 => {
                let l = take(&mut h, 2)?;
                usize::from(u16::from_be_bytes([l[0], l[1]]))
            }
            _ => return Err(bad_header()),
        };
        let value = take(&mut h, len)?;
        if kind != 7 {
            continue;
        }
        let slot = match name {
            b":message-type" => &mut out.message_type,
            b":event-type" => &mut out.event_type,
            b":exception-type" => &mut out.exception_type,
            b":error-code" => &mut out.error_code,
            b":error-message" => &mut out.error_message,
            _ => continue,
        };
        *slot = Some(String::from_utf8_lossy(value).into_owned());
    }
    Ok(out)
}

fn frame_of(h: Headers, payload: &[u8]) -> Frame {
    let message_type = h.message_type.unwrap_or_else(|| "event".to_string());
    let event_type = match message_type.as_str() {
        "exception" => h.exception_type,
        "error" => h.error_code,
        _ => h.event_type,
    }
    .unwrap_or_default();
    let payload = match h.error_message {
        Some(message) if payload.is_empty() => {
            serde_json::to_vec(&serde_json::json!({ "message": message })).unwrap_or_default()
        }
        _ => payload.to_vec(),
    };
    Frame {
        event_type,
        message_type,
        payload,
    }
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes as they arrive.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > 4096 && self.pos * 2 > self.buf.len() {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    fn fail(&mut self, message: &str) -> Option<Result<Frame, DecodeError>> {
        self.failed = true;
        Some(Err(DecodeError(format!("event-stream: {message}"))))
    }

    /// The next whole message, if the buffer holds one.
    pub fn next_frame(&mut self) -> Option<Result<Frame, DecodeError>> {
        if self.failed {
            return None;
        }
        let rest = &self.buf[self.pos..];
        if rest.len() < 12 {
            return None;
        }
        let total = be32(&rest[0..4]) as usize;
        let headers_len = be32(&rest[4..8]) as usize;
        if crc32fast::hash(&rest[0..8]) != be32(&rest[8..12]) {
            return self.fail("prelude CRC mismatch");
        }
        if !(OVERHEAD..=MAX_MESSAGE).contains(&total) || headers_len > total - OVERHEAD {
            return self.fail("bad message lengths");
        }
        if rest.len() < total {
            return None;
        }
        let msg = &rest[..total];
        if crc32fast::hash(&msg[..total - 4]) != be32(&msg[total - 4..]) {
            return self.fail("message CRC mismatch");
        }
        let headers = match parse_headers(&msg[12..12 + headers_len]) {
            Ok(h) => h,
            Err(e) => {
                self.failed = true;
                return Some(Err(e));
            }
        };
        let frame = frame_of(headers, &msg[12 + headers_len..total - 4]);
        self.pos += total;
        Some(Ok(frame))
    }
}

/// One event-stream message with string headers (names longer than 255 bytes and
/// values longer than 65535 bytes are cut to fit).
pub fn encode_frame(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(headers.iter().map(|(n, v)| n.len() + v.len() + 4).sum());
    for (name, value) in headers {
        let name = &name.as_bytes()[..name.len().min(usize::from(u8::MAX))];
        let value = &value.as_bytes()[..value.len().min(usize::from(u16::MAX))];
        h.push(name.len() as u8);
        h.extend_from_slice(name);
        h.push(7);
        h.extend_from_slice(&(value.len() as u16).to_be_bytes());
        h.extend_from_slice(value);
    }
    let total = OVERHEAD + h.len() + payload.len();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&(h.len() as u32).to_be_bytes());
    let prelude_crc = crc32fast::hash(&out);
    out.extend_from_slice(&prelude_crc.to_be_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// An `event` message of type `event_type` with a JSON payload.
pub fn encode_event(event_type: &str, payload: &[u8]) -> Vec<u8> {
    encode_frame(
        &[
            (":event-type", event_type),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload,
    )
}

/// An `exception` message of type `exception_type` with a JSON payload.
pub fn encode_exception(exception_type: &str, payload: &[u8]) -> Vec<u8> {
    encode_frame(
        &[
            (":exception-type", exception_type),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        payload,
    )
}
