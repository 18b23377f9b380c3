//! Requests: the canonical form rendered for OpenAI's Responses API.

use super::*;

#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum Content<'a> {
    Text(&'a str),
    Parts(Vec<InPart<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type")]
pub(super) enum InPart<'a> {
    #[serde(rename = "input_text")]
    Text { text: &'a str },
    #[serde(rename = "input_image")]
    Image { image_url: &'a str, detail: &'a str },
    #[serde(rename = "input_file")]
    File {
        #[serde(skip_serializing_if = "Option::is_none")]
        file_data: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        file_url: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        filename: Option<Cow<'a, str>>,
    },
}

#[derive(Serialize)]
pub(super) struct Summary<'a> {
    #[serde(rename = "type")]
    pub(super) kind: &'static str,
    pub(super) text: &'a str,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Item<'a> {
    Message {
        role: &'static str,
        content: Content<'a>,
    },
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        arguments: &'a str,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: Content<'a>,
    },
    Reasoning {
        /// Left out when the client's item had none.
        #[serde(skip_serializing_if = "str::is_empty")]
        id: &'a str,
        summary: Vec<Summary<'a>>,
        encrypted_content: &'a str,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum ToolOut<'a> {
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<&'a str>,
        parameters: &'a RawValue,
        strict: bool,
        /// Withheld until the provider's own tool search loads it.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        defer_loading: bool,
    },
    /// A hosted tool the client declared, forwarded whole.
    Raw(&'a RawValue),
    /// A hosted tool the gateway declares (`web_search`, `tool_search`).
    Hosted {
        #[serde(rename = "type")]
        kind: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        search_context_size: Option<&'a str>,
    },
}

pub(super) fn function_out(t: &crate::ir::Tool, deferred: bool) -> ToolOut<'_> {
    ToolOut::Function {
        kind: "function",
        name: &t.name,
        description: t.description.as_deref(),
        parameters: &t.parameters,
        // An omitted `strict` means strict on this API, unlike elsewhere.
        strict: t.strict.unwrap_or(false),
        defer_loading: deferred,
    }
}

#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum ToolChoiceOut<'a> {
    Mode(&'static str),
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        name: &'a str,
    },
}

#[derive(Serialize)]
pub(super) struct ReasoningOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) effort: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) summary: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum FormatOut<'a> {
    Text,
    JsonObject,
    JsonSchema {
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        description: Option<&'a str>,
        schema: &'a RawValue,
        #[serde(skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
    },
}

#[derive(Serialize)]
pub(super) struct TextOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) format: Option<FormatOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) verbosity: Option<&'a RawValue>,
}

#[derive(Serialize)]
pub(super) struct Body<'a> {
    pub(super) model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) instructions: Option<&'a str>,
    pub(super) input: Vec<Item<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) tools: Vec<ToolOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tool_choice: Option<ToolChoiceOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reasoning: Option<ReasoningOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) text: Option<TextOut<'a>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub(super) include: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) user: Option<&'a str>,
    pub(super) store: bool,
    pub(super) stream: bool,
}

/// A user-side content part, if it has a place in a message.
pub(super) fn in_part(p: &Part) -> Option<InPart<'_>> {
    Some(match p {
        Part::Text { text } => InPart::Text { text },
        Part::Image { url, detail } => InPart::Image {
            image_url: url,
            detail: detail.as_deref().unwrap_or("auto"),
        },
        Part::Document { url, name } if url.starts_with("data:") => InPart::File {
            file_data: Some(url),
            file_url: None,
            // Inline file data needs a file name.
            filename: Some(match name {
                Some(n) => Cow::Borrowed(n.as_str()),
                None if url.starts_with("data:application/pdf") => Cow::Borrowed("document.pdf"),
                None => Cow::Borrowed("document"),
            }),
        },
        Part::Document { url, name } => InPart::File {
            file_data: None,
            file_url: Some(url),
            filename: name.as_deref().map(Cow::Borrowed),
        },
        _ => return None,
    })
}

