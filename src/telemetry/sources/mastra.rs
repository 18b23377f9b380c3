//! `mastra`: Mastra's traces, in the two shapes Mastra stores them. Its AI
//! tracing spans (`GET /api/observability/traces/{traceId}` → `{traceId, spans}`):
//! `traceId`, `spanId`, `parentSpanId`, `name`, `spanType` (agent_run,
//! model_generation / llm_generation, tool_call, workflow_*), `startedAt`,
//! `endedAt`, `input`, `output`, `attributes {model, provider, usage
//! {inputTokens|promptTokens, outputTokens|completionTokens}}`, `error`. And its
//! older OpenTelemetry rows (`mastra_traces`: `id`, `traceId`, `parentSpanId`,
//! `name`, `kind`, `startTime`/`endTime` in nanoseconds, `attributes` with the AI
//! SDK's `ai.*` keys, `status`).

use super::common::{content_text, decoded, int, messages, records, text, time_ms};
use super::otel::OtelSpan;
use crate::telemetry::model::{Span, Trace, TraceSet};
use serde_json::{Map, Value};

/// The Vercel AI SDK's span attributes (`ai.model.id`, `ai.model.provider`,
/// `ai.usage.promptTokens`, `ai.prompt.messages`, `ai.response.text`), which
/// Mastra's OpenTelemetry spans and many OTLP exports carry.
pub fn ai_sdk_convention(s: &OtelSpan, span: &mut Span) {
    ai_sdk(&s.attrs, span);
}

fn ai_sdk(a: &Map<String, Value>, span: &mut Span) {
    if !a.keys().any(|k| k.starts_with("ai.")) {
        return;
    }
    if span.kind == "span" && a.contains_key("ai.model.id") {
        span.kind = "llm".into();
    }
    if span.model.is_none() {
        span.model = text(a.get("ai.response.model")).or_else(|| text(a.get("ai.model.id")));
    }
    if span.provider.is_none() {
        span.provider = text(a.get("ai.model.provider"));
    }
    if span.input_tokens == 0 {
        span.input_tokens = int(a.get("ai.usage.promptTokens"))
            .or_else(|| int(a.get("ai.usage.inputTokens")))
            .unwrap_or(0);
    }
    if span.output_tokens == 0 {
        span.output_tokens = int(a.get("ai.usage.completionTokens"))
            .or_else(|| int(a.get("ai.usage.outputTokens")))
            .unwrap_or(0);
    }
    if span.input.is_empty() {
        if let Some(m) = a.get("ai.prompt.messages").or(a.get("ai.prompt")) {
            span.input = messages(m, "user");
        }
    }
    if span.output.is_empty() {
        if let Some(t) = a.get("ai.response.text") {
            span.output = messages(t, "assistant");
        }
    }
}

fn ai_span(r: &Value) -> Option<(String, Span)> {
    let trace_id = text(r.get("traceId"))?;
    let attrs = r.get("attributes").map(decoded).unwrap_or(Value::Null);
    let usage = attrs.get("usage");
    let u = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| int(usage.and_then(|x| x.get(*k))))
            .unwrap_or(0)
    };
    let kind = match r
        .get("spanType")
        .and_then(Value::as_str)
        .unwrap_or("generic")
    {
        "model_generation" | "llm_generation" | "model_step" | "llm_step" => "llm".to_string(),
        other => other.to_string(),
    };
    Some((
        trace_id,
        Span {
            span_id: text(r.get("spanId"))
                .or_else(|| text(r.get("id")))
                .unwrap_or_default(),
            parent_id: text(r.get("parentSpanId")),
            name: text(r.get("name")).unwrap_or_else(|| kind.clone()),
            kind,
            started_at: time_ms(r.get("startedAt")),
            ended_at: time_ms(r.get("endedAt")),
            model: text(attrs.get("model")),
            provider: text(attrs.get("provider")),
            input: r
                .get("input")
                .map(|v| messages(v, "user"))
                .unwrap_or_default(),
            output: r
                .get("output")
                .map(|v| messages(v, "assistant"))
                .unwrap_or_default(),
            input_tokens: u(&["inputTokens", "promptTokens"]),
            output_tokens: u(&["outputTokens", "completionTokens"]),
            cost_usd: None,
            tags: super::common::tags(r.get("metadata").and_then(|m| m.get("tags"))),
            error: r
                .get("errorInfo")
                .or(r.get("error"))
                .filter(|e| !e.is_null())
                .map(|e| {
                    e.get("message")
                        .map(content_text)
                        .unwrap_or_else(|| content_text(e))
                }),
        },
    ))
}

fn otel_row(r: &Value) -> Option<(String, Span)> {
    let trace_id = text(r.get("traceId"))?;
    let attrs = match r.get("attributes").map(decoded) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let failed = r
        .get("status")
        .map(decoded)
        .and_then(|s| s.get("code").cloned())
        .is_some_and(|c| c == 2);
    let mut span = Span {
        span_id: text(r.get("id"))
            .or_else(|| text(r.get("spanId")))
            .unwrap_or_default(),
        parent_id: text(r.get("parentSpanId")),
        name: text(r.get("name")).unwrap_or_default(),
        kind: "span".into(),
        started_at: time_ms(r.get("startTime")),
        ended_at: time_ms(r.get("endTime")),
        error: failed.then(|| "error".into()),
        ..Span::default()
    };
    ai_sdk(&attrs, &mut span);
    Some((trace_id, span))
}

pub fn parse(bytes: &[u8]) -> Result<Vec<Trace>, String> {
    let recs = records(bytes, &["spans", "traces", "data"])?;
    let mut set = TraceSet::default();
    let mut n = 0;
    for r in &recs {
        let found = if r.get("spanType").is_some() || r.get("spanId").is_some() {
            ai_span(r)
        } else {
            otel_row(r)
        };
        if let Some((trace_id, span)) = found {
            n += 1;
            let root = span.parent_id.is_none();
            let t = set.trace(&trace_id);
            if root {
                t.name = Some(span.name.clone());
            }
            t.spans.push(span);
        }
    }
    if n == 0 {
        return Err("no Mastra spans (records with traceId)".into());
    }
    Ok(set.finish())
}
