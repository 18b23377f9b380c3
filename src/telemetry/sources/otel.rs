//! Reading OpenTelemetry's OTLP/JSON trace export (`ExportTraceServiceRequest`:
//! `resourceSpans[].scopeSpans[].spans[]`, one document or one per line as the
//! collector's file exporter writes) into spans with flat attribute maps, and
//! projecting them with the LLM conventions a source kind reads (`otlp`,
//! `otel-genai`, `phoenix` use it).

use super::common::{records, time_ms};
use crate::telemetry::model::{Span, Trace, TraceSet};
use serde_json::{Map, Value};

/// A span as OTLP carries it, attributes flattened to a map.
pub struct OtelSpan {
    pub trace_id: String,
    pub span_id: String,
    pub parent_id: Option<String>,
    pub name: String,
    pub start: Option<i64>,
    pub end: Option<i64>,
    pub attrs: Map<String, Value>,
    /// The resource's `service.name`.
    pub service: Option<String>,
    /// (event name, its attributes)
    pub events: Vec<(String, Map<String, Value>)>,
    pub error: Option<String>,
}

/// Reads `AnyValue` (`stringValue`, `intValue`, `doubleValue`, `boolValue`,
/// `arrayValue`, `kvlistValue`, `bytesValue`) into plain JSON.
pub fn any_value(v: &Value) -> Value {
    let Some(o) = v.as_object() else {
        return v.clone();
    };
    if let Some(s) = o.get("stringValue") {
        return s.clone();
    }
    if let Some(i) = o.get("intValue") {
        return match i {
            Value::String(s) => s.parse::<i64>().map(Value::from).unwrap_or(i.clone()),
            other => other.clone(),
        };
    }
    if let Some(d) = o.get("doubleValue") {
        return d.clone();
    }
    if let Some(b) = o.get("boolValue") {
        return b.clone();
    }
    if let Some(a) = o.get("arrayValue") {
        return Value::Array(
            a.get("values")
                .and_then(Value::as_array)
                .map(|vs| vs.iter().map(any_value).collect())
                .unwrap_or_default(),
        );
    }
    if let Some(kv) = o.get("kvlistValue") {
        return Value::Object(attributes(kv.get("values")));
    }
    if let Some(b) = o.get("bytesValue") {
        return b.clone();
    }
    Value::Null
}

/// `[{key, value}]` into a map.
pub fn attributes(v: Option<&Value>) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(items) = v.and_then(Value::as_array) {
        for kv in items {
            if let Some(k) = kv.get("key").and_then(Value::as_str) {
                m.insert(
                    k.to_string(),
                    kv.get("value").map(any_value).unwrap_or(Value::Null),
                );
            }
        }
    }
    m
}

/// Every span of an OTLP/JSON export.
pub fn read(bytes: &[u8]) -> Result<Vec<OtelSpan>, String> {
    let docs = records(bytes, &[])?;
    let mut out = Vec::new();
    let mut saw_otlp = false;
    for doc in &docs {
        let Some(rs) = doc.get("resourceSpans").and_then(Value::as_array) else {
            continue;
        };
        saw_otlp = true;
        for r in rs {
            let resource = attributes(r.get("resource").and_then(|x| x.get("attributes")));
            let service = resource
                .get("service.name")
                .and_then(Value::as_str)
                .map(str::to_string);
            let scopes = r
                .get("scopeSpans")
                .or_else(|| r.get("instrumentationLibrarySpans"))
                .and_then(Value::as_array);
            for scope in scopes.into_iter().flatten() {
                for s in scope
                    .get("spans")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    out.push(span(s, &service));
                }
            }
        }
    }
    if !saw_otlp {
        return Err("no resourceSpans: not an OTLP/JSON trace export".into());
    }
    Ok(out)
}

fn span(s: &Value, service: &Option<String>) -> OtelSpan {
    let id = |k: &str| {
        s.get(k)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let status = s.get("status");
    // STATUS_CODE_ERROR is 2 (or its name).
    let failed = status
        .and_then(|st| st.get("code"))
        .is_some_and(|c| c == 2 || c == "STATUS_CODE_ERROR");
    OtelSpan {
        trace_id: id("traceId").unwrap_or_default(),
        span_id: id("spanId").unwrap_or_default(),
        parent_id: id("parentSpanId"),
        name: id("name").unwrap_or_default(),
        start: time_ms(s.get("startTimeUnixNano")),
        end: time_ms(s.get("endTimeUnixNano")),
        attrs: attributes(s.get("attributes")),
        service: service.clone(),
        events: s
            .get("events")
            .and_then(Value::as_array)
            .map(|es| {
                es.iter()
                    .map(|e| {
                        (
                            e.get("name")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                            attributes(e.get("attributes")),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        error: failed.then(|| {
            status
                .and_then(|st| st.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("error")
                .to_string()
        }),
    }
}

/// A span of the model with its OTLP identity; the conventions fill the rest.
pub fn base_span(s: &OtelSpan) -> Span {
    Span {
        span_id: s.span_id.clone(),
        parent_id: s.parent_id.clone(),
        name: s.name.clone(),
        kind: "span".into(),
        started_at: s.start,
        ended_at: s.end,
        error: s.error.clone(),
        ..Span::default()
    }
}

/// Projects OTLP spans with the given conventions, applied in order (each fills
/// only what an earlier one left empty).
pub fn project(spans: Vec<OtelSpan>, conventions: &[fn(&OtelSpan, &mut Span)]) -> Vec<Trace> {
    let mut set = TraceSet::default();
    for s in &spans {
        let mut out = base_span(s);
        for c in conventions {
            c(s, &mut out);
        }
        let t = set.trace(&s.trace_id);
        // The service that recorded it, as OpenTelemetry users filter by it.
        if let Some(name) = &s.service {
            if t.tags.len() < 8
                && !t
                    .tags
                    .iter()
                    .any(|x| x.strip_prefix("service:") == Some(name))
            {
                t.tags.push(format!("service:{name}"));
            }
        }
        t.spans.push(out);
    }
    set.finish()
}
