//! OpenAI responses wire format (`/v1/responses`): `response` objects and the
//! typed, sequence-numbered SSE event stream (`response.created` ...
//! `response.completed`). Asked for a reasoning summary, the answer opens with a
//! reasoning item (its encrypted content when `include` asks), as a reasoning
//! model's does; like OpenAI with `store: false`, an input item that only a
//! provider's store could resolve (an `item_reference`, a reasoning item without
//! its encrypted content) is refused as not found.

use bytes::Bytes;
use serde::{de::IgnoredAny, Deserialize};
use serde_json::{json, Value};

use crate::{
    openai::{self, dated},
    sse::{self, json_str, Frames, Template},
    step::Content,
    wire::{self, Ctx, Parsed, Wire},
};

#[derive(Deserialize)]
struct Request {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    // The members a Response repeats (see `echo_defaults`).
    #[serde(default)]
    instructions: Option<Value>,
    #[serde(default)]
    max_output_tokens: Option<Value>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<Value>,
    #[serde(default)]
    store: Option<Value>,
    #[serde(default)]
    temperature: Option<Value>,
    #[serde(default)]
    text: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    top_p: Option<Value>,
    #[serde(default)]
    reasoning: Option<ReasoningIn>,
    #[serde(default)]
    include: Option<Vec<String>>,
    #[serde(default)]
    input: Option<Input>,
}

#[derive(Deserialize)]
struct ReasoningIn {
    #[serde(default)]
    effort: Option<String>,
    #[serde(default)]
    summary: Option<String>,
}

/// The request's input: a string, or items (read only for what the mock refuses).
#[derive(Deserialize)]
#[serde(untagged)]
enum Input {
    Items(Vec<ItemIn>),
    Other(IgnoredAny),
}

#[derive(Deserialize)]
struct ItemIn {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    encrypted_content: Option<IgnoredAny>,
}

/// A function tool as OpenAI repeats it: `strict` (true unless the request said).
fn strict(mut tool: Value) -> Value {
    if tool["type"] == "function" && tool.get("strict").is_none_or(Value::is_null) {
        tool["strict"] = json!(true);
    }
    tool
}

