//! What the parsers share: reading an export (one JSON document or JSONL), times
//! in the spellings tools write them, messages in the shapes tools record them
//! (chat messages, content parts, LangChain's serialized messages, completions'
//! choices), and loose number reading.

use crate::telemetry::model::Message;
use serde_json::{Map, Value};

/// The top-level records of an export: a JSON array's items, the items under one of
/// `keys` of a JSON object (`data`, `events`, ...), the object itself, or one record
/// per JSONL line. Bad JSON is an error naming the line.
pub fn records(bytes: &[u8], keys: &[&str]) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    let mut stream = serde_json::Deserializer::from_slice(bytes).into_iter::<Value>();
    loop {
        let at = stream.byte_offset();
        match stream.next() {
            None => break,
            Some(Ok(v)) => out.push(v),
            Some(Err(e)) => {
                let line = bytes[..at.min(bytes.len())]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + e.line().max(1);
                return Err(format!("not JSON or JSONL (line {line}: {e})"));
            }
        }
    }
    if out.is_empty() {
        return Err("the file holds no JSON".into());
    }
    let mut flat = Vec::with_capacity(out.len());
    for v in out {
        unwrap_into(v, keys, &mut flat);
    }
    Ok(flat)
}

fn unwrap_into(v: Value, keys: &[&str], out: &mut Vec<Value>) {
    match v {
        Value::Array(items) => out.extend(items),
        Value::Object(mut m) => {
            for k in keys {
                if matches!(m.get(*k), Some(Value::Array(_))) {
                    if let Some(Value::Array(items)) = m.remove(*k) {
                        out.extend(items);
                        return;
                    }
                }
            }
            out.push(Value::Object(m));
        }
        other => out.push(other),
    }
}

/// A string member, or a number as its decimal text.
pub fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// An integer from a number or a numeric string.
pub fn int(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s
            .parse::<i64>()
            .ok()
            .or_else(|| s.parse::<f64>().ok().map(|f| f as i64)),
        _ => None,
    }
}

pub fn float(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A time in any spelling exports use, as Unix milliseconds: RFC 3339 (with or
/// without a zone; none means UTC), or a number whose size tells its unit
/// (seconds, milliseconds, microseconds, nanoseconds; OTLP writes nanoseconds as
/// a string).
pub fn time_ms(v: Option<&Value>) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_f64().map(number_ms),
        Value::String(s) if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') && !s.is_empty() => {
            s.parse::<f64>().ok().map(number_ms)
        }
        Value::String(s) => parse_rfc3339(s),
        _ => None,
    }
}

fn number_ms(n: f64) -> i64 {
    let a = n.abs();
    if a >= 1e17 {
        (n / 1e6) as i64
    } else if a >= 1e14 {
        (n / 1e3) as i64
    } else if a >= 1e11 {
        n as i64
    } else {
        (n * 1e3) as i64
    }
}

fn parse_rfc3339(s: &str) -> Option<i64> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_millis());
    }
    // `2024-05-01 10:00:00+00:00` and zone-less times (LangSmith, PostHog exports).
    let s2 = s.replacen(' ', "T", 1);
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(&s2) {
        return Some(t.timestamp_millis());
    }
    chrono::NaiveDateTime::parse_from_str(&s2, "%Y-%m-%dT%H:%M:%S%.f")
        .ok()
        .map(|t| t.and_utc().timestamp_millis())
}

/// A JSON-encoded string's value (attributes often carry JSON as text).
pub fn decoded(v: &Value) -> Value {
    if let Value::String(s) = v {
        let t = s.trim_start();
        if t.starts_with('{') || t.starts_with('[') {
            if let Ok(inner) = serde_json::from_str(s) {
                return inner;
            }
        }
    }
    v.clone()
}

