//! The OpenAI chat-completions wire, spoken by the openai, azure, mistral,
//! openrouter, hosted and local rungs: request rendering (the rung's model id,
//! stream usage always on, gateway-owned fields removed) and inspection of answers
//! (is there content yet, a refusal, an in-band error, the usage).

use super::chat_scan::raw_text_len;
pub use super::chat_scan::Inspection;
use crate::ir::{
    DecodeError, Event, FinishReason, Part, RefusalReason, Request, ResponseFormat, Role,
    StreamDecoder, ToolChoice,
};
use crate::json::RawObject;
use crate::upstream::spliced::Spliced;
use crate::upstream::Rendered;
use crate::usage::Usage;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Fields the gateway owns and never forwards.
const GATEWAY_OWNED: [&str; 1] = ["prompt_cache_key"];

/// The body for an OpenAI-compatible rung.
pub fn render_request(body: &RawObject, provider_model_id: &str, stream: bool) -> Vec<u8> {
    render_spliced(body, provider_model_id, stream).flatten()
}

/// [`render_request`], with the client's long values borrowed rather than copied.
pub fn render_spliced<'a>(
    body: &RawObject<'a>,
    provider_model_id: &str,
    stream: bool,
) -> Spliced<'a> {
    let values = body.iter().map(|(_, v)| v.get());
    let mut out = Spliced::for_values(values, 256 + 16 * body.len());
    out.key("model");
    let _ = serde_json::to_writer(&mut out.bytes, provider_model_id);
    for (k, v) in body.iter() {
        match k {
            "model" => {}
            "stream_options" if stream => {}
            k if GATEWAY_OWNED.contains(&k) => {}
            _ => {
                out.key(k);
                out.put_value(v.get().as_bytes());
            }
        }
    }
    if stream {
        // Usage is always needed for billing; the chunk is stripped again when the
        // client did not ask for it.
        out.key("stream_options");
        out.bytes.extend_from_slice(br#"{"include_usage":true}"#);
    }
    out.bytes.push(b'}');
    out
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
    /// Aggregators serving Claude (OpenRouter) report its cache writes here.
    #[serde(default)]
    cache_write_tokens: Option<u64>,
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
            // OpenAI charges no cache writes and reports none.
            cache_write_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cache_write_tokens)
                .unwrap_or(0),
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
            cache_write_1h_tokens: 0,
            web_search_requests: 0,
            cost_micro_usd: None,
        }
    }
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(default)]
    tool_calls: Option<Vec<serde::de::IgnoredAny>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    message: Option<Message<'a>>,
    #[serde(borrow, default)]
    delta: Option<Message<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow, default)]
    choices: Vec<Choice<'a>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<&'a RawValue>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    created: Option<i64>,
}

fn text_len(content: Option<&RawValue>) -> usize {
    content.map_or(0, |raw| raw_text_len(raw.get()))
}

/// Reads a completion body or a chunk's data; `None` when it is not JSON of the
/// expected shape.
pub fn inspect(json: &[u8]) -> Option<Inspection<'_>> {
    // The common shape is read in one pass, its UTF-8 checked on the way (every
    // chunk of a stream comes here). Anything else goes to serde after one UTF-8
    // check of the whole text: read from a slice, serde_json would check every
    // string (keys included) on its own.
    super::chat_scan::inspect(json).or_else(|| inspect_serde(std::str::from_utf8(json).ok()?))
}

