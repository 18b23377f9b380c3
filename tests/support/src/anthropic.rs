//! Anthropic messages wire format (`/v1/messages`): `message` objects, the
//! named-event stream (`message_start` ... `message_stop`) and Anthropic's
//! `{type:"error", error:{type, message}}` envelope.

use bytes::Bytes;
use serde::{de::IgnoredAny, Deserialize};
use serde_json::{json, Value};

use crate::{
    sse::{self, Frames, Template},
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
    tools: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    thinking: Option<Value>,
    #[serde(default)]
    messages: Vec<Value>,
}

/// Anthropic's 400 for a history it cannot continue with thinking on: the last
/// assistant turn calls a tool and does not start with its thinking block, worded
/// as the real API words it.
fn thinking_rejection(req: &Request) -> Option<(u16, Value)> {
    if req.thinking.as_ref()?["type"] != "enabled" {
        return None;
    }
    let (i, last) = req
        .messages
        .iter()
        .enumerate()
        .rfind(|(_, m)| m["role"] == "assistant")?;
    let blocks = last["content"].as_array()?;
    if !blocks.iter().any(|b| b["type"] == "tool_use") {
        return None;
    }
    let found = blocks.first()?["type"].as_str().unwrap_or_default();
    if matches!(found, "thinking" | "redacted_thinking") {
        return None;
    }
    let message = format!(
        "messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
    );
    Some((
        400,
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}}),
    ))
}

fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

fn stop_reason(content: &Content) -> &'static str {
    match content {
        Content::Text(_) => "end_turn",
        Content::Exhausted(_) => "max_tokens",
        Content::Refusal(_) => "refusal",
        Content::ToolCall { .. } => "tool_use",
    }
}

/// The tool input object parsed from the scripted arguments text.
fn tool_input(arguments: &str) -> Value {
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// The content block of a finished message, if any.
fn block(content: &Content, tool_id: &str) -> Option<Value> {
    match content {
        Content::Text(p) | Content::Exhausted(p) | Content::Refusal(p) if p.is_empty() => None,
        Content::Text(p) | Content::Exhausted(p) | Content::Refusal(p) => {
            Some(json!({"type": "text", "text": p.text()}))
        }
        Content::ToolCall { name, arguments } => Some(json!({
            "type": "tool_use",
            "id": tool_id,
            "name": name,
            "input": tool_input(arguments.text()),
        })),
    }
}

/// Anthropic messages API.
pub(crate) struct Messages;

impl Wire for Messages {
    fn parse(&self, body: &[u8]) -> Result<Parsed, String> {
        let req: Request =
            serde_json::from_slice(body).map_err(|e| format!("invalid request body: {e}"))?;
        Ok(Parsed {
            has_tools: wire::non_empty(&req.tools),
            rejection: thinking_rejection(&req),
            model: req.model,
            stream: req.stream.unwrap_or(false),
            include_usage: false,
            asks: Default::default(),
        })
    }

    fn reply(&self, ctx: &Ctx<'_>, content: &Content) -> Value {
        let n = wire::next_id();
        let blocks: Vec<Value> = block(content, &format!("toolu_mock{n}"))
            .into_iter()
            .collect();
        json!({
            "id": format!("msg_mock{n}"),
            "type": "message",
            "role": "assistant",
            "model": ctx.model,
            "content": blocks,
            "stop_reason": stop_reason(content),
            "stop_sequence": null,
            "usage": {
                "input_tokens": ctx.cache_split().1,
                "cache_creation_input_tokens": ctx.cache_split().0,
                "cache_read_input_tokens": 0,
                "output_tokens": content.tokens(),
                "service_tier": "standard",
            },
        })
    }

    fn frames(&self, ctx: &Ctx<'_>, content: &Content) -> Frames {
        let n = wire::next_id();
        let mut pre = vec![sse::event(
            "message_start",
            &json!({"type": "message_start", "message": {
                "id": format!("msg_mock{n}"),
                "type": "message",
                "role": "assistant",
                "model": ctx.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {
                    "input_tokens": ctx.cache_split().1,
                    "cache_creation_input_tokens": ctx.cache_split().0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 1,
                    "service_tier": "standard",
                },
            }}),
        )];

        let (start_block, delta_head, pieces) = match content {
            Content::Text(p) | Content::Exhausted(p) | Content::Refusal(p) => (
                json!({"type": "text", "text": ""}),
                "{\"type\":\"text_delta\",\"text\":",
                p,
            ),
            Content::ToolCall { name, arguments } => (
                json!({"type": "tool_use", "id": format!("toolu_mock{n}"), "name": name, "input": {}}),
                "{\"type\":\"input_json_delta\",\"partial_json\":",
                arguments,
            ),
        };
        let has_block = !pieces.is_empty() || matches!(content, Content::ToolCall { .. });
        if has_block {
            pre.push(sse::event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0, "content_block": start_block}),
            ));
        }
        pre.push(Bytes::from_static(
            b"event: ping\ndata: {\"type\": \"ping\"}\n\n",
        ));

        let template = Template::new(
            format!(
                "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\
                 \"index\":0,\"delta\":{delta_head}"
            ),
            "}}\n\n".to_owned(),
        );

        let mut post = Vec::with_capacity(3);
        if has_block {
            post.push(sse::event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": 0}),
            ));
        }
        post.push(sse::event(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(content), "stop_sequence": null},
                "usage": {"output_tokens": content.tokens()},
            }),
        ));
        post.push(Bytes::from_static(
            b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ));

        Frames {
            pre,
            content: pieces
                .iter()
                .map(|p| Bytes::from(template.render(p)))
                .collect(),
            post,
        }
    }

    fn error_event(&self) -> Bytes {
        sse::event(
            "error",
            &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        )
    }

    fn error_body(&self, status: u16, message: &str) -> Value {
        json!({"type": "error", "error": {"type": error_type(status), "message": message}})
    }
}