/// The text of a content value: a string, content parts (`text`, `content`), or
/// anything else as compact JSON.
pub fn content_text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                let piece = match p {
                    Value::String(s) => s.clone(),
                    Value::Object(o) => o
                        .get("text")
                        .or_else(|| o.get("content"))
                        .map(content_text)
                        .unwrap_or_else(|| p.to_string()),
                    other => other.to_string(),
                };
                if !piece.is_empty() {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(&piece);
                }
            }
            out
        }
        Value::Object(o) => o
            .get("text")
            .or_else(|| o.get("content"))
            .map(content_text)
            .unwrap_or_else(|| v.to_string()),
        other => other.to_string(),
    }
}

/// A role in the common spelling (`human` → `user`, `ai` → `assistant`, ...).
pub fn role(r: &str) -> String {
    match r.to_ascii_lowercase().as_str() {
        "human" | "humanmessage" | "user" => "user",
        "ai" | "aimessage" | "assistant" | "model" | "aimessagechunk" => "assistant",
        "system" | "systemmessage" | "developer" => "system",
        "tool" | "toolmessage" | "function" | "functionmessage" => "tool",
        other => return other.to_string(),
    }
    .to_string()
}

fn one_message(m: &Map<String, Value>, default_role: &str) -> Option<Message> {
    // LangChain's serialized message: {lc, type: "constructor", id: [.., "HumanMessage"], kwargs}.
    if let Some(kwargs) = m.get("kwargs").and_then(Value::as_object) {
        let r = m
            .get("id")
            .and_then(Value::as_array)
            .and_then(|ids| ids.last())
            .and_then(Value::as_str)
            .or_else(|| kwargs.get("type").and_then(Value::as_str))
            .unwrap_or(default_role);
        return Some(Message {
            role: role(r),
            content: content_text(kwargs.get("content").unwrap_or(&Value::Null)),
        });
    }
    // LangChain's dict form: {type: "human", data: {content}}.
    if let (Some(t), Some(data)) = (
        m.get("type").and_then(Value::as_str),
        m.get("data").and_then(Value::as_object),
    ) {
        return Some(Message {
            role: role(t),
            content: content_text(data.get("content").unwrap_or(&Value::Null)),
        });
    }
    let r = m
        .get("role")
        .and_then(Value::as_str)
        .or_else(|| {
            m.get("type").and_then(Value::as_str).filter(|t| {
                matches!(
                    *t,
                    "human" | "ai" | "system" | "tool" | "user" | "assistant"
                )
            })
        })
        .unwrap_or(default_role);
    let content = if let Some(parts) = m.get("parts") {
        content_text(parts)
    } else if let Some(c) = m.get("content") {
        content_text(c)
    } else if let Some(t) = m.get("text") {
        content_text(t)
    } else if let Some(calls) = m.get("tool_calls") {
        calls.to_string()
    } else {
        return None;
    };
    Some(Message {
        role: role(r),
        content,
    })
}

/// The messages a recorded input or output holds, in the shapes tools record:
/// a list of chat messages (nested lists too, as LangChain batches them), an
/// object with `messages`, `choices` (a completion), `generations` (LangChain), a
/// `prompt` or `prompts`, a single message, or any other value as one message of
/// `default_role` with its JSON as content.
pub fn messages(v: &Value, default_role: &str) -> Vec<Message> {
    let v = decoded(v);
    let mut out = Vec::new();
    collect(&v, default_role, &mut out, 0);
    out
}

