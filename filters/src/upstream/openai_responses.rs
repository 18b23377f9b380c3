//! The OpenAI responses wire (`POST {base}/responses`): request bodies rendered from
//! the canonical form (or passed through from a responses client), and answers, whole
//! or streamed as named SSE events, decoded into canonical events (see the module
//! contract in `upstream`).
//!
//! Nothing is ever stored with the provider: `store` is always false, and neither
//! `previous_response_id` nor the gateway's `prompt_cache_key` is sent. Reasoning is
//! replayed through encrypted reasoning items instead.

use super::openai_chat::policy_reason;
use crate::ir::{
    DecodeError, Event, FinishReason, Message, Part, RefusalReason, Request, ResponseFormat, Role,
    StreamDecoder, ToolChoice,
};
use crate::json::append_member;
use crate::json::Members;
use crate::upstream::Rendered;
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Extras forwarded verbatim as top-level members: fields of this API the
/// canonical form does not model.
const FORWARDED: [&str; 8] = [
    "metadata",
    "service_tier",
    "truncation",
    "client_metadata",
    "background",
    "top_logprobs",
    "safety_identifier",
    "max_tool_calls",
];

/// Extras that are neither forwarded nor disclosed: the gateway owns them.
const GATEWAY_OWNED: [&str; 3] = ["store", "previous_response_id", "prompt_cache_key"];

/// The smallest `max_output_tokens` the API accepts; a smaller budget is raised to
/// it rather than failing the rung.
const MIN_OUTPUT_TOKENS: u64 = 16;

// ---------------------------------------------------------------------------
// Requests

#[derive(Serialize)]
#[serde(untagged)]
enum Content<'a> {
    Text(&'a str),
    Parts(Vec<InPart<'a>>),
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum InPart<'a> {
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
struct Summary<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Item<'a> {
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
enum ToolOut<'a> {
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

fn function_out(t: &crate::ir::Tool, deferred: bool) -> ToolOut<'_> {
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
enum ToolChoiceOut<'a> {
    Mode(&'static str),
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        name: &'a str,
    },
}

#[derive(Serialize)]
struct ReasoningOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    effort: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum FormatOut<'a> {
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
struct TextOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    format: Option<FormatOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    verbosity: Option<&'a RawValue>,
}

#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    input: Vec<Item<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ToolOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoiceOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<ReasoningOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<TextOut<'a>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    include: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    store: bool,
    stream: bool,
}

/// A user-side content part, if it has a place in a message.
fn in_part(p: &Part) -> Option<InPart<'_>> {
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
fn content(parts: Vec<InPart<'_>>) -> Content<'_> {
    match parts.as_slice() {
        [InPart::Text { text }] => Content::Text(text),
        _ => Content::Parts(parts),
    }
}

/// The input items of a user, system or tool turn: its content parts as one
/// message, its tool results as function call outputs, in order.
fn user_items<'a>(m: &'a Message, role: &'static str, items: &mut Vec<Item<'a>>) {
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
fn assistant_items<'a>(m: &'a Message, items: &mut Vec<Item<'a>>) {
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

fn format_out(f: &ResponseFormat) -> FormatOut<'_> {
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

fn reasoning_out(req: &Request) -> Option<ReasoningOut<'_>> {
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

// ---------------------------------------------------------------------------
// Answers

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_tokens_details: Option<CachedDetails>,
    #[serde(default)]
    output_tokens_details: Option<ReasoningDetails>,
}

#[derive(Deserialize, Default)]
struct CachedDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct ReasoningDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    fn to_usage(&self) -> Usage {
        Usage {
            input_tokens: self.input_tokens,
            // OpenAI charges no cache writes.
            cache_write_tokens: 0,
            cached_tokens: self
                .input_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            output_tokens: self.output_tokens,
            reasoning_tokens: self
                .output_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            cache_write_1h_tokens: 0,
            web_search_requests: 0,
            cost_micro_usd: None,
        }
    }
}

#[derive(Deserialize)]
struct WireError {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
    /// Azure OpenAI names a content-filter refusal here.
    #[serde(default)]
    innererror: Option<InnerError>,
}

#[derive(Deserialize)]
struct InnerError {
    #[serde(default)]
    code: Option<String>,
}

