//! The Gemini generateContent wire, spoken by the google rungs (Google AI:
//! `POST {base}/v1beta/models/{model}:generateContent`, streamed as
//! `:streamGenerateContent?alt=sse`) and by vertex rungs (the same body on Vertex's
//! own URL). See the module contract in `upstream`.
//!
//! Rendering notes:
//! - Turns become `contents` of role `user` / `model`; tool turns are `user` turns of
//!   `functionResponse` parts, and adjacent turns of one role are merged (parallel
//!   tool results travel together).
//! - A `functionResponse` needs the function's name: it is taken from the nearest
//!   earlier tool call with the result's id. The result goes in `response.output`
//!   (`response.error` when the result is an error), as the API documents.
//! - Gemini signs its reasoning with `thoughtSignature` on the part after the
//!   thoughts. A signed [`Part::Thinking`] puts its signature on the next part of the
//!   turn; thought text itself is not replayed. A model turn whose first function
//!   call has no signature gets the documented placeholder
//!   `skip_thought_signature_validator` (Gemini 3 refuses unsigned calls in history,
//!   e.g. a conversation begun on another maker's rung).
//! - Tool schemas go as `parametersJsonSchema` and structured output as
//!   `responseJsonSchema`: plain JSON Schema, no OpenAPI subset conversion.
//! - Reasoning: `budget_tokens` is `thinkingBudget` on every model (Gemini 3 still
//!   takes a budget). An effort is a `thinkingLevel` on Gemini 3 and later (the
//!   model id's generation): Pro takes `low` and `high` (none, minimal and low are
//!   `low`; medium and above `high`), the others also `minimal` and `medium`
//!   (none is `minimal`, Gemini 3 cannot turn thinking off; above high is
//!   `high`). Earlier models take an effort as a budget (none 0, minimal 512,
//!   low 1024, medium 8192, high and above 24576). The two are never sent
//!   together (Gemini refuses that). `includeThoughts` is set when a reasoning
//!   summary is asked for.
//!
//! Decoding notes: thought parts are [`Event::Thinking`], signatures
//! [`Event::ThinkingSignature`] (emitted before the part they ride on), function
//! calls get the id Gemini gives or a synthesized `call_<n>` (n counts the answer's
//! calls, so a whole answer and its stream agree). Usage: input counts the prompt
//! (cached content included) plus tool-use prompt tokens; output counts candidates
//! plus thoughts. Refusal reasons (Gemini has no CBRN or cyber category:
//! `HARM_CATEGORY_DANGEROUS_CONTENT` covers both, so it stays content policy):
//!
//! | Gemini reason | refusal_reason |
//! |---|---|
//! | SAFETY, BLOCKLIST, PROHIBITED_CONTENT, IMAGE_SAFETY, IMAGE_PROHIBITED_CONTENT, JAILBREAK | content_policy |
//! | RECITATION, IMAGE_RECITATION | recitation |
//! | SPII, MODEL_ARMOR | data_inspection |
//! | promptFeedback OTHER / anything else | unspecified |
//!
//! A blocked finish before any content is a refusal; after content it is a
//! `content_filter` finish.

use super::Rendered;
use crate::ir::{
    DecodeError, Event, FinishReason, Message, Part, RefusalReason, Request, ResponseFormat, Role,
    StreamDecoder, ToolChoice,
};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The documented placeholder for a function call whose signature is unknown.
const SKIP_SIGNATURE: &str = "skip_thought_signature_validator";

/// The largest thinking budget every current Gemini model accepts.
const MAX_BUDGET: u64 = 24_576;

/// The Google AI path for a model: `/v1beta/models/{model}:generateContent`, or the
/// SSE stream method.
pub fn path(model_id: &str, stream: bool) -> String {
    let model = model_id.strip_prefix("models/").unwrap_or(model_id);
    if stream {
        format!("/v1beta/models/{model}:streamGenerateContent?alt=sse")
    } else {
        format!("/v1beta/models/{model}:generateContent")
    }
}