fn collect(v: &Value, default_role: &str, out: &mut Vec<Message>, depth: usize) {
    if depth > 6 {
        return;
    }
    match v {
        Value::Null => {}
        Value::String(s) => {
            if !s.is_empty() {
                out.push(Message {
                    role: default_role.into(),
                    content: s.clone(),
                })
            }
        }
        Value::Array(items) => {
            for i in items {
                match i {
                    Value::Object(m) => match one_message(m, default_role) {
                        Some(msg) if !m.contains_key("messages") && !m.contains_key("message") => {
                            out.push(msg)
                        }
                        _ => collect(i, default_role, out, depth + 1),
                    },
                    _ => collect(i, default_role, out, depth + 1),
                }
            }
        }
        Value::Object(m) => {
            for key in [
                "messages",
                "choices",
                "generations",
                "message",
                "prompts",
                "prompt",
            ] {
                if let Some(inner) = m.get(key) {
                    let before = out.len();
                    collect(&decoded(inner), default_role, out, depth + 1);
                    if out.len() > before {
                        return;
                    }
                }
            }
            if let Some(msg) = one_message(m, default_role) {
                out.push(msg);
                return;
            }
            for key in [
                "input",
                "output",
                "completion",
                "response",
                "result",
                "query",
                "question",
                "answer",
            ] {
                if let Some(inner) = m.get(key) {
                    let before = out.len();
                    collect(&decoded(inner), default_role, out, depth + 1);
                    if out.len() > before {
                        return;
                    }
                }
            }
            if !m.is_empty() {
                out.push(Message {
                    role: default_role.into(),
                    content: v.to_string(),
                });
            }
        }
        other => out.push(Message {
            role: default_role.into(),
            content: other.to_string(),
        }),
    }
}

/// Tags from a list of strings, or an object's keys `k:v`.
pub fn tags(v: Option<&Value>) -> Vec<String> {
    match v.map(decoded) {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|t| t.as_str().map(str::to_string))
            .collect(),
        Some(Value::String(s)) if !s.is_empty() => vec![s],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn times_in_every_spelling() {
        let want = 1_714_557_600_123;
        for v in [
            json!("2024-05-01T10:00:00.123Z"),
            json!("2024-05-01T12:00:00.123+02:00"),
            json!("2024-05-01T10:00:00.123"),
            json!("2024-05-01 10:00:00.123"),
            json!("1714557600123000000"),
            json!(1_714_557_600_123_000i64),
            json!(1_714_557_600_123i64),
            json!(1_714_557_600.123),
        ] {
            assert_eq!(time_ms(Some(&v)), Some(want), "{v}");
        }
    }

    #[test]
    fn messages_in_the_shapes_tools_record() {
        let lc = json!({"messages": [[{"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "HumanMessage"], "kwargs": {"content": "hi", "type": "human"}}]]});
        assert_eq!(
            messages(&lc, "user"),
            vec![Message {
                role: "user".into(),
                content: "hi".into()
            }]
        );
        let gens = json!({"generations": [[{"text": "yo", "message": {"lc": 1, "id": ["langchain", "schema", "messages", "AIMessage"], "kwargs": {"content": "yo"}}}]]});
        assert_eq!(messages(&gens, "assistant")[0].content, "yo");
        let choices = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}]});
        assert_eq!(
            messages(&choices, "assistant"),
            vec![Message {
                role: "assistant".into(),
                content: "a\nb".into()
            }]
        );
        let parts = json!([{"role": "user", "parts": [{"type": "text", "content": "q"}]}]);
        assert_eq!(messages(&parts, "user")[0].content, "q");
        assert_eq!(messages(&json!("plain"), "user")[0].content, "plain");
        assert_eq!(
            messages(&json!("[{\"role\":\"system\",\"content\":\"s\"}]"), "user")[0].role,
            "system"
        );
    }

    #[test]
    fn exports_are_json_or_jsonl() {
        assert_eq!(records(b"[1,2]", &[]).unwrap().len(), 2);
        assert_eq!(records(b"{\"data\":[1,2,3]}", &["data"]).unwrap().len(), 3);
        assert_eq!(records(b"{\"a\":1}\n{\"a\":2}\n", &[]).unwrap().len(), 2);
        let e = records(b"{\"a\":1}\n{\"a\":\n", &[]).unwrap_err();
        assert!(e.contains("line"), "{e}");
        assert!(records(b"  ", &[]).is_err());
    }
}