#[derive(Deserialize)]
struct Incomplete {
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
struct TextIn {
    #[serde(default)]
    text: String,
}

/// An output text's annotation; `url_citation` is the one the canonical form
/// carries.
#[derive(Deserialize)]
struct AnnotationIn {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    start_index: u32,
    #[serde(default)]
    end_index: u32,
}

impl AnnotationIn {
    /// The citation, its span moved to the answer's text (`offset` characters
    /// before this output text).
    fn citation(&self, offset: u32) -> Option<Event> {
        (self.kind == "url_citation").then(|| {
            Event::Citation(Box::new(crate::ir::UrlCitation {
                url: self.url.clone(),
                title: self.title.clone().unwrap_or_default(),
                content: None,
                start_index: self.start_index + offset,
                end_index: self.end_index + offset,
            }))
        })
    }
}

/// What a `web_search_call` did.
#[derive(Deserialize)]
struct ActionIn {
    #[serde(default)]
    query: Option<String>,
}

/// A `web_search_call` item as a server search (OpenAI shows no results).
fn server_search(id: &Option<String>, action: &Option<ActionIn>) -> Event {
    Event::ServerSearch(Box::new(crate::ir::ServerSearch {
        id: id.clone().unwrap_or_default(),
        query: action
            .as_ref()
            .and_then(|a| a.query.clone())
            .unwrap_or_default(),
        results: Vec::new(),
    }))
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentIn {
    OutputText {
        #[serde(default)]
        text: String,
        #[serde(default)]
        annotations: Vec<AnnotationIn>,
    },
    Refusal {
        #[serde(default)]
        refusal: String,
    },
    #[serde(other)]
    Other,
}

/// An output item, as far as the canonical form needs it.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ItemIn {
    Message {
        #[serde(default)]
        content: Vec<ContentIn>,
    },
    FunctionCall {
        #[serde(default)]
        call_id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        arguments: String,
    },
    Reasoning {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        summary: Vec<TextIn>,
        /// Raw reasoning text (open-weight models), when given.
        #[serde(default)]
        content: Option<Vec<TextIn>>,
        #[serde(default)]
        encrypted_content: Option<String>,
    },
    /// The provider's own web search.
    WebSearchCall {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        action: Option<ActionIn>,
    },
    /// Other hosted tool calls and anything newer: nothing the canonical form
    /// carries.
    #[serde(other)]
    Other,
}

/// A response object (whole, or inside a stream's lifecycle events).
#[derive(Deserialize)]
struct WireResponse {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    output: Vec<ItemIn>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<WireError>,
    #[serde(default)]
    incomplete_details: Option<Incomplete>,
}

impl WireError {
    fn refusal(&self) -> Option<RefusalReason> {
        let inner = self.innererror.as_ref().and_then(|i| i.code.as_deref());
        self.code
            .as_deref()
            .and_then(policy_reason)
            .or_else(|| inner.and_then(policy_reason))
    }

