//! The interface each generation format (OpenAI chat, OpenAI responses,
//! Anthropic messages, Gemini) implements, and the per-request facts shared
//! between them.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use serde_json::Value;

use crate::{sse::Frames, step::Content};

/// What the mock needs to know from a generation request body.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub(crate) model: Option<String>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) has_tools: bool,
    /// The status and body the real provider gives this request (an unsupported
    /// value, an item it cannot find).
    pub(crate) rejection: Option<(u16, Value)>,
    /// What a responses request asks of its answer (responses wire only).
    pub(crate) asks: Asks,
}

/// What a responses request asks of its answer: a reasoning summary
/// (`reasoning.summary`; the answer then opens with a reasoning item, as a
/// reasoning model's does), the encrypted reasoning
/// (`include: ["reasoning.encrypted_content"]`), and the request members a
/// Response object repeats (`echo`: instructions, tools, sampling...), as OpenAI's
/// do.
#[derive(Clone, Debug, Default)]
pub(crate) struct Asks {
    pub(crate) summary: bool,
    pub(crate) encrypted: bool,
    pub(crate) echo: serde_json::Map<String, Value>,
}

/// The reasoning efforts OpenAI's reasoning models take.
pub(crate) const EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// OpenAI's 400 for an effort its model does not take, naming the field and the
/// supported set, as the real API words it.
pub(crate) fn effort_rejection(param: &str, effort: Option<&str>) -> Option<(u16, Value)> {
    let e = effort?;
    if EFFORTS.contains(&e) {
        return None;
    }
    Some((
        400,
        serde_json::json!({"error": {
            "message": format!(
                "Unsupported value: '{param}' does not support '{e}' with this model. Supported values are: 'none', 'minimal', 'low', 'medium', 'high', 'xhigh', and 'max'."
            ),
            "type": "invalid_request_error",
            "param": param,
            "code": "unsupported_value",
        }}),
    ))
}

/// Facts about the request an answer is built for.
pub(crate) struct Ctx<'a> {
    /// Model as requested (body `model`, Gemini path model, Azure deployment).
    pub(crate) model: &'a str,
    pub(crate) prompt_tokens: u64,
    pub(crate) include_usage: bool,
    /// The request marks a prompt-cache breakpoint (Anthropic `cache_control`,
    /// Bedrock `cachePoint`): the makers that bill writes report half the prompt
    /// written to the cache.
    pub(crate) cache_write: bool,
    pub(crate) asks: Asks,
}

impl Ctx<'_> {
    /// Prompt tokens written to the cache, and the rest.
    pub(crate) fn cache_split(&self) -> (u64, u64) {
        let written = if self.cache_write {
            self.prompt_tokens / 2
        } else {
            0
        };
        (written, self.prompt_tokens - written)
    }
}

/// True when a request body carries a prompt-cache breakpoint. Searched with
/// `memmem`: a byte-by-byte window compare took 55% of the mock's CPU on the load
/// bench's 100 KB body, and its run-to-run swing showed as the gateway's latency.
pub(crate) fn marks_cache(body: &[u8]) -> bool {
    contains(body, b"\"cache_control\"") || contains(body, b"\"cachePoint\"")
}

/// True when `needle` occurs in `body`.
fn contains(body: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(body, needle).is_some()
}

/// One provider's generation wire format.
pub(crate) trait Wire: Send + Sync + 'static {
    /// Reads the request body; `Err` is a message for a 400.
    fn parse(&self, body: &[u8]) -> Result<Parsed, String>;
    /// Non-streaming answer body.
    fn reply(&self, ctx: &Ctx<'_>, content: &Content) -> Value;
    /// Streaming answer frames.
    fn frames(&self, ctx: &Ctx<'_>, content: &Content) -> Frames;
    /// The in-band error sent instead of content by [`crate::Step::ErrorEvent`].
    fn error_event(&self) -> Bytes;
    /// Error body in the format's envelope.
    fn error_body(&self, status: u16, message: &str) -> Value;
    /// Content type of a streamed answer.
    fn stream_content_type(&self) -> &'static str {
        "text/event-stream; charset=utf-8"
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A process-wide counter for response ids.
pub(crate) fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Token estimate for `len` bytes of text: ceil(len / 4), at least 1.
pub(crate) fn estimate_tokens(len: usize) -> u64 {
    (len.div_ceil(4) as u64).max(1)
}

/// True for non-empty arrays: `"tools": []` counts as no tools.
pub(crate) fn non_empty(list: &Option<Vec<serde::de::IgnoredAny>>) -> bool {
    list.as_ref().is_some_and(|l| !l.is_empty())
}

/// Canned message for a scripted error status.
pub(crate) fn scripted_message(status: u16) -> String {
    format!("sluice-mock: scripted error (status {status})")
}

/// The names of the tools a generation request declares, in any wire's shape:
/// chat `tools[].function.name`, responses and messages `tools[].name`, Gemini
/// `tools[].functionDeclarations[].name`, Bedrock `toolConfig.tools[].toolSpec.name`.
pub(crate) fn declared_tools(body: &[u8]) -> Vec<String> {
    // Every shape names its list `"tools"`: a body without that key has none,
    // and is not parsed a second time.
    if !contains(body, b"\"tools\"") {
        return Vec::new();
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut push = |n: Option<&Value>| {
        if let Some(n) = n.and_then(Value::as_str) {
            out.push(n.to_owned());
        }
    };
    let tools = v
        .get("tools")
        .or_else(|| v.get("toolConfig").and_then(|t| t.get("tools")));
    for t in tools.and_then(Value::as_array).into_iter().flatten() {
        push(t.get("function").and_then(|f| f.get("name")));
        push(t.get("name"));
        push(t.get("toolSpec").and_then(|s| s.get("name")));
        for d in t
            .get("functionDeclarations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            push(d.get("name"));
        }
    }
    out
}
