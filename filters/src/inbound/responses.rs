//! The responses inbound format (`POST /v1/responses`): the body parsed and
//! validated into the canonical [`Request`]; answers rendered back as a `response`
//! object, whole or as the responses API's named stream events (see the module
//! contract in `inbound`).
//!
//! The responses API is a closed schema: an unknown top-level field, or an unknown
//! key in an input message item, is a 400 naming it. Fields the canonical form does
//! not model but an OpenAI rung understands are kept verbatim in `extras`.

use super::common::{
    check_description, invalid, malformed, refused_everywhere, unsupported, MAX_DESCRIPTION_CHARS,
};
use crate::error::{ApiError, ErrorCode, Format};
use crate::ir::{
    Event, Extra, FinishReason, Message, Meta, Part, Reasoning, Request, Response, ResponseFormat,
    Role, SearchForm, ServerSearch, StreamEncoder, Tail, Tool, ToolChoice, ToolSearch,
    ToolSearchKind, UrlCitation,
};
use crate::json::{append_member, Member, Members, RawObject};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::fmt;

/// The member of the final answer that carries the receipt.
/// The member of the final answer that names the dropped fields.
use crate::ir::{IGNORED_MEMBER, RECEIPT_MEMBER};

/// Top-level fields kept verbatim as extras under their own names: an OpenAI rung
/// understands them, the canonical form does not model them.
const EXTRA_FIELDS: [&str; 8] = [
    "metadata",
    "service_tier",
    "truncation",
    "client_metadata",
    "background",
    "top_logprobs",
    "safety_identifier",
    "max_tool_calls",
];

/// The prefix of an `encrypted_content` that holds Anthropic's hidden reasoning
/// (redacted thinking) rather than OpenAI's.
pub const ANTHROPIC_REASONING: &str = "sluice:anthropic:";

/// Parameters for a function tool that declares none.
const EMPTY_PARAMETERS: &str = r#"{"type":"object","properties":{}}"#;

// ---------------------------------------------------------------------------
// Reading objects member by member

/// Whether a member is absent in effect (`null`).
fn is_null(v: &RawValue) -> bool {
    v.get() == "null"
}

/// Where a value sits in the body (`input[3].content[1]`), spelled out only when an
/// error names it: a valid body costs no formatting.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root(&'static str),
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl<'a> Path<'a> {
    fn key(&'a self, k: &'a str) -> Path<'a> {
        Path::Key(self, k)
    }

    fn at(&'a self, i: usize) -> Path<'a> {
        Path::Index(self, i)
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Path::Root(name) => f.write_str(name),
            Path::Key(p, k) => write!(f, "{p}.{k}"),
            Path::Index(p, i) => write!(f, "{p}[{i}]"),
        }
    }
}

/// Reads an optional member: absent and `null` are both `None`; a value of the wrong
/// type is a 400 naming `param`.
fn opt<'a, T: Deserialize<'a>>(
    v: Option<&'a RawValue>,
    param: impl fmt::Display,
    what: &str,
) -> Result<Option<T>, ApiError> {
    match v {
        None => Ok(None),
        Some(v) if is_null(v) => Ok(None),
        Some(v) => serde_json::from_str(v.get())
            .map(Some)
            .map_err(|_| invalid(param.to_string(), format!("`{param}` must be {what}."))),
    }
}

/// Reads a required member.
fn req<'a, T: Deserialize<'a>>(
    v: Option<&'a RawValue>,
    param: impl fmt::Display + Copy,
    what: &str,
) -> Result<T, ApiError> {
    opt(v, param, what)?.ok_or_else(|| missing(param))
}

fn missing(param: impl fmt::Display) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequest,
        format!("Missing required parameter: `{param}`."),
    )
    .param(param.to_string())
}

fn members(v: &RawValue, param: impl fmt::Display) -> Result<Vec<Member<'_>>, ApiError> {
    crate::json::split_valid_object(v)
        .map_err(|_| invalid(param.to_string(), format!("`{param}` must be an object.")))
}

fn array(v: &RawValue, param: impl fmt::Display) -> Result<Vec<&RawValue>, ApiError> {
    crate::json::split_valid_array(v)
        .map_err(|_| invalid(param.to_string(), format!("`{param}` must be an array.")))
}

// ---------------------------------------------------------------------------
// Parsing

/// The top-level members the format knows, unparsed until read.
#[derive(Default)]
struct Top<'a> {
    model: Option<&'a RawValue>,
    input: Option<&'a RawValue>,
    instructions: Option<&'a RawValue>,
    tools: Option<&'a RawValue>,
    tool_choice: Option<&'a RawValue>,
    parallel_tool_calls: Option<&'a RawValue>,
    max_output_tokens: Option<&'a RawValue>,
    temperature: Option<&'a RawValue>,
    top_p: Option<&'a RawValue>,
    reasoning: Option<&'a RawValue>,
    text: Option<&'a RawValue>,
    store: Option<&'a RawValue>,
    include: Option<&'a RawValue>,
    user: Option<&'a RawValue>,
    prompt_cache_key: Option<&'a RawValue>,
    stream: Option<&'a RawValue>,
    plugins: Option<&'a RawValue>,
    extras: Vec<(&'static str, &'a RawValue)>,
}

impl<'a> Top<'a> {
    fn collect(members: Vec<Member<'a>>) -> Result<Self, ApiError> {
        let mut t = Top::default();
        for (k, v) in members {
            let slot = match k.as_ref() {
                "model" => &mut t.model,
                "input" => &mut t.input,
                "instructions" => &mut t.instructions,
                "tools" => &mut t.tools,
                "tool_choice" => &mut t.tool_choice,
                "parallel_tool_calls" => &mut t.parallel_tool_calls,
                "max_output_tokens" => &mut t.max_output_tokens,
                "temperature" => &mut t.temperature,
                "top_p" => &mut t.top_p,
                "reasoning" => &mut t.reasoning,
                "text" => &mut t.text,
                "store" => &mut t.store,
                "include" => &mut t.include,
                "user" => &mut t.user,
                "prompt_cache_key" => &mut t.prompt_cache_key,
                "stream" => &mut t.stream,
                "plugins" => &mut t.plugins,
                "previous_response_id" => {
                    previous_response(v)?;
                    continue;
                }
                name => {
                    if let Some(x) = EXTRA_FIELDS.iter().find(|x| **x == name) {
                        if !is_null(v) {
                            t.extras.push((x, v));
                        }
                        continue;
                    }
                    return Err(refused_everywhere(name).unwrap_or_else(|| {
                        unsupported(
                            name.to_string(),
                            format!(
                                "The parameter `{name}` is not supported on the responses route."
                            ),
                        )
                    }));
                }
            };
            *slot = Some(v);
        }
        Ok(t)
    }
}

/// The gateway keeps no responses yet: any id given is not found.
fn previous_response(v: &RawValue) -> Result<(), ApiError> {
    let id: Option<String> = opt(Some(v), "previous_response_id", "a string")?;
    match id {
        None => Ok(()),
        Some(_) => Err(ApiError::new(
            ErrorCode::PreviousResponseNotFound,
            "The previous response was not found; send the full conversation as `input`.",
        )
        .param("previous_response_id")),
    }
}