// ---------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    contents: Vec<Content<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_instruction: Option<Instruction<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Tools<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<ToolConfig<'a>>,
    #[serde(skip_serializing_if = "GenerationConfig::is_empty")]
    generation_config: GenerationConfig<'a>,
}

#[derive(Serialize)]
struct Content<'a> {
    role: &'static str,
    parts: Vec<WirePart<'a>>,
}

#[derive(Serialize)]
struct Instruction<'a> {
    parts: Vec<TextOnly<'a>>,
}

#[derive(Serialize)]
struct TextOnly<'a> {
    text: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WirePart<'a> {
    #[serde(flatten)]
    data: Kind<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thought_signature: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase")]
enum Kind<'a> {
    Text(&'a str),
    InlineData {
        mime_type: &'a str,
        data: &'a str,
    },
    FileData {
        #[serde(skip_serializing_if = "Option::is_none")]
        mime_type: Option<&'static str>,
        file_uri: &'a str,
    },
    FunctionCall {
        name: &'a str,
        args: Args<'a>,
    },
    FunctionResponse {
        name: &'a str,
        response: FnResult<'a>,
    },
}

/// Function-call arguments: the caller's JSON object, or `{}` when it sent none.
#[derive(Serialize)]
#[serde(untagged)]
enum Args<'a> {
    Raw(&'a RawValue),
    Empty(Empty),
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct FnResult<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Cow<'a, str>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Tools<'a> {
    #[serde(rename_all = "camelCase")]
    Functions {
        function_declarations: Vec<FunctionDecl<'a>>,
    },
    /// Grounding with Google Search: Gemini's own web search.
    Search { google_search: Empty },
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FunctionDecl<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    parameters_json_schema: &'a RawValue,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig<'a> {
    function_calling_config: CallingConfig<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CallingConfig<'a> {
    mode: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    allowed_function_names: Vec<&'a str>,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_mime_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_json_schema: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking_config: Option<ThinkingConfig>,
}

impl GenerationConfig<'_> {
    fn is_empty(&self) -> bool {
        self.max_output_tokens.is_none()
            && self.temperature.is_none()
            && self.top_p.is_none()
            && self.top_k.is_none()
            && self.stop_sequences.is_empty()
            && self.presence_penalty.is_none()
            && self.frequency_penalty.is_none()
            && self.response_mime_type.is_none()
            && self.response_json_schema.is_none()
            && self.thinking_config.is_none()
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ThinkingConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking_budget: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking_level: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    include_thoughts: Option<bool>,
}

/// The body for a Gemini rung. The model id goes in the URL (see [`path`]), so
/// `model_id` and `stream` do not change the body.
pub fn render(req: &Request, model_id: &str, _stream: bool) -> Rendered {
    let mut dropped = Vec::new();
    let body = Body {
        contents: contents(&req.messages),
        system_instruction: (!req.system.is_empty()).then(|| Instruction {
            parts: req.system.iter().map(|s| TextOnly { text: s }).collect(),
        }),
        tools: tools(req),
        tool_config: tool_config(req),
        generation_config: generation_config(req, model_id, &mut dropped),
    };
    disclose_unsupported(req, &mut dropped);
    Rendered {
        // Every RawValue in the body is valid JSON: serializing cannot fail.
        body: serde_json::to_vec(&body).unwrap_or_default(),
        dropped,
    }
}

/// Request fields no Gemini body carries, by their inbound names.
fn disclose_unsupported(req: &Request, dropped: &mut Vec<String>) {
    let mut drop = |name: &str| {
        if !dropped.iter().any(|d| d == name) {
            dropped.push(name.to_string());
        }
    };
    if req.parallel_tool_calls.is_some() {
        drop("parallel_tool_calls");
    }
    if req.user.is_some() {
        drop("user");
    }
    if !req.include.is_empty() {
        drop("include");
    }
    // Gemini has no search over deferred tools.
    if req.tool_search.is_some() {
        drop("tool_search");
    }
    for e in &req.extras {
        drop(&e.name);
    }
}

fn tools(req: &Request) -> Vec<Tools<'_>> {
    let mut out = Vec::new();
    if !req.tools.is_empty() {
        out.push(Tools::Functions {
            function_declarations: req
                .tools
                .iter()
                .map(|t| FunctionDecl {
                    name: &t.name,
                    description: t.description.as_deref(),
                    parameters_json_schema: &t.parameters,
                })
                .collect(),
        });
    }
    if req.web_search.is_some() {
        out.push(Tools::Search {
            google_search: Empty {},
        });
    }
    out
}

fn tool_config(req: &Request) -> Option<ToolConfig<'_>> {
    if req.tools.is_empty() {
        return None;
    }
    let (mode, allowed) = match req.tool_choice.as_ref()? {
        ToolChoice::Auto => ("AUTO", Vec::new()),
        ToolChoice::None => ("NONE", Vec::new()),
        ToolChoice::Required => ("ANY", Vec::new()),
        ToolChoice::Tool { name } => ("ANY", vec![name.as_str()]),
    };
    Some(ToolConfig {
        function_calling_config: CallingConfig {
            mode,
            allowed_function_names: allowed,
        },
    })
}

