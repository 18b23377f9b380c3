//! `chat-json`: plain chat logs, one JSON record per line: a chat request and its
//! response (`{request: {model, messages}, response: {id, model, choices, usage}}`,
//! also `input`/`output`), or a conversation alone (`{messages: [...], model?}`
//! or a bare array of messages). Each record is one trace of one `llm` span; an
//! `id` or `trace_id` names it, else its line number. The postgres pull stores its
//! rows in this shape.

use super::common::{float, int, messages, records, tags, text, time_ms};
use crate::telemetry::model::{Message, Span, Trace, TraceSet};
use serde_json::Value;

/// Messages one record may hold: a trace with more is no conversation a person
/// reads, and the projection stays linear in what was uploaded.
const MAX_MESSAGES: usize = 100_000;

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
        if input.len() + output.len() > MAX_MESSAGES {
            return Err(format!(
                "record {}: more than {MAX_MESSAGES} messages",
                i + 1
            ));
        }
        // A conversation alone: the assistant turns at its end are the answer
        // (split off at once: one move, whatever their number).
        if output.is_empty() {
            let trailing = input
                .iter()
                .rev()
                .take_while(|m| m.role == "assistant")
                .count()
                .min(input.len().saturating_sub(1));
            output = input.split_off(input.len() - trailing);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// M6 of the 2026-12-01 security review: the assistant turns ending a
    /// conversation are taken as its answer in one move (they were moved to the
    /// front one at a time: quadratic in their number), and a record is bounded.
    #[test]
    fn trailing_assistant_turns_are_the_answer_in_order_and_records_are_bounded() {
        let mut msgs = vec![serde_json::json!({"role": "user", "content": "q"})];
        for i in 0..50_000 {
            msgs.push(serde_json::json!({"role": "assistant", "content": format!("a{i}")}));
        }
        let line = serde_json::to_vec(&serde_json::json!({"messages": msgs})).unwrap();
        let traces = parse(&line).unwrap();
        let span = &traces[0].spans[0];
        assert_eq!(span.input.len(), 1);
        assert_eq!(span.output.len(), 50_000);
        assert_eq!(span.output[0].content, "a0");
        assert_eq!(span.output[49_999].content, "a49999");
        // Only assistant turns: the first stays the input.
        let only = br#"{"messages": [{"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}]}"#;
        let t = parse(only).unwrap();
        assert_eq!(
            (t[0].spans[0].input.len(), t[0].spans[0].output.len()),
            (1, 1)
        );
        // Past the bound the record is refused by number.
        let many: Vec<_> = (0..MAX_MESSAGES + 1)
            .map(|_| serde_json::json!({"role": "user", "content": "x"}))
            .collect();
        let line = serde_json::to_vec(&serde_json::json!({"messages": many})).unwrap();
        let e = parse(&line).unwrap_err();
        assert!(e.contains("more than 100000 messages"), "{e}");
    }
}
