//! The OpenAI chat-completions wire, spoken by the openai, azure, mistral,
//! openrouter, hosted and local rungs: request rendering (the rung's model id,
//! stream usage always on, gateway-owned fields removed) and inspection of answers
//! (is there content yet, a refusal, an in-band error, the usage).

use crate::usage::Usage;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::BTreeMap;

/// A JSON object whose values stay unparsed: forwarded fields are never
/// re-serialized from a parsed form.
pub type RawObject = BTreeMap<String, Box<RawValue>>;

/// Fields the gateway owns and never forwards.
const GATEWAY_OWNED: [&str; 1] = ["prompt_cache_key"];

/// The body for an OpenAI-compatible rung.
pub fn render_request(body: &RawObject, provider_model_id: &str, stream: bool) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(256 + body.values().map(|v| v.get().len() + 16).sum::<usize>());
    out.push(b'{');
    let mut first = true;
    let mut put = |out: &mut Vec<u8>, k: &str, v: &[u8]| {
        if !first {
            out.push(b',');
        }
        first = false;
        // Keys came from a JSON document: serializing a str cannot fail.
        out.extend_from_slice(&serde_json::to_vec(k).unwrap_or_default());
        out.push(b':');
        out.extend_from_slice(v);
    };
    let model = serde_json::to_vec(provider_model_id).unwrap_or_default();
    put(&mut out, "model", &model);
    for (k, v) in body {
        match k.as_str() {
            "model" => {}
            "stream_options" if stream => {}
            k if GATEWAY_OWNED.contains(&k) => {}
            _ => put(&mut out, k, v.get().as_bytes()),
        }
    }
    if stream {
        // Usage is always needed for billing; the chunk is stripped again when the
        // client did not ask for it.
        put(&mut out, "stream_options", br#"{"include_usage":true}"#);
    }
    out.push(b'}');
    out
}

/// Whether the client's own `stream_options.include_usage` is true.
pub fn client_wants_stream_usage(body: &RawObject) -> bool {
    #[derive(Deserialize)]
    struct Opts {
        #[serde(default)]
        include_usage: bool,
    }
    body.get("stream_options")
        .and_then(|v| serde_json::from_str::<Opts>(v.get()).ok())
        .is_some_and(|o| o.include_usage)
}

#[derive(Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<CachedDetails>,
    #[serde(default)]
    completion_tokens_details: Option<ReasoningDetails>,
}

#[derive(Deserialize, Default)]
struct CachedDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
struct ReasoningDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    fn to_usage(&self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens,
            cached_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            output_tokens: self.completion_tokens,
            reasoning_tokens: self
                .completion_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(default)]
    tool_calls: Option<Vec<serde::de::IgnoredAny>>,
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    message: Option<Message<'a>>,
    #[serde(borrow, default)]
    delta: Option<Message<'a>>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow, default)]
    choices: Vec<Choice<'a>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<&'a RawValue>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    created: Option<i64>,
}

/// What one answer (a whole completion, or one stream chunk) carries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inspection {
    /// A non-empty text or tool-call delta: the commit point.
    pub has_content: bool,
    /// Characters of text content (for estimating a cut stream's output).
    pub content_chars: usize,
    pub refusal: Option<String>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// An in-band error object (`{"error": …}`).
    pub error: Option<String>,
    /// A chunk with `choices: []` that only carries usage.
    pub usage_only: bool,
    pub id: Option<String>,
    pub model: Option<String>,
    pub created: Option<i64>,
}

fn text_len(content: Option<&RawValue>) -> usize {
    let Some(raw) = content else { return 0 };
    let text = raw.get();
    if text.starts_with('"') {
        // The common case: a plain string, read without building a Value.
        return serde_json::from_str::<std::borrow::Cow<str>>(text).map_or(0, |s| s.len());
    }
    // Content parts: count the text parts.
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
            .map(str::len)
            .sum(),
        _ => 0,
    }
}