fn generation_config<'a>(
    req: &'a Request,
    model_id: &str,
    dropped: &mut Vec<String>,
) -> GenerationConfig<'a> {
    let mut g = GenerationConfig {
        max_output_tokens: req.max_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stop_sequences: &req.stop,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        ..GenerationConfig::default()
    };
    match &req.response_format {
        Some(ResponseFormat::JsonObject) => g.response_mime_type = Some("application/json"),
        Some(ResponseFormat::JsonSchema { schema, .. }) => {
            g.response_mime_type = Some("application/json");
            g.response_json_schema = Some(schema);
        }
        Some(ResponseFormat::Text) | None => {}
    }
    if let Some(r) = &req.reasoning {
        let (mut budget, mut level) = (None, None);
        match (r.budget_tokens, r.effort.as_deref()) {
            (Some(b), _) => budget = Some(b),
            (None, Some(effort)) => {
                if generation(model_id) >= 3 {
                    level = effort_level(effort, model_id.contains("-pro"));
                } else {
                    budget = effort_budget(effort).map(|b| b.min(MAX_BUDGET));
                }
                if budget.is_none() && level.is_none() {
                    dropped.push("reasoning.effort".to_string());
                }
            }
            (None, None) => {}
        }
        let include = r.summary.as_deref().is_some_and(|s| s != "none");
        if budget.is_some() || level.is_some() || include {
            g.thinking_config = Some(ThinkingConfig {
                thinking_budget: budget,
                thinking_level: level,
                include_thoughts: include.then_some(true),
            });
        }
    }
    g
}

/// The Gemini generation a model id names (`gemini-3-pro-preview` is 3, a
/// publisher path included); 0 when it names none.
fn generation(model_id: &str) -> u32 {
    let Some(at) = model_id.find("gemini-") else {
        return 0;
    };
    let rest = &model_id[at + "gemini-".len()..];
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..digits].parse().unwrap_or(0)
}

/// The `thinkingLevel` for an effort on Gemini 3 and later; Pro takes only `low`
/// and `high`.
fn effort_level(effort: &str, pro: bool) -> Option<&'static str> {
    Some(match (effort, pro) {
        ("none" | "minimal" | "low", true) => "low",
        ("none" | "minimal", false) => "minimal",
        ("low", false) => "low",
        ("medium", false) => "medium",
        ("medium" | "high" | "xhigh" | "max", _) => "high",
        _ => return None,
    })
}

/// The thinking budget for an effort level (shared with the Bedrock wire, which
/// raises it to Anthropic's minimum).
pub(crate) fn effort_budget(effort: &str) -> Option<u64> {
    Some(match effort {
        "none" => 0,
        "minimal" => 512,
        "low" => 1024,
        "medium" => 8192,
        "high" => MAX_BUDGET,
        "xhigh" | "max" => 32_768,
        _ => return None,
    })
}

/// Splits a `data:<media type>;base64,<data>` URL.
pub(crate) fn data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let mime = meta.strip_suffix(";base64")?;
    Some((mime, data))
}