/// Parses and validates a responses body into the canonical request.
pub fn parse(body: &[u8]) -> Result<Request, ApiError> {
    let Members(top) = serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => malformed("The request body must be a JSON object."),
        _ => ApiError::invalid_json(e),
    })?;
    let t = Top::collect(top)?;
    let mut r = Request {
        model: req(t.model, "model", "a string")?,
        stream: opt(t.stream, "stream", "a boolean")?.unwrap_or(false),
        ..Request::default()
    };
    if r.model.is_empty() {
        return Err(invalid("model", "`model` must not be empty."));
    }
    if let Some(i) = opt::<String>(t.instructions, "instructions", "a string")? {
        r.system.push(i);
    }
    parse_input(t.input.ok_or_else(|| missing("input"))?, &mut r)?;
    if let Some(tools) = t.tools.filter(|v| !is_null(v)) {
        parse_tools(tools, &mut r)?;
    }
    r.tool_choice = parse_tool_choice(t.tool_choice)?;
    r.parallel_tool_calls = opt(t.parallel_tool_calls, "parallel_tool_calls", "a boolean")?;
    r.max_tokens = opt(
        t.max_output_tokens,
        "max_output_tokens",
        "a positive integer",
    )?;
    if r.max_tokens == Some(0) {
        return Err(invalid(
            "max_output_tokens",
            "`max_output_tokens` must be a positive integer.",
        ));
    }
    r.temperature = ranged(
        t.temperature,
        "temperature",
        2.0,
        "a number between 0 and 2",
    )?;
    r.top_p = ranged(t.top_p, "top_p", 1.0, "a number between 0 and 1")?;
    r.reasoning = parse_reasoning(t.reasoning)?;
    if let Some(text) = t.text.filter(|v| !is_null(v)) {
        parse_text(text, &mut r)?;
    }
    // Nothing is stored upstream whatever the client asks; the value is checked only.
    opt::<bool>(t.store, "store", "a boolean")?;
    r.include = opt(t.include, "include", "an array of strings")?.unwrap_or_default();
    r.user = opt(t.user, "user", "a string")?;
    r.prompt_cache_key = opt(t.prompt_cache_key, "prompt_cache_key", "a string")?;
    if let Some(p) = t.plugins {
        super::common::parse_plugins(p, &mut r)?;
    }
    super::common::check_tool_search(&r)?;
    for (name, v) in t.extras {
        if name == "top_logprobs" {
            let n: Option<u8> = opt(Some(v), name, "an integer between 0 and 20")?;
            if n.is_some_and(|n| n > 20) {
                return Err(invalid(
                    name,
                    "`top_logprobs` must be an integer between 0 and 20.",
                ));
            }
        }
        r.extras.push(Extra {
            name: name.to_string(),
            value: v.to_owned(),
        });
    }
    Ok(r)
}

/// A number in `0..=max`; `what` says so in words.
fn ranged(
    v: Option<&RawValue>,
    param: &str,
    max: f64,
    what: &str,
) -> Result<Option<f64>, ApiError> {
    let n: Option<f64> = opt(v, param, what)?;
    match n {
        Some(x) if !(0.0..=max).contains(&x) => Err(invalid(
            param.to_string(),
            format!("`{param}` must be {what}."),
        )),
        n => Ok(n),
    }
}

fn parse_input(v: &RawValue, r: &mut Request) -> Result<(), ApiError> {
    if v.get().starts_with('"') {
        let text: String = req(Some(v), "input", "a string or an array of input items")?;
        r.messages.push(Message {
            role: Role::User,
            parts: vec![Part::text(text)],
        });
        return Ok(());
    }
    let items: Vec<&RawValue> = serde_json::from_str(v.get()).map_err(|_| {
        invalid(
            "input",
            "`input` must be a string or an array of input items.",
        )
    })?;
    let input = Path::Root("input");
    for (i, item) in items.into_iter().enumerate() {
        parse_item(input.at(i), item, r)?;
    }
    Ok(())
}

/// The parts of the turn `role` is adding to: assistant output items (reasoning,
/// messages, function calls) join one assistant turn, and consecutive function
/// call outputs one tool turn, so every wire sees calls and results grouped.
fn turn(r: &mut Request, role: Role) -> &mut Vec<Part> {
    let merge = matches!(role, Role::Assistant | Role::Tool)
        && r.messages.last().is_some_and(|m| m.role == role);
    if !merge {
        r.messages.push(Message {
            role,
            parts: Vec::new(),
        });
    }
    let last = r.messages.len() - 1;
    &mut r.messages[last].parts
}

fn parse_item(param: Path, item: &RawValue, r: &mut Request) -> Result<(), ApiError> {
    let fields = members(item, param)?;
    let kind = fields.iter().find(|(k, _)| k == "type").map(|(_, v)| *v);
    let kind: Option<String> = opt(kind, param.key("type"), "a string")?;
    match kind.as_deref() {
        None | Some("message") => message_item(param, &fields, r),
        Some("function_call") => function_call_item(param, item, r),
        Some("function_call_output") => function_output_item(param, item, r),
        Some("reasoning") => reasoning_item(param, item, r),
        // A search an earlier answer showed: nothing for the model to read again.
        Some("web_search_call") => Ok(()),
        Some(other) => Err(unsupported(
            param.key("type").to_string(),
            format!("Input items of type `{other}` are not supported."),
        )),
    }
}

fn message_item(param: Path, fields: &[Member], r: &mut Request) -> Result<(), ApiError> {
    let (mut role, mut content) = (None, None);
    for (k, v) in fields {
        match k.as_ref() {
            "role" => role = Some(*v),
            "content" => content = Some(*v),
            // Output-item bookkeeping a client replays; `phase` is a hint the
            // canonical form cannot carry.
            "type" | "id" | "status" | "phase" => {}
            other => {
                return Err(invalid(
                    param.key(other).to_string(),
                    format!("Unknown key `{other}` in a message input item."),
                ))
            }
        }
    }
    let role_param = param.key("role");
    let role: String = req(role, role_param, "a string")?;
    let role = match role.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "system" | "developer" => Role::System,
        _ => {
            return Err(invalid(
                role_param.to_string(),
                "The role must be one of user, assistant, system or developer.",
            ))
        }
    };
    let content_param = param.key("content");
    let content = content.ok_or_else(|| missing(content_param))?;
    let parts = content_parts(content, content_param)?;
    match role {
        Role::System => r.system.push(system_text(parts, content_param)?),
        Role::User => r.messages.push(Message { role, parts }),
        _ => turn(r, role).extend(parts),
    }
    Ok(())
}

/// A system or developer message's text; its parts are joined by newlines.
fn system_text(parts: Vec<Part>, param: Path) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, p) in parts.into_iter().enumerate() {
        let Part::Text { text: t } = p else {
            return Err(invalid(
                param.at(j).to_string(),
                "System and developer messages take text only.",
            ));
        };
        if j > 0 {
            text.push('\n');
        }
        text.push_str(&t);
    }
    Ok(text)
}

/// One content part of a message or of a function call output.
#[derive(Deserialize)]
struct InPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    refusal: Option<String>,
    image_url: Option<String>,
    detail: Option<String>,
    file_id: Option<String>,
    file_data: Option<String>,
    file_url: Option<String>,
    filename: Option<String>,
}