/// The request members a Response repeats, each the request's value or, when it
/// leaves it out, OpenAI's.
fn echo(req: &mut Request) -> serde_json::Map<String, Value> {
    let given = |v: &mut Option<Value>, default: Value| {
        v.take().filter(|v| !v.is_null()).unwrap_or(default)
    };
    let members = [
        ("instructions", given(&mut req.instructions, Value::Null)),
        (
            "max_output_tokens",
            given(&mut req.max_output_tokens, Value::Null),
        ),
        ("metadata", given(&mut req.metadata, json!({}))),
        (
            "parallel_tool_calls",
            given(&mut req.parallel_tool_calls, json!(true)),
        ),
        ("store", given(&mut req.store, json!(true))),
        ("temperature", given(&mut req.temperature, json!(1.0))),
        (
            "text",
            given(&mut req.text, json!({"format": {"type": "text"}})),
        ),
        ("tool_choice", given(&mut req.tool_choice, json!("auto"))),
        ("top_p", given(&mut req.top_p, json!(1.0))),
        (
            "tools",
            json!(req
                .tools
                .take()
                .unwrap_or_default()
                .into_iter()
                .map(strict)
                .collect::<Vec<_>>()),
        ),
    ];
    members
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

/// Reasoning tokens an answer with a reasoning summary reports.
const REASONING_TOKENS: u64 = 8;

/// OpenAI's answer to an input item it would have to find in its store (the
/// gateway always sends `store: false`): 404, as the real API words it.
fn not_found(input: Option<&Input>) -> Option<(u16, Value)> {
    let Some(Input::Items(items)) = input else {
        return None;
    };
    let missing = items.iter().find(|i| match i.kind.as_deref() {
        Some("item_reference") => true,
        Some("reasoning") => i.encrypted_content.is_none(),
        _ => false,
    })?;
    let id = missing.id.as_deref().unwrap_or("");
    Some((
        404,
        json!({"error": {
            "message": format!(
                "Item with id '{id}' not found. Items are not persisted when `store` is set to false. Try again with `store` set to true, or remove this item from your input."
            ),
            "type": "invalid_request_error",
            "param": "input",
            "code": null,
        }}),
    ))
}

/// The summary text of the mock's reasoning item.
fn summary_text(model: &str) -> String {
    format!("Thinking about {model}.")
}

fn usage(input: u64, output: u64, reasoning: u64) -> Value {
    json!({
        "input_tokens": input,
        // As OpenAI's answers give it (its OpenAPI document requires both).
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output + reasoning,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input + output + reasoning,
    })
}

/// Ids and fixed fields of one response.
struct Shape {
    id: String,
    item_id: String,
    call_id: String,
    /// The reasoning item's id, when the answer opens with one.
    reasoning_id: Option<String>,
    encrypted: bool,
    echo: serde_json::Map<String, Value>,
    created: u64,
    model: String,
}

impl Shape {
    fn new(ctx: &Ctx<'_>, content: &Content) -> Self {
        let n = wire::next_id();
        let item_id = match content {
            Content::ToolCall { .. } => format!("fc_mock{n}"),
            _ => format!("msg_mock{n}"),
        };
        let reasoning = ctx.asks.summary && !matches!(content, Content::Exhausted(_));
        Shape {
            id: format!("resp_mock{n}"),
            item_id,
            call_id: format!("call_mock{n}"),
            reasoning_id: reasoning.then(|| format!("rs_mock{n}")),
            encrypted: ctx.asks.encrypted,
            echo: ctx.asks.echo.clone(),
            created: wire::now(),
            model: dated(ctx.model),
        }
    }

    /// Where the answer's own item sits in `output` (after a reasoning item).
    fn index(&self) -> usize {
        usize::from(self.reasoning_id.is_some())
    }

    fn reasoning_tokens(&self) -> u64 {
        if self.reasoning_id.is_some() {
            REASONING_TOKENS
        } else {
            0
        }
    }

    /// The reasoning item, finished or as first announced; its encrypted content
    /// (`gAAAAB-mock-<id>`, so a test can tell it came back whole) only when asked.
    fn reasoning_item(&self, id: &str, done: bool) -> Value {
        let mut item = json!({
            "id": id,
            "type": "reasoning",
            "summary": if done {
                json!([{"type": "summary_text", "text": summary_text(&self.model)}])
            } else {
                json!([])
            },
        });
        if done && self.encrypted {
            item["encrypted_content"] = json!(format!("gAAAAB-mock-{id}"));
        }
        item
    }

    /// The whole output: the reasoning item, if any, then `item`.
    fn output(&self, item: Value) -> Value {
        match &self.reasoning_id {
            Some(id) => json!([self.reasoning_item(id, true), item]),
            None => json!([item]),
        }
    }

    fn response(&self, status: &str, output: Value, usage: Value) -> Value {
        let mut response = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": false,
            "error": null,
            "incomplete_details": if status == "incomplete" {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            },
            "model": self.model,
            "output": output,
            "previous_response_id": null,
            "reasoning": {"effort": null, "summary": null},
            "service_tier": "default",
            "truncation": "disabled",
            "usage": usage,
            "user": null,
        });
        // What the request set (or OpenAI's defaults): instructions, tools, sampling...
        for (k, v) in &self.echo {
            response[k.as_str()] = v.clone();
        }
        response
    }

    /// The content part of a message item (text or refusal).
    fn part(content: &Content, text: &str) -> Value {
        match content {
            Content::Refusal(_) => json!({"type": "refusal", "refusal": text}),
            _ => json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []}),
        }
    }

    /// The output item, finished (`done`) or as first announced.
    fn item(&self, content: &Content, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        match content {
            Content::ToolCall { name, arguments } => json!({
                "id": self.item_id,
                "type": "function_call",
                "status": status,
                "arguments": if done { arguments.text() } else { "" },
                "call_id": self.call_id,
                "name": name,
            }),
            Content::Text(p) | Content::Exhausted(p) | Content::Refusal(p) => json!({
                "id": self.item_id,
                "type": "message",
                "status": status,
                "role": "assistant",
                "content": if done { json!([Self::part(content, p.text())]) } else { json!([]) },
            }),
        }
    }
}

