//! The chat-completions inbound format (`POST /v1/chat/completions`): the body
//! parsed and validated into the canonical [`Request`]; answers rendered back as a
//! `chat.completion` object, whole or as `chat.completion.chunk` SSE frames (see the
//! module contract in `inbound`).
//!
//! Every standard field is handled: modelled fields go to the canonical form; fields
//! only an OpenAI rung understands (`metadata`, `service_tier`, `logprobs`, ...) are
//! kept verbatim in `extras`; fields refused on every route and unknown fields are a
//! 400 naming them, as is an unknown key inside a message.
//!
//! Visible reasoning of another maker (thinking parts) has no standard chat field:
//! it is rendered as `message.reasoning_content` (stream: `delta.reasoning_content`),
//! the member OpenAI-compatible servers use, so it is never silently dropped.

use super::common::{
    check_description, invalid, malformed, refused_everywhere, unsupported, MAX_DESCRIPTION_CHARS,
};
use crate::error::{ApiError, Format};
use crate::ir::{
    Event, Extra, FinishReason, Message, Meta, Part, Reasoning, Request, Response, ResponseFormat,
    Role, SearchForm, StreamEncoder, Tail, Tool, ToolChoice, ToolSearch, ToolSearchKind,
    UrlCitation, IGNORED_MEMBER,
};
use crate::json::Member;
use crate::sse::data_frame;
use crate::usage::usage_json;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::fmt;

/// Top-level fields an OpenAI rung understands and the canonical form does not
/// model: kept verbatim, forwarded to OpenAI rungs only.
const EXTRA_FIELDS: [&str; 7] = [
    "metadata",
    "service_tier",
    "store",
    "logprobs",
    "top_logprobs",
    "verbosity",
    "safety_identifier",
];

/// The chat declaration of tool search (the vendor prefix neutralised as
/// `service`).
const TOOL_SEARCH_TYPE: &str = "service:tool_search";

/// Parameters for a function that declares none.
const EMPTY_PARAMETERS: &str = r#"{"type":"object","properties":{}}"#;

/// Where a value sits in the body (`messages[3].content[1]`), spelled out only when
/// an error names it: a valid body costs no formatting.
#[derive(Clone, Copy)]
enum At<'a> {
    Root(&'static str),
    Index(&'a At<'a>, usize),
    Key(&'a At<'a>, &'static str),
}

impl<'a> At<'a> {
    fn at(&'a self, i: usize) -> At<'a> {
        At::Index(self, i)
    }

    fn key(&'a self, k: &'static str) -> At<'a> {
        At::Key(self, k)
    }
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            At::Root(name) => f.write_str(name),
            At::Index(p, i) => write!(f, "{p}[{i}]"),
            At::Key(p, k) => write!(f, "{p}.{k}"),
        }
    }
}

fn is_null(v: &RawValue) -> bool {
    v.get() == "null"
}

/// Reads an optional member of type `T`; `null` is absent.
fn opt<'a, T: Deserialize<'a>>(
    v: Option<&'a RawValue>,
    param: impl fmt::Display,
    what: &str,
) -> Result<Option<T>, ApiError> {
    opt_with(v, param, what, |v| serde_json::from_str(v.get()))
}

/// [`opt`] of a string, borrowed from the body when it holds no escapes.
fn opt_str<'a>(
    v: Option<&'a RawValue>,
    param: impl fmt::Display,
) -> Result<Option<Cow<'a, str>>, ApiError> {
    opt_with(v, param, "a string", crate::json::valid_string_value)
}

/// An optional member read by `read`; `null` is absent, anything `read` refuses is
/// a 400 naming `param`.
fn opt_with<'a, T>(
    v: Option<&'a RawValue>,
    param: impl fmt::Display,
    what: &str,
    read: impl FnOnce(&'a RawValue) -> Result<T, serde_json::Error>,
) -> Result<Option<T>, ApiError> {
    match v {
        None => Ok(None),
        Some(v) if is_null(v) => Ok(None),
        Some(v) => read(v)
            .map(Some)
            .map_err(|_| invalid(param.to_string(), format!("`{param}` must be {what}."))),
    }
}