/// A message content (a string, or a list of parts) as canonical parts.
fn content_parts(v: &RawValue, param: Path) -> Result<Vec<Part>, ApiError> {
    if v.get().starts_with('"') {
        let text: String = req(Some(v), param, "a string or an array of content parts")?;
        return Ok(vec![Part::text(text)]);
    }
    let list: Vec<&RawValue> = serde_json::from_str(v.get()).map_err(|_| {
        invalid(
            param.to_string(),
            format!("`{param}` must be a string or an array of content parts."),
        )
    })?;
    let mut parts = Vec::with_capacity(list.len());
    for (j, raw) in list.into_iter().enumerate() {
        let pp = param.at(j);
        let p: InPart = serde_json::from_str(raw.get()).map_err(|_| {
            invalid(
                pp.to_string(),
                "Each content part must be an object with a string `type`.",
            )
        })?;
        parts.push(content_part(p, pp)?);
    }
    Ok(parts)
}

fn content_part(p: InPart, param: Path) -> Result<Part, ApiError> {
    let need = |v: Option<String>, key: &str| v.ok_or_else(|| missing(param.key(key)));
    let no_file_id = |id: &Option<String>| match id {
        Some(_) => Err(invalid(
            param.key("file_id").to_string(),
            "File ids are not supported; send the content inline as a data URL or as a URL.",
        )),
        None => Ok(()),
    };
    match p.kind.as_str() {
        "input_text" | "output_text" => Ok(Part::text(need(p.text, "text")?)),
        "refusal" => Ok(Part::text(need(p.refusal, "refusal")?)),
        "input_image" => {
            no_file_id(&p.file_id)?;
            Ok(Part::Image {
                url: need(p.image_url, "image_url")?,
                detail: p.detail,
            })
        }
        "input_file" => {
            no_file_id(&p.file_id)?;
            let url = match (p.file_data, p.file_url) {
                (Some(data), _) if data.starts_with("data:") => data,
                // Bare base64: the format's files are PDFs.
                (Some(data), _) => format!("data:application/pdf;base64,{data}"),
                (None, Some(url)) => url,
                (None, None) => return Err(missing(param.key("file_data"))),
            };
            Ok(Part::Document {
                url,
                name: p.filename,
            })
        }
        other => Err(invalid(
            param.key("type").to_string(),
            format!("Content parts of type `{other}` are not supported."),
        )),
    }
}

#[derive(Deserialize)]
struct FunctionCallItem {
    call_id: Option<String>,
    name: Option<String>,
    arguments: Option<String>,
}

fn function_call_item(param: Path, item: &RawValue, r: &mut Request) -> Result<(), ApiError> {
    let c: FunctionCallItem = serde_json::from_str(item.get()).map_err(|_| {
        invalid(
            param.to_string(),
            "A function_call item needs string `call_id`, `name` and `arguments`.",
        )
    })?;
    let need = |v: Option<String>, key: &str| v.ok_or_else(|| missing(param.key(key)));
    let part = Part::ToolCall {
        id: need(c.call_id, "call_id")?,
        name: need(c.name, "name")?,
        arguments: need(c.arguments, "arguments")?,
    };
    turn(r, Role::Assistant).push(part);
    Ok(())
}

#[derive(Deserialize)]
struct FunctionOutputItem<'a> {
    call_id: Option<String>,
    #[serde(borrow)]
    output: Option<&'a RawValue>,
}

fn function_output_item(param: Path, item: &RawValue, r: &mut Request) -> Result<(), ApiError> {
    let o: FunctionOutputItem = serde_json::from_str(item.get()).map_err(|_| {
        invalid(
            param.to_string(),
            "A function_call_output item needs a string `call_id` and an `output`.",
        )
    })?;
    let call_id = o.call_id.ok_or_else(|| missing(param.key("call_id")))?;
    let out_param = param.key("output");
    let output = o.output.ok_or_else(|| missing(out_param))?;
    let part = Part::ToolResult {
        call_id,
        content: content_parts(output, out_param)?,
        is_error: false,
    };
    turn(r, Role::Tool).push(part);
    Ok(())
}

#[derive(Deserialize)]
struct ReasoningItem {
    id: Option<String>,
    #[serde(default)]
    summary: Vec<SummaryIn>,
    encrypted_content: Option<String>,
}

#[derive(Deserialize)]
struct SummaryIn {
    text: String,
}

fn reasoning_item(param: Path, item: &RawValue, r: &mut Request) -> Result<(), ApiError> {
    let it: ReasoningItem = serde_json::from_str(item.get()).map_err(|_| {
        invalid(
            param.to_string(),
            "A reasoning item needs `summary` as an array of summary_text parts.",
        )
    })?;
    let parts = turn(r, Role::Assistant);
    for s in it.summary {
        parts.push(Part::Thinking {
            text: s.text,
            signature: None,
        });
    }
    if let Some(data) = it.encrypted_content {
        // Hidden reasoning another maker produced travels in this format under the
        // gateway's prefix; an unprefixed one is OpenAI's (an id, maybe empty,
        // marks it so).
        parts.push(match data.strip_prefix(ANTHROPIC_REASONING) {
            Some(rest) => Part::EncryptedReasoning {
                data: rest.to_string(),
                id: None,
            },
            None => Part::EncryptedReasoning {
                data,
                id: Some(it.id.unwrap_or_default()),
            },
        });
    }
    Ok(())
}

/// The description cap; a text short in bytes is short in characters, so only a
/// long one is counted.
fn described(param: Path, text: &str) -> Result<(), ApiError> {
    if text.len() <= MAX_DESCRIPTION_CHARS {
        return Ok(());
    }
    check_description(param.to_string(), text)
}

#[derive(Deserialize)]
struct ToolIn<'a> {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    description: Option<String>,
    #[serde(borrow)]
    parameters: Option<&'a RawValue>,
    strict: Option<bool>,
    #[serde(borrow, default)]
    defer_loading: Option<&'a RawValue>,
    search_context_size: Option<String>,
}

fn parse_tools(v: &RawValue, r: &mut Request) -> Result<(), ApiError> {
    let tools = Path::Root("tools");
    for (i, raw) in array(v, "tools")?.into_iter().enumerate() {
        let param = tools.at(i);
        let t: ToolIn = serde_json::from_str(raw.get()).map_err(|_| {
            invalid(
                param.to_string(),
                "Each tool must be an object with a string `type`.",
            )
        })?;
        match t.kind.as_str() {
            "function" => {
                let name = t
                    .name
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| missing(param.key("name")))?;
                if let Some(d) = &t.description {
                    described(param.key("description"), d)?;
                }
                let parameters = match t.parameters {
                    Some(p) => p.to_owned(),
                    None => RawValue::from_string(EMPTY_PARAMETERS.to_string())
                        .map_err(|_| ApiError::internal())?,
                };
                let deferred = super::common::defer_loading(
                    t.defer_loading,
                    param.key("defer_loading").to_string(),
                )?;
                let tool = Tool {
                    name,
                    description: t.description,
                    parameters,
                    strict: t.strict,
                };
                if deferred {
                    r.deferred.push(tool);
                } else {
                    r.tools.push(tool);
                }
            }
            // Web search (`web_search`, `web_search_preview`, dated versions): the
            // provider's own search, or the gateway's.
            k if k.starts_with("web_search") => {
                let ws = super::common::want_web_search(r, SearchForm::ResponsesTool);
                ws.raw = Some(raw.to_owned());
                ws.context_size = t.search_context_size;
            }
            "tool_search" => {
                r.tool_search = Some(Box::new(ToolSearch {
                    kind: ToolSearchKind::Bm25,
                    max_results: None,
                }))
            }
            k => {
                return Err(unsupported(
                    param.key("type").to_string(),
                    format!("Tools of type `{k}` are not supported."),
                ))
            }
        }
    }
    Ok(())
}

