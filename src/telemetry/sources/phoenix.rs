//! `phoenix`: Arize Phoenix spans under the OpenInference conventions
//! (`openinference.span.kind`, `llm.model_name`, `llm.provider` / `llm.system`,
//! `llm.token_count.prompt|completion`, `llm.cost.total`,
//! `llm.input_messages.N.message.role|content`, `llm.output_messages.N...`,
//! `input.value` / `output.value`, `tag.tags`), in any of the shapes Phoenix
//! exports: OTLP/JSON, the REST API's span records (`GET /v1/projects/{id}/spans`:
//! `{data: [{context: {trace_id, span_id}, parent_id, start_time, end_time,
//! attributes, ...}], next_cursor}`), or the spans dataframe's rows written as
//! JSON (`context.trace_id`, `attributes.llm.model_name`, ...).

use super::common::{content_text, float, int, messages, records, role, tags, text, time_ms};
use super::otel::{self, OtelSpan};
use crate::telemetry::model::{Message, Span, Trace, TraceSet};
use serde_json::{Map, Value};

pub fn parse(bytes: &[u8]) -> Result<Vec<Trace>, String> {
    if let Ok(spans) = otel::read(bytes) {
        return Ok(otel::project(spans, &[convention]));
    }
    let recs = records(bytes, &["data", "spans"])?;
    let mut set = TraceSet::default();
    let mut n = 0;
    for r in &recs {
        let Some(o) = r.as_object() else { continue };
        let Some(s) = record_span(o) else { continue };
        n += 1;
        let trace_id = s.trace_id.clone();
        let mut out = otel::base_span(&s);
        convention(&s, &mut out);
        set.push(&trace_id, out);
    }
    if n == 0 {
        return Err("no Phoenix spans (OTLP/JSON, span records or span rows)".into());
    }
    Ok(set.finish())
}

/// Flattens nested attribute objects to dotted keys (`{llm: {model_name}}` →
/// `llm.model_name`), as the OTLP attributes are spelled.
fn flatten(prefix: &str, v: &Value, out: &mut Map<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, inner) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, inner, out);
            }
        }
        // OpenInference lists of messages: llm.input_messages: [{message: {...}}].
        Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
            for (i, inner) in items.iter().enumerate() {
                flatten(&format!("{prefix}.{i}"), inner, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

fn record_span(o: &Map<String, Value>) -> Option<OtelSpan> {
    let mut attrs = Map::new();
    // The REST record: nested context and attributes.
    if let Some(ctx) = o.get("context") {
        if let Some(a) = o.get("attributes") {
            flatten("", &super::common::decoded(a), &mut attrs);
        }
        let status_error = (o.get("status_code").and_then(Value::as_str) == Some("ERROR"))
            .then(|| text(o.get("status_message")).unwrap_or_else(|| "error".into()));
        return Some(OtelSpan {
            trace_id: text(ctx.get("trace_id"))?,
            span_id: text(ctx.get("span_id")).unwrap_or_default(),
            parent_id: text(o.get("parent_id")),
            name: text(o.get("name")).unwrap_or_default(),
            start: time_ms(o.get("start_time")),
            end: time_ms(o.get("end_time")),
            attrs,
            service: None,
            events: Vec::new(),
            error: status_error,
        });
    }
    // The dataframe row: flat `context.*` and `attributes.*` columns.
    let trace_id = text(o.get("context.trace_id"))?;
    for (k, v) in o {
        if let Some(rest) = k.strip_prefix("attributes.") {
            flatten(rest, v, &mut attrs);
        }
    }
    Some(OtelSpan {
        trace_id,
        span_id: text(o.get("context.span_id")).unwrap_or_default(),
        parent_id: text(o.get("parent_id")),
        name: text(o.get("name")).unwrap_or_default(),
        start: time_ms(o.get("start_time")),
        end: time_ms(o.get("end_time")),
        attrs,
        service: None,
        events: Vec::new(),
        error: (o.get("status_code").and_then(Value::as_str) == Some("ERROR"))
            .then(|| text(o.get("status_message")).unwrap_or_else(|| "error".into())),
    })
}

fn indexed(a: &Map<String, Value>, prefix: &str, default_role: &str) -> Vec<Message> {
    let mut out = Vec::new();
    for i in 0.. {
        let r = a.get(&format!("{prefix}.{i}.message.role"));
        let c = a.get(&format!("{prefix}.{i}.message.content"));
        let parts = a.get(&format!(
            "{prefix}.{i}.message.contents.0.message_content.text"
        ));
        if r.is_none() && c.is_none() && parts.is_none() {
            break;
        }
        out.push(Message {
            role: role(r.and_then(Value::as_str).unwrap_or(default_role)),
            content: c.or(parts).map(content_text).unwrap_or_default(),
        });
    }
    out
}

/// Fills a span from the OpenInference attributes.
pub fn convention(s: &OtelSpan, span: &mut Span) {
    let a = &s.attrs;
    let kind = a.get("openinference.span.kind").and_then(Value::as_str);
    if kind.is_none()
        && !a
            .keys()
            .any(|k| k.starts_with("llm.") || k == "input.value")
    {
        return;
    }
    if span.kind == "span" {
        span.kind = kind.map_or("span".into(), str::to_ascii_lowercase);
    }
    if span.model.is_none() {
        span.model = text(a.get("llm.model_name"));
    }
    if span.provider.is_none() {
        span.provider = text(a.get("llm.provider")).or_else(|| text(a.get("llm.system")));
    }
    if span.input_tokens == 0 {
        span.input_tokens = int(a.get("llm.token_count.prompt")).unwrap_or(0);
    }
    if span.output_tokens == 0 {
        span.output_tokens = int(a.get("llm.token_count.completion")).unwrap_or(0);
    }
    if span.cost_usd.is_none() {
        span.cost_usd = float(a.get("llm.cost.total"));
    }
    if span.input.is_empty() {
        span.input = indexed(a, "llm.input_messages", "user");
        if span.input.is_empty() {
            if let Some(v) = a.get("input.value") {
                span.input = messages(v, "user");
            }
        }
    }
    if span.output.is_empty() {
        span.output = indexed(a, "llm.output_messages", "assistant");
        if span.output.is_empty() {
            if let Some(v) = a.get("output.value") {
                span.output = messages(v, "assistant");
            }
        }
    }
    if span.tags.is_empty() {
        span.tags = tags(a.get("tag.tags"));
    }
}
