//! Edits of a provider's JSON answer at the byte level: one member set (added, or
//! replacing every member of that name) in the object itself or in an object
//! nested under it, the rest of the bytes forwarded as they came.
//!
//! Every edit is right for any valid JSON a provider may send: any whitespace, any
//! key order, strings holding the looked-for bytes, escapes, repeated members,
//! deep nesting. Where the scan cannot be sure (an escaped key, nesting past its
//! depth, anything it does not read as serde does) the edit is made on a serde
//! `Value` instead, whose reading is the reference: the result parses, and equals
//! what a serde-based rewrite gives (a repeated member reads as its last
//! occurrence, as serde reads it).

use super::scan::Scan;
use serde_json::{Map, Value};
use std::ops::Range;

/// One top-level member: the bytes from its key's opening quote to the end of its
/// value, the value's own span, and its key (unescaped: the scan takes no other).
struct Member<'a> {
    span: Range<usize>,
    value: Range<usize>,
    key: &'a str,
}

/// An object's members and where its braces are, within `text`.
struct Object<'a> {
    open: usize,
    close: usize,
    members: Vec<Member<'a>>,
}

/// The members of the object that is the whole of `text` (whitespace around it
/// allowed); `None` when the scan declines or `text` is not an object.
fn object(text: &str) -> Option<Object<'_>> {
    let mut s = Scan::new(text);
    s.ws();
    let open = s.at;
    let base = text.as_ptr() as usize;
    let mut members = Vec::new();
    s.object(|s, key| {
        // The key is borrowed from `text`: its quote is the byte before it.
        let start = key.as_ptr() as usize - base - 1;
        s.ws();
        let from = s.at;
        s.skip_value(0)?;
        members.push(Member {
            span: start..s.at,
            value: from..s.at,
            key,
        });
        Some(())
    })?;
    let close = s.at - 1;
    s.end()?;
    Some(Object {
        open,
        close,
        members,
    })
}

/// `json` with `key` set to `value_json` as its last member, every other member of
/// that name removed. Text that is not a JSON object comes back unchanged.
pub fn set_member(json: &[u8], key: &str, value_json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() + key.len() + value_json.len() + 8);
    set_member_into(&mut out, json, key, value_json);
    out
}

/// [`set_member`] appending to `out`.
pub fn set_member_into(out: &mut Vec<u8>, json: &[u8], key: &str, value_json: &[u8]) {
    debug_assert!(key.bytes().all(|b| b != b'"' && b != b'\\' && b >= 0x20));
    // The common case: the name occurs nowhere, and without a backslash no key can
    // spell it with escapes. Then the member is appended and nothing else moves.
    if !contains_key(json, key) && memchr::memchr(b'\\', json).is_none() {
        if let Some(end) = json.iter().rposition(|&b| b == b'}') {
            let empty = json[..end]
                .iter()
                .rev()
                .find(|b| !b.is_ascii_whitespace())
                .is_some_and(|&b| b == b'{');
            out.extend_from_slice(&json[..end]);
            if !empty {
                out.push(b',');
            }
            push_member(out, key, value_json);
            out.extend_from_slice(&json[end..]);
            return;
        }
    }
    let Some(obj) = std::str::from_utf8(json).ok().and_then(object) else {
        match with_serde(json, |m| set_in(m, key, value_json)) {
            Some(v) => out.extend_from_slice(&v),
            None => out.extend_from_slice(json),
        }
        return;
    };
    if obj.members.iter().all(|m| m.key != key) {
        // Not there: appended before the closing brace, the rest as it came.
        out.extend_from_slice(&json[..obj.close]);
        if !obj.members.is_empty() {
            out.push(b',');
        }
        push_member(out, key, value_json);
        out.extend_from_slice(&json[obj.close..]);
        return;
    }
    out.extend_from_slice(&json[..=obj.open]);
    for m in obj.members.iter().filter(|m| m.key != key) {
        out.extend_from_slice(&json[m.span.clone()]);
        out.push(b',');
    }
    push_member(out, key, value_json);
    out.extend_from_slice(&json[obj.close..]);
}

/// `json` with `key` set inside the object found by following `path` from the top
/// (the last member of each name, as serde reads repeats); `None` when there is no
/// object at that path, or `json` is not JSON.
pub fn set_nested(json: &[u8], path: &[&str], key: &str, value_json: &[u8]) -> Option<Vec<u8>> {
    let located = std::str::from_utf8(json).ok().and_then(|t| locate(t, path));
    match located {
        Some(Some(at)) => {
            let mut out = Vec::with_capacity(json.len() + key.len() + value_json.len() + 8);
            out.extend_from_slice(&json[..at.start]);
            set_member_into(&mut out, &json[at.clone()], key, value_json);
            out.extend_from_slice(&json[at.end..]);
            Some(out)
        }
        Some(None) => None,
        None => {
            let mut found = false;
            let out = with_serde(json, |m| {
                let mut here = Some(m);
                for p in path {
                    here = here
                        .and_then(|m| m.get_mut(*p))
                        .and_then(Value::as_object_mut);
                }
                if let Some(m) = here {
                    found = true;
                    set_in(m, key, value_json);
                }
            })?;
            found.then_some(out)
        }
    }
}