#[derive(Deserialize)]
struct ToolChoiceIn {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
}

fn parse_tool_choice(v: Option<&RawValue>) -> Result<Option<ToolChoice>, ApiError> {
    let Some(v) = v.filter(|v| !is_null(v)) else {
        return Ok(None);
    };
    let bad = || {
        invalid(
            "tool_choice",
            "`tool_choice` must be auto, none, required or {\"type\":\"function\",\"name\":...}.",
        )
    };
    if v.get().starts_with('"') {
        let s: String = serde_json::from_str(v.get()).map_err(|_| bad())?;
        return match s.as_str() {
            "auto" => Ok(Some(ToolChoice::Auto)),
            "none" => Ok(Some(ToolChoice::None)),
            "required" => Ok(Some(ToolChoice::Required)),
            _ => Err(bad()),
        };
    }
    let c: ToolChoiceIn = serde_json::from_str(v.get()).map_err(|_| bad())?;
    match (c.kind.as_str(), c.name) {
        ("function", Some(name)) => Ok(Some(ToolChoice::Tool { name })),
        ("function", None) => Err(missing("tool_choice.name")),
        (kind, _) => Err(unsupported(
            "tool_choice",
            format!("A tool_choice of type `{kind}` is not supported."),
        )),
    }
}

fn parse_reasoning(v: Option<&RawValue>) -> Result<Option<Reasoning>, ApiError> {
    let Some(v) = v.filter(|v| !is_null(v)) else {
        return Ok(None);
    };
    let mut out = Reasoning::default();
    let mut legacy = None;
    for (k, v) in members(v, "reasoning")? {
        match k.as_ref() {
            "effort" => out.effort = opt(Some(v), "reasoning.effort", "a string")?,
            "summary" => out.summary = opt(Some(v), "reasoning.summary", "a string")?,
            // The deprecated spelling of `summary`.
            "generate_summary" => legacy = opt(Some(v), "reasoning.generate_summary", "a string")?,
            other => {
                return Err(unsupported(
                    format!("reasoning.{other}"),
                    format!("The parameter `reasoning.{other}` is not supported."),
                ))
            }
        }
    }
    if out.summary.is_none() {
        out.summary = legacy;
    }
    Ok((out.effort.is_some() || out.summary.is_some()).then_some(out))
}

#[derive(Deserialize)]
struct FormatIn<'a> {
    #[serde(rename = "type")]
    kind: String,
    name: Option<String>,
    description: Option<String>,
    #[serde(borrow)]
    schema: Option<&'a RawValue>,
    strict: Option<bool>,
}

fn parse_text(v: &RawValue, r: &mut Request) -> Result<(), ApiError> {
    for (k, v) in members(v, "text")? {
        match k.as_ref() {
            "format" if is_null(v) => {}
            "format" => r.response_format = Some(parse_format(v)?),
            "verbosity" if is_null(v) => {}
            "verbosity" => r.extras.push(Extra {
                name: "text.verbosity".into(),
                value: v.to_owned(),
            }),
            other => {
                return Err(unsupported(
                    format!("text.{other}"),
                    format!("The parameter `text.{other}` is not supported."),
                ))
            }
        }
    }
    Ok(())
}

fn parse_format(v: &RawValue) -> Result<ResponseFormat, ApiError> {
    let f: FormatIn = serde_json::from_str(v.get()).map_err(|_| {
        invalid(
            "text.format",
            "`text.format` must be an object with a string `type`.",
        )
    })?;
    match f.kind.as_str() {
        "text" => Ok(ResponseFormat::Text),
        "json_object" => Ok(ResponseFormat::JsonObject),
        "json_schema" => {
            if let Some(d) = &f.description {
                described(Path::Root("text.format.description"), d)?;
            }
            Ok(ResponseFormat::JsonSchema {
                name: f.name.ok_or_else(|| missing("text.format.name"))?,
                description: f.description,
                schema: f
                    .schema
                    .ok_or_else(|| missing("text.format.schema"))?
                    .to_owned(),
                strict: f.strict,
            })
        }
        other => Err(invalid(
            "text.format.type",
            format!("`text.format.type` must be text, json_object or json_schema, not `{other}`."),
        )),
    }
}

// ---------------------------------------------------------------------------
// The response object

/// Ids of the answer and its output items. The provider's id is kept when it is a
/// responses id; any other is prefixed so the client sees the format's own shape.
struct Ids {
    resp: String,
}

impl Ids {
    fn new(id: Option<&str>, fallback: &str) -> Self {
        let raw = id.filter(|s| !s.is_empty()).unwrap_or(fallback);
        let resp = if raw.starts_with("resp_") {
            raw.to_string()
        } else {
            format!("resp_{raw}")
        };
        Ids { resp }
    }

    /// An output item id, unique within the answer.
    fn item(&self, prefix: &str, index: usize) -> String {
        format!("{prefix}_{}_{index}", &self.resp["resp_".len()..])
    }
}

#[derive(Serialize)]
struct SummaryText {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
}

/// A `url_citation` annotation of an output text, indexes within that text.
#[derive(Clone, Serialize)]
struct Annotation {
    #[serde(rename = "type")]
    kind: &'static str,
    start_index: u32,
    end_index: u32,
    url: String,
    title: String,
}

impl Annotation {
    /// `c` moved to a text that starts `offset` characters into the answer.
    fn of(c: &UrlCitation, offset: u32) -> Self {
        Annotation {
            kind: "url_citation",
            start_index: c.start_index.saturating_sub(offset),
            end_index: c.end_index.saturating_sub(offset),
            url: c.url.clone(),
            title: c.title.clone(),
        }
    }
}

#[derive(Serialize)]
struct OutputText {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
    annotations: Vec<Annotation>,
    logprobs: [(); 0],
}

impl OutputText {
    fn new(text: String) -> Self {
        OutputText {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: [],
        }
    }
}

/// What a `web_search_call` did.
#[derive(Serialize)]
struct SearchAction {
    #[serde(rename = "type")]
    kind: &'static str,
    query: String,
}

/// One output item of the answer.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum OutItem {
    Reasoning {
        id: String,
        summary: Vec<SummaryText>,
        #[serde(skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
    },
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
    /// A search run on the server side (the gateway's, or the provider's).
    WebSearchCall {
        id: String,
        status: &'static str,
        action: SearchAction,
    },
}

impl OutItem {
    fn web_search(s: &ServerSearch, status: &'static str) -> Self {
        let id = if s.id.starts_with("ws_") {
            s.id.clone()
        } else {
            format!("ws_{}", s.id)
        };
        OutItem::WebSearchCall {
            id,
            status,
            action: SearchAction {
                kind: "search",
                query: s.query.clone(),
            },
        }
    }

    fn reasoning(id: String) -> Self {
        OutItem::Reasoning {
            id,
            summary: Vec::new(),
            encrypted_content: None,
        }
    }

    /// A message item, announced without content.
    fn message(id: String, status: &'static str) -> Self {
        OutItem::Message {
            id,
            status,
            role: "assistant",
            content: Vec::new(),
        }
    }