/// Reads a completion body or a chunk's data; `None` when it is not JSON of the
/// expected shape.
pub fn inspect(json: &[u8]) -> Option<Inspection> {
    let a: Answer = serde_json::from_slice(json).ok()?;
    let mut out = Inspection {
        usage: a.usage.as_ref().map(WireUsage::to_usage),
        error: a.error.map(|e| e.get().to_string()),
        usage_only: a.choices.is_empty() && a.usage.is_some(),
        id: a.id,
        model: a.model,
        created: a.created,
        ..Inspection::default()
    };
    for c in &a.choices {
        if let Some(m) = c.message.as_ref().or(c.delta.as_ref()) {
            let chars = text_len(m.content);
            out.content_chars += chars;
            let tools = m.tool_calls.as_ref().is_some_and(|t| !t.is_empty());
            if chars > 0 || tools {
                out.has_content = true;
            }
            if let Some(r) = m.refusal.as_ref().filter(|r| !r.is_empty()) {
                out.refusal.get_or_insert_with(String::new).push_str(r);
            }
        }
        if c.finish_reason.is_some() {
            out.finish_reason.clone_from(&c.finish_reason);
        }
    }
    Some(out)
}

/// The first byte of a member's value, found by scanning (no parse): `"` for a
/// string, `{` for an object, `n` for null. `None` when the key does not occur.
fn member_value_start(json: &[u8], key: &memchr::memmem::Finder<'_>) -> Option<u8> {
    let mut from = 0;
    while let Some(i) = key.find(&json[from..]) {
        let mut j = from + i + key.needle().len();
        while json.get(j).is_some_and(u8::is_ascii_whitespace) {
            j += 1;
        }
        if json.get(j) == Some(&b':') {
            j += 1;
            while json.get(j).is_some_and(u8::is_ascii_whitespace) {
                j += 1;
            }
            return json.get(j).copied();
        }
        from = from + i + 1;
    }
    None
}

/// Finders for the member names the quick scan looks for, built once.
struct Keys {
    finish_reason: memchr::memmem::Finder<'static>,
    usage: memchr::memmem::Finder<'static>,
    error: memchr::memmem::Finder<'static>,
    content: memchr::memmem::Finder<'static>,
}