/// The media type of an https URL, guessed from its extension.
fn guess_mime(url: &str) -> Option<&'static str> {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let ext = path.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "heic" => "image/heic",
        "pdf" => "application/pdf",
        "txt" => "text/plain",
        _ => return None,
    })
}

fn media(url: &str) -> Kind<'_> {
    match data_url(url) {
        Some((mime_type, data)) => Kind::InlineData { mime_type, data },
        None => Kind::FileData {
            mime_type: guess_mime(url),
            file_uri: url,
        },
    }
}

fn part(data: Kind<'_>) -> WirePart<'_> {
    WirePart {
        data,
        thought_signature: None,
    }
}

/// The name of the function a result answers: the nearest earlier call with its id.
fn call_name<'a>(history: &'a [Message], call_id: &'a str) -> &'a str {
    history
        .iter()
        .rev()
        .flat_map(|m| m.parts.iter().rev())
        .find_map(|p| match p {
            Part::ToolCall { id, name, .. } if id == call_id => Some(name.as_str()),
            _ => None,
        })
        // No call in the history: the id is the only name there is.
        .unwrap_or(call_id)
}

fn call_args(arguments: &str) -> Args<'_> {
    match serde_json::from_str::<&RawValue>(arguments) {
        Ok(raw) if raw.get().starts_with('{') => Args::Raw(raw),
        _ => Args::Empty(Empty {}),
    }
}

fn tool_result<'a>(
    history: &'a [Message],
    call_id: &'a str,
    content: &'a [Part],
    is_error: bool,
    parts: &mut Vec<WirePart<'a>>,
) {
    let texts: Vec<&str> = content
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let text: Cow<str> = match texts.as_slice() {
        [one] => Cow::Borrowed(one),
        many => Cow::Owned(many.join("\n")),
    };
    let response = if is_error {
        FnResult {
            output: None,
            error: Some(text),
        }
    } else {
        FnResult {
            output: Some(text),
            error: None,
        }
    };
    parts.push(part(Kind::FunctionResponse {
        name: call_name(history, call_id),
        response,
    }));
    // Media in a result travels as parts beside the response.
    for p in content {
        if let Part::Image { url, .. } | Part::Document { url, .. } = p {
            parts.push(part(media(url)));
        }
    }
}

/// The parts of one turn. `history` is every turn before it.
fn turn_parts<'a>(history: &'a [Message], m: &'a Message) -> Vec<WirePart<'a>> {
    let mut parts = Vec::with_capacity(m.parts.len());
    let mut signature: Option<&str> = None;
    let mut first_call = true;
    for p in &m.parts {
        let data = match p {
            Part::Text { text } if text.is_empty() => continue,
            Part::Text { text } => Kind::Text(text),
            Part::Image { url, .. } | Part::Document { url, .. } => media(url),
            Part::ToolCall {
                name, arguments, ..
            } => {
                let mut sig = signature.take();
                if std::mem::take(&mut first_call) && sig.is_none() {
                    sig = Some(SKIP_SIGNATURE);
                }
                parts.push(WirePart {
                    data: Kind::FunctionCall {
                        name,
                        args: call_args(arguments),
                    },
                    thought_signature: sig,
                });
                continue;
            }
            Part::ToolResult {
                call_id,
                content,
                is_error,
            } => {
                tool_result(history, call_id, content, *is_error, &mut parts);
                continue;
            }
            Part::Thinking {
                signature: Some(s), ..
            } => {
                signature = Some(s);
                continue;
            }
            Part::Thinking { .. } | Part::EncryptedReasoning { .. } => continue,
        };
        parts.push(WirePart {
            data,
            thought_signature: signature.take(),
        });
    }
    if let Some(s) = signature {
        // Thoughts closed the turn: the signature rides on an empty text part, as
        // Gemini itself sends it.
        parts.push(WirePart {
            data: Kind::Text(""),
            thought_signature: Some(s),
        });
    }
    parts
}

