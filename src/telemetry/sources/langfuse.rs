//! `langfuse`: Langfuse traces and observations, as its export and its public API
//! (`GET /api/public/traces` and `/api/public/observations` → `{data, meta}`) give
//! them. A trace (`id`, `name`, `timestamp`, `input`, `output`, `tags`, and in the
//! trace detail `observations: [...]`) holds observations (`traceId`, `type`
//! GENERATION | SPAN | EVENT | ..., `parentObservationId`, `startTime`, `endTime`,
//! `model`, `input`, `output`, `usage {input, output}` or `usageDetails`,
//! `calculatedTotalCost` or `costDetails.total`, `level`, `statusMessage`).
//! Observations may come nested in their trace or as records of their own.

use super::common::{content_text, float, int, messages, records, tags, text, time_ms};
use crate::telemetry::model::{Span, Trace, TraceSet};
use serde_json::Value;

fn observation(o: &Value) -> Span {
    let usage = o
        .get("usageDetails")
        .filter(|u| u.is_object())
        .or(o.get("usage"));
    let u = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| int(usage.and_then(|x| x.get(*k))))
            .unwrap_or(0)
    };
    let kind = match o.get("type").and_then(Value::as_str).unwrap_or("SPAN") {
        "GENERATION" => "llm".to_string(),
        other => other.to_ascii_lowercase(),
    };
    let failed = o.get("level").and_then(Value::as_str) == Some("ERROR");
    Span {
        span_id: text(o.get("id")).unwrap_or_default(),
        parent_id: text(o.get("parentObservationId")),
        name: text(o.get("name")).unwrap_or_else(|| kind.clone()),
        kind,
        started_at: time_ms(o.get("startTime")),
        ended_at: time_ms(o.get("endTime")),
        model: text(o.get("model")).or_else(|| text(o.get("providedModelName"))),
        provider: o
            .get("metadata")
            .and_then(|m| text(m.get("provider")).or_else(|| text(m.get("ls_provider")))),
        input: o
            .get("input")
            .map(|v| messages(v, "user"))
            .unwrap_or_default(),
        output: o
            .get("output")
            .map(|v| messages(v, "assistant"))
            .unwrap_or_default(),
        input_tokens: u(&["input", "promptTokens", "prompt_tokens", "input_tokens"]),
        output_tokens: u(&[
            "output",
            "completionTokens",
            "completion_tokens",
            "output_tokens",
        ]),
        cost_usd: float(o.get("calculatedTotalCost"))
            .or_else(|| float(o.get("totalCost")))
            .or_else(|| float(o.get("costDetails").and_then(|c| c.get("total")))),
        tags: Vec::new(),
        error: failed.then(|| {
            o.get("statusMessage")
                .map(content_text)
                .unwrap_or_else(|| "error".into())
        }),
    }
}

pub fn parse(bytes: &[u8]) -> Result<Vec<Trace>, String> {
    let recs = records(bytes, &["data"])?;
    let mut set = TraceSet::default();
    let mut n = 0;
    // Traces without observations become one span of their own input and output.
    let mut bare: Vec<(String, Span)> = Vec::new();
    for r in &recs {
        if let Some(trace_id) = text(r.get("traceId")) {
            n += 1;
            set.push(&trace_id, observation(r));
            continue;
        }
        let Some(id) = text(r.get("id")) else {
            continue;
        };
        if r.get("timestamp").is_none() && r.get("observations").is_none() {
            continue;
        }
        n += 1;
        let t = set.trace(&id);
        t.name = text(r.get("name"));
        t.tags.extend(tags(r.get("tags")));
        let mut nested = 0;
        if let Some(obs) = r.get("observations").and_then(Value::as_array) {
            for o in obs.iter().filter(|o| o.is_object()) {
                t.spans.push(observation(o));
                nested += 1;
            }
        }
        if nested == 0 {
            bare.push((
                id.clone(),
                Span {
                    span_id: id,
                    name: text(r.get("name")).unwrap_or_else(|| "trace".into()),
                    kind: "trace".into(),
                    started_at: time_ms(r.get("timestamp")),
                    input: r
                        .get("input")
                        .map(|v| messages(v, "user"))
                        .unwrap_or_default(),
                    output: r
                        .get("output")
                        .map(|v| messages(v, "assistant"))
                        .unwrap_or_default(),
                    cost_usd: float(r.get("totalCost")),
                    ..Span::default()
                },
            ));
        }
    }
    if n == 0 {
        return Err("no Langfuse traces or observations".into());
    }
    for (id, span) in bare {
        let t = set.trace(&id);
        // Observations listed as records of their own may have arrived.
        if t.spans.is_empty() {
            t.spans.push(span);
        }
    }
    Ok(set.finish())
}
