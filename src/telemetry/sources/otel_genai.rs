//! `otel-genai`: OTLP/JSON spans under OpenTelemetry's GenAI semantic conventions:
//! `gen_ai.operation.name`, `gen_ai.provider.name` (formerly `gen_ai.system`),
//! `gen_ai.request.model` / `gen_ai.response.model`, `gen_ai.usage.input_tokens` /
//! `output_tokens` (formerly `prompt_tokens` / `completion_tokens`); messages as
//! `gen_ai.input.messages` / `gen_ai.output.messages` / `gen_ai.system_instructions`
//! (JSON, role + parts), as the older events (`gen_ai.user.message`,
//! `gen_ai.choice`, ...), or as OpenLLMetry's indexed `gen_ai.prompt.N.*` /
//! `gen_ai.completion.N.*`.

use super::common::{content_text, decoded, float, int, messages, role, text};
use super::otel::{self, OtelSpan};
use crate::telemetry::model::{Message, Span, Trace};
use serde_json::{Map, Value};

pub fn parse(bytes: &[u8]) -> Result<Vec<Trace>, String> {
    Ok(otel::project(otel::read(bytes)?, &[convention]))
}

fn indexed(a: &Map<String, Value>, prefix: &str, default_role: &str) -> Vec<Message> {
    let mut out = Vec::new();
    for i in 0.. {
        let r = a.get(&format!("{prefix}.{i}.role"));
        let c = a.get(&format!("{prefix}.{i}.content"));
        if r.is_none() && c.is_none() {
            break;
        }
        out.push(Message {
            role: role(r.and_then(Value::as_str).unwrap_or(default_role)),
            content: c.map(content_text).unwrap_or_default(),
        });
    }
    out
}

/// Fills a span from the gen_ai.* attributes and events.
pub fn convention(s: &OtelSpan, span: &mut Span) {
    let a = &s.attrs;
    let op = a.get("gen_ai.operation.name").and_then(Value::as_str);
    let has_genai = op.is_some() || a.keys().any(|k| k.starts_with("gen_ai."));
    if !has_genai {
        return;
    }
    if span.kind == "span" {
        span.kind = match op {
            Some("execute_tool") => "tool",
            Some("invoke_agent") | Some("create_agent") => "agent",
            Some("embeddings") => "embedding",
            _ => "llm",
        }
        .into();
    }
    if span.model.is_none() {
        span.model =
            text(a.get("gen_ai.response.model")).or_else(|| text(a.get("gen_ai.request.model")));
    }
    if span.provider.is_none() {
        span.provider =
            text(a.get("gen_ai.provider.name")).or_else(|| text(a.get("gen_ai.system")));
    }
    if span.input_tokens == 0 {
        span.input_tokens = int(a.get("gen_ai.usage.input_tokens"))
            .or_else(|| int(a.get("gen_ai.usage.prompt_tokens")))
            .unwrap_or(0);
    }
    if span.output_tokens == 0 {
        span.output_tokens = int(a.get("gen_ai.usage.output_tokens"))
            .or_else(|| int(a.get("gen_ai.usage.completion_tokens")))
            .unwrap_or(0);
    }
    if span.cost_usd.is_none() {
        span.cost_usd = float(a.get("gen_ai.usage.cost"));
    }
    if span.input.is_empty() {
        let mut input = Vec::new();
        if let Some(sys) = a.get("gen_ai.system_instructions") {
            for m in messages(sys, "system") {
                input.push(Message {
                    role: "system".into(),
                    ..m
                });
            }
        }
        if let Some(m) = a.get("gen_ai.input.messages") {
            input.extend(messages(m, "user"));
        }
        if input.is_empty() {
            input = indexed(a, "gen_ai.prompt", "user");
        }
        if input.is_empty() {
            for (name, ea) in &s.events {
                let r = match name.as_str() {
                    "gen_ai.system.message" => "system",
                    "gen_ai.user.message" => "user",
                    "gen_ai.assistant.message" => "assistant",
                    "gen_ai.tool.message" => "tool",
                    _ => continue,
                };
                let content = ea
                    .get("content")
                    .map(|c| content_text(&decoded(c)))
                    .unwrap_or_default();
                input.push(Message {
                    role: r.into(),
                    content,
                });
            }
        }
        span.input = input;
    }
    if span.output.is_empty() {
        let mut output = a
            .get("gen_ai.output.messages")
            .map(|m| messages(m, "assistant"))
            .unwrap_or_default();
        if output.is_empty() {
            output = indexed(a, "gen_ai.completion", "assistant");
        }
        if output.is_empty() {
            for (name, ea) in &s.events {
                if name == "gen_ai.choice" {
                    let msg = ea.get("message").map(decoded);
                    let content = msg
                        .as_ref()
                        .and_then(|m| m.get("content"))
                        .or(ea.get("content"))
                        .map(content_text)
                        .unwrap_or_default();
                    output.push(Message {
                        role: "assistant".into(),
                        content,
                    });
                }
            }
        }
        span.output = output;
    }
}