fn contents(messages: &[Message]) -> Vec<Content<'_>> {
    let mut out: Vec<Content> = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role {
            Role::Assistant => "model",
            Role::User | Role::Tool | Role::System => "user",
        };
        let parts = turn_parts(&messages[..i], m);
        if parts.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.role == role => last.parts.extend(parts),
            _ => out.push(Content { role, parts }),
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Chunk<'a> {
    #[serde(default, borrow)]
    candidates: Vec<Candidate<'a>>,
    #[serde(default)]
    prompt_feedback: Option<PromptFeedback>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default)]
    model_version: Option<String>,
    #[serde(default)]
    response_id: Option<String>,
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate<'a> {
    #[serde(default, borrow)]
    content: Option<CandidateContent<'a>>,
    #[serde(default)]
    finish_reason: Option<String>,
    #[serde(default)]
    finish_message: Option<String>,
    #[serde(default)]
    grounding_metadata: Option<Grounding>,
}

/// What grounding with Google Search found and where the answer relies on it.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Grounding {
    #[serde(default)]
    web_search_queries: Vec<String>,
    #[serde(default)]
    grounding_chunks: Vec<GroundingChunk>,
    #[serde(default)]
    grounding_supports: Vec<Support>,
}

#[derive(Deserialize, Default)]
struct GroundingChunk {
    #[serde(default)]
    web: Option<WebChunk>,
}

#[derive(Deserialize, Default)]
struct WebChunk {
    #[serde(default)]
    uri: String,
    #[serde(default)]
    title: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Support {
    #[serde(default)]
    segment: Option<Segment>,
    #[serde(default)]
    grounding_chunk_indices: Vec<usize>,
}

/// A span of the answer's text, in UTF-8 bytes.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Segment {
    #[serde(default)]
    start_index: usize,
    #[serde(default)]
    end_index: usize,
}

#[derive(Deserialize)]
struct CandidateContent<'a> {
    #[serde(default, borrow)]
    parts: Vec<WireOutPart<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireOutPart<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    thought: bool,
    #[serde(default)]
    thought_signature: Option<String>,
    #[serde(default, borrow)]
    function_call: Option<FunctionCall<'a>>,
}

#[derive(Deserialize)]
struct FunctionCall<'a> {
    #[serde(default)]
    id: Option<String>,
    name: String,
    #[serde(default, borrow)]
    args: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    #[serde(default)]
    block_reason: Option<String>,
    #[serde(default)]
    block_reason_message: Option<String>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    cached_content_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    #[serde(default)]
    thoughts_token_count: u64,
    #[serde(default)]
    tool_use_prompt_token_count: u64,
}

impl UsageMetadata {
    fn usage(self) -> Usage {
        Usage {
            // Provider-supplied counts: saturate rather than wrap.
            input_tokens: self
                .prompt_token_count
                .saturating_add(self.tool_use_prompt_token_count),
            cached_tokens: self.cached_content_token_count,
            // Gemini's cache is created ahead (cachedContents), never by a call.
            cache_write_tokens: 0,
            output_tokens: self
                .candidates_token_count
                .saturating_add(self.thoughts_token_count),
            reasoning_tokens: self.thoughts_token_count,
            cache_write_1h_tokens: 0,
            web_search_requests: 0,
            cost_micro_usd: None,
        }
    }
}

#[derive(Deserialize)]
struct WireError {
    #[serde(default)]
    message: String,
    #[serde(default)]
    status: Option<String>,
}

/// The refusal reason for a Gemini finish or block reason, if it is one.
fn refusal_reason(reason: &str) -> Option<RefusalReason> {
    Some(match reason {
        "SAFETY"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "JAILBREAK" => RefusalReason::ContentPolicy,
        "RECITATION" | "IMAGE_RECITATION" => RefusalReason::Recitation,
        "SPII" | "MODEL_ARMOR" => RefusalReason::DataInspection,
        _ => return None,
    })
}

/// Finish reasons that mean the model's output was unusable.
fn is_failure(reason: &str) -> bool {
    matches!(
        reason,
        "MALFORMED_FUNCTION_CALL" | "UNEXPECTED_TOOL_CALL" | "TOO_MANY_TOOL_CALLS"
    )
}