    fn set_status(&mut self, to: &'static str) {
        match self {
            OutItem::Message { status, .. } | OutItem::FunctionCall { status, .. } => *status = to,
            OutItem::Reasoning { .. } | OutItem::WebSearchCall { .. } => {}
        }
    }

    /// Whether this is a reasoning item that can still take its encrypted content.
    fn open_reasoning(&self) -> bool {
        matches!(
            self,
            OutItem::Reasoning {
                encrypted_content: None,
                ..
            }
        )
    }

    /// Adds visible reasoning to a reasoning item (one summary part).
    fn add_thinking(&mut self, text: &str) {
        if let OutItem::Reasoning { summary, .. } = self {
            match summary.last_mut() {
                Some(s) => s.text.push_str(text),
                None => summary.push(SummaryText {
                    kind: "summary_text",
                    text: text.to_string(),
                }),
            }
        }
    }

    fn set_encrypted(&mut self, data: &str, new_id: Option<&str>) {
        if let OutItem::Reasoning {
            id,
            encrypted_content,
            ..
        } = self
        {
            match new_id {
                Some(n) => {
                    *encrypted_content = Some(data.to_string());
                    if !n.is_empty() {
                        *id = n.to_string();
                    }
                }
                // Anthropic's hidden reasoning (redacted thinking), marked so that a
                // replay of this item goes back to an Anthropic rung only.
                None => *encrypted_content = Some(format!("{ANTHROPIC_REASONING}{data}")),
            }
        }
    }
}

/// How the answer ended, in the format's terms.
#[derive(Clone, Copy, PartialEq)]
enum Outcome {
    Completed,
    /// `incomplete`, with `incomplete_details.reason`.
    Incomplete(&'static str),
}

impl Outcome {
    fn of(finish: Option<FinishReason>, cut: bool) -> Self {
        match finish {
            _ if cut => Outcome::Incomplete("max_output_tokens"),
            Some(FinishReason::Length) => Outcome::Incomplete("max_output_tokens"),
            Some(FinishReason::ContentFilter) => Outcome::Incomplete("content_filter"),
            _ => Outcome::Completed,
        }
    }

    fn status(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Incomplete(_) => "incomplete",
        }
    }
}

#[derive(Serialize)]
struct Incomplete {
    reason: &'static str,
}

#[derive(Serialize)]
struct CachedDetails {
    cached_tokens: u64,
    /// Tokens the provider wrote to its cache (0 on OpenAI, which never reports any).
    cache_write_tokens: u64,
}

#[derive(Serialize)]
struct ReasoningDetails {
    reasoning_tokens: u64,
}

/// Usage in the responses format's names.
#[derive(Serialize)]
struct UsageOut {
    input_tokens: u64,
    input_tokens_details: CachedDetails,
    output_tokens: u64,
    output_tokens_details: ReasoningDetails,
    total_tokens: u64,
    /// Web searches run for the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    server_tool_use_details: Option<SearchCount>,
    /// What the call cost, in USD.
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<f64>,
}

#[derive(Serialize)]
struct SearchCount {
    web_search_requests: u64,
}

impl From<&Usage> for UsageOut {
    fn from(u: &Usage) -> Self {
        UsageOut {
            input_tokens: u.input_tokens,
            input_tokens_details: CachedDetails {
                cached_tokens: u.cached_tokens,
                cache_write_tokens: u.cache_write_tokens,
            },
            output_tokens: u.output_tokens,
            output_tokens_details: ReasoningDetails {
                reasoning_tokens: u.reasoning_tokens,
            },
            total_tokens: u.total(),
            server_tool_use_details: (u.web_search_requests > 0).then_some(SearchCount {
                web_search_requests: u.web_search_requests,
            }),
            cost: u.cost_usd(),
        }
    }
}

#[derive(Serialize)]
struct ResponseObj<'a> {
    id: &'a str,
    object: &'static str,
    created_at: i64,
    status: &'static str,
    error: Option<()>,
    incomplete_details: Option<Incomplete>,
    model: &'a str,
    output: &'a [OutItem],
    usage: Option<UsageOut>,
    provider: &'a str,
    /// The request's members the object repeats (see [`echo`]).
    #[serde(skip)]
    echo: &'a str,
}

