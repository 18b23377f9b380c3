//! `posthog`: PostHog LLM analytics events, as its export and its query API give
//! them: `$ai_generation` (one model call), `$ai_span` and `$ai_trace` events whose
//! `properties` carry `$ai_trace_id`, `$ai_span_id`, `$ai_parent_id`,
//! `$ai_span_name` / `$ai_trace_name`, `$ai_model`, `$ai_provider`, `$ai_input`,
//! `$ai_output_choices`, `$ai_input_tokens`, `$ai_output_tokens`,
//! `$ai_total_cost_usd`, `$ai_latency` (seconds), `$ai_is_error`, `$ai_error`.
//! Properties may be an object or JSON text (as the query API returns them); the
//! query API's rows (`results: [[uuid, event, timestamp, properties, ...]]` with
//! `columns`) are read too.

use super::common::{content_text, decoded, float, int, messages, records, text, time_ms};
use crate::telemetry::model::{Span, Trace, TraceSet};
use serde_json::{Map, Value};

/// Query API rows into event objects, by their `columns`.
fn rows_to_events(doc: &Value) -> Option<Vec<Value>> {
    let cols: Vec<&str> = doc
        .get("columns")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let rows = doc.get("results")?.as_array()?;
    Some(
        rows.iter()
            .filter_map(Value::as_array)
            .map(|row| {
                let mut m = Map::new();
                for (c, v) in cols.iter().zip(row) {
                    m.insert((*c).to_string(), v.clone());
                }
                Value::Object(m)
            })
            .collect(),
    )
}

pub fn parse(bytes: &[u8]) -> Result<Vec<Trace>, String> {
    let mut recs = Vec::new();
    for r in records(bytes, &[])? {
        match rows_to_events(&r) {
            Some(events) => recs.extend(events),
            None => match r.get("results").and_then(Value::as_array) {
                Some(items) => recs.extend(items.iter().cloned()),
                None => recs.push(r),
            },
        }
    }
    let mut set = TraceSet::default();
    let mut n = 0;
    for r in &recs {
        let event = r.get("event").and_then(Value::as_str).unwrap_or("");
        if !event.starts_with("$ai_") {
            continue;
        }
        let props = r.get("properties").map(decoded).unwrap_or(Value::Null);
        let p = |k: &str| props.get(k);
        let uuid = text(r.get("uuid")).or_else(|| text(r.get("id")));
        let Some(trace_id) = text(p("$ai_trace_id")) else {
            continue;
        };
        n += 1;
        let at = time_ms(r.get("timestamp"));
        let latency_ms = float(p("$ai_latency")).map(|s| (s * 1000.0) as i64);
        if event == "$ai_trace" {
            let t = set.trace(&trace_id);
            t.name = text(p("$ai_trace_name")).or_else(|| text(p("$ai_span_name")));
            continue;
        }
        let kind = match event {
            "$ai_generation" => "llm",
            "$ai_embedding" => "embedding",
            _ => "span",
        };
        let parent = text(p("$ai_parent_id")).filter(|x| *x != trace_id);
        let failed = p("$ai_is_error").and_then(Value::as_bool).unwrap_or(false);
        let span = Span {
            span_id: text(p("$ai_span_id")).or(uuid).unwrap_or_default(),
            parent_id: parent,
            name: text(p("$ai_span_name")).unwrap_or_else(|| event.trim_start_matches('$').into()),
            kind: kind.into(),
            started_at: match (at, latency_ms) {
                (Some(t), Some(l)) => Some(t - l),
                (t, _) => t,
            },
            ended_at: at,
            model: text(p("$ai_model")),
            provider: text(p("$ai_provider")),
            input: p("$ai_input")
                .or(p("$ai_input_state"))
                .map(|v| messages(v, "user"))
                .unwrap_or_default(),
            output: p("$ai_output_choices")
                .or(p("$ai_output_state"))
                .or(p("$ai_output"))
                .map(|v| messages(v, "assistant"))
                .unwrap_or_default(),
            input_tokens: int(p("$ai_input_tokens")).unwrap_or(0),
            output_tokens: int(p("$ai_output_tokens")).unwrap_or(0),
            cost_usd: float(p("$ai_total_cost_usd")),
            tags: Vec::new(),
            error: failed.then(|| {
                p("$ai_error")
                    .map(content_text)
                    .unwrap_or_else(|| "error".into())
            }),
        };
        set.push(&trace_id, span);
    }
    if n == 0 {
        return Err("no PostHog $ai_* events with $ai_trace_id".into());
    }
    let mut traces = set.finish();
    // A trace seen only through its $ai_trace event has no spans: keep it counted
    // as a trace all the same (it was recorded).
    traces.retain(|t| !t.spans.is_empty() || t.name.is_some());
    Ok(traces)
}