/// A stateful reader of Gemini answers: the stream's chunks, or one whole answer
/// read as a single chunk.
#[derive(Default)]
pub struct Decoder {
    started: bool,
    /// Function calls seen so far (the next call's index).
    calls: u32,
    /// Text or a tool call was emitted.
    content: bool,
    done: bool,
    usage: Option<Usage>,
    /// The answer's text so far: grounding spans are in its bytes, citations in
    /// its characters.
    text: String,
    /// Google searches Gemini ran.
    searches: u64,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Grounding as the citations of the spans that rely on it, then the searches
    /// Gemini ran (the sources with the first).
    fn grounding(&mut self, g: Grounding, out: &mut Vec<Event>) {
        let sources: Vec<crate::ir::SearchResult> = g
            .grounding_chunks
            .iter()
            .filter_map(|c| c.web.as_ref())
            .map(|w| crate::ir::SearchResult {
                title: w.title.clone(),
                url: w.uri.clone(),
                snippet: String::new(),
                page_age: None,
            })
            .collect();
        let chars = |byte: usize| {
            let mut b = byte.min(self.text.len());
            while !self.text.is_char_boundary(b) {
                b -= 1;
            }
            self.text[..b].chars().count() as u32
        };
        for s in &g.grounding_supports {
            let Some(seg) = &s.segment else { continue };
            let (start, end) = (chars(seg.start_index), chars(seg.end_index));
            for &i in &s.grounding_chunk_indices {
                if let Some(src) = sources.get(i) {
                    out.push(Event::Citation(Box::new(crate::ir::UrlCitation {
                        url: src.url.clone(),
                        title: src.title.clone(),
                        content: None,
                        start_index: start,
                        end_index: end,
                    })));
                }
            }
        }
        // The searches after the citations: Gemini tells both in its last chunk,
        // and a format that shows a search as an item or block of its own
        // (messages server tool blocks, a responses web_search_call) closes the
        // open text there; its citations belong inside it.
        for (i, q) in g.web_search_queries.iter().enumerate() {
            self.searches += 1;
            out.push(Event::ServerSearch(Box::new(crate::ir::ServerSearch {
                id: format!("gs_{}", self.searches),
                query: q.clone(),
                results: if i == 0 { sources.clone() } else { Vec::new() },
            })));
        }
    }

    fn chunk(&mut self, c: Chunk<'_>, out: &mut Vec<Event>) {
        if let Some(e) = c.error {
            let status = e.status.map(|s| format!(" ({s})")).unwrap_or_default();
            out.push(Event::Error {
                message: format!("{}{status}", e.message),
            });
            return;
        }
        if !std::mem::replace(&mut self.started, true) {
            out.push(Event::Start {
                id: c.response_id,
                model: c.model_version,
            });
        }
        if let Some(u) = c.usage_metadata {
            self.usage = Some(u.usage());
        }
        let was_done = self.done;
        let mut finished = false;
        if let Some(cand) = c.candidates.into_iter().next() {
            if let Some(content) = cand.content {
                for p in content.parts {
                    self.part(p, out);
                }
            }
            if let Some(g) = cand.grounding_metadata {
                self.grounding(g, out);
            }
            if let Some(reason) = cand.finish_reason {
                self.finish(&reason, cand.finish_message, out);
                finished = true;
            }
        }
        if let Some(PromptFeedback {
            block_reason: Some(reason),
            block_reason_message,
        }) = c.prompt_feedback
        {
            if !finished {
                out.push(Event::Refusal {
                    reason: refusal_reason(&reason).unwrap_or(RefusalReason::Unspecified),
                    text: block_reason_message,
                });
                out.push(Event::Finish {
                    reason: FinishReason::ContentFilter,
                    raw: Some(reason),
                    stop_sequence: None,
                });
                finished = true;
            }
        }
        if finished || (was_done && c.usage_metadata.is_some()) {
            self.done = true;
            if let Some(mut u) = self.usage {
                u.web_search_requests = self.searches;
                out.push(Event::Usage(u));
            }
        }
    }

