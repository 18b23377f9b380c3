//! Parsing: a responses body read member by member and validated into the canonical
//! Request.

use super::*;

/// The top-level members the format knows, unparsed until read.
#[derive(Default)]
pub(super) struct Top<'a> {
    pub(super) model: Option<&'a RawValue>,
    pub(super) input: Option<&'a RawValue>,
    pub(super) instructions: Option<&'a RawValue>,
    pub(super) tools: Option<&'a RawValue>,
    pub(super) tool_choice: Option<&'a RawValue>,
    pub(super) parallel_tool_calls: Option<&'a RawValue>,
    pub(super) max_output_tokens: Option<&'a RawValue>,
    pub(super) temperature: Option<&'a RawValue>,
    pub(super) top_p: Option<&'a RawValue>,
    pub(super) reasoning: Option<&'a RawValue>,
    pub(super) text: Option<&'a RawValue>,
    pub(super) store: Option<&'a RawValue>,
    pub(super) include: Option<&'a RawValue>,
    pub(super) user: Option<&'a RawValue>,
    pub(super) prompt_cache_key: Option<&'a RawValue>,
    pub(super) stream: Option<&'a RawValue>,
    pub(super) plugins: Option<&'a RawValue>,
    pub(super) extras: Vec<(&'static str, &'a RawValue)>,
}

impl<'a> Top<'a> {
    pub(super) fn collect(members: Vec<Member<'a>>) -> Result<Self, ApiError> {
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
pub(super) fn previous_response(v: &RawValue) -> Result<(), ApiError> {
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
        crate::inbound::common::parse_plugins(p, &mut r)?;
    }
    crate::inbound::common::check_tool_search(&r)?;
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
pub(super) fn ranged(
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

pub(super) fn parse_input(v: &RawValue, r: &mut Request) -> Result<(), ApiError> {
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
pub(super) fn turn(r: &mut Request, role: Role) -> &mut Vec<Part> {
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

pub(super) fn parse_item(param: Path, item: &RawValue, r: &mut Request) -> Result<(), ApiError> {
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

pub(super) fn message_item(
    param: Path,
    fields: &[Member],
    r: &mut Request,
) -> Result<(), ApiError> {
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
pub(super) fn system_text(parts: Vec<Part>, param: Path) -> Result<String, ApiError> {
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
pub(super) struct InPart {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) text: Option<String>,
    pub(super) refusal: Option<String>,
    pub(super) image_url: Option<String>,
    pub(super) detail: Option<String>,
    pub(super) file_id: Option<String>,
    pub(super) file_data: Option<String>,
    pub(super) file_url: Option<String>,
    pub(super) filename: Option<String>,
}

/// A message content (a string, or a list of parts) as canonical parts.
pub(super) fn content_parts(v: &RawValue, param: Path) -> Result<Vec<Part>, ApiError> {
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

pub(super) fn content_part(p: InPart, param: Path) -> Result<Part, ApiError> {
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
pub(super) struct FunctionCallItem {
    pub(super) call_id: Option<String>,
    pub(super) name: Option<String>,
    pub(super) arguments: Option<String>,
}

pub(super) fn function_call_item(
    param: Path,
    item: &RawValue,
    r: &mut Request,
) -> Result<(), ApiError> {
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
pub(super) struct FunctionOutputItem<'a> {
    pub(super) call_id: Option<String>,
    #[serde(borrow)]
    pub(super) output: Option<&'a RawValue>,
}

pub(super) fn function_output_item(
    param: Path,
    item: &RawValue,
    r: &mut Request,
) -> Result<(), ApiError> {
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
pub(super) struct ReasoningItem {
    pub(super) id: Option<String>,
    #[serde(default)]
    pub(super) summary: Vec<SummaryIn>,
    pub(super) encrypted_content: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct SummaryIn {
    pub(super) text: String,
}

pub(super) fn reasoning_item(
    param: Path,
    item: &RawValue,
    r: &mut Request,
) -> Result<(), ApiError> {
    let it: ReasoningItem = serde_json::from_str(item.get()).map_err(|_| {
        invalid(
            param.to_string(),
            "A reasoning item needs `summary` as an array of summary_text parts.",
        )
    })?;
    let parts = turn(r, Role::Assistant);
    if let Some(signature) = it
        .encrypted_content
        .as_deref()
        .and_then(|c| c.strip_prefix(SIGNED_REASONING))
    {
        // Signed visible reasoning: the summary is the text the signature covers.
        parts.push(Part::Thinking {
            text: it.summary.into_iter().map(|s| s.text).collect(),
            signature: Some(signature.to_string()),
        });
        return Ok(());
    }
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
pub(super) fn described(param: Path, text: &str) -> Result<(), ApiError> {
    if text.len() <= MAX_DESCRIPTION_CHARS {
        return Ok(());
    }
    check_description(param.to_string(), text)
}

#[derive(Deserialize)]
pub(super) struct ToolIn<'a> {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) name: Option<String>,
    pub(super) description: Option<String>,
    #[serde(borrow)]
    pub(super) parameters: Option<&'a RawValue>,
    pub(super) strict: Option<bool>,
    #[serde(borrow, default)]
    pub(super) defer_loading: Option<&'a RawValue>,
    pub(super) search_context_size: Option<String>,
}

pub(super) fn parse_tools(v: &RawValue, r: &mut Request) -> Result<(), ApiError> {
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
                let deferred = crate::inbound::common::defer_loading(
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
                let ws = crate::inbound::common::want_web_search(r, SearchForm::ResponsesTool);
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
pub(super) struct ToolChoiceIn {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) name: Option<String>,
}

pub(super) fn parse_tool_choice(v: Option<&RawValue>) -> Result<Option<ToolChoice>, ApiError> {
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

pub(super) fn parse_reasoning(v: Option<&RawValue>) -> Result<Option<Reasoning>, ApiError> {
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
pub(super) struct FormatIn<'a> {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) name: Option<String>,
    pub(super) description: Option<String>,
    #[serde(borrow)]
    pub(super) schema: Option<&'a RawValue>,
    pub(super) strict: Option<bool>,
}

pub(super) fn parse_text(v: &RawValue, r: &mut Request) -> Result<(), ApiError> {
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

pub(super) fn parse_format(v: &RawValue) -> Result<ResponseFormat, ApiError> {
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