fn members<'a>(v: &'a RawValue, param: impl fmt::Display) -> Result<Vec<Member<'a>>, ApiError> {
    crate::json::split_valid_object(v)
        .map_err(|_| invalid(param.to_string(), format!("`{param}` must be an object.")))
}

fn array(v: &RawValue, param: impl fmt::Display) -> Result<Vec<&RawValue>, ApiError> {
    crate::json::split_valid_array(v)
        .map_err(|_| invalid(param.to_string(), format!("`{param}` must be an array.")))
}

fn get<'a>(fields: &[Member<'a>], key: &str) -> Option<&'a RawValue> {
    fields.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

/// Checks a number lies in `lo..=hi`.
fn ranged(v: Option<f64>, param: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) => Err(invalid(
            param,
            format!("`{param}` must be between {lo} and {hi}."),
        )),
        v => Ok(v),
    }
}

/// Parses and validates a chat-completions body.
pub fn parse(body: &[u8]) -> Result<Request, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| malformed("The body is not UTF-8."))?;
    let top = crate::json::split_object(text).map_err(ApiError::invalid_json)?;
    parse_members(&top)
}

/// [`parse`] of a body already split into its top-level members.
pub fn parse_members(top: &[Member<'_>]) -> Result<Request, ApiError> {
    let mut r = Request::default();
    let mut max_tokens: Option<u64> = None;
    let mut max_completion: Option<u64> = None;
    let mut messages = None;
    for (k, v) in top {
        let v: &RawValue = v;
        match k.as_ref() {
            "model" => {
                r.model = opt_str(Some(v), "model")?
                    .ok_or_else(|| invalid("model", "`model` must be a string."))?
                    .into_owned()
            }
            "messages" => messages = Some(v),
            "stream" => r.stream = opt::<bool>(Some(v), "stream", "a boolean")?.unwrap_or(false),
            "stream_options" => {
                if let Some(o) = opt::<Value>(Some(v), "stream_options", "an object")? {
                    match o.get("include_usage") {
                        None | Some(Value::Null) => {}
                        Some(Value::Bool(b)) => r.include_usage = *b,
                        Some(_) => {
                            return Err(invalid(
                                "stream_options.include_usage",
                                "`stream_options.include_usage` must be a boolean.",
                            ))
                        }
                    }
                }
            }
            "tools" => parse_tools(v, &mut r)?,
            "tool_choice" => r.tool_choice = parse_tool_choice(v)?,
            "parallel_tool_calls" => {
                r.parallel_tool_calls = opt(Some(v), "parallel_tool_calls", "a boolean")?
            }
            "max_tokens" => max_tokens = opt(Some(v), "max_tokens", "a positive integer")?,
            "max_completion_tokens" => {
                max_completion = opt(Some(v), "max_completion_tokens", "a positive integer")?
            }
            "temperature" => {
                r.temperature = ranged(
                    opt(Some(v), "temperature", "a number")?,
                    "temperature",
                    0.0,
                    2.0,
                )?
            }
            "top_p" => r.top_p = ranged(opt(Some(v), "top_p", "a number")?, "top_p", 0.0, 1.0)?,
            "top_k" => r.top_k = opt(Some(v), "top_k", "a positive integer")?,
            "frequency_penalty" => {
                r.frequency_penalty = ranged(
                    opt(Some(v), "frequency_penalty", "a number")?,
                    "frequency_penalty",
                    -2.0,
                    2.0,
                )?
            }
            "presence_penalty" => {
                r.presence_penalty = ranged(
                    opt(Some(v), "presence_penalty", "a number")?,
                    "presence_penalty",
                    -2.0,
                    2.0,
                )?
            }
            "stop" => r.stop = parse_stop(v)?,
            "n" => {
                if let Some(n) = opt::<u64>(Some(v), "n", "a positive integer")? {
                    if n != 1 {
                        return Err(unsupported("n", "Only one choice (`n: 1`) is served."));
                    }
                }
            }
            "response_format" => r.response_format = parse_format(v)?,
            "web_search_options" => parse_web_search_options(v, &mut r)?,
            "plugins" => super::common::parse_plugins(v, &mut r)?,
            "reasoning_effort" => {
                if let Some(effort) = opt::<String>(Some(v), "reasoning_effort", "a string")? {
                    r.reasoning = Some(Reasoning {
                        effort: Some(effort),
                        ..Reasoning::default()
                    });
                }
            }
            "user" => r.user = opt(Some(v), "user", "a string")?,
            "prompt_cache_key" => {
                r.prompt_cache_key = opt(Some(v), "prompt_cache_key", "a string")?
            }
            name if EXTRA_FIELDS.contains(&name) => {
                if !is_null(v) {
                    r.extras.push(Extra {
                        name: name.to_string(),
                        value: v.to_owned(),
                    });
                }
            }
            name => {
                return Err(refused_everywhere(name).unwrap_or_else(|| {
                    unsupported(
                        name,
                        format!(
                        "The parameter `{name}` is not supported on the chat-completions route."
                    ),
                    )
                }))
            }
        }
    }
    if r.model.is_empty() {
        return Err(ApiError::new(
            crate::error::ErrorCode::InvalidRequest,
            "`model` is required.",
        )
        .param("model"));
    }
    r.max_tokens = match (max_tokens, max_completion) {
        (Some(a), Some(b)) if a != b => {
            return Err(invalid(
                "max_completion_tokens",
                "`max_tokens` and `max_completion_tokens` disagree; send one.",
            ))
        }
        (a, b) => b.or(a),
    };
    if r.max_tokens == Some(0) {
        return Err(invalid("max_tokens", "`max_tokens` must be positive."));
    }
    let messages = messages.ok_or_else(|| {
        ApiError::new(
            crate::error::ErrorCode::InvalidRequest,
            "`messages` is required.",
        )
        .param("messages")
    })?;
    parse_messages(messages, &mut r)?;
    super::common::check_tool_search(&r)?;
    Ok(r)
}

/// `web_search_options`: web search, its object kept for OpenAI's search models.
fn parse_web_search_options(v: &RawValue, r: &mut Request) -> Result<(), ApiError> {
    if is_null(v) {
        return Ok(());
    }
    let fields = members(v, "web_search_options")?;
    let size: Option<String> = opt(
        get(&fields, "search_context_size"),
        "web_search_options.search_context_size",
        "a string",
    )?;
    let ws = super::common::want_web_search(r, SearchForm::ChatOptions);
    ws.raw = Some(v.to_owned());
    if size.is_some() {
        ws.context_size = size;
    }
    Ok(())
}

fn parse_stop(v: &RawValue) -> Result<Vec<String>, ApiError> {
    if is_null(v) {
        return Ok(Vec::new());
    }
    if let Ok(s) = serde_json::from_str::<String>(v.get()) {
        return Ok(vec![s]);
    }
    let list: Vec<String> = serde_json::from_str(v.get())
        .map_err(|_| invalid("stop", "`stop` must be a string or an array of strings."))?;
    if list.len() > 4 {
        return Err(invalid("stop", "`stop` takes at most 4 sequences."));
    }
    Ok(list)
}

fn parse_format(v: &RawValue) -> Result<Option<ResponseFormat>, ApiError> {
    if is_null(v) {
        return Ok(None);
    }
    let fields = members(v, "response_format")?;
    let kind: String =
        opt(get(&fields, "type"), "response_format.type", "a string")?.ok_or_else(|| {
            invalid(
                "response_format.type",
                "`response_format.type` is required.",
            )
        })?;
    match kind.as_str() {
        "text" => Ok(Some(ResponseFormat::Text)),
        "json_object" => Ok(Some(ResponseFormat::JsonObject)),
        "json_schema" => {
            let js = get(&fields, "json_schema").ok_or_else(|| {
                invalid(
                    "response_format.json_schema",
                    "`response_format.json_schema` is required.",
                )
            })?;
            let js = members(js, "response_format.json_schema")?;
            let name: String = opt(
                get(&js, "name"),
                "response_format.json_schema.name",
                "a string",
            )?
            .ok_or_else(|| {
                invalid(
                    "response_format.json_schema.name",
                    "`response_format.json_schema.name` is required.",
                )
            })?;
            let description: Option<String> = opt(
                get(&js, "description"),
                "response_format.json_schema.description",
                "a string",
            )?;
            if let Some(d) = &description {
                check_description("response_format.json_schema.description".into(), d)?;
            }
            let schema = match get(&js, "schema") {
                Some(s) if !is_null(s) => s.to_owned(),
                _ => RawValue::from_string("{}".into()).map_err(|_| ApiError::internal())?,
            };
            let strict = opt(
                get(&js, "strict"),
                "response_format.json_schema.strict",
                "a boolean",
            )?;
            Ok(Some(ResponseFormat::JsonSchema {
                name,
                description,
                schema,
                strict,
            }))
        }
        _ => Err(invalid(
            "response_format.type",
            "`response_format.type` must be text, json_object or json_schema.",
        )),
    }
}

fn parse_tools(v: &RawValue, r: &mut Request) -> Result<(), ApiError> {
    if is_null(v) {
        return Ok(());
    }
    let tools = At::Root("tools");
    for (i, t) in array(v, "tools")?.into_iter().enumerate() {
        let p = tools.at(i);
        let fields = members(t, p)?;
        let kind: String =
            opt(get(&fields, "type"), p.key("type"), "a string")?.unwrap_or_default();
        if kind == TOOL_SEARCH_TYPE {
            let max_results: Option<u32> = opt(
                get(&fields, "max_results"),
                p.key("max_results"),
                "an integer from 1 to 50",
            )?;
            if max_results.is_some_and(|n| !(1..=50).contains(&n)) {
                return Err(invalid(
                    format!("{p}.max_results"),
                    "`max_results` must be an integer from 1 to 50.",
                ));
            }
            r.tool_search = Some(Box::new(ToolSearch {
                kind: ToolSearchKind::Bm25,
                max_results,
            }));
            continue;
        }
        if kind != "function" {
            return Err(unsupported(
                format!("{p}.type"),
                format!("Tools of type {kind:?} are not served on this route; use function tools."),
            ));
        }
        let f = get(&fields, "function").ok_or_else(|| {
            invalid(
                format!("{p}.function"),
                format!("`{p}.function` is required."),
            )
        })?;
        let f = members(f, p.key("function"))?;
        let name: String = opt(get(&f, "name"), p.key("function").key("name"), "a string")?
            .filter(|n: &String| !n.is_empty())
            .ok_or_else(|| {
                invalid(
                    format!("{p}.function.name"),
                    format!("`{p}.function.name` is required."),
                )
            })?;
        let description: Option<String> = opt(
            get(&f, "description"),
            p.key("function").key("description"),
            "a string",
        )?;
        if let Some(d) = &description {
            // Bytes bound characters: only a long text is counted and named.
            if d.len() > MAX_DESCRIPTION_CHARS {
                check_description(format!("{p}.function.description"), d)?;
            }
        }
        let parameters = match get(&f, "parameters") {
            Some(s) if !is_null(s) => s.to_owned(),
            _ => {
                RawValue::from_string(EMPTY_PARAMETERS.into()).map_err(|_| ApiError::internal())?
            }
        };
        let strict = opt(
            get(&f, "strict"),
            p.key("function").key("strict"),
            "a boolean",
        )?;
        let deferred = super::common::defer_loading(
            get(&fields, "defer_loading"),
            format!("{p}.defer_loading"),
        )?;
        let tool = Tool {
            name,
            description,
            parameters,
            strict,
        };
        if deferred {
            r.deferred.push(tool);
        } else {
            r.tools.push(tool);
        }
    }
    Ok(())
}

fn parse_tool_choice(v: &RawValue) -> Result<Option<ToolChoice>, ApiError> {
    if is_null(v) {
        return Ok(None);
    }
    if let Ok(s) = serde_json::from_str::<String>(v.get()) {
        return match s.as_str() {
            "auto" => Ok(Some(ToolChoice::Auto)),
            "none" => Ok(Some(ToolChoice::None)),
            "required" => Ok(Some(ToolChoice::Required)),
            _ => Err(invalid(
                "tool_choice",
                "`tool_choice` must be auto, none, required or a function.",
            )),
        };
    }
    #[derive(Deserialize)]
    struct Named {
        function: NamedFn,
    }
    #[derive(Deserialize)]
    struct NamedFn {
        name: String,
    }
    serde_json::from_str::<Named>(v.get())
        .map(|n| {
            Some(ToolChoice::Tool {
                name: n.function.name,
            })
        })
        .map_err(|_| {
            invalid(
                "tool_choice",
                "`tool_choice` must be auto, none, required or a function.",
            )
        })
}

/// Keys a message may carry, by role. An assistant message also takes back every
/// key an answer's message has (OpenAI's and this gateway's own), so a client can
/// append the message it was given as it is.
fn allowed(role: &str, key: &str) -> bool {
    matches!(key, "role" | "content" | "name")
        || (role == "assistant" && matches!(key, "tool_calls" | "refusal") || answer_key(role, key))
        || (role == "tool" && key == "tool_call_id")
}

/// Keys only an answer's assistant message has: taken back, never forwarded.
fn answer_key(role: &str, key: &str) -> bool {
    role == "assistant"
        && matches!(
            key,
            "annotations"
                | "audio"
                | "function_call"
                | "reasoning_content"
                | "reasoning"
                | "reasoning_details"
        )
}

/// Checks the answer-only keys of an assistant message: `audio` and
/// `function_call` are refused unless empty (SPEC refuses both everywhere), and a
/// `refusal` must be a string or null. Returns whether any answer-only key (or a
/// null `refusal`) is there.
fn answer_keys(fields: &[Member], p: At) -> Result<bool, ApiError> {
    let mut any = false;
    for (k, v) in fields {
        let empty = is_null(v) || v.get() == "[]" || v.get() == "{}" || v.get() == "\"\"";
        match k.as_ref() {
            "audio" | "function_call" if !empty => {
                return Err(unsupported(
                    format!("{p}.{k}"),
                    format!(
                        "`{p}.{k}` is not supported: send the assistant's text and tool calls."
                    ),
                ))
            }
            "refusal" if is_null(v) => any = true,
            "refusal" => {
                opt_str(Some(*v), p.key("refusal"))?;
            }
            k if answer_key("assistant", k) => any = true,
            _ => {}
        }
    }
    Ok(any)
}

/// A chat `messages` array without the answer-only keys of its assistant
/// messages (and their null `refusal`): what a rung that gets the client's own
/// messages is sent.
pub fn without_answer_keys(messages: &RawValue) -> Option<Box<RawValue>> {
    let mut list: Vec<serde_json::Map<String, Value>> =
        serde_json::from_str(messages.get()).ok()?;
    for m in &mut list {
        if m.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        m.retain(|k, v| !(answer_key("assistant", k) || (k == "refusal" && v.is_null())));
    }
    RawValue::from_string(serde_json::to_string(&list).ok()?).ok()
}

fn parse_messages(v: &RawValue, r: &mut Request) -> Result<(), ApiError> {
    let list = array(v, "messages")?;
    let root = At::Root("messages");
    if list.is_empty() {
        return Err(invalid("messages", "`messages` must not be empty."));
    }
    for (i, m) in list.into_iter().enumerate() {
        let p = root.at(i);
        let fields = members(m, p)?;
        let role = opt_str(get(&fields, "role"), p.key("role"))?
            .ok_or_else(|| invalid(format!("{p}.role"), format!("`{p}.role` is required.")))?;
        if !matches!(
            role.as_ref(),
            "system" | "developer" | "user" | "assistant" | "tool"
        ) {
            return Err(invalid(
                format!("{p}.role"),
                "`role` must be system, developer, user, assistant or tool.",
            ));
        }
        if let Some((k, _)) = fields.iter().find(|(k, _)| !allowed(&role, k)) {
            return Err(invalid(
                format!("{p}.{k}"),
                format!("Unknown message key `{k}` in `{p}`."),
            ));
        }
        if role == "assistant" && answer_keys(&fields, p)? {
            r.replayed_answer_keys = true;
        }
        let content = get(&fields, "content").filter(|c| !is_null(c));
        let parts = match content {
            Some(c) => content_parts(c, p.key("content"))?,
            None => Vec::new(),
        };
        match role.as_ref() {
            // System and developer turns are instructions, kept in order; one in the
            // middle of the conversation is an instruction all the same.
            "system" | "developer" => {
                let text: Vec<String> = parts
                    .into_iter()
                    .filter_map(|p| match p {
                        Part::Text { text } => Some(text),
                        _ => None,
                    })
                    .collect();
                r.system.push(text.join("\n"));
            }
            "user" => r.messages.push(Message {
                role: Role::User,
                parts,
            }),
            "assistant" => {
                let mut parts = parts;
                if let Some(tc) = get(&fields, "tool_calls").filter(|t| !is_null(t)) {
                    for (j, call) in array(tc, p.key("tool_calls"))?.into_iter().enumerate() {
                        parts.push(tool_call(call, p.key("tool_calls").at(j))?);
                    }
                }
                r.messages.push(Message {
                    role: Role::Assistant,
                    parts,
                });
            }
            _ => {
                let call_id: String = opt(
                    get(&fields, "tool_call_id"),
                    p.key("tool_call_id"),
                    "a string",
                )?
                .ok_or_else(|| {
                    invalid(
                        format!("{p}.tool_call_id"),
                        format!("`{p}.tool_call_id` is required."),
                    )
                })?;
                r.messages.push(Message {
                    role: Role::Tool,
                    parts: vec![Part::ToolResult {
                        call_id,
                        content: parts,
                        is_error: false,
                    }],
                });
            }
        }
    }
    Ok(())
}

fn tool_call(v: &RawValue, p: At) -> Result<Part, ApiError> {
    #[derive(Deserialize)]
    struct Call {
        id: String,
        function: Fn,
    }
    #[derive(Deserialize)]
    struct Fn {
        name: String,
        #[serde(default)]
        arguments: String,
    }
    let c: Call = serde_json::from_str(v.get()).map_err(|_| {
        invalid(
            p.to_string(),
            format!("`{p}` must be {{id, type: function, function: {{name, arguments}}}}."),
        )
    })?;
    Ok(Part::ToolCall {
        id: c.id,
        name: c.function.name,
        arguments: c.function.arguments,
    })
}

fn content_parts(v: &RawValue, p: At) -> Result<Vec<Part>, ApiError> {
    if let Ok(text) = crate::json::valid_string_value(v) {
        return Ok(vec![Part::Text {
            text: text.into_owned(),
        }]);
    }
    let mut out = Vec::new();
    for (j, part) in array(v, p)?.into_iter().enumerate() {
        let pp = p.at(j);
        let fields = members(part, pp)?;
        let kind: String =
            opt(get(&fields, "type"), pp.key("type"), "a string")?.unwrap_or_default();
        match kind.as_str() {
            "text" => {
                let text: String =
                    opt(get(&fields, "text"), pp.key("text"), "a string")?.unwrap_or_default();
                out.push(Part::Text { text });
            }
            "image_url" => {
                #[derive(Deserialize)]
                struct Img {
                    url: String,
                    #[serde(default)]
                    detail: Option<String>,
                }
                let img: Img = opt(
                    get(&fields, "image_url"),
                    pp.key("image_url"),
                    "an object with a url",
                )?
                .ok_or_else(|| invalid(format!("{pp}.image_url"), "`image_url` is required."))?;
                out.push(Part::Image {
                    url: img.url,
                    detail: img.detail,
                });
            }
            "file" => {
                #[derive(Deserialize)]
                struct File {
                    #[serde(default)]
                    file_data: Option<String>,
                    #[serde(default)]
                    filename: Option<String>,
                }
                let f: File = opt(get(&fields, "file"), pp.key("file"), "an object")?
                    .ok_or_else(|| invalid(format!("{pp}.file"), "`file` is required."))?;
                let url = f.file_data.ok_or_else(|| {
                    unsupported(
                        format!("{pp}.file.file_id"),
                        "Files are passed inline as `file_data`.",
                    )
                })?;
                out.push(Part::Document {
                    url,
                    name: f.filename,
                });
            }
            "input_audio" => {
                return Err(unsupported(
                    format!("{pp}.type"),
                    "Audio input is not served.",
                ))
            }
            // Refusal parts of an earlier assistant turn carry no content to replay.
            "refusal" => {}
            _ => {
                return Err(invalid(
                    format!("{pp}.type"),
                    "A content part's `type` must be text, image_url or file.",
                ))
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Rendering

fn finish_str(resp_finish: Option<FinishReason>, cut: bool) -> &'static str {
    if cut {
        return "length";
    }
    match resp_finish {
        Some(FinishReason::Length) => "length",
        Some(FinishReason::ToolCalls) => "tool_calls",
        Some(FinishReason::ContentFilter) => "content_filter",
        _ => "stop",
    }
}

fn receipt(tail: &Tail) -> Option<Value> {
    serde_json::from_str(&tail.receipt).ok()
}

/// `url_citation` annotations in the chat format.
fn annotations(citations: &[UrlCitation]) -> Value {
    citations
        .iter()
        .map(|c| {
            let mut cite = json!({
                "url": c.url, "title": c.title,
                "start_index": c.start_index, "end_index": c.end_index,
            });
            if let Some(content) = &c.content {
                cite["content"] = Value::from(content.as_str());
            }
            json!({"type": "url_citation", "url_citation": cite})
        })
        .collect()
}

/// A whole `chat.completion`.
pub fn render(resp: &Response, meta: &Meta, tail: &Tail) -> Vec<u8> {
    let mut text = String::new();
    let mut thinking = String::new();
    let mut calls = Vec::new();
    for p in &resp.parts {
        match p {
            Part::Text { text: t } => text.push_str(t),
            Part::Thinking { text: t, .. } => thinking.push_str(t),
            Part::ToolCall {
                id,
                name,
                arguments,
            } => calls.push(json!({
                "id": id, "type": "function",
                "function": {"name": name, "arguments": arguments},
            })),
            _ => {}
        }
    }
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() { Value::Null } else { Value::from(text) },
        "refusal": null,
    });
    if !thinking.is_empty() {
        message["reasoning_content"] = Value::from(thinking);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::from(calls);
    }
    if !resp.citations.is_empty() {
        message["annotations"] = annotations(&resp.citations);
    }
    let usage = resp
        .usage
        .map_or(tail.usage, |u| if tail.cut { tail.usage } else { u });
    let mut out = json!({
        "id": resp.id.clone().unwrap_or_else(|| format!("chatcmpl-{}", meta.fallback_id)),
        "object": "chat.completion",
        "created": meta.created,
        "model": resp.model.clone().unwrap_or_else(|| meta.slug.clone()),
        "choices": [{"index": 0, "message": message, "logprobs": null,
                     "finish_reason": finish_str(resp.finish, tail.cut)}],
        "usage": usage_json(&usage),
        "provider": meta.provider,
    });
    if let Some(r) = receipt(tail) {
        out["x_gateway"] = r;
    }
    if let Some(ignored) = &tail.ignored {
        out[IGNORED_MEMBER] = Value::from(ignored.as_str());
    }
    serde_json::to_vec(&out).unwrap_or_default()
}

/// Encodes canonical events as `chat.completion.chunk` frames.
pub struct Encoder {
    meta: Meta,
    id: Option<String>,
    model: Option<String>,
    started: bool,
    finish: Option<FinishReason>,
    /// Stream index of each tool call, by canonical call index.
    calls: Vec<u32>,
    /// Citations, sent in one `delta.annotations` chunk before the finish.
    citations: Vec<UrlCitation>,
}

impl Encoder {
    pub fn new(meta: Meta) -> Self {
        Encoder {
            meta,
            id: None,
            model: None,
            started: false,
            finish: None,
            calls: Vec::new(),
            citations: Vec::new(),
        }
    }

    /// One chunk; with `include_usage` every chunk but the usage chunk carries
    /// `"usage": null`, as OpenAI's do.
    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        let mut c = json!({
            "id": self.id.clone().unwrap_or_else(|| format!("chatcmpl-{}", self.meta.fallback_id)),
            "object": "chat.completion.chunk",
            "created": self.meta.created,
            "model": self.model.clone().unwrap_or_else(|| self.meta.slug.clone()),
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            "provider": self.meta.provider,
        });
        if self.meta.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }

    fn write(&mut self, out: &mut Vec<u8>, delta: Value) {
        if !self.started {
            self.started = true;
            let first = self.chunk(json!({"role": "assistant", "content": ""}), None);
            out.extend_from_slice(&data_frame(&serde_json::to_vec(&first).unwrap_or_default()));
        }
        let c = self.chunk(delta, None);
        out.extend_from_slice(&data_frame(&serde_json::to_vec(&c).unwrap_or_default()));
    }

    fn call_index(&mut self, index: u32) -> u32 {
        match self.calls.iter().position(|i| *i == index) {
            Some(p) => p as u32,
            None => {
                self.calls.push(index);
                (self.calls.len() - 1) as u32
            }
        }
    }
}

impl StreamEncoder for Encoder {
    fn event(&mut self, ev: &Event, out: &mut Vec<u8>) {
        match ev {
            Event::Start { id, model } => {
                if id.is_some() {
                    self.id.clone_from(id);
                }
                if model.is_some() {
                    self.model.clone_from(model);
                }
            }
            Event::Text { text } if !text.is_empty() => {
                self.write(out, json!({"content": text}));
            }
            Event::Thinking { text } if !text.is_empty() => {
                self.write(out, json!({"reasoning_content": text}));
            }
            Event::ToolCallStart { index, id, name } => {
                let i = self.call_index(*index);
                self.write(
                    out,
                    json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                                           "function": {"name": name, "arguments": ""}}]}),
                );
            }
            Event::ToolCallArgs { index, arguments } if !arguments.is_empty() => {
                let i = self.call_index(*index);
                self.write(
                    out,
                    json!({"tool_calls": [{"index": i, "function": {"arguments": arguments}}]}),
                );
            }
            Event::Finish { reason, .. } => self.finish = Some(*reason),
            Event::Citation(c) => self.citations.push((**c).clone()),
            _ => {}
        }
    }

    fn end(&mut self, tail: &Tail, out: &mut Vec<u8>) {
        if !self.citations.is_empty() {
            let delta = json!({"annotations": annotations(&self.citations)});
            self.write(out, delta);
        }
        let fin = if !self.started {
            self.started = true;
            // An empty answer: the role chunk itself carries the finish.
            let mut first = self.chunk(json!({"role": "assistant", "content": null}), None);
            first["choices"][0]["finish_reason"] = Value::from(finish_str(self.finish, tail.cut));
            first
        } else {
            self.chunk(json!({}), Some(finish_str(self.finish, tail.cut)))
        };
        let mut fin = fin;
        finish_members(&mut fin, tail);
        out.extend_from_slice(&data_frame(&serde_json::to_vec(&fin).unwrap_or_default()));
        // The usage comes in a chunk of its own, last, when the client asked for it
        // (a cut stream's too); otherwise no chunk carries one.
        if self.meta.include_usage {
            let mut u = self.chunk(json!({}), None);
            u["choices"] = json!([]);
            u["usage"] = usage_json(&tail.usage);
            out.extend_from_slice(&data_frame(&serde_json::to_vec(&u).unwrap_or_default()));
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
    }
}

fn finish_members(chunk: &mut Value, tail: &Tail) {
    if let Some(r) = receipt(tail) {
        chunk["x_gateway"] = r;
    }
    if let Some(ignored) = &tail.ignored {
        chunk[IGNORED_MEMBER] = Value::from(ignored.as_str());
    }
}

/// The in-band error that ends a stream whose header already went out.
pub fn error_frame(err: &ApiError) -> Vec<u8> {
    let mut out = data_frame(&err.to_body(Format::OpenAi));
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}