/// An answer (a whole `response` object, or stream frames) without the encrypted
/// content of its reasoning items: what a client that did not ask for
/// `reasoning.encrypted_content` gets, when the gateway asked for it to keep (or
/// rendered it from another maker's hidden reasoning). `None`: nothing to remove.
pub fn without_encrypted_content(answer: &[u8], streamed: bool) -> Option<Vec<u8>> {
    const NEEDLE: &[u8] = b"\"encrypted_content\"";
    memchr::memmem::find(answer, NEEDLE)?;
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(o) => {
                if o.get("type").and_then(|t| t.as_str()) == Some("reasoning") {
                    o.remove("encrypted_content");
                }
                o.values_mut().for_each(strip);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let rewrite = |json: &[u8]| -> Option<Vec<u8>> {
        let mut v: serde_json::Value = serde_json::from_slice(json).ok()?;
        strip(&mut v);
        serde_json::to_vec(&v).ok()
    };
    if !streamed {
        return rewrite(answer);
    }
    let mut out = Vec::with_capacity(answer.len());
    for frame in answer.split_inclusive(|&b| b == b'\n') {
        // Each frame's data is one line; only the ones that hold the member change.
        match frame.strip_prefix(b"data: ") {
            Some(data) if memchr::memmem::find(data, NEEDLE).is_some() => {
                let line = data.strip_suffix(b"\n").unwrap_or(data);
                match rewrite(line) {
                    Some(json) => {
                        out.extend_from_slice(b"data: ");
                        out.extend_from_slice(&json);
                        out.push(b'\n');
                    }
                    None => out.extend_from_slice(frame),
                }
            }
            _ => out.extend_from_slice(frame),
        }
    }
    Some(out)
}

/// The request members a `response` object repeats, as OpenAI's schema requires
/// them (`tools`, `tool_choice` and `parallel_tool_calls` never null), each the
/// client's value or the API's default: JSON members without braces.
pub fn echo(object: &RawObject) -> String {
    const FIELDS: [(&str, &str); 7] = [
        ("instructions", "null"),
        ("metadata", "{}"),
        ("parallel_tool_calls", "true"),
        ("temperature", "1.0"),
        ("tool_choice", "\"auto\""),
        ("tools", "[]"),
        ("top_p", "1.0"),
    ];
    let mut out = String::new();
    for (name, default) in FIELDS {
        let given = object.get(name).map(RawValue::get).filter(|v| *v != "null");
        let tools;
        let given = match (name, given) {
            ("tools", Some(v)) => {
                tools = echoed_tools(v);
                Some(tools.as_deref().unwrap_or(v))
            }
            _ => given,
        };
        let value = match (name, given) {
            (_, Some(v)) => v,
            // Nullable members stay null when the client said null.
            ("instructions" | "temperature" | "top_p", None) if object.contains_key(name) => "null",
            (_, None) => default,
        };
        if !out.is_empty() {
            out.push(',');
        }
        out.push('"');
        out.push_str(name);
        out.push_str("\":");
        out.push_str(value);
    }
    out
}

/// The request's tools as a `response` object repeats them: a function tool with
/// its `strict` (the API's default, true) and `parameters` (null) filled in.
fn echoed_tools(raw: &str) -> Option<String> {
    let mut tools: Vec<serde_json::Map<String, serde_json::Value>> =
        serde_json::from_str(raw).ok()?;
    for t in &mut tools {
        if t.get("type").and_then(|v| v.as_str()) == Some("function") {
            t.entry("strict").or_insert(serde_json::Value::Bool(true));
            t.entry("parameters").or_insert(serde_json::Value::Null);
        }
    }
    serde_json::to_string(&tools).ok()
}

/// Writes a response object into `out`; a finished one carries the receipt and the
/// disclosure of dropped fields.
fn write_response(out: &mut Vec<u8>, obj: &ResponseObj, tail: Option<&Tail>) {
    let start = out.len();
    // Serializing plain strings and numbers into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, obj);
    if !obj.echo.is_empty() && out.last() == Some(&b'}') {
        out.pop();
        out.push(b',');
        out.extend_from_slice(obj.echo.as_bytes());
        out.push(b'}');
    }
    let Some(tail) = tail else { return };
    if !tail.receipt.is_empty() {
        append_member(out, start, RECEIPT_MEMBER, tail.receipt.as_bytes());
    }
    if let Some(ignored) = &tail.ignored {
        let v = serde_json::to_vec(ignored).unwrap_or_default();
        append_member(out, start, IGNORED_MEMBER, &v);
    }
}

/// The output items of a whole answer, in order: the searches run for it, then its
/// parts (visible reasoning and the encrypted content that follows it share one
/// reasoning item); each message's text carries the citations of its span.
fn items_of(resp: &Response, ids: &Ids) -> Vec<OutItem> {
    let mut items: Vec<OutItem> = resp
        .searches
        .iter()
        .map(|s| OutItem::web_search(s, "completed"))
        .collect();
    // Characters of answer text before the part being read.
    let mut offset = 0u32;
    for p in &resp.parts {
        if let Part::Text { text } = p {
            let len = text.chars().count() as u32;
            if !text.is_empty() {
                let n = items.len();
                let mut out = OutputText::new(text.clone());
                out.annotations = resp
                    .citations
                    .iter()
                    .filter(|c| c.start_index >= offset && c.start_index < offset + len)
                    .map(|c| Annotation::of(c, offset))
                    .collect();
                let mut item = OutItem::message(ids.item("msg", n), "completed");
                if let OutItem::Message { content, .. } = &mut item {
                    content.push(out);
                }
                items.push(item);
            }
            offset += len;
            continue;
        }
        let n = items.len();
        match p {
            Part::Thinking { text, .. } if text.is_empty() => {}
            Part::Thinking { text, .. } => {
                if !items.last().is_some_and(OutItem::open_reasoning) {
                    items.push(OutItem::reasoning(ids.item("rs", n)));
                }
                if let Some(it) = items.last_mut() {
                    it.add_thinking(text);
                }
            }
            Part::EncryptedReasoning { data, id } => {
                if !items.last().is_some_and(OutItem::open_reasoning) {
                    items.push(OutItem::reasoning(ids.item("rs", n)));
                }
                if let Some(it) = items.last_mut() {
                    it.set_encrypted(data, id.as_deref());
                }
            }
            Part::Text { .. } => {}
            Part::ToolCall {
                id,
                name,
                arguments,
            } => items.push(OutItem::FunctionCall {
                id: ids.item("fc", n),
                call_id: id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
                status: "completed",
            }),
            // Inputs never appear in an answer.
            Part::Image { .. } | Part::Document { .. } | Part::ToolResult { .. } => {}
        }
    }
    items
}

/// One whole answer as a `response` object.
pub fn render(resp: &Response, meta: &Meta, tail: &Tail) -> Vec<u8> {
    let ids = Ids::new(resp.id.as_deref(), &meta.fallback_id);
    let mut items = items_of(resp, &ids);
    let outcome = Outcome::of(resp.finish, tail.cut);
    if let (Outcome::Incomplete(_), Some(last)) = (outcome, items.last_mut()) {
        last.set_status("incomplete");
    }
    let obj = ResponseObj {
        id: &ids.resp,
        object: "response",
        created_at: meta.created,
        status: outcome.status(),
        error: None,
        incomplete_details: match outcome {
            Outcome::Incomplete(reason) => Some(Incomplete { reason }),
            Outcome::Completed => None,
        },
        model: resp.model.as_deref().unwrap_or(&meta.slug),
        output: &items,
        usage: Some(UsageOut::from(&tail.usage)),
        provider: &meta.provider,
        echo: &meta.echo,
    };
    let mut out = Vec::with_capacity(512 + tail.receipt.len());
    write_response(&mut out, &obj, Some(tail));
    out
}

// ---------------------------------------------------------------------------
// The stream

/// A stream event: its `type` (also the SSE `event:` name) and `sequence_number`
/// around the event's own members.
#[derive(Serialize)]
struct Envelope<'a, T: Serialize> {
    #[serde(rename = "type")]
    kind: &'a str,
    sequence_number: u64,
    #[serde(flatten)]
    body: T,
}

#[derive(Serialize)]
struct ItemEvent<'a> {
    output_index: usize,
    item: &'a OutItem,
}

#[derive(Serialize)]
struct PartEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    part: &'a OutputText,
}

#[derive(Serialize)]
struct TextDelta<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    delta: &'a str,
    logprobs: [(); 0],
}

#[derive(Serialize)]
struct TextDone<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    text: &'a str,
    logprobs: [(); 0],
}

#[derive(Serialize)]
struct SummaryPartEvent<'a> {
    item_id: &'a str,
    output_index: usize,
    summary_index: usize,
    part: &'a SummaryText,
}

#[derive(Serialize)]
struct SummaryDelta<'a> {
    item_id: &'a str,
    output_index: usize,
    summary_index: usize,
    delta: &'a str,
}

#[derive(Serialize)]
struct SummaryDone<'a> {
    item_id: &'a str,
    output_index: usize,
    summary_index: usize,
    text: &'a str,
}

#[derive(Serialize)]
struct ArgsDelta<'a> {
    item_id: &'a str,
    output_index: usize,
    delta: &'a str,
}

#[derive(Serialize)]
struct ItemRef<'a> {
    item_id: &'a str,
    output_index: usize,
}

#[derive(Serialize)]
struct AnnotationAdded<'a> {
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    annotation_index: usize,
    annotation: &'a Annotation,
}

#[derive(Serialize)]
struct ArgsDone<'a> {
    item_id: &'a str,
    output_index: usize,
    name: &'a str,
    arguments: &'a str,
}

/// Writes one named event straight into `out`.
fn frame<T: Serialize>(out: &mut Vec<u8>, seq: &mut u64, name: &str, body: T) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    let env = Envelope {
        kind: name,
        sequence_number: *seq,
        body,
    };
    // Serializing strings and numbers into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &env);
    out.extend_from_slice(b"\n\n");
    *seq += 1;
}

/// Writes a lifecycle event, which carries the response object (the last one with
/// the tail's members).
fn lifecycle(out: &mut Vec<u8>, seq: u64, name: &str, obj: &ResponseObj, tail: Option<&Tail>) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "event: {name}\ndata: {{\"type\":\"{name}\",\"sequence_number\":{seq},\"response\":"
    );
    write_response(out, obj, tail);
    out.extend_from_slice(b"}\n\n");
}