    /// A policy refusal, or an in-band error.
    fn event(&self) -> Event {
        match self.refusal() {
            Some(reason) => Event::Refusal {
                reason,
                text: self.message.clone(),
            },
            None => Event::Error {
                message: self
                    .message
                    .clone()
                    .or_else(|| self.code.clone())
                    .unwrap_or_else(|| "the provider reported an error".into()),
            },
        }
    }
}

/// The closing events of an answer: its error, finish and usage (with the web
/// searches the provider ran).
fn settle(r: &WireResponse, has_calls: bool, searches: u64, out: &mut Vec<Event>) {
    if let Some(e) = &r.error {
        out.push(e.event());
    }
    let status = r.status.as_deref().unwrap_or("completed");
    let reason = match status {
        "completed" if has_calls => FinishReason::ToolCalls,
        "completed" => FinishReason::Stop,
        "incomplete" => match r
            .incomplete_details
            .as_ref()
            .and_then(|d| d.reason.as_deref())
        {
            Some("content_filter") => FinishReason::ContentFilter,
            _ => FinishReason::Length,
        },
        // failed, cancelled, or an unfinished (background) response.
        other => {
            if r.error.is_none() {
                out.push(Event::Error {
                    message: format!("the response ended with status `{other}`"),
                });
            }
            return;
        }
    };
    out.push(Event::Finish {
        reason,
        raw: Some(status.to_string()),
        stop_sequence: None,
    });
    if let Some(u) = &r.usage {
        let mut u = u.to_usage();
        u.web_search_requests = searches;
        out.push(Event::Usage(u));
    }
}

/// The visible reasoning of a reasoning item: summary parts (or raw reasoning
/// text) joined by blank lines, as one canonical thinking text.
fn reasoning_text(summary: &[TextIn], content: Option<&[TextIn]>) -> String {
    let parts = if summary.is_empty() {
        content.unwrap_or_default()
    } else {
        summary
    };
    let texts: Vec<&str> = parts.iter().map(|t| t.text.as_str()).collect();
    texts.join("\n\n")
}

/// A whole response object as the events its stream would give.
pub fn decode(body: &[u8]) -> Result<Vec<Event>, DecodeError> {
    let r: WireResponse = serde_json::from_slice(body)
        .map_err(|e| DecodeError(format!("not a responses answer: {e}")))?;
    let mut out = Vec::with_capacity(2 + 2 * r.output.len() + 2);
    out.push(Event::Start {
        id: r.id.clone(),
        model: r.model.clone(),
    });
    let mut calls = 0u32;
    let mut searches = 0u64;
    // Characters of answer text before the output text being read.
    let mut offset = 0u32;
    for item in &r.output {
        match item {
            ItemIn::Reasoning {
                id,
                summary,
                content,
                encrypted_content,
            } => {
                let text = reasoning_text(summary, content.as_deref());
                if !text.is_empty() {
                    out.push(Event::Thinking { text });
                }
                if let Some(data) = encrypted_content {
                    out.push(Event::EncryptedReasoning {
                        data: data.clone(),
                        id: id.clone(),
                    });
                }
            }
            ItemIn::Message { content } => {
                for c in content {
                    match c {
                        ContentIn::OutputText { text, annotations } => {
                            out.push(Event::Text { text: text.clone() });
                            out.extend(annotations.iter().filter_map(|a| a.citation(offset)));
                            offset += text.chars().count() as u32;
                        }
                        ContentIn::Refusal { refusal } => out.push(Event::Refusal {
                            reason: RefusalReason::ContentPolicy,
                            text: Some(refusal.clone()),
                        }),
                        ContentIn::Other => {}
                    }
                }
            }
            ItemIn::FunctionCall {
                call_id,
                name,
                arguments,
            } => {
                out.push(Event::ToolCallStart {
                    index: calls,
                    id: call_id.clone(),
                    name: name.clone(),
                });
                if !arguments.is_empty() {
                    out.push(Event::ToolCallArgs {
                        index: calls,
                        arguments: arguments.clone(),
                    });
                }
                calls += 1;
            }
            ItemIn::WebSearchCall { id, action } => {
                searches += 1;
                out.push(server_search(id, action));
            }
            ItemIn::Other => {}
        }
    }
    settle(&r, calls > 0, searches, &mut out);
    Ok(out)
}

#[derive(Deserialize)]
struct ErrorBody {
    error: Option<WireError>,
}

/// Whether an error answer is a policy refusal (see
/// [`policy_reason`](super::openai_chat::policy_reason) for the
/// codes). Only client errors are: a 5xx is the provider failing.
pub fn refusal(status: u16, body: &[u8]) -> Option<RefusalReason> {
    if !(400..500).contains(&status) {
        return None;
    }
    let b: ErrorBody = serde_json::from_slice(body).ok()?;
    b.error?.refusal()
}

// ---------------------------------------------------------------------------
// Streams

/// The members of a stream event that the decoder reads.
#[derive(Deserialize)]
struct Frame<'a> {
    #[serde(borrow, default)]
    delta: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    item_id: Option<Cow<'a, str>>,
    #[serde(default)]
    output_index: Option<u64>,
    #[serde(default)]
    summary_index: Option<u64>,
    #[serde(borrow, default)]
    item: Option<&'a RawValue>,
    #[serde(borrow, default)]
    response: Option<&'a RawValue>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    annotation: Option<AnnotationIn>,
    /// Some providers nest the `error` event's members.
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Deserialize)]
struct TypeOnly<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
}

/// The item id of a function call item as it opens.
#[derive(Deserialize)]
struct ItemHead {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    id: Option<String>,
}

#[derive(Deserialize)]
struct ResponseHead {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
}

/// A function call seen in the stream.
struct Call {
    item_id: Option<String>,
    output_index: Option<u64>,
    index: u32,
    /// Whether any of its arguments went out yet.
    args: bool,
}