/// Where the object at `path` is: `Some(None)` when the scan read the text and
/// found no object there; `None` when the scan declined somewhere on the way.
fn locate(text: &str, path: &[&str]) -> Option<Option<Range<usize>>> {
    let mut at = 0..text.len();
    for name in path {
        let obj = object(&text[at.clone()])?;
        let Some(m) = obj.members.iter().rev().find(|m| m.key == *name) else {
            return Some(None);
        };
        if text.as_bytes()[at.start + m.value.start] != b'{' {
            return Some(None);
        }
        at = at.start + m.value.start..at.start + m.value.end;
    }
    Some(Some(at))
}

/// Whether `"key"` occurs in `json` at all (as a key or anywhere else).
fn contains_key(json: &[u8], key: &str) -> bool {
    let mut from = 0;
    while let Some(i) = memchr::memmem::find(&json[from..], key.as_bytes()) {
        let at = from + i;
        if at > 0 && json[at - 1] == b'"' && json.get(at + key.len()) == Some(&b'"') {
            return true;
        }
        from = at + 1;
    }
    false
}

fn push_member(out: &mut Vec<u8>, key: &str, value_json: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    out.extend_from_slice(value_json);
}

fn set_in(m: &mut Map<String, Value>, key: &str, value_json: &[u8]) {
    // The value is ours (a number, a string, a receipt): always valid JSON.
    let v = serde_json::from_slice(value_json).unwrap_or(Value::Null);
    m.remove(key);
    m.insert(key.to_string(), v);
}