/// A content list, as a plain string when it is one text.
pub(super) fn content(parts: Vec<InPart<'_>>) -> Content<'_> {
    match parts.as_slice() {
        [InPart::Text { text }] => Content::Text(text),
        _ => Content::Parts(parts),
    }
}

/// The input items of a user, system or tool turn: its content parts as one
/// message, its tool results as function call outputs, in order.
pub(super) fn user_items<'a>(m: &'a Message, role: &'static str, items: &mut Vec<Item<'a>>) {
    let mut pending: Vec<InPart<'a>> = Vec::new();
    let flush = |pending: &mut Vec<InPart<'a>>, items: &mut Vec<Item<'a>>| {
        if !pending.is_empty() {
            items.push(Item::Message {
                role,
                content: content(std::mem::take(pending)),
            });
        }
    };
    for p in &m.parts {
        if let Part::ToolResult {
            call_id,
            content: c,
            ..
        } = p
        {
            flush(&mut pending, items);
            let output = match content(c.iter().filter_map(in_part).collect()) {
                // A result with nothing in it is an empty string to this API.
                Content::Parts(p) if p.is_empty() => Content::Text(""),
                output => output,
            };
            items.push(Item::FunctionCallOutput { call_id, output });
        } else if let Some(ip) = in_part(p) {
            pending.push(ip);
        }
    }
    if m.parts.is_empty() && m.role == Role::User {
        items.push(Item::Message {
            role,
            content: Content::Parts(Vec::new()),
        });
    }
    flush(&mut pending, items);
}

/// The input items of an assistant turn. Visible reasoning is replayed only with
/// the OpenAI encrypted reasoning item it summarizes (an item without its encrypted
/// content cannot be replayed when nothing is stored); reasoning of other makers
/// (no item id) has no place here.
pub(super) fn assistant_items<'a>(m: &'a Message, items: &mut Vec<Item<'a>>) {
    let mut summary: Vec<Summary<'a>> = Vec::new();
    for p in &m.parts {
        match p {
            Part::Thinking { text, .. } => {
                summary.push(Summary {
                    kind: "summary_text",
                    text,
                });
                continue;
            }
            Part::EncryptedReasoning { data, id: Some(id) } => items.push(Item::Reasoning {
                id,
                summary: std::mem::take(&mut summary),
                encrypted_content: data,
            }),
            Part::Text { text } => items.push(Item::Message {
                role: "assistant",
                content: Content::Text(text),
            }),
            Part::ToolCall {
                id,
                name,
                arguments,
            } => items.push(Item::FunctionCall {
                call_id: id,
                name,
                arguments,
            }),
            _ => {}
        }
        summary.clear();
    }
}

pub(super) fn format_out(f: &ResponseFormat) -> FormatOut<'_> {
    match f {
        ResponseFormat::Text => FormatOut::Text,
        ResponseFormat::JsonObject => FormatOut::JsonObject,
        ResponseFormat::JsonSchema {
            name,
            description,
            schema,
            strict,
        } => FormatOut::JsonSchema {
            name,
            description: description.as_deref(),
            schema,
            strict: *strict,
        },
    }
}

pub(super) fn reasoning_out(req: &Request) -> Option<ReasoningOut<'_>> {
    let r = req.reasoning.as_ref()?;
    let summary = r.summary.as_deref().or_else(|| {
        // A thinking budget (another maker's control) asks for visible reasoning;
        // the effort stays the model's default.
        r.budget_tokens.map(|_| "auto")
    });
    (r.effort.is_some() || summary.is_some()).then_some(ReasoningOut {
        effort: r.effort.as_deref(),
        summary,
    })
}