/// Event emitter that numbers events in order.
struct Events {
    seq: u64,
}

impl Events {
    fn emit(&mut self, kind: &str, mut body: Value) -> Bytes {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        sse::event(kind, &body)
    }
}

/// OpenAI responses API.
pub(crate) struct Responses;

impl Wire for Responses {
    fn parse(&self, body: &[u8]) -> Result<Parsed, String> {
        let mut req: Request = serde_json::from_slice(body)
            .map_err(|e| format!("We could not parse the JSON body of your request. ({e})"))?;
        let has_tools = req.tools.as_ref().is_some_and(|t| !t.is_empty());
        let echo = echo(&mut req);
        let effort = req.reasoning.as_ref().and_then(|r| r.effort.as_deref());
        let summary = req.reasoning.as_ref().and_then(|r| r.summary.as_deref());
        let encrypted = req
            .include
            .as_ref()
            .is_some_and(|i| i.iter().any(|s| s == "reasoning.encrypted_content"));
        Ok(Parsed {
            has_tools,
            rejection: wire::effort_rejection("reasoning.effort", effort)
                .or_else(|| not_found(req.input.as_ref())),
            model: req.model,
            stream: req.stream.unwrap_or(false),
            include_usage: false,
            asks: wire::Asks {
                summary: summary.is_some_and(|s| s != "none"),
                encrypted,
                echo,
            },
        })
    }

    fn reply(&self, ctx: &Ctx<'_>, content: &Content) -> Value {
        let shape = Shape::new(ctx, content);
        if let Content::Exhausted(_) = content {
            return shape.response(
                "incomplete",
                json!([]),
                usage(ctx.prompt_tokens, content.tokens(), 0),
            );
        }
        shape.response(
            "completed",
            shape.output(shape.item(content, true)),
            usage(
                ctx.prompt_tokens,
                content.tokens(),
                shape.reasoning_tokens(),
            ),
        )
    }

    fn frames(&self, ctx: &Ctx<'_>, content: &Content) -> Frames {
        let shape = Shape::new(ctx, content);
        let mut ev = Events { seq: 0 };
        let mut pre = vec![
            ev.emit(
                "response.created",
                json!({"response": shape.response("in_progress", json!([]), Value::Null)}),
            ),
            ev.emit(
                "response.in_progress",
                json!({"response": shape.response("in_progress", json!([]), Value::Null)}),
            ),
        ];
        if let Some(id) = &shape.reasoning_id {
            let text = summary_text(&shape.model);
            let at = json!({"item_id": id, "output_index": 0, "summary_index": 0});
            let with_at = |extra: Value| {
                let mut v = at.clone();
                if let (Some(v), Value::Object(extra)) = (v.as_object_mut(), extra) {
                    v.extend(extra);
                }
                v
            };
            pre.push(ev.emit(
                "response.output_item.added",
                json!({"output_index": 0, "item": shape.reasoning_item(id, false)}),
            ));
            pre.push(ev.emit(
                "response.reasoning_summary_part.added",
                with_at(json!({"part": {"type": "summary_text", "text": ""}})),
            ));
            pre.push(ev.emit(
                "response.reasoning_summary_text.delta",
                with_at(json!({"delta": text})),
            ));
            pre.push(ev.emit(
                "response.reasoning_summary_text.done",
                with_at(json!({"text": text})),
            ));
            pre.push(ev.emit(
                "response.reasoning_summary_part.done",
                with_at(json!({"part": {"type": "summary_text", "text": text}})),
            ));
            pre.push(ev.emit(
                "response.output_item.done",
                json!({"output_index": 0, "item": shape.reasoning_item(id, true)}),
            ));
        }
        let index = shape.index();
        pre.push(ev.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": shape.item(content, false)}),
        ));
        let item_ref = json!({"item_id": shape.item_id, "output_index": index, "content_index": 0});
        let with_ref = |extra: Value| {
            let mut v = item_ref.clone();
            if let (Some(v), Value::Object(extra)) = (v.as_object_mut(), extra) {
                v.extend(extra);
            }
            v
        };