    fn part(&mut self, p: WireOutPart<'_>, out: &mut Vec<Event>) {
        let text = p.text.filter(|t| !t.is_empty());
        if p.thought {
            if let Some(t) = text {
                out.push(Event::Thinking {
                    text: t.into_owned(),
                });
            }
            if let Some(signature) = p.thought_signature {
                out.push(Event::ThinkingSignature { signature });
            }
            return;
        }
        // A signature belongs to the thoughts before this part: it comes first.
        if let Some(signature) = p.thought_signature {
            out.push(Event::ThinkingSignature { signature });
        }
        if let Some(t) = text {
            self.content = true;
            self.text.push_str(&t);
            out.push(Event::Text {
                text: t.into_owned(),
            });
        }
        if let Some(call) = p.function_call {
            let index = self.calls;
            self.calls += 1;
            self.content = true;
            out.push(Event::ToolCallStart {
                index,
                id: call.id.unwrap_or_else(|| format!("call_{index}")),
                name: call.name,
            });
            let arguments = call.args.map_or("{}", RawValue::get).to_string();
            out.push(Event::ToolCallArgs { index, arguments });
        }
    }

    fn finish(&mut self, reason: &str, message: Option<String>, out: &mut Vec<Event>) {
        let canonical = match reason {
            "STOP" if self.calls > 0 => FinishReason::ToolCalls,
            "MAX_TOKENS" => FinishReason::Length,
            r if is_failure(r) => {
                let detail = message.map(|m| format!(": {m}")).unwrap_or_default();
                out.push(Event::Error {
                    message: format!("Gemini ended the answer with {r}{detail}"),
                });
                return;
            }
            r => match refusal_reason(r) {
                Some(why) => {
                    if !self.content {
                        out.push(Event::Refusal {
                            reason: why,
                            text: message,
                        });
                    }
                    FinishReason::ContentFilter
                }
                None => FinishReason::Stop,
            },
        };
        out.push(Event::Finish {
            reason: canonical,
            raw: Some(reason.to_string()),
            // Gemini ends a stop-sequence match as a plain STOP.
            stop_sequence: None,
        });
    }
}

impl StreamDecoder for Decoder {
    fn frame(
        &mut self,
        _name: Option<&str>,
        data: &[u8],
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        if data.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let chunk: Chunk = serde_json::from_slice(data)
            .map_err(|e| DecodeError(format!("gemini stream chunk: {e}")))?;
        self.chunk(chunk, out);
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }
}

/// A whole answer (a GenerateContentResponse, or the JSON array a stream without
/// `alt=sse` gives) as the events its stream would give.
pub fn decode(body: &[u8]) -> Result<Vec<Event>, DecodeError> {
    let mut d = Decoder::new();
    let mut out = Vec::new();
    let trimmed = body.trim_ascii_start();
    if trimmed.first() == Some(&b'[') {
        let chunks: Vec<Chunk> = serde_json::from_slice(trimmed)
            .map_err(|e| DecodeError(format!("gemini answer: {e}")))?;
        for c in chunks {
            d.chunk(c, &mut out);
        }
    } else {
        let c: Chunk =
            serde_json::from_slice(body).map_err(|e| DecodeError(format!("gemini answer: {e}")))?;
        d.chunk(c, &mut out);
    }
    Ok(out)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ErrorAnswer {
    #[serde(default)]
    error: Option<WireError>,
    #[serde(default)]
    prompt_feedback: Option<PromptFeedback>,
}

/// Whether an error answer is a policy refusal: a blocked prompt's feedback, or an
/// error whose message says the content was prohibited or blocked for safety.
pub fn refusal(status: u16, body: &[u8]) -> Option<RefusalReason> {
    if !(400..500).contains(&status) {
        return None;
    }
    let a: ErrorAnswer = serde_json::from_slice(body).ok()?;
    if let Some(reason) = a.prompt_feedback.and_then(|f| f.block_reason) {
        return Some(refusal_reason(&reason).unwrap_or(RefusalReason::Unspecified));
    }
    let msg = a.error?.message.to_ascii_lowercase();
    let prohibited = msg.contains("prohibited content") || msg.contains("prohibited_content");
    let safety = msg.contains("blocked") && (msg.contains("safety") || msg.contains("policy"));
    (prohibited || safety).then_some(RefusalReason::ContentPolicy)
}