/// Encodes canonical events as the responses API's stream: `response.created` and
/// `response.in_progress`, then each output item's added / delta / done events,
/// then `response.completed` (or `response.incomplete`) with the whole response.
///
/// Text and function calls stream as they arrive. A reasoning item is written when
/// it closes: its id (needed to replay its encrypted content) is known only then.
pub struct Encoder {
    meta: Meta,
    seq: u64,
    ids: Option<Ids>,
    model: Option<String>,
    items: Vec<OutItem>,
    /// The output index of the item still taking deltas.
    open: Option<usize>,
    /// Output index of each tool call, by its canonical index.
    calls: Vec<(u32, usize)>,
    finish: Option<FinishReason>,
    /// Each message item's output index and where its text starts in the
    /// answer's text (characters): citations are placed by it.
    texts: Vec<(usize, u32)>,
    /// Characters of answer text so far.
    chars: u32,
}

/// The id of the output item at `index`.
fn item_id(items: &[OutItem], index: usize) -> &str {
    match items.get(index) {
        Some(OutItem::Reasoning { id, .. })
        | Some(OutItem::Message { id, .. })
        | Some(OutItem::FunctionCall { id, .. })
        | Some(OutItem::WebSearchCall { id, .. }) => id,
        None => "",
    }
}

impl Encoder {
    pub fn new(meta: Meta) -> Self {
        Encoder {
            meta,
            seq: 0,
            ids: None,
            model: None,
            items: Vec::new(),
            open: None,
            calls: Vec::new(),
            finish: None,
            texts: Vec::new(),
            chars: 0,
        }
    }

    /// A search shown as a `web_search_call` item, whole: added, its three
    /// progress events, done.
    fn search(&mut self, s: &ServerSearch, out: &mut Vec<u8>) {
        self.close(out, "completed");
        let index = self.items.len();
        self.items.push(OutItem::web_search(s, "in_progress"));
        self.added(index, out);
        for name in [
            "response.web_search_call.in_progress",
            "response.web_search_call.searching",
            "response.web_search_call.completed",
        ] {
            let ev = ItemRef {
                item_id: item_id(&self.items, index),
                output_index: index,
            };
            frame(out, &mut self.seq, name, ev);
        }
        if let Some(OutItem::WebSearchCall { status, .. }) = self.items.get_mut(index) {
            *status = "completed";
        }
        if let Some(item) = self.items.get(index) {
            let ev = ItemEvent {
                output_index: index,
                item,
            };
            frame(out, &mut self.seq, "response.output_item.done", ev);
        }
    }

    /// A citation, on the message whose text holds its start.
    fn cite(&mut self, c: &UrlCitation, out: &mut Vec<u8>) {
        let Some(&(index, start)) = self
            .texts
            .iter()
            .rev()
            .find(|(_, start)| *start <= c.start_index)
            .or(self.texts.first())
        else {
            return;
        };
        let annotation = Annotation::of(c, start);
        let Some(OutItem::Message { id, content, .. }) = self.items.get_mut(index) else {
            return;
        };
        let Some(part) = content.first_mut() else {
            return;
        };
        part.annotations.push(annotation);
        let ev = AnnotationAdded {
            item_id: id,
            output_index: index,
            content_index: 0,
            annotation_index: part.annotations.len() - 1,
            annotation: &part.annotations[part.annotations.len() - 1],
        };
        frame(
            out,
            &mut self.seq,
            "response.output_text.annotation.added",
            ev,
        );
    }

    fn ids(&self) -> &str {
        self.ids.as_ref().map_or("", |i| i.resp.as_str())
    }

    /// The response object as it stands.
    fn snapshot<'a>(&'a self, outcome: Option<Outcome>, usage: Option<&Usage>) -> ResponseObj<'a> {
        ResponseObj {
            id: self.ids(),
            object: "response",
            created_at: self.meta.created,
            status: outcome.map_or("in_progress", Outcome::status),
            error: None,
            incomplete_details: match outcome {
                Some(Outcome::Incomplete(reason)) => Some(Incomplete { reason }),
                _ => None,
            },
            model: self.model.as_deref().unwrap_or(&self.meta.slug),
            output: if outcome.is_some() { &self.items } else { &[] },
            usage: usage.map(UsageOut::from),
            provider: &self.meta.provider,
            echo: &self.meta.echo,
        }
    }

    /// Writes `response.created` and `response.in_progress` before anything else.
    fn start(&mut self, id: Option<&str>, out: &mut Vec<u8>) {
        if self.ids.is_some() {
            return;
        }
        self.ids = Some(Ids::new(id, &self.meta.fallback_id));
        for name in ["response.created", "response.in_progress"] {
            lifecycle(out, self.seq, name, &self.snapshot(None, None), None);
            self.seq += 1;
        }
    }

    /// Opens a new item at the end of the output (the previous one closes first).
    fn push_item(&mut self, out: &mut Vec<u8>, make: impl FnOnce(&Ids, usize) -> OutItem) -> usize {
        self.close(out, "completed");
        let index = self.items.len();
        let item = match &self.ids {
            Some(ids) => make(ids, index),
            None => make(&Ids::new(None, &self.meta.fallback_id), index),
        };
        self.items.push(item);
        self.open = Some(index);
        index
    }

    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() {
            return;
        }
        let index = match self.open {
            Some(i) if matches!(self.items.get(i), Some(OutItem::Message { .. })) => i,
            _ => {
                let i = self.push_item(out, |ids, i| {
                    OutItem::message(ids.item("msg", i), "in_progress")
                });
                // The item is announced without content, then its one text part.
                self.texts.push((i, self.chars));
                self.added(i, out);
                if let Some(OutItem::Message { id, content, .. }) = self.items.get_mut(i) {
                    content.push(OutputText::new(String::new()));
                    if let Some(part) = content.first() {
                        let ev = PartEvent {
                            item_id: id,
                            output_index: i,
                            content_index: 0,
                            part,
                        };
                        frame(out, &mut self.seq, "response.content_part.added", ev);
                    }
                }
                i
            }
        };
        if let Some(OutItem::Message { content, .. }) = self.items.get_mut(index) {
            if let Some(part) = content.first_mut() {
                part.text.push_str(text);
            }
        }
        self.chars += text.chars().count() as u32;
        let ev = TextDelta {
            item_id: item_id(&self.items, index),
            output_index: index,
            content_index: 0,
            delta: text,
            logprobs: [],
        };
        frame(out, &mut self.seq, "response.output_text.delta", ev);
    }

    fn thinking(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() {
            return;
        }
        let index = match self.open {
            Some(i) if self.items.get(i).is_some_and(OutItem::open_reasoning) => i,
            _ => self.push_item(out, |ids, i| OutItem::reasoning(ids.item("rs", i))),
        };
        if let Some(it) = self.items.get_mut(index) {
            it.add_thinking(text);
        }
    }

    fn encrypted(&mut self, data: &str, id: Option<&str>, out: &mut Vec<u8>) {
        let index = match self.open {
            Some(i) if self.items.get(i).is_some_and(OutItem::open_reasoning) => i,
            _ => self.push_item(out, |ids, i| OutItem::reasoning(ids.item("rs", i))),
        };
        if let Some(it) = self.items.get_mut(index) {
            it.set_encrypted(data, id);
        }
        self.close(out, "completed");
    }

    fn tool_start(&mut self, index: u32, call_id: &str, name: &str, out: &mut Vec<u8>) {
        let i = self.push_item(out, |ids, i| OutItem::FunctionCall {
            id: ids.item("fc", i),
            call_id: call_id.to_string(),
            name: name.to_string(),
            arguments: String::new(),
            status: "in_progress",
        });
        self.calls.push((index, i));
        self.added(i, out);
    }

    fn tool_args(&mut self, index: u32, args: &str, out: &mut Vec<u8>) {
        let Some(&(_, i)) = self.calls.iter().rev().find(|(c, _)| *c == index) else {
            return;
        };
        if let Some(OutItem::FunctionCall { arguments, .. }) = self.items.get_mut(i) {
            arguments.push_str(args);
        }
        // A call that already closed keeps the late pieces in the final response.
        if self.open == Some(i) && !args.is_empty() {
            let ev = ArgsDelta {
                item_id: item_id(&self.items, i),
                output_index: i,
                delta: args,
            };
            frame(
                out,
                &mut self.seq,
                "response.function_call_arguments.delta",
                ev,
            );
        }
    }

    fn added(&mut self, index: usize, out: &mut Vec<u8>) {
        if let Some(item) = self.items.get(index) {
            let ev = ItemEvent {
                output_index: index,
                item,
            };
            frame(out, &mut self.seq, "response.output_item.added", ev);
        }
    }

    /// Closes the open item with its done events.
    fn close(&mut self, out: &mut Vec<u8>, status: &'static str) {
        let Some(index) = self.open.take() else {
            return;
        };
        let Some(item) = self.items.get_mut(index) else {
            return;
        };
        item.set_status(status);
        let seq = &mut self.seq;
        match &*item {
            OutItem::Message { id, content, .. } => {
                if let Some(part) = content.first() {
                    let done = TextDone {
                        item_id: id,
                        output_index: index,
                        content_index: 0,
                        text: &part.text,
                        logprobs: [],
                    };
                    frame(out, seq, "response.output_text.done", done);
                    let ev = PartEvent {
                        item_id: id,
                        output_index: index,
                        content_index: 0,
                        part,
                    };
                    frame(out, seq, "response.content_part.done", ev);
                }
            }
            OutItem::FunctionCall {
                id,
                name,
                arguments,
                ..
            } => {
                let ev = ArgsDone {
                    item_id: id,
                    output_index: index,
                    name,
                    arguments,
                };
                frame(out, seq, "response.function_call_arguments.done", ev);
            }
            // Written whole when it was added.
            OutItem::WebSearchCall { .. } => return,
            OutItem::Reasoning { id, summary, .. } => {
                // Written whole now that its id is final.
                let ev = ItemEvent {
                    output_index: index,
                    item: &OutItem::Reasoning {
                        id: id.clone(),
                        summary: Vec::new(),
                        encrypted_content: None,
                    },
                };
                frame(out, seq, "response.output_item.added", ev);
                let empty = SummaryText {
                    kind: "summary_text",
                    text: String::new(),
                };
                for (j, part) in summary.iter().enumerate() {
                    let added = SummaryPartEvent {
                        item_id: id,
                        output_index: index,
                        summary_index: j,
                        part: &empty,
                    };
                    frame(out, seq, "response.reasoning_summary_part.added", added);
                    let delta = SummaryDelta {
                        item_id: id,
                        output_index: index,
                        summary_index: j,
                        delta: &part.text,
                    };
                    frame(out, seq, "response.reasoning_summary_text.delta", delta);
                    let done = SummaryDone {
                        item_id: id,
                        output_index: index,
                        summary_index: j,
                        text: &part.text,
                    };
                    frame(out, seq, "response.reasoning_summary_text.done", done);
                    let done = SummaryPartEvent {
                        item_id: id,
                        output_index: index,
                        summary_index: j,
                        part,
                    };
                    frame(out, seq, "response.reasoning_summary_part.done", done);
                }
            }
        }
        let ev = ItemEvent {
            output_index: index,
            item,
        };
        frame(out, seq, "response.output_item.done", ev);
    }
}

