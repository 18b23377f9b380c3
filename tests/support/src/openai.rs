//! OpenAI chat completions wire format (`/v1/chat/completions`, also Azure's
//! `/openai/deployments/{deployment}/chat/completions`): `chat.completion`
//! objects, `chat.completion.chunk` SSE streams, and the OpenAI error
//! envelope shared with the responses and embeddings endpoints.

use bytes::Bytes;
use serde::{de::IgnoredAny, Deserialize};
use serde_json::{json, Value};

use crate::{
    sse::{self, json_str, Frames, Template},
    step::Content,
    wire::{self, Ctx, Parsed, Wire},
};

pub(crate) const FINGERPRINT: &str = "fp_mock0001";

/// The date OpenAI-style snapshots are suffixed with.
const SNAPSHOT: &str = "-2025-04-14";

/// The model name OpenAI reports: the requested one with a dated snapshot
/// suffix, unless it already ends with something date-like
/// (`-2024-08-06`, `-20241022`, `-0613`).
pub(crate) fn dated(model: &str) -> String {
    if has_date_suffix(model) {
        model.to_owned()
    } else {
        let mut out = String::with_capacity(model.len() + SNAPSHOT.len());
        out.push_str(model);
        out.push_str(SNAPSHOT);
        out
    }
}

fn has_date_suffix(model: &str) -> bool {
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    let mut parts = model.rsplit('-');
    let (Some(last), Some(prev)) = (parts.next(), parts.next()) else {
        return false;
    };
    if digits(last, 8) || digits(last, 4) {
        return true;
    }
    digits(last, 2) && digits(prev, 2) && parts.next().is_some_and(|y| digits(y, 4))
}

/// OpenAI error envelope `{error:{message,type,param,code}}`.
pub(crate) fn error_body(status: u16, message: &str) -> Value {
    let (kind, code) = match status {
        401 => ("invalid_request_error", json!("invalid_api_key")),
        403 => ("invalid_request_error", json!("permission_denied")),
        404 => ("invalid_request_error", json!("model_not_found")),
        429 => ("requests", json!("rate_limit_exceeded")),
        500..=599 => ("server_error", Value::Null),
        _ => ("invalid_request_error", Value::Null),
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// In-band stream error object (chat completions).
fn stream_error() -> Value {
    json!({"error": {
        "message": "The server had an error while processing your request. Sorry about that!",
        "type": "server_error",
        "param": null,
        "code": null,
    }})
}

#[derive(Deserialize)]
struct Request {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    tools: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    reasoning_effort: Option<String>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

fn usage(prompt: u64, completion: u64) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    })
}

fn finish_reason(content: &Content) -> &'static str {
    match content {
        Content::ToolCall { .. } => "tool_calls",
        Content::Exhausted(_) => "length",
        _ => "stop",
    }
}

/// OpenAI chat completions.
pub(crate) struct Chat;

impl Wire for Chat {
    fn parse(&self, body: &[u8]) -> Result<Parsed, String> {
        let req: Request = serde_json::from_slice(body)
            .map_err(|e| format!("We could not parse the JSON body of your request. ({e})"))?;
        Ok(Parsed {
            has_tools: wire::non_empty(&req.tools),
            rejection: wire::effort_rejection("reasoning_effort", req.reasoning_effort.as_deref()),
            model: req.model,
            stream: req.stream.unwrap_or(false),
            include_usage: req
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            asks: Default::default(),
        })
    }