/// Decodes the responses stream: the events it needs by name (the SSE `event:`
/// field, or the data's `type` when a provider sends no name), ignoring the rest.
#[derive(Default)]
pub struct Decoder {
    started: bool,
    done: bool,
    calls: Vec<Call>,
    /// Items whose text or visible reasoning already went out as deltas (a `.done`
    /// only repeats it).
    streamed: Vec<String>,
    refusal: String,
    /// Where each message item's text starts in the answer's text (characters),
    /// by item id: a citation's span is moved there.
    texts: Vec<(String, u32)>,
    /// Characters of answer text so far.
    chars: u32,
    /// Web searches the provider ran.
    searches: u64,
}

impl Decoder {
    /// Counts streamed text, noting where each item's text starts.
    fn text_seen(&mut self, item_id: Option<&str>, text: &str) {
        if let Some(id) = item_id {
            if !self.texts.iter().any(|(i, _)| i == id) {
                self.texts.push((id.to_string(), self.chars));
            }
        }
        self.chars += text.chars().count() as u32;
    }

    pub fn new() -> Self {
        Self::default()
    }

    fn streamed(&self, item_id: Option<&str>) -> bool {
        item_id.is_some_and(|id| self.streamed.iter().any(|s| s == id))
    }

    fn mark(&mut self, item_id: Option<&str>) {
        if let Some(id) = item_id {
            if !self.streamed(Some(id)) {
                self.streamed.push(id.to_string());
            }
        }
    }

    fn call(&mut self, f: &Frame) -> Option<&mut Call> {
        let by_id = f.item_id.as_deref();
        self.calls
            .iter_mut()
            .rev()
            .find(|c| match (by_id, &c.item_id) {
                (Some(a), Some(b)) => a == b,
                _ => f.output_index.is_some() && c.output_index == f.output_index,
            })
    }

    fn start_call(
        &mut self,
        f: &Frame,
        item: &RawValue,
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        let head: ItemHead = parse(item.get())?;
        if head.kind != "function_call" {
            return Ok(());
        }
        let ItemIn::FunctionCall {
            call_id,
            name,
            arguments,
        } = parse(item.get())?
        else {
            return Ok(());
        };
        let index = self.calls.len() as u32;
        out.push(Event::ToolCallStart {
            index,
            id: call_id,
            name,
        });
        let args = !arguments.is_empty();
        if args {
            out.push(Event::ToolCallArgs { index, arguments });
        }
        self.calls.push(Call {
            item_id: head.id,
            output_index: f.output_index,
            index,
            args,
        });
        Ok(())
    }

    fn item_done(
        &mut self,
        f: &Frame,
        item: &RawValue,
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        match parse::<ItemIn>(item.get())? {
            ItemIn::Reasoning {
                id,
                summary,
                content,
                encrypted_content,
            } => {
                if !self.streamed(id.as_deref()) {
                    let text = reasoning_text(&summary, content.as_deref());
                    if !text.is_empty() {
                        out.push(Event::Thinking { text });
                    }
                }
                // Only the finished item carries the whole encrypted content.
                if let Some(data) = encrypted_content {
                    out.push(Event::EncryptedReasoning { data, id });
                }
            }
            ItemIn::FunctionCall { arguments, .. } => match self.call(f) {
                Some(c) if !c.args && !arguments.is_empty() => {
                    c.args = true;
                    out.push(Event::ToolCallArgs {
                        index: c.index,
                        arguments,
                    });
                }
                Some(_) => {}
                None => self.start_call(f, item, out)?,
            },
            ItemIn::WebSearchCall { id, action } => {
                self.searches += 1;
                out.push(server_search(&id, &action));
            }
            // Text went out with its deltas (or its `.done`).
            ItemIn::Message { .. } | ItemIn::Other => {}
        }
        Ok(())
    }

    fn finished(&mut self, f: &Frame, out: &mut Vec<Event>) -> Result<(), DecodeError> {
        self.done = true;
        let Some(raw) = f.response else {
            return Ok(());
        };
        let r: WireResponse = parse(raw.get())?;
        settle(&r, !self.calls.is_empty(), self.searches, out);
        Ok(())
    }
}