/// The edit made on serde's reading of `json`; `None` when it is not a JSON object.
fn with_serde(json: &[u8], edit: impl FnOnce(&mut Map<String, Value>)) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(json).ok()?;
    edit(v.as_object_mut()?);
    serde_json::to_vec(&v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: serde's reading with the member set, or `None` when serde
    /// cannot read the text as an object.
    fn reference(json: &str, path: &[&str], key: &str, value: &Value) -> Option<Option<Value>> {
        let mut v: Value = serde_json::from_str(json).ok()?;
        v.as_object()?;
        let mut here = Some(&mut v);
        for p in path {
            here = here.and_then(|v| v.get_mut(*p)).filter(|v| v.is_object());
        }
        let Some(m) = here else {
            return Some(None);
        };
        m[key] = value.clone();
        Some(Some(v))
    }

    fn edited(json: &str, path: &[&str], key: &str, value: &Value) -> Option<Value> {
        let v = serde_json::to_vec(value).unwrap();
        let out = if path.is_empty() {
            Some(set_member(json.as_bytes(), key, &v))
        } else {
            set_nested(json.as_bytes(), path, key, &v)
        }?;
        Some(serde_json::from_slice(&out).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&out));
        }))
    }

    #[test]
    fn a_number_past_u64_keeps_its_value_through_any_path() {
        // Found by the json_edit fuzz target: with a backslash in a key the edit
        // may go through serde, and serde's default float reading did not give
        // back the same number for the text it wrote (`float_roundtrip` now).
        let json = r#"{" \\ue":111742290702200011174229070}"#;
        let want = reference(json, &[], "provider", &Value::from("openai:m")).unwrap();
        assert_eq!(
            edited(json, &[], "provider", &Value::from("openai:m")),
            want
        );
    }

    #[test]
    fn pretty_and_compact_answers_get_their_cost() {
        let compact = r#"{"id":"x","usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
        let pretty = "{\n  \"id\": \"x\",\n  \"usage\": {\n    \"prompt_tokens\": 3\n  }\n}\n";
        for json in [compact, pretty] {
            let out = set_nested(json.as_bytes(), &["usage"], "cost", b"0.5").unwrap();
            let v: Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["usage"]["cost"], 0.5, "{json}");
            assert_eq!(v["usage"]["prompt_tokens"], 3);
        }
    }

    #[test]
    fn looked_for_bytes_inside_strings_are_not_members() {
        // The text of a message holds `"usage":{` and `"provider":`.
        let json = r#"{"choices":[{"message":{"content":"say \"usage\":{\"a\":1} and \"provider\":x"}}],"usage":{"prompt_tokens":1}}"#;
        let out = set_nested(json.as_bytes(), &["usage"], "cost", b"1").unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["choices"][0]["message"]["content"],
            "say \"usage\":{\"a\":1} and \"provider\":x"
        );
        assert_eq!(v["usage"]["cost"], 1);
        let out = set_member(json.as_bytes(), "provider", b"\"openai:m\"");
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["provider"], "openai:m");
        // No usage at the top: a nested one is not it.
        let nested_only = r#"{"choices":[{"usage":{"a":1}}]}"#;
        assert_eq!(
            set_nested(nested_only.as_bytes(), &["usage"], "cost", b"1"),
            None
        );
        assert_eq!(
            set_nested(br#"{"usage":null}"#, &["usage"], "cost", b"1"),
            None
        );
    }

    #[test]
    fn repeated_and_escaped_members_are_replaced_not_repeated() {
        let json = r#"{"provider":"Up","a":1,"provider":"Down"}"#;
        let out = set_member(json.as_bytes(), "provider", b"\"openai:m\"");
        assert_eq!(out, br#"{"a":1,"provider":"openai:m"}"#);
        // An escaped spelling of the name: serde's reading decides.
        let json = r#"{"provid\u0065r":"Up","usage":{"cost":9,"co\u0073t":8}}"#;
        let v: Value =
            serde_json::from_slice(&set_member(json.as_bytes(), "provider", b"1")).unwrap();
        assert_eq!(v["provider"], 1);
        let out = set_nested(json.as_bytes(), &["usage"], "cost", b"2").unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["usage"], serde_json::json!({"cost": 2}));
        // The upstream's own cost (OpenRouter sends one) is replaced by ours.
        let out = set_nested(br#"{"usage":{"cost":9,"x":1}}"#, &["usage"], "cost", b"2").unwrap();
        assert_eq!(out, br#"{"usage":{"x":1,"cost":2}}"#);
    }

    #[test]
    fn empty_objects_and_deep_nesting() {
        assert_eq!(set_member(b"{ }", "a", b"1"), b"{ \"a\":1}");
        assert_eq!(set_member(b" {} \n", "a", b"1"), b" {\"a\":1} \n");
        // Deeper than the scan goes, not deeper than serde: serde's reading edits it.
        let deep = format!(
            "{{\"x\":{}{},\"provider\":1}}",
            "[".repeat(110),
            "]".repeat(110)
        );
        let v: Value =
            serde_json::from_slice(&set_member(deep.as_bytes(), "provider", b"2")).unwrap();
        assert_eq!(v["provider"], 2);
        assert_eq!(set_member(b"not json", "a", b"1"), b"not json");
        assert_eq!(set_member(b"[1]", "a", b"1"), b"[1]");
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("\"usage\"".to_string()),
            Just("\"provider\"".to_string()),
            Just("\"cost\"".to_string()),
            Just("\"response\"".to_string()),
            Just("\"message\"".to_string()),
            Just("\"provid\\u0065r\"".to_string()),
            Just("\"us\\u0061ge\"".to_string()),
            Just("\"content\"".to_string()),
            "\"[a-z_]{1,6}\"",
        ]
    }

    /// Provider-like answers: objects with the interesting keys at any depth and
    /// order, repeated, escaped; strings that hold the looked-for bytes; compact,
    /// spaced or pretty.
    fn answer() -> impl Strategy<Value = String> {
        let value = super::super::scan::json_like(key().boxed());
        let member = (key(), value);
        (prop::collection::vec(member, 0..6), 0u8..3).prop_map(|(members, style)| {
            let sep = match style {
                0 => ",",
                1 => " , ",
                _ => ",\n  ",
            };
            let body: Vec<String> = members
                .into_iter()
                .map(|(k, v)| format!("{k}:{v}"))
                .collect();
            match style {
                2 => format!("{{\n  {}\n}}\n", body.join(sep)),
                _ => format!("{{{}}}", body.join(sep)),
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn edits_equal_the_serde_rewrite(
            json in answer(),
            path in prop_oneof![
                Just(vec![]),
                Just(vec!["usage"]),
                Just(vec!["response", "usage"]),
                Just(vec!["message"]),
            ],
            key in prop_oneof![Just("cost"), Just("provider"), Just("x_gateway")],
            value in prop_oneof![
                Just(serde_json::json!(0.000123)),
                Just(serde_json::json!("openai:gpt-4.1-mini")),
                Just(serde_json::json!({"attempts": "openai:ok", "overhead_us": 12})),
            ],
        ) {
            let Some(want) = reference(&json, &path, key, &value) else {
                return Ok(());
            };
            prop_assert_eq!(edited(&json, &path, key, &value), want, "{}", json);
        }

        #[test]
        fn broken_text_is_never_turned_into_something_else(
            json in answer(), cut in 0usize..400, byte in any::<u8>()
        ) {
            let mut b = json.into_bytes();
            if !b.is_empty() {
                let at = cut % b.len();
                b[at] = byte;
            }
            let v = serde_json::to_vec(&serde_json::json!(1.5)).unwrap();
            let out = set_member(&b, "provider", &v);
            let read = serde_json::from_slice::<Value>(&b);
            match read {
                Ok(Value::Object(_)) => {
                    let got: Value = serde_json::from_slice(&out).unwrap();
                    prop_assert_eq!(&got["provider"], &serde_json::json!(1.5));
                }
                // serde refuses a number out of its range that is still valid JSON
                // syntax (`1e400`, or a mutated digit turned exponent: `-1E117...`):
                // the scan may edit such a document.
                Err(e) if e.to_string().contains("number out of range") => {}
                // Not an object: left as it came, or still not JSON.
                _ => prop_assert!(out == b || serde_json::from_slice::<Value>(&out).is_err()),
            }
        }
    }
}
