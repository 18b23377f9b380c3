//! `braintrust`: Braintrust log events, as its export and its fetch API
//! (`POST /v1/project_logs/{id}/fetch` → `{events, cursor}`) give them: `id`,
//! `span_id`, `root_span_id` (the trace), `span_parents`, `span_attributes {name,
//! type}`, `input`, `output`, `metadata {model, provider, ...}`, `metrics {start,
//! end (seconds), prompt_tokens, completion_tokens, estimated_cost}`, `tags`,
//! `error`.

use super::common::{float, int, messages, records, tags, text, time_ms};
use crate::telemetry::model::{Span, Trace, TraceSet};
use serde_json::Value;

pub fn parse(bytes: &[u8]) -> Result<Vec<Trace>, String> {
    let recs = records(bytes, &["events", "data"])?;
    let mut set = TraceSet::default();
    let mut n = 0;
    for r in &recs {
        let Some(root) = text(r.get("root_span_id")) else {
            continue;
        };
        n += 1;
        let span_id = text(r.get("span_id"))
            .or_else(|| text(r.get("id")))
            .unwrap_or_default();
        let attrs = r.get("span_attributes");
        let metrics = r.get("metrics");
        let meta = r.get("metadata");
        let m = |k: &str| metrics.and_then(|x| x.get(k));
        let parent = r
            .get("span_parents")
            .and_then(Value::as_array)
            .and_then(|p| p.first())
            .and_then(Value::as_str)
            .map(str::to_string);
        let kind = attrs
            .and_then(|a| a.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("span")
            .to_string();
        let span = Span {
            span_id,
            parent_id: parent,
            name: attrs
                .and_then(|a| text(a.get("name")))
                .unwrap_or_else(|| kind.clone()),
            kind,
            started_at: time_ms(m("start")).or_else(|| time_ms(r.get("created"))),
            ended_at: time_ms(m("end")),
            model: meta.and_then(|x| text(x.get("model"))),
            provider: meta.and_then(|x| text(x.get("provider"))),
            input: r
                .get("input")
                .map(|v| messages(v, "user"))
                .unwrap_or_default(),
            output: r
                .get("output")
                .map(|v| messages(v, "assistant"))
                .unwrap_or_default(),
            input_tokens: int(m("prompt_tokens")).unwrap_or(0),
            output_tokens: int(m("completion_tokens")).unwrap_or(0),
            cost_usd: float(m("estimated_cost")).or_else(|| float(m("cost"))),
            tags: tags(r.get("tags")),
            error: r
                .get("error")
                .filter(|e| !e.is_null())
                .map(super::common::content_text),
        };
        let is_root = span.parent_id.is_none();
        let t = set.trace(&root);
        if is_root {
            t.name = Some(span.name.clone());
            t.tags.extend(span.tags.iter().cloned());
        }
        t.spans.push(span);
    }
    if n == 0 {
        return Err("no Braintrust log events (records with root_span_id)".into());
    }
    Ok(set.finish())
}