fn parse<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, DecodeError> {
    serde_json::from_str(text).map_err(|e| DecodeError(format!("unreadable responses event: {e}")))
}

/// The stream events the decoder acts on.
const HANDLED: [&str; 18] = [
    "response.created",
    "response.output_text.annotation.added",
    "response.in_progress",
    "response.output_item.added",
    "response.output_item.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.refusal.delta",
    "response.refusal.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
];

impl StreamDecoder for Decoder {
    fn frame(
        &mut self,
        name: Option<&str>,
        data: &[u8],
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        let text = std::str::from_utf8(data)
            .map_err(|_| DecodeError("responses event is not UTF-8".into()))?;
        let named;
        let name = match name {
            Some(n) => n,
            None => {
                named = parse::<TypeOnly>(text)?.kind;
                named.as_deref().unwrap_or("")
            }
        };
        if !HANDLED.contains(&name) {
            return Ok(());
        }
        let f: Frame = parse(text)?;
        let item_id = f.item_id.as_deref();
        match name {
            "response.created" | "response.in_progress" if !self.started => {
                self.started = true;
                let head: ResponseHead = match f.response {
                    Some(r) => parse(r.get())?,
                    None => ResponseHead {
                        id: None,
                        model: None,
                    },
                };
                out.push(Event::Start {
                    id: head.id,
                    model: head.model,
                });
            }
            "response.output_item.added" => {
                if let Some(item) = f.item {
                    self.start_call(&f, item, out)?;
                }
            }
            "response.output_item.done" => {
                if let Some(item) = f.item {
                    self.item_done(&f, item, out)?;
                }
            }
            "response.output_text.delta" => {
                if let Some(d) = f.delta.as_deref().filter(|d| !d.is_empty()) {
                    out.push(Event::Text {
                        text: d.to_string(),
                    });
                    self.mark(item_id);
                    self.text_seen(item_id, d);
                }
            }
            "response.output_text.done" if !self.streamed(item_id) => {
                if let Some(t) = f.text.filter(|t| !t.is_empty()) {
                    self.text_seen(item_id, &t);
                    out.push(Event::Text { text: t });
                }
                self.mark(item_id);
            }
            "response.output_text.annotation.added" => {
                let offset = self
                    .texts
                    .iter()
                    .find(|(i, _)| Some(i.as_str()) == item_id)
                    .map_or(0, |(_, start)| *start);
                out.extend(f.annotation.as_ref().and_then(|a| a.citation(offset)));
            }
            "response.refusal.delta" => {
                if let Some(d) = f.delta.as_deref() {
                    self.refusal.push_str(d);
                    out.push(Event::Refusal {
                        reason: RefusalReason::ContentPolicy,
                        text: Some(self.refusal.clone()),
                    });
                }
            }
            "response.refusal.done" if self.refusal.is_empty() => {
                out.push(Event::Refusal {
                    reason: RefusalReason::ContentPolicy,
                    text: f.refusal,
                });
            }
            "response.function_call_arguments.delta" => {
                let delta = f.delta.as_deref().unwrap_or_default();
                if let (Some(c), false) = (self.call(&f), delta.is_empty()) {
                    c.args = true;
                    let index = c.index;
                    out.push(Event::ToolCallArgs {
                        index,
                        arguments: delta.to_string(),
                    });
                }
            }
            "response.function_call_arguments.done" => {
                let args = f.arguments.clone().unwrap_or_default();
                if let Some(c) = self.call(&f).filter(|c| !c.args && !args.is_empty()) {
                    c.args = true;
                    let index = c.index;
                    out.push(Event::ToolCallArgs {
                        index,
                        arguments: args,
                    });
                }
            }
            // Summary parts after the first are set apart by a blank line.
            "response.reasoning_summary_part.added"
                if f.summary_index.unwrap_or(0) > 0 && self.streamed(item_id) =>
            {
                out.push(Event::Thinking {
                    text: "\n\n".into(),
                });
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                if let Some(d) = f.delta.as_deref().filter(|d| !d.is_empty()) {
                    out.push(Event::Thinking {
                        text: d.to_string(),
                    });
                    self.mark(item_id);
                }
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.finished(&f, out)?;
            }
            "error" => {
                let e = f.error.unwrap_or(WireError {
                    code: f.code,
                    message: f.message,
                    innererror: None,
                });
                out.push(e.event());
            }
            _ => {}
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }
}