        let (delta_kind, head_fields, pieces) = match content {
            Content::Text(p) | Content::Exhausted(p) => (
                "response.output_text.delta",
                ",\"content_index\":0,\"logprobs\":[]",
                p,
            ),
            Content::Refusal(p) => ("response.refusal.delta", ",\"content_index\":0", p),
            Content::ToolCall { arguments, .. } => {
                ("response.function_call_arguments.delta", "", arguments)
            }
        };
        if !matches!(content, Content::ToolCall { .. }) {
            pre.push(ev.emit(
                "response.content_part.added",
                with_ref(json!({"part": Shape::part(content, "")})),
            ));
        }

        let template = Template::new(
            format!(
                "event: {delta_kind}\ndata: {{\"type\":\"{delta_kind}\",\"item_id\":{},\
                 \"output_index\":{index}{head_fields},\"delta\":",
                json_str(&shape.item_id)
            ),
            "}\n\n".to_owned(),
        );
        let content_frames = pieces
            .iter()
            .map(|p| {
                let seq = ev.seq;
                ev.seq += 1;
                Bytes::from(template.render_seq(p, seq))
            })
            .collect();

        let mut post = Vec::with_capacity(5);
        match content {
            Content::Text(p) | Content::Exhausted(p) => {
                post.push(ev.emit(
                    "response.output_text.done",
                    with_ref(json!({"text": p.text(), "logprobs": []})),
                ));
            }
            Content::Refusal(p) => {
                post.push(ev.emit(
                    "response.refusal.done",
                    with_ref(json!({"refusal": p.text()})),
                ));
            }
            Content::ToolCall { name, arguments } => {
                post.push(ev.emit(
                    "response.function_call_arguments.done",
                    json!({
                        "item_id": shape.item_id,
                        "output_index": index,
                        "name": name,
                        "arguments": arguments.text(),
                    }),
                ));
            }
        }
        if let Content::Text(p) | Content::Exhausted(p) | Content::Refusal(p) = content {
            post.push(ev.emit(
                "response.content_part.done",
                with_ref(json!({"part": Shape::part(content, p.text())})),
            ));
        }
        let done_item = shape.item(content, true);
        post.push(ev.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": done_item}),
        ));
        let (end, status, output) = match content {
            Content::Exhausted(_) => ("response.incomplete", "incomplete", json!([])),
            _ => ("response.completed", "completed", shape.output(done_item)),
        };
        post.push(ev.emit(
            end,
            json!({"response": shape.response(
                status,
                output,
                usage(ctx.prompt_tokens, content.tokens(), shape.reasoning_tokens()),
            )}),
        ));

        Frames {
            pre,
            content: content_frames,
            post,
        }
    }

    fn error_event(&self) -> Bytes {
        sse::event(
            "error",
            &json!({
                "type": "error",
                "code": "server_error",
                "message": "The server had an error while processing your request. Sorry about that!",
                "param": null,
                "sequence_number": 0,
            }),
        )
    }

    fn error_body(&self, status: u16, message: &str) -> Value {
        openai::error_body(status, message)
    }
}