impl StreamEncoder for Encoder {
    fn event(&mut self, ev: &Event, out: &mut Vec<u8>) {
        match ev {
            Event::Start { id, model } => {
                if model.is_some() {
                    self.model.clone_from(model);
                }
                self.start(id.as_deref(), out);
                return;
            }
            _ => self.start(None, out),
        }
        match ev {
            Event::Text { text } => self.text(text, out),
            Event::Thinking { text } => self.thinking(text, out),
            Event::EncryptedReasoning { data, id } => self.encrypted(data, id.as_deref(), out),
            Event::ToolCallStart { index, id, name } => self.tool_start(*index, id, name, out),
            Event::ToolCallArgs { index, arguments } => self.tool_args(*index, arguments, out),
            Event::Finish { reason, .. } => self.finish = Some(*reason),
            Event::ServerSearch(s) => self.search(s, out),
            Event::Citation(c) => self.cite(c, out),
            // Usage comes whole with the tail; signatures have no place in this
            // format; refusals and errors are settled by the gateway.
            Event::Usage(_)
            | Event::ThinkingSignature { .. }
            | Event::Refusal { .. }
            | Event::Error { .. }
            | Event::Start { .. } => {}
        }
    }

    fn end(&mut self, tail: &Tail, out: &mut Vec<u8>) {
        self.start(None, out);
        let outcome = Outcome::of(self.finish, tail.cut);
        // The item still open is where the answer stopped.
        self.close(out, outcome.status());
        let name = match outcome {
            Outcome::Completed => "response.completed",
            Outcome::Incomplete(_) => "response.incomplete",
        };
        let obj = self.snapshot(Some(outcome), Some(&tail.usage));
        lifecycle(out, self.seq, name, &obj, Some(tail));
        self.seq += 1;
    }
}

/// The `error` event that ends a stream whose header already went out. No
/// response event was written before it (after the commit a failure settles as a
/// cut), so it is the first in sequence.
pub fn error_frame(err: &ApiError) -> Vec<u8> {
    let mut v = err.to_value(Format::OpenAi);
    let mut obj = match v.get_mut("error").map(serde_json::Value::take) {
        Some(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    obj.insert("type".into(), "error".into());
    obj.insert("sequence_number".into(), 0.into());
    let data = serde_json::to_vec(&obj).unwrap_or_default();
    crate::sse::named_frame("error", &data)
}

#[cfg(test)]
mod encrypted_tests {
    use super::without_encrypted_content;
    use serde_json::{json, Value};

    #[test]
    fn encrypted_reasoning_leaves_whole_answers_and_stream_frames_alone_else() {
        let whole = json!({"id": "r", "output": [
            {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "gA"},
            {"type": "message", "content": [{"type": "output_text", "text": "encrypted_content"}]}
        ]});
        let out = without_encrypted_content(&serde_json::to_vec(&whole).unwrap(), false).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert!(v["output"][0].get("encrypted_content").is_none());
        assert_eq!(v["output"][1], whole["output"][1]);
        let sse = b"event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"item\":{\"type\":\"reasoning\",\"id\":\"rs\",\"encrypted_content\":\"gA\",\"summary\":[]}}\n\nevent: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n";
        let out = String::from_utf8(without_encrypted_content(sse, true).unwrap()).unwrap();
        assert!(!out.contains("gA"), "{out}");
        assert!(
            out.starts_with("event: response.output_item.done\ndata: {"),
            "{out}"
        );
        assert!(out.ends_with("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n"), "{out}");
        assert!(without_encrypted_content(b"{\"id\":\"r\"}", false).is_none());
    }
}