/// Renders the canonical request as a responses body for `model_id`.
pub fn render(req: &Request, model_id: &str, stream: bool) -> Rendered {
    let mut input = Vec::with_capacity(req.messages.len() + req.system.len());
    // The first instruction is `instructions`; any further ones lead the input as
    // developer messages, in order.
    for s in req.system.iter().skip(1) {
        input.push(Item::Message {
            role: "developer",
            content: Content::Text(s),
        });
    }
    for m in &req.messages {
        match m.role {
            Role::User | Role::Tool => user_items(m, "user", &mut input),
            Role::System => user_items(m, "developer", &mut input),
            Role::Assistant => assistant_items(m, &mut input),
        }
    }
    let mut tools: Vec<ToolOut> = req.tools.iter().map(|t| function_out(t, false)).collect();
    // The provider's own searches, when the request asks for them here.
    if let Some(ws) = &req.web_search {
        tools.push(match (&ws.raw, ws.form) {
            (Some(raw), crate::ir::SearchForm::ResponsesTool) => ToolOut::Raw(raw),
            _ => ToolOut::Hosted {
                kind: "web_search",
                search_context_size: ws.context_size.as_deref(),
            },
        });
    }
    if req.tool_search.is_some() {
        tools.extend(req.deferred.iter().map(|t| function_out(t, true)));
        tools.push(ToolOut::Hosted {
            kind: "tool_search",
            search_context_size: None,
        });
    }
    let mut verbosity = None;
    let mut top_level = Vec::new();
    let mut dropped = Vec::new();
    for e in &req.extras {
        match e.name.as_str() {
            // The chat format's spelling of the same control.
            "text.verbosity" | "verbosity" => verbosity = Some(&*e.value),
            n if FORWARDED.contains(&n) => top_level.push(e),
            n if GATEWAY_OWNED.contains(&n) => {}
            n => {
                if !dropped.iter().any(|d| d == n) {
                    dropped.push(n.to_string());
                }
            }
        }
    }
    let text = (req.response_format.is_some() || verbosity.is_some()).then(|| TextOut {
        format: req.response_format.as_ref().map(format_out),
        verbosity,
    });
    let body = Body {
        model: model_id,
        instructions: req.system.first().map(String::as_str),
        input,
        tools,
        tool_choice: req.tool_choice.as_ref().map(|c| match c {
            ToolChoice::Auto => ToolChoiceOut::Mode("auto"),
            ToolChoice::None => ToolChoiceOut::Mode("none"),
            ToolChoice::Required => ToolChoiceOut::Mode("required"),
            ToolChoice::Tool { name } => ToolChoiceOut::Function {
                kind: "function",
                name,
            },
        }),
        parallel_tool_calls: req.parallel_tool_calls,
        max_output_tokens: req.max_tokens.map(|n| n.max(MIN_OUTPUT_TOKENS)),
        temperature: req.temperature,
        top_p: req.top_p,
        reasoning: reasoning_out(req),
        text,
        include: &req.include,
        user: req.user.as_deref(),
        store: false,
        stream,
    };
    let mut out = Vec::with_capacity(1024);
    // Strings, numbers and raw JSON into a Vec: serializing cannot fail.
    let _ = serde_json::to_writer(&mut out, &body);
    for e in top_level {
        append_member(&mut out, 0, &e.name, e.value.get().as_bytes());
    }
    Rendered { body: out, dropped }
}

/// The body of a responses client for a responses rung: every member passes
/// verbatim except `model` (the rung's id), `store` (always false), `stream`, and
/// the gateway's own `previous_response_id` and `prompt_cache_key` (removed).
pub fn render_native(body: &[u8], model_id: &str, stream: bool) -> Vec<u8> {
    let Ok(Members(members)) = serde_json::from_slice::<Members>(body) else {
        // The body was parsed before; an unreadable one goes as it came.
        return body.to_vec();
    };
    let mut out = Vec::with_capacity(body.len() + model_id.len() + 32);
    out.extend_from_slice(b"{\"model\":");
    let _ = serde_json::to_writer(&mut out, model_id);
    for (k, v) in &members {
        match k.as_ref() {
            "model" | "store" | "stream" | "previous_response_id" | "prompt_cache_key" => {}
            _ => {
                out.push(b',');
                let _ = serde_json::to_writer(&mut out, k.as_ref());
                out.push(b':');
                out.extend_from_slice(v.get().as_bytes());
            }
        }
    }
    out.extend_from_slice(b",\"store\":false,\"stream\":");
    out.extend_from_slice(if stream { b"true" } else { b"false" });
    out.push(b'}');
    out
}
