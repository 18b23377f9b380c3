//! `chat-json`: plain chat logs, one JSON record per line: a chat request and its
//! response (`{request: {model, messages}, response: {id, model, choices, usage}}`,
//! also `input`/`output`), or a conversation alone (`{messages: [...], model?}`
//! or a bare array of messages). Each record is one trace of one `llm` span; an
//! `id` or `trace_id` names it, else its line number. The postgres pull stores its
//! rows in this shape.

use super::common::{float, int, messages, records, tags, text, time_ms};
use crate::telemetry::model::{Message, Span, Trace, TraceSet};
use serde_json::Value;

pub fn parse(bytes: &[u8]) -> Result<Vec<Trace>, String> {
    let recs = records(bytes, &[])?;
    let mut set = TraceSet::default();
    for (i, r) in recs.iter().enumerate() {
        let (request, response) = match r {
            Value::Array(_) => (r, &Value::Null),
            _ => (
                r.get("request").or(r.get("input")).unwrap_or(r),
                r.get("response")
                    .or(r.get("output"))
                    .unwrap_or(&Value::Null),
            ),
        };
        let mut input: Vec<Message> = match request.get("messages") {
            Some(m) => messages(m, "user"),
            None if request.is_array() => messages(request, "user"),
            None => messages(request, "user"),
        };
        let mut output = if response.is_null() {
            Vec::new()
        } else {
            messages(response, "assistant")
        };
        // A conversation alone: the assistant turns at its end are the answer.
        if output.is_empty() {
            while input.last().is_some_and(|m| m.role == "assistant") && input.len() > 1 {
                output.insert(0, input.pop().expect("non-empty"));
            }
        }
        if input.is_empty() && output.is_empty() {
            return Err(format!("record {}: no chat messages", i + 1));
        }
        let usage = response.get("usage").or(r.get("usage"));
        let u = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| int(usage.and_then(|x| x.get(*k))))
                .unwrap_or(0)
        };
        let id = text(r.get("trace_id"))
            .or_else(|| text(r.get("id")))
            .or_else(|| text(response.get("id")))
            .unwrap_or_else(|| format!("line-{}", i + 1));
        let at = time_ms(r.get("timestamp"))
            .or_else(|| time_ms(r.get("created_at")))
            .or_else(|| time_ms(response.get("created")));
        let span = Span {
            span_id: id.clone(),
            parent_id: None,
            name: "chat".into(),
            kind: "llm".into(),
            started_at: at,
            ended_at: at.map(|t| t + int(r.get("latency_ms")).unwrap_or(0)),
            model: text(response.get("model"))
                .or_else(|| text(request.get("model")))
                .or_else(|| text(r.get("model"))),
            provider: text(r.get("provider")).or_else(|| text(response.get("provider"))),
            input,
            output,
            input_tokens: u(&["prompt_tokens", "input_tokens"]),
            output_tokens: u(&["completion_tokens", "output_tokens"]),
            cost_usd: float(usage.and_then(|x| x.get("cost"))).or_else(|| float(r.get("cost_usd"))),
            tags: tags(r.get("tags")),
            error: None,
        };
        let t = set.trace(&id);
        t.tags.extend(span.tags.iter().cloned());
        t.spans.push(span);
    }
    Ok(set.finish())
}