    fn reply(&self, ctx: &Ctx<'_>, content: &Content) -> Value {
        let message = match content {
            Content::Text(p) | Content::Exhausted(p) => json!({
                "role": "assistant", "content": p.text(), "refusal": null, "annotations": [],
            }),
            Content::Refusal(p) => json!({
                "role": "assistant", "content": null, "refusal": p.text(), "annotations": [],
            }),
            Content::ToolCall { name, arguments } => json!({
                "role": "assistant",
                "content": null,
                "refusal": null,
                "annotations": [],
                "tool_calls": [{
                    "id": format!("call_mock{}", wire::next_id()),
                    "type": "function",
                    "function": {"name": name, "arguments": arguments.text()},
                }],
            }),
        };
        json!({
            "id": format!("chatcmpl-mock{}", wire::next_id()),
            "object": "chat.completion",
            "created": wire::now(),
            "model": dated(ctx.model),
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": finish_reason(content),
            }],
            "usage": usage(ctx.prompt_tokens, content.tokens()),
            "service_tier": "default",
            "system_fingerprint": FINGERPRINT,
        })
    }

    fn frames(&self, ctx: &Ctx<'_>, content: &Content) -> Frames {
        let id = format!("chatcmpl-mock{}", wire::next_id());
        let created = wire::now();
        let model = dated(ctx.model);
        let chunk = |delta: Value, finish: Value| {
            let mut v = json!({
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "service_tier": "default",
                "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            });
            if ctx.include_usage {
                v["usage"] = Value::Null;
            }
            sse::data(&v)
        };

        let (role_delta, delta_head, delta_tail, pieces) = match content {
            Content::Text(p) | Content::Exhausted(p) => (
                json!({"role": "assistant", "content": "", "refusal": null}),
                "{\"content\":",
                "}",
                p,
            ),
            Content::Refusal(p) => (
                json!({"role": "assistant", "content": null, "refusal": ""}),
                "{\"refusal\":",
                "}",
                p,
            ),
            Content::ToolCall { name, arguments } => (
                json!({
                    "role": "assistant",
                    "content": null,
                    "refusal": null,
                    "tool_calls": [{
                        "index": 0,
                        "id": format!("call_mock{}", wire::next_id()),
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }],
                }),
                "{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":",
                "}}]}",
                arguments,
            ),
        };

        let head = format!(
            "data: {{\"id\":{},\"object\":\"chat.completion.chunk\",\"created\":{created},\
             \"model\":{},\"service_tier\":\"default\",\"system_fingerprint\":\"{FINGERPRINT}\",\
             \"choices\":[{{\"index\":0,\"delta\":{delta_head}",
            json_str(&id),
            json_str(&model),
        );
        let usage_null = if ctx.include_usage {
            ",\"usage\":null"
        } else {
            ""
        };
        let tail =
            format!("{delta_tail},\"logprobs\":null,\"finish_reason\":null}}]{usage_null}}}\n\n");
        let template = Template::new(head, tail);

        let mut post = vec![chunk(json!({}), json!(finish_reason(content)))];
        if ctx.include_usage {
            post.push(sse::data(&json!({
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "service_tier": "default",
                "system_fingerprint": FINGERPRINT,
                "choices": [],
                "usage": usage(ctx.prompt_tokens, content.tokens()),
            })));
        }
        post.push(Bytes::from_static(b"data: [DONE]\n\n"));

        Frames {
            pre: vec![chunk(role_delta, Value::Null)],
            content: pieces
                .iter()
                .map(|p| Bytes::from(template.render(p)))
                .collect(),
            post,
        }
    }

    fn error_event(&self) -> Bytes {
        sse::data(&stream_error())
    }

    fn error_body(&self, status: u16, message: &str) -> Value {
        error_body(status, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dated_models() {
        assert_eq!(dated("gpt-4.1-mini"), "gpt-4.1-mini-2025-04-14");
        assert_eq!(dated("gpt-4o-2024-08-06"), "gpt-4o-2024-08-06");
        assert_eq!(dated("gpt-4-0613"), "gpt-4-0613");
        assert_eq!(
            dated("claude-3-5-sonnet-20241022"),
            "claude-3-5-sonnet-20241022"
        );
        assert_eq!(dated("mock"), "mock-2025-04-14");
        assert_eq!(dated("gpt-4o-11-22"), "gpt-4o-11-22-2025-04-14");
    }
}