static KEYS: std::sync::LazyLock<Keys> = std::sync::LazyLock::new(|| Keys {
    finish_reason: memchr::memmem::Finder::new(br#""finish_reason""#),
    usage: memchr::memmem::Finder::new(br#""usage""#),
    error: memchr::memmem::Finder::new(br#""error""#),
    content: memchr::memmem::Finder::new(br#""content""#),
});

/// The cheap reading of a committed stream chunk: when it carries no finish, no
/// usage and no error, only its text length matters, and that is found by a scan.
/// `None` means the chunk needs a full [`inspect`].
pub fn quick_content_len(json: &[u8]) -> Option<usize> {
    let k = &*KEYS;
    if member_value_start(json, &k.finish_reason).is_some_and(|b| b != b'n')
        || member_value_start(json, &k.usage).is_some_and(|b| b != b'n')
        || member_value_start(json, &k.error).is_some_and(|b| b != b'n')
    {
        return None;
    }
    match member_value_start(json, &k.content) {
        Some(b'"') => {
            let start = k.content.find(json)?;
            let rest = &json[start + 9..];
            let open = memchr::memchr(b'"', rest)? + 1;
            let mut escaped = false;
            let mut len = 0;
            for &b in &rest[open..] {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                    continue;
                } else if b == b'"' {
                    return Some(len);
                }
                len += 1;
            }
            None
        }
        Some(b'n') | None => Some(0),
        // Content parts or anything unusual: read it properly.
        Some(_) => None,
    }
}

/// Adds `"key": <json value>` as the last member of a JSON object (so it wins over a
/// same-named member an upstream sent), without parsing the object.
pub fn splice_member(object: &[u8], key: &str, value_json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(object.len() + key.len() + value_json.len() + 6);
    splice_member_into(&mut out, object, key, value_json);
    out
}

/// [`splice_member`] appending to `out`.
pub fn splice_member_into(out: &mut Vec<u8>, object: &[u8], key: &str, value_json: &[u8]) {
    let start = out.len();
    out.extend_from_slice(object);
    append_member(out, start, key, value_json);
}

/// [`splice_member`] on the object that ends `buf` (from `start`), in place: only the
/// closing brace and what follows it move.
pub fn append_member(buf: &mut Vec<u8>, start: usize, key: &str, value_json: &[u8]) {
    let Some(end) = buf[start..]
        .iter()
        .rposition(|&b| b == b'}')
        .map(|e| start + e)
    else {
        return;
    };
    let tail = buf.split_off(end);
    let empty = buf[start..]
        .iter()
        .rev()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'{');
    if !empty {
        buf.push(b',');
    }
    buf.push(b'"');
    buf.extend_from_slice(key.as_bytes());
    buf.extend_from_slice(b"\":");
    buf.extend_from_slice(value_json);
    buf.extend_from_slice(&tail);
}

/// The usage object in the chat format.
pub fn usage_json(u: &Usage) -> serde_json::Value {
    serde_json::json!({
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.total(),
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(s: &str) -> RawObject {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn request_gets_the_rung_model_and_stream_usage() {
        let body = obj(
            r#"{"model":"alpha-1.0","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":false},"prompt_cache_key":"k"}"#,
        );
        let out: serde_json::Value =
            serde_json::from_slice(&render_request(&body, "alpha-a", true)).unwrap();
        assert_eq!(out["model"], "alpha-a");
        assert_eq!(out["stream_options"]["include_usage"], true);
        assert!(out.get("prompt_cache_key").is_none());
        assert_eq!(out["messages"][0]["content"], "hi");
        assert!(!client_wants_stream_usage(&body));
        let plain = render_request(&obj(r#"{"model":"x","messages":[]}"#), "y", false);
        assert_eq!(plain, br#"{"model":"y","messages":[]}"#);
    }

    #[test]
    fn content_is_text_or_tool_calls() {
        let role = inspect(
            br#"{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        )
        .unwrap();
        assert!(!role.has_content);
        let text = inspect(br#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#).unwrap();
        assert!(text.has_content);
        assert_eq!(text.content_chars, 3);
        let tool = inspect(br#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":""}}]}}]}"#).unwrap();
        assert!(tool.has_content);
        let fin = inspect(br#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#).unwrap();
        assert_eq!(
            (fin.has_content, fin.finish_reason.as_deref()),
            (false, Some("stop"))
        );
        let usage = inspect(br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":1}}}"#).unwrap();
        assert!(usage.usage_only);
        assert_eq!(usage.usage.unwrap().cached_tokens, 1);
        let err = inspect(br#"{"error":{"message":"boom","type":"server_error"}}"#).unwrap();
        assert!(err.error.is_some());
        let refusal =
            inspect(br#"{"choices":[{"message":{"content":null,"refusal":"I can't"}}]}"#).unwrap();
        assert_eq!(refusal.refusal.as_deref(), Some("I can't"));
        assert!(!refusal.has_content);
        assert!(inspect(b"not json").is_none());
    }

    #[test]
    fn quick_scan_defers_to_inspect_when_it_matters() {
        assert_eq!(quick_content_len(br#"{"choices":[{"delta":{"content":"Hel\"lo"},"finish_reason":null}],"usage":null}"#), Some(6));
        assert_eq!(
            quick_content_len(br#"{"choices":[{"delta":{"role":"assistant"}}]}"#),
            Some(0)
        );
        assert_eq!(
            quick_content_len(br#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#),
            None
        );
        assert_eq!(
            quick_content_len(br#"{"choices":[],"usage":{"prompt_tokens":1}}"#),
            None
        );
        assert_eq!(quick_content_len(br#"{"error": {"message":"x"}}"#), None);
        assert_eq!(
            quick_content_len(br#"{"choices":[{"delta":{"content":[{"type":"text"}]}}]}"#),
            None
        );
    }

    #[test]
    fn splice_wins_over_an_upstream_member() {
        let out = splice_member(
            br#"{"id":"x","provider":"Up"}"#,
            "provider",
            br#""openai:m""#,
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["provider"], "openai:m");
        assert_eq!(splice_member(b"{ }", "a", b"1"), b"{ \"a\":1}");
    }
}