/// [`inspect`] by a serde parse: the reading the one-pass scan must agree with.
pub(super) fn inspect_serde(text: &str) -> Option<Inspection<'_>> {
    let a: Answer = serde_json::from_str(text).ok()?;
    let mut out = Inspection {
        usage: a.usage.as_ref().map(WireUsage::to_usage),
        error: a.error.map(|e| e.get().to_string()),
        usage_only: a.choices.is_empty() && a.usage.is_some(),
        id: a.id,
        model: a.model,
        created: a.created,
        ..Inspection::default()
    };
    for c in a.choices {
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
            out.finish_reason = c.finish_reason;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(s: &str) -> RawObject<'_> {
        RawObject::parse(s).unwrap()
    }

    #[test]
    fn forwarded_objects_keep_document_order_and_the_last_of_repeats() {
        let body = r#"{"b":1,"model":"x","a":2,"b":3}"#;
        assert_eq!(
            render_request(&obj(body), "m", false),
            br#"{"model":"m","a":2,"b":3}"#
        );
        // Past the small-object path, too.
        let many: Vec<String> = (0..40).map(|i| format!("\"k{}\":{i}", i % 20)).collect();
        let many = format!("{{{}}}", many.join(","));
        let o = obj(&many);
        assert_eq!(o.iter().count(), 20);
        assert_eq!(o.get("k3").map(|v| v.get()), Some("23"));
        assert_eq!(o.iter().next().map(|(k, _)| k), Some("k0"));
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
        // An aggregator serving Claude reports its cache writes in the details.
        let written = inspect(br#"{"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":2,"total_tokens":52,"prompt_tokens_details":{"cached_tokens":0,"cache_write_tokens":40}}}"#).unwrap();
        assert_eq!(written.usage.unwrap().cache_write_tokens, 40);
        let err = inspect(br#"{"error":{"message":"boom","type":"server_error"}}"#).unwrap();
        assert!(err.error.is_some());
        let refusal =
            inspect(br#"{"choices":[{"message":{"content":null,"refusal":"I can't"}}]}"#).unwrap();
        assert_eq!(refusal.refusal.as_deref(), Some("I can't"));
        assert!(!refusal.has_content);
        assert!(inspect(b"not json").is_none());
    }
}

// ---------------------------------------------------------------------------
// The canonical side: a client of another format on an OpenAI-wire rung.

/// Extras a chat rung understands (the rest are another maker's: dropped).
const CHAT_EXTRAS: [&str; 7] = [
    "metadata",
    "service_tier",
    "store",
    "logprobs",
    "top_logprobs",
    "verbosity",
    "safety_identifier",
];

/// A function tool in the chat format; a deferred one is marked so.
fn tool_json(t: &crate::ir::Tool, deferred: bool) -> serde_json::Value {
    use serde_json::{json, Value};
    let mut f = json!({"name": t.name,
        "parameters": serde_json::from_str::<Value>(t.parameters.get()).unwrap_or(json!({}))});
    if let Some(d) = &t.description {
        f["description"] = json!(d);
    }
    if let Some(s) = t.strict {
        f["strict"] = json!(s);
    }
    let mut tool = json!({"type": "function", "function": f});
    if deferred {
        tool["defer_loading"] = json!(true);
    }
    tool
}

/// The search options of a rung whose own search runs (OpenAI's search models):
/// a chat client's own object as it sent it, else one made from the request.
fn web_search_options(ws: &crate::ir::WebSearch) -> serde_json::Value {
    use serde_json::{json, Value};
    if let (Some(raw), crate::ir::SearchForm::ChatOptions) = (&ws.raw, ws.form) {
        if let Ok(v) = serde_json::from_str::<Value>(raw.get()) {
            return v;
        }
    }
    let mut o = json!({});
    if let Some(size) = &ws.context_size {
        o["search_context_size"] = json!(size);
    }
    o
}

fn part_json(p: &Part) -> Option<serde_json::Value> {
    use serde_json::json;
    match p {
        Part::Text { text } => Some(json!({"type": "text", "text": text})),
        Part::Image { url, detail } => {
            let mut img = json!({"url": url});
            if let Some(d) = detail {
                img["detail"] = json!(d);
            }
            Some(json!({"type": "image_url", "image_url": img}))
        }
        Part::Document { url, name } => Some(json!({"type": "file", "file": {
            "file_data": url,
            "filename": name.clone().unwrap_or_else(|| "document.pdf".into()),
        }})),
        _ => None,
    }
}

/// Text-only parts become a plain string (what every OpenAI-compatible server takes).
fn content_json(parts: &[Part]) -> serde_json::Value {
    let media = parts
        .iter()
        .any(|p| matches!(p, Part::Image { .. } | Part::Document { .. }));
    if !media {
        let text: Vec<&str> = parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        return serde_json::Value::from(text.join(""));
    }
    serde_json::Value::from(parts.iter().filter_map(part_json).collect::<Vec<_>>())
}

/// The body for an OpenAI-chat rung from the canonical form. `max_tokens` is sent
/// as `max_tokens` (every OpenAI-compatible server knows it; OpenAI maps it for
/// reasoning models too).
pub fn render(req: &Request, model_id: &str, stream: bool) -> Rendered {
    use serde_json::{json, Map, Value};
    let mut dropped = Vec::new();
    let mut messages = Vec::new();
    for s in &req.system {
        messages.push(json!({"role": "system", "content": s}));
    }
    let mut reasoning_dropped = false;
    for m in &req.messages {
        match m.role {
            Role::Assistant => {
                let text: Vec<&Part> = m
                    .parts
                    .iter()
                    .filter(|p| matches!(p, Part::Text { .. }))
                    .collect();
                let calls: Vec<Value> = m
                    .parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::ToolCall {
                            id,
                            name,
                            arguments,
                        } => Some(json!({
                            "id": id, "type": "function",
                            "function": {"name": name, "arguments": arguments},
                        })),
                        _ => None,
                    })
                    .collect();
                reasoning_dropped |= m
                    .parts
                    .iter()
                    .any(|p| matches!(p, Part::Thinking { .. } | Part::EncryptedReasoning { .. }));
                let content: String = text
                    .iter()
                    .filter_map(|p| match p {
                        Part::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                let mut msg = json!({"role": "assistant",
                    "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { Value::from(content) }});
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::from(calls);
                }
                messages.push(msg);
            }
            Role::Tool => {
                for p in &m.parts {
                    if let Part::ToolResult {
                        call_id, content, ..
                    } = p
                    {
                        messages.push(json!({"role": "tool", "tool_call_id": call_id,
                                             "content": content_json(content)}));
                    }
                }
            }
            Role::User | Role::System => {
                let role = if m.role == Role::System {
                    "system"
                } else {
                    "user"
                };
                // Tool results inside a user turn (a messages client) go first, as
                // tool turns.
                for p in &m.parts {
                    if let Part::ToolResult {
                        call_id, content, ..
                    } = p
                    {
                        messages.push(json!({"role": "tool", "tool_call_id": call_id,
                                             "content": content_json(content)}));
                    }
                }
                let rest: Vec<Part> = m
                    .parts
                    .iter()
                    .filter(|p| !matches!(p, Part::ToolResult { .. }))
                    .cloned()
                    .collect();
                if !rest.is_empty() {
                    messages.push(json!({"role": role, "content": content_json(&rest)}));
                }
            }
        }
    }
    if reasoning_dropped {
        dropped.push("reasoning".to_string());
    }
    let mut o = Map::new();
    o.insert("model".into(), json!(model_id));
    o.insert("messages".into(), Value::from(messages));
    if !req.tools.is_empty() || req.tool_search.is_some() {
        let mut tools: Vec<Value> = req.tools.iter().map(|t| tool_json(t, false)).collect();
        // A rung whose own tool search runs (OpenRouter's server tool) gets the
        // declaration and the deferred tools.
        if let Some(ts) = &req.tool_search {
            tools.extend(req.deferred.iter().map(|t| tool_json(t, true)));
            let mut decl = json!({"type": "openrouter:tool_search"});
            if let Some(n) = ts.max_results {
                decl["max_results"] = json!(n);
            }
            tools.push(decl);
        }
        o.insert("tools".into(), Value::from(tools));
    }
    if let Some(ws) = &req.web_search {
        o.insert("web_search_options".into(), web_search_options(ws));
    }
    if let Some(tc) = &req.tool_choice {
        o.insert(
            "tool_choice".into(),
            match tc {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::None => json!("none"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Tool { name } => {
                    json!({"type": "function", "function": {"name": name}})
                }
            },
        );
    }
    if let Some(p) = req.parallel_tool_calls {
        o.insert("parallel_tool_calls".into(), json!(p));
    }
    let put = |o: &mut Map<String, Value>, k: &str, v: Option<Value>| {
        if let Some(v) = v {
            o.insert(k.into(), v);
        }
    };
    put(&mut o, "max_tokens", req.max_tokens.map(Value::from));
    put(&mut o, "temperature", req.temperature.map(Value::from));
    put(&mut o, "top_p", req.top_p.map(Value::from));
    put(
        &mut o,
        "frequency_penalty",
        req.frequency_penalty.map(Value::from),
    );
    put(
        &mut o,
        "presence_penalty",
        req.presence_penalty.map(Value::from),
    );
    if !req.stop.is_empty() {
        o.insert("stop".into(), json!(req.stop));
    }
    if let Some(rf) = &req.response_format {
        o.insert(
            "response_format".into(),
            match rf {
                ResponseFormat::Text => json!({"type": "text"}),
                ResponseFormat::JsonObject => json!({"type": "json_object"}),
                ResponseFormat::JsonSchema { name, description, schema, strict } => {
                    let mut js = json!({"name": name,
                        "schema": serde_json::from_str::<Value>(schema.get()).unwrap_or(json!({}))});
                    if let Some(d) = description {
                        js["description"] = json!(d);
                    }
                    if let Some(s) = strict {
                        js["strict"] = json!(s);
                    }
                    json!({"type": "json_schema", "json_schema": js})
                }
            },
        );
    }
    if let Some(r) = &req.reasoning {
        match (&r.effort, r.budget_tokens) {
            (Some(e), _) => {
                o.insert("reasoning_effort".into(), json!(e));
            }
            (None, Some(b)) => {
                o.insert("reasoning_effort".into(), json!(effort_for_budget(b)));
            }
            _ => {}
        }
    }
    put(&mut o, "user", req.user.clone().map(Value::from));
    for e in &req.extras {
        if CHAT_EXTRAS.contains(&e.name.as_str()) {
            if let Ok(v) = serde_json::from_str::<Value>(e.value.get()) {
                o.insert(e.name.clone(), v);
            }
        } else if !e.name.starts_with("tools.") && e.name != "thinking" {
            dropped.push(e.name.clone());
        }
    }
    if stream {
        o.insert("stream".into(), json!(true));
        o.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Rendered {
        body: serde_json::to_vec(&Value::Object(o)).unwrap_or_default(),
        dropped,
    }
}

/// A thinking budget in OpenAI's effort terms.
fn effort_for_budget(budget: u64) -> &'static str {
    match budget {
        0..=2048 => "low",
        2049..=12_000 => "medium",
        _ => "high",
    }
}

fn finish_of(raw: &str) -> FinishReason {
    match raw {
        "length" => FinishReason::Length,
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "content_filter" => FinishReason::ContentFilter,
        _ => FinishReason::Stop,
    }
}

#[derive(Deserialize)]
struct WireCall {
    #[serde(default)]
    index: Option<u32>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFn>,
}

#[derive(Deserialize)]
struct WireFn {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

/// A `url_citation` annotation (OpenAI's search models; OpenRouter adds
/// `content`).
#[derive(Deserialize)]
struct WireAnnotation {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    url_citation: Option<WireUrlCitation>,
}

#[derive(Deserialize)]
struct WireUrlCitation {
    url: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    start_index: Option<u32>,
    #[serde(default)]
    end_index: Option<u32>,
}

/// Citation events for a message's (or delta's) annotations.
fn citations(list: &Option<Vec<WireAnnotation>>, out: &mut Vec<Event>) {
    for a in list.iter().flatten() {
        let (Some("url_citation"), Some(c)) = (a.kind.as_deref(), &a.url_citation) else {
            continue;
        };
        out.push(Event::Citation(Box::new(crate::ir::UrlCitation {
            url: c.url.clone(),
            title: c.title.clone().unwrap_or_default(),
            content: c.content.clone(),
            start_index: c.start_index.unwrap_or(0),
            end_index: c.end_index.unwrap_or(0),
        })));
    }
}

#[derive(Deserialize)]
struct WireMsg {
    #[serde(default)]
    annotations: Option<Vec<WireAnnotation>>,
    #[serde(default)]
    content: Option<serde_json::Value>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireCall>>,
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct WireChoice {
    #[serde(default)]
    message: Option<WireMsg>,
    #[serde(default)]
    delta: Option<WireMsg>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireAnswer {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

fn text_of(content: &Option<serde_json::Value>) -> String {
    match content {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(|t| t.as_str()))
            .collect(),
        _ => String::new(),
    }
}

fn error_message(e: &serde_json::Value) -> String {
    e.get("message")
        .and_then(|m| m.as_str())
        .unwrap_or("provider error")
        .to_string()
}

/// A whole chat completion as canonical events.
pub fn decode(body: &[u8]) -> Result<Vec<Event>, DecodeError> {
    let a: WireAnswer =
        serde_json::from_slice(body).map_err(|e| DecodeError(format!("chat completion: {e}")))?;
    let mut out = vec![Event::Start {
        id: a.id,
        model: a.model,
    }];
    if let Some(e) = &a.error {
        out.push(Event::Error {
            message: error_message(e),
        });
        return Ok(out);
    }
    if let Some(c) = a.choices.first() {
        if let Some(m) = &c.message {
            if let Some(r) = &m.refusal {
                out.push(Event::Refusal {
                    reason: RefusalReason::ContentPolicy,
                    text: Some(r.clone()),
                });
            }
            if let Some(t) = m.reasoning_content.as_ref().filter(|t| !t.is_empty()) {
                out.push(Event::Thinking { text: t.clone() });
            }
            let text = text_of(&m.content);
            if !text.is_empty() {
                out.push(Event::Text { text });
            }
            citations(&m.annotations, &mut out);
            for (i, call) in m.tool_calls.iter().flatten().enumerate() {
                let f = call.function.as_ref();
                out.push(Event::ToolCallStart {
                    index: i as u32,
                    id: call.id.clone().unwrap_or_else(|| format!("call_{i}")),
                    name: f.and_then(|f| f.name.clone()).unwrap_or_default(),
                });
                out.push(Event::ToolCallArgs {
                    index: i as u32,
                    arguments: f.and_then(|f| f.arguments.clone()).unwrap_or_default(),
                });
            }
        }
        if let Some(f) = &c.finish_reason {
            out.push(Event::Finish {
                reason: finish_of(f),
                raw: Some(f.clone()),
                // Chat does not say which stop matched.
                stop_sequence: None,
            });
        }
    }
    if let Some(u) = &a.usage {
        out.push(Event::Usage(u.to_usage()));
    }
    Ok(out)
}

/// The chat chunk stream as canonical events.
#[derive(Default)]
pub struct Decoder {
    started: bool,
    done: bool,
    /// Tool-call stream indexes already started.
    calls: Vec<u32>,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }
}

impl StreamDecoder for Decoder {
    fn frame(
        &mut self,
        _name: Option<&str>,
        data: &[u8],
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError> {
        if data == b"[DONE]" {
            self.done = true;
            return Ok(());
        }
        let a: WireAnswer =
            serde_json::from_slice(data).map_err(|e| DecodeError(format!("chat chunk: {e}")))?;
        if let Some(e) = &a.error {
            out.push(Event::Error {
                message: error_message(e),
            });
            return Ok(());
        }
        // The answer's id and model come from its first chunk that names them:
        // Azure's first chunk carries only the prompt's filter results, with an
        // empty id and model and no choices.
        let named = a.model.as_deref().is_some_and(|m| !m.is_empty());
        if !self.started && (named || !a.choices.is_empty() || a.usage.is_some()) {
            self.started = true;
            out.push(Event::Start {
                id: a.id.clone().filter(|i| !i.is_empty()),
                model: a.model.clone().filter(|m| !m.is_empty()),
            });
        }
        for c in &a.choices {
            if let Some(d) = &c.delta {
                if let Some(r) = d.refusal.as_ref().filter(|r| !r.is_empty()) {
                    out.push(Event::Refusal {
                        reason: RefusalReason::ContentPolicy,
                        text: Some(r.clone()),
                    });
                }
                if let Some(t) = d.reasoning_content.as_ref().filter(|t| !t.is_empty()) {
                    out.push(Event::Thinking { text: t.clone() });
                }
                let text = text_of(&d.content);
                if !text.is_empty() {
                    out.push(Event::Text { text });
                }
                citations(&d.annotations, out);
                for (n, call) in d.tool_calls.iter().flatten().enumerate() {
                    let index = call.index.unwrap_or(n as u32);
                    let f = call.function.as_ref();
                    if !self.calls.contains(&index) {
                        self.calls.push(index);
                        out.push(Event::ToolCallStart {
                            index,
                            id: call.id.clone().unwrap_or_else(|| format!("call_{index}")),
                            name: f.and_then(|f| f.name.clone()).unwrap_or_default(),
                        });
                    }
                    if let Some(args) = f
                        .and_then(|f| f.arguments.clone())
                        .filter(|a| !a.is_empty())
                    {
                        out.push(Event::ToolCallArgs {
                            index,
                            arguments: args,
                        });
                    }
                }
            }
            if let Some(f) = &c.finish_reason {
                out.push(Event::Finish {
                    reason: finish_of(f),
                    raw: Some(f.clone()),
                    // Chat does not say which stop matched.
                    stop_sequence: None,
                });
            }
        }
        if let Some(u) = &a.usage {
            out.push(Event::Usage(u.to_usage()));
        }
        Ok(())
    }

    fn done(&self) -> bool {
        self.done
    }
}

/// Whether an error answer is a policy refusal (see [`policy_reason`]); only
/// client errors are: a 5xx is the provider failing.
pub fn refusal(status: u16, body: &[u8]) -> Option<RefusalReason> {
    if !(400..500).contains(&status) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let e = v.get("error")?;
    // Azure puts the filter's verdict in `innererror.code` as well.
    let code = |o: &serde_json::Value| o.get("code")?.as_str().and_then(policy_reason);
    code(e).or_else(|| e.get("innererror").and_then(code))
}

/// The refusal reason an error code stands for, if it is a policy refusal:
/// `cyber_policy` (cybersecurity safety checks), `bio_policy` (biology and other
/// CBRN checks), `invalid_prompt` (a prompt "flagged as potentially violating our
/// usage policy"), the content-policy codes of image input and OpenAI's image
/// models, and Azure OpenAI's `content_filter` / `ResponsibleAIPolicyViolation`.
pub(crate) fn policy_reason(code: &str) -> Option<RefusalReason> {
    match code {
        "cyber_policy" => Some(RefusalReason::CyberPolicy),
        "bio_policy" => Some(RefusalReason::Cbrn),
        "invalid_prompt"
        | "content_policy_violation"
        | "image_content_policy_violation"
        | "content_filter"
        | "ResponsibleAIPolicyViolation" => Some(RefusalReason::ContentPolicy),
        _ => None,
    }
}

/// The one-pass scan held to the serde reading.
#[cfg(test)]
mod scan_tests {
    /// The one-pass reading of a text.
    fn inspect(text: &str) -> Option<super::Inspection<'_>> {
        super::super::chat_scan::inspect(text.as_bytes())
    }
    use super::inspect_serde;
    use proptest::prelude::*;

    const ANSWER: &str = r#"{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"message":{"annotations":[],"content":"Hello from mock.","refusal":null,"role":"assistant"}}],"created":1795466564,"id":"chatcmpl-1","model":"m-2025","object":"chat.completion","usage":{"completion_tokens":64,"completion_tokens_details":{"reasoning_tokens":3},"prompt_tokens":23,"prompt_tokens_details":{"audio_tokens":0,"cached_tokens":5},"total_tokens":87}}"#;

    /// The scan either declines or agrees with serde.
    fn agrees(text: &str) -> bool {
        match inspect(text) {
            None => true,
            Some(fast) => inspect_serde(text) == Some(fast),
        }
    }

    #[test]
    fn the_common_shapes_are_read_in_one_pass_as_serde_reads_them() {
        for text in [
            ANSWER,
            r#"{"choices":[{"index":0,"delta":{"content":"Hel"}}]}"#,
            r#"{"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"t","function":{"name":"f","arguments":""}}]}}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":null}}"#,
            r#"{"error":{"message":"boom \"quoted\" \u00e9","type":"server_error"}}"#,
            r#"{"choices":[{"message":{"content":null,"refusal":"I can\u2019t"}}]}"#,
            r#"{"choices":[{"message":{"content":"a\nb\ud83d\ude00"},"delta":{"content":"zz"}}]}"#,
            r#"{"choices":[{"message":null,"delta":{"content":[{"type":"text","text":"hi"}]}}]}"#,
            " {\"id\" : \"x\" , \"choices\" : [ ] , \"created\" : -5 } \n",
        ] {
            let fast = inspect(text).unwrap_or_else(|| panic!("declined {text}"));
            assert_eq!(Some(fast), inspect_serde(text), "{text}");
        }
    }

    #[test]
    fn anything_unusual_or_broken_is_left_to_serde() {
        for text in [
            r#"{"choices":[],"choices":[]}"#,     // serde refuses repeats
            r#"{"ch\u006fices":[]}"#,             // escaped key
            r#"{"choices":null}"#,                // not an array
            r#"{"usage":{"prompt_tokens":1.5}}"#, // not an integer
            r#"{"usage":{"prompt_tokens":-1}}"#,
            r#"{"created":1e3}"#,
            r#"{"id":"\ud800"}"#,  // lone surrogate
            r#"{"id":"a\x"}"#,     // bad escape
            "{\"id\":\"a\u{1}\"}", // control character
            r#"{"id":"x"} x"#,     // trailing text
            r#"{"id":"x",}"#,
            r#"{"n":01}"#,
            r#"{"n":-}"#,
            r#"{"n":1.}"#,
            r#"{"n":tru}"#,
            r#"[1]"#,
            "",
        ] {
            assert_eq!(inspect(text), None, "{text}");
        }
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(inspect(&deep), None);
    }

    fn value() -> impl Strategy<Value = String> {
        crate::json::scan::json_like(key().boxed())
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("\"choices\"".to_string()),
            Just("\"message\"".to_string()),
            Just("\"delta\"".to_string()),
            Just("\"content\"".to_string()),
            Just("\"tool_calls\"".to_string()),
            Just("\"refusal\"".to_string()),
            Just("\"finish_reason\"".to_string()),
            Just("\"usage\"".to_string()),
            Just("\"prompt_tokens\"".to_string()),
            Just("\"completion_tokens\"".to_string()),
            Just("\"prompt_tokens_details\"".to_string()),
            Just("\"cached_tokens\"".to_string()),
            Just("\"cache_write_tokens\"".to_string()),
            Just("\"error\"".to_string()),
            Just("\"id\"".to_string()),
            Just("\"model\"".to_string()),
            Just("\"created\"".to_string()),
            "\"[a-z_]{1,6}\"",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn the_scan_never_disagrees_with_serde(v in value()) {
            prop_assert!(agrees(&v), "{}", v);
        }

        #[test]
        fn well_formed_answers_take_the_one_pass_reading(
            content in proptest::option::of("[a-z\\\\\"\n\u{e9}\u{1F600} ]{0,20}"),
            finish in proptest::option::of("[a-z_]{1,8}"),
            refusal in proptest::option::of("[a-z ]{0,8}"),
            tools in 0usize..3,
            usage in proptest::option::of((any::<u32>(), any::<u32>(), proptest::option::of(any::<u32>()), proptest::option::of(any::<u32>()))),
            stream in any::<bool>(),
            created in any::<i64>(),
        ) {
            let mut m = serde_json::json!({"role": "assistant", "content": content, "refusal": refusal});
            if tools > 0 {
                m["tool_calls"] = serde_json::json!(vec![serde_json::json!({"id": "t", "function": {"name": "f"}}); tools]);
            }
            let mut a = serde_json::json!({
                "id": "chatcmpl-x", "created": created, "model": "m",
                "choices": [{"index": 0, "finish_reason": finish, "logprobs": null}],
            });
            a["choices"][0][if stream { "delta" } else { "message" }] = m;
            if let Some((p, c, cached, written)) = usage {
                a["usage"] = serde_json::json!({"prompt_tokens": p, "completion_tokens": c,
                    "prompt_tokens_details": {"cached_tokens": cached}, "total_tokens": 0});
                if let Some(w) = written {
                    a["usage"]["prompt_tokens_details"]["cache_write_tokens"] = w.into();
                }
            }
            let text = if created % 2 == 0 { serde_json::to_string_pretty(&a) } else { serde_json::to_string(&a) }.unwrap();
            let fast = inspect(&text);
            prop_assert!(fast.is_some(), "{}", text);
            prop_assert_eq!(fast, inspect_serde(&text), "{}", text);
        }

        #[test]
        fn broken_answers_are_never_read_differently(cut in 0usize..400, byte in any::<u8>()) {
            let mut b = ANSWER.as_bytes().to_vec();
            let at = cut % b.len();
            b[at] = byte;
            if let Ok(text) = std::str::from_utf8(&b) {
                prop_assert!(agrees(text), "{}", text);
            } else {
                // Bytes that are not UTF-8 are no answer, in the one pass too.
                prop_assert!(super::super::chat_scan::inspect(&b).is_none());
                prop_assert!(super::inspect(&b).is_none());
            }
            prop_assert!(agrees(&ANSWER[..at]));
        }
    }
}
