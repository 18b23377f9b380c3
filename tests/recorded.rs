//! The gateway on recordings of the real provider APIs (tests/recordings, each kept
//! byte-exact with the client library's test cassette or fixture it comes from):
//! the mock provider replays a recording as the provider sent it, once whole and
//! once in 5-byte writes, to every client format the recording's route serves, and
//! what the client reads is held to what the recording says. The shapes are the
//! ones the documentation leaves out: padded Anthropic events and `ping`s,
//! thinking signatures and redacted thinking, tool-call arguments split at any
//! byte, `obfuscation` members, moderation results after the usage chunk, Azure's
//! content-filter results in a chunk without choices, Gemini's CRLF framing and
//! grounding in its last chunk.
//!
//! Each test also reads the ledger: the answer is billed on the provider's counts,
//! not marked as an estimate.

mod harness;

use harness::{recorded_body, Answer, Backend, Opts, Provider, Sluice};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

/// The routes the recordings are replayed on, one per wire: Claude, OpenAI (chat
/// for chat clients, responses for responses clients), Azure OpenAI (chat for
/// every client) and Gemini with Google Search: (slug, maker, provider, the
/// provider's model id, the rung's caps).
const ROUTES: [(&str, &str, &str, &str, &str); 4] = [
    (
        "rec-claude",
        "anthropic",
        "anthropic",
        "c1",
        r#""sampling", "tools", "thinking", "reasoning""#,
    ),
    (
        "rec-gpt",
        "openai",
        "openai",
        "o1",
        r#""sampling", "tools""#,
    ),
    (
        "rec-azure",
        "openai",
        "azure",
        "az1",
        r#""sampling", "tools""#,
    ),
    (
        "rec-gemini",
        "google",
        "google",
        "g1",
        r#""sampling", "tools", "reasoning", "web_search""#,
    ),
];

/// The catalog of [`ROUTES`]: one price and one context for all of them.
fn routes_catalog() -> String {
    ROUTES
        .iter()
        .map(|(slug, maker, provider, id, caps)| {
            format!(
                r#"
[[model]]
slug = "{slug}"
display_name = "{slug}"
kind = "chat"
owned_by = "{maker}"
context_window = 200000
max_input_tokens = 200000
modalities = ["text"]
supported_params = ["temperature", "max_tokens", "tools"]
price = {{ input = 1000000, cached_input = 100000, output = 5000000, cache_write_input = 1250000 }}
category = "general"
max_output_tokens = 8192

[[model.rung]]
provider = "{provider}"
provider_model_id = "{id}"
zdr = true
caps = [{caps}]
"#
            )
        })
        .collect()
}

/// The size of each write when a recording arrives in small pieces: it splits
/// lines, frames, JSON strings and multi-byte characters.
const PIECE: usize = 5;

/// A gateway over the mock with the recordings' catalog, and a key.
struct Rec {
    mock: Mock,
    s: Sluice,
    key: String,
    /// Answers served so far: the ledger holds this many once each is billed.
    served: Cell<usize>,
    _b: Backend,
    _dir: tempfile::TempDir,
}

/// One client call answered from a recording, whole and in pieces, and the two
/// ledger entries.
struct Replayed {
    whole: Answer,
    pieces: Answer,
    billed: [Value; 2],
}

impl Rec {
    async fn start() -> Rec {
        use Provider::*;
        let dir = tempfile::tempdir().unwrap();
        let catalog = dir.path().join("catalog.toml");
        std::fs::write(&catalog, routes_catalog()).unwrap();
        let mock = Mock::start().await;
        let b = Backend::fresh().await;
        let opts = Opts::default()
            .catalog(catalog.display())
            .providers(&mock.base_url(), &[OpenAi, Anthropic, Google, Azure]);
        let s = Sluice::start(&b, opts).await;
        let (_, _, key) = s.org_and_key().await;
        Rec {
            mock,
            s,
            key,
            served: Cell::new(0),
            _b: b,
            _dir: dir,
        }
    }

    /// The client call `body` on `path`, answered by upstream model `model_id` with
    /// `recording`: once whole, once in [`PIECE`]-byte writes.
    async fn replay(&self, model_id: &str, recording: &str, path: &str, body: &Value) -> Replayed {
        let recorded = recorded_body(recording);
        let before = self.mock.count(model_id);
        self.mock.script(
            model_id,
            vec![Step::Reply {
                status: 200,
                body: recorded.clone(),
                retry_after: None,
            }],
        );
        let whole = self.s.call(&self.key, path, body).await;
        self.mock.script(
            model_id,
            vec![Step::ReplyInPieces {
                status: 200,
                body: recorded,
                piece: PIECE,
            }],
        );
        let pieces = self.s.call(&self.key, path, body).await;
        for (a, how) in [(&whole, "whole"), (&pieces, "in pieces")] {
            assert_eq!(a.status, 200, "{recording} {how} on {path}: {:?}", a.json);
            assert!(
                a.header("content-type").starts_with("text/event-stream"),
                "{recording} {how} on {path}: {}",
                a.header("content-type")
            );
        }
        assert_eq!(
            self.mock.count(model_id),
            before + 2,
            "{recording}: one upstream call per client call"
        );
        let n = self.served.get() + 2;
        self.served.set(n);
        let events = self.s.usage_events(&self.key, n).await;
        assert!(events.len() >= n, "{n} answers billed: {events:?}");
        Replayed {
            whole,
            pieces,
            billed: [events[1].clone(), events[0].clone()],
        }
    }
}

impl Replayed {
    /// What the client saw, read by `view`: the same whole and in pieces.
    fn view(&self, view: fn(&Answer) -> Value) -> Value {
        let whole = view(&self.whole);
        let pieces = view(&self.pieces);
        assert_eq!(
            pieces, whole,
            "the recording in {PIECE}-byte pieces reads differently"
        );
        whole
    }

    /// Both ledger entries bill the provider's counts: `input` and `output`
    /// tokens (`reasoning` of them), at a cost, not estimated, not incomplete.
    #[track_caller]
    fn billed(&self, input: i64, output: i64, reasoning: i64) {
        for e in &self.billed {
            assert_eq!(e["status"], 200, "{e}");
            assert_eq!(e["input_tokens"], input, "{e}");
            assert_eq!(e["output_tokens"], output, "{e}");
            assert_eq!(e["reasoning_tokens"], reasoning, "{e}");
            assert_eq!(e["estimated"], false, "{e}");
            assert_eq!(e["incomplete"], false, "{e}");
            assert!(e["cost_usd"].as_f64().unwrap() > 0.0, "{e}");
        }
    }
}

// ---------------------------------------------------------------------------
// The recordings as their APIs sent them

/// A recording's frames: event name (if any) and data JSON, `[DONE]` left out.
fn recorded(name: &str) -> Vec<(Option<String>, Value)> {
    let body = recorded_body(name).replace("\r\n", "\n");
    body.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .filter_map(|f| {
            let event = f
                .lines()
                .find_map(|l| l.strip_prefix("event:"))
                .map(|e| e.trim().to_string());
            let data: Vec<&str> = f
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            let data = data.join("\n");
            (data != "[DONE]").then(|| (event, serde_json::from_str(&data).unwrap()))
        })
        .collect()
}

/// An Anthropic recording's thinking, signatures, redacted thinking and text.
struct Claude {
    thinking: String,
    signature: String,
    redacted: Vec<String>,
    text: String,
}

fn claude(name: &str) -> Claude {
    let mut c = Claude {
        thinking: String::new(),
        signature: String::new(),
        redacted: Vec::new(),
        text: String::new(),
    };
    for (_, d) in recorded(name) {
        let delta = &d["delta"];
        match (d["type"].as_str(), delta["type"].as_str()) {
            (Some("content_block_delta"), Some("thinking_delta")) => {
                c.thinking.push_str(delta["thinking"].as_str().unwrap())
            }
            (Some("content_block_delta"), Some("signature_delta")) => {
                c.signature.push_str(delta["signature"].as_str().unwrap())
            }
            (Some("content_block_delta"), Some("text_delta")) => {
                c.text.push_str(delta["text"].as_str().unwrap())
            }
            (Some("content_block_start"), _)
                if d["content_block"]["type"] == "redacted_thinking" =>
            {
                c.redacted
                    .push(d["content_block"]["data"].as_str().unwrap().to_string())
            }
            _ => {}
        }
    }
    c
}

/// An OpenAI chat recording's text and tool calls (index to id, name, arguments).
fn openai_chat(name: &str) -> (String, BTreeMap<u64, (String, String, String)>) {
    let mut text = String::new();
    let mut calls: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
    for (_, c) in recorded(name) {
        for ch in c["choices"].as_array().unwrap() {
            let delta = &ch["delta"];
            if let Some(t) = delta["content"].as_str() {
                text.push_str(t);
            }
            for tc in delta["tool_calls"].as_array().into_iter().flatten() {
                let call = calls.entry(tc["index"].as_u64().unwrap()).or_default();
                if let Some(id) = tc["id"].as_str() {
                    call.0 = id.to_string();
                }
                if let Some(n) = tc["function"]["name"].as_str() {
                    call.1 = n.to_string();
                }
                call.2
                    .push_str(tc["function"]["arguments"].as_str().unwrap_or_default());
            }
        }
    }
    (text, calls)
}

// ---------------------------------------------------------------------------
// What a client reads

/// Every frame's data as JSON: a frame a client cannot parse fails the test.
/// `[DONE]` is left out; `done` says whether it ended the stream.
fn frames(a: &Answer) -> (Vec<(Option<String>, Value)>, bool) {
    let mut out = Vec::new();
    let mut done = false;
    for (name, d) in &a.frames {
        assert!(!done, "a frame after [DONE]: {d}");
        if d == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value =
            serde_json::from_str(d).unwrap_or_else(|e| panic!("a client cannot read {d:?}: {e}"));
        out.push((name.clone(), v));
    }
    (out, done)
}

/// A chat stream as a client assembles it: text, reasoning, tool calls by index,
/// finish reason, the usage chunk, annotations.
fn chat_view(a: &Answer) -> Value {
    let (chunks, done) = frames(a);
    assert!(done, "a chat stream ends with [DONE]");
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls: BTreeMap<u64, Value> = BTreeMap::new();
    let mut finish = Value::Null;
    let mut usage = Value::Null;
    let mut annotations = Vec::new();
    for (_, c) in &chunks {
        if c["usage"].is_object() {
            assert!(usage.is_null(), "a second usage chunk: {c}");
            usage = c["usage"].clone();
        }
        for ch in c["choices"].as_array().unwrap() {
            let delta = &ch["delta"];
            if let Some(t) = delta["content"].as_str() {
                text.push_str(t);
            }
            if let Some(t) = delta["reasoning_content"].as_str() {
                reasoning.push_str(t);
            }
            for tc in delta["tool_calls"].as_array().into_iter().flatten() {
                let i = tc["index"]
                    .as_u64()
                    .expect("a tool call delta has its index");
                let call = calls
                    .entry(i)
                    .or_insert_with(|| json!({"id": null, "name": null, "arguments": ""}));
                if let Some(id) = tc["id"].as_str() {
                    call["id"] = id.into();
                }
                if let Some(n) = tc["function"]["name"].as_str() {
                    call["name"] = n.into();
                }
                if let Some(args) = tc["function"]["arguments"].as_str() {
                    let all = format!("{}{args}", call["arguments"].as_str().unwrap());
                    call["arguments"] = all.into();
                }
            }
            annotations.extend(
                delta["annotations"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .cloned(),
            );
            if !ch["finish_reason"].is_null() {
                finish = ch["finish_reason"].clone();
            }
        }
    }
    json!({"text": text, "reasoning": reasoning, "tool_calls": calls.into_values().collect::<Vec<_>>(),
           "finish_reason": finish, "usage": usage, "annotations": annotations})
}

/// A messages stream as a client assembles it: each content block (its start with
/// its deltas applied), stop reason, usage. Every delta falls inside its open
/// block, and every block is stopped before the message.
fn messages_view(a: &Answer) -> Value {
    let (events, _) = frames(a);
    let mut blocks: Vec<Value> = Vec::new();
    let mut open = BTreeSet::new();
    let mut stop_reason = Value::Null;
    let mut input = Value::Null;
    let mut output = Value::Null;
    let mut stopped = false;
    for (name, d) in &events {
        let kind = d["type"].as_str().unwrap_or_default();
        assert_eq!(name.as_deref(), Some(kind), "an event named by its type");
        assert!(!stopped, "an event after message_stop: {d}");
        let index = d["index"].as_u64().unwrap_or_default();
        match kind {
            "message_start" => input = d["message"]["usage"]["input_tokens"].clone(),
            "content_block_start" => {
                assert_eq!(index as usize, blocks.len(), "blocks start in order: {d}");
                blocks.push(d["content_block"].clone());
                open.insert(index);
            }
            "content_block_delta" => {
                assert!(open.contains(&index), "a delta outside its block: {d}");
                let b = &mut blocks[index as usize];
                let delta = &d["delta"];
                let field = match delta["type"].as_str().unwrap_or_default() {
                    "text_delta" => "text",
                    "thinking_delta" => "thinking",
                    "signature_delta" => "signature",
                    "input_json_delta" => "partial_json",
                    "citations_delta" => {
                        let mut cites = b["citations"].as_array().cloned().unwrap_or_default();
                        cites.push(delta["citation"].clone());
                        b["citations"] = cites.into();
                        continue;
                    }
                    other => panic!("a delta of type {other}: {d}"),
                };
                // The piece is in the member of its name; partial_json's too.
                let piece = delta[field].as_str().unwrap();
                let all = format!("{}{piece}", b[field].as_str().unwrap_or_default());
                b[field] = all.into();
            }
            "content_block_stop" => assert!(open.remove(&index), "a stop of no open block: {d}"),
            "message_delta" => {
                stop_reason = d["delta"]["stop_reason"].clone();
                output = d["usage"]["output_tokens"].clone();
            }
            "message_stop" => {
                assert!(open.is_empty(), "blocks {open:?} never stopped");
                stopped = true;
            }
            "ping" => {}
            other => panic!("a messages event {other}: {d}"),
        }
    }
    assert!(stopped, "the message stops");
    json!({"blocks": blocks, "stop_reason": stop_reason, "input_tokens": input, "output_tokens": output})
}

/// `v` without its `id` members (ids the gateway mints differ per answer).
fn without_ids(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| k.as_str() != "id" && k.as_str() != "item_id")
                .map(|(k, v)| (k.clone(), without_ids(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_ids).collect()),
        other => other.clone(),
    }
}

/// A responses stream as a client assembles it: text deltas, function-call
/// argument deltas and dones by output index, the items as done, the annotations
/// announced, the final response's status, output and usage. Each event is named
/// by its type, and its sequence number follows the one before.
fn responses_view(a: &Answer) -> Value {
    let (events, _) = frames(a);
    let mut text = String::new();
    let mut args: BTreeMap<u64, String> = BTreeMap::new();
    let mut args_done: BTreeMap<u64, Value> = BTreeMap::new();
    let mut items = Vec::new();
    let mut annotations = Vec::new();
    let mut last_seq: Option<u64> = None;
    for (name, d) in &events {
        let kind = d["type"].as_str().unwrap_or_default();
        assert_eq!(name.as_deref(), Some(kind), "an event named by its type");
        if let Some(seq) = d["sequence_number"].as_u64() {
            assert!(
                last_seq.is_none_or(|l| seq > l),
                "sequence {seq} after {last_seq:?}"
            );
            last_seq = Some(seq);
        }
        let at = d["output_index"].as_u64().unwrap_or_default();
        match kind {
            "response.output_text.delta" => text.push_str(d["delta"].as_str().unwrap()),
            "response.function_call_arguments.delta" => {
                args.entry(at)
                    .or_default()
                    .push_str(d["delta"].as_str().unwrap());
            }
            "response.function_call_arguments.done" => {
                args_done.insert(at, d["arguments"].clone());
            }
            "response.output_item.done" => items.push(without_ids(&d["item"])),
            "response.output_text.annotation.added" => {
                annotations.push(d["annotation"].clone());
            }
            _ => {}
        }
    }
    let (_, last) = events.last().expect("events");
    let response = &last["response"];
    json!({"text": text, "arguments": args, "arguments_done": args_done, "items": items,
           "annotations": annotations, "end": last["type"], "status": response["status"],
           "output": without_ids(&response["output"]), "usage": response["usage"]})
}

/// All the text of a responses item or output: output text and reasoning summaries.
fn shown_text(v: &Value) -> String {
    let mut out = String::new();
    for it in v.as_array().into_iter().flatten() {
        for part in it["content"]
            .as_array()
            .into_iter()
            .chain(it["summary"].as_array())
            .flatten()
        {
            out.push_str(part["text"].as_str().unwrap_or_default());
        }
    }
    out
}

/// The index of the first event `pred` holds for.
fn position(a: &Answer, what: &str, pred: impl Fn(&str, &Value) -> bool) -> usize {
    frames(a)
        .0
        .iter()
        .position(|(n, d)| pred(n.as_deref().unwrap_or_default(), d))
        .unwrap_or_else(|| panic!("no {what}"))
}

fn chat(model: &str, extra: Value) -> Value {
    let mut b = json!({"model": model, "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Hello"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn responses(model: &str, extra: Value) -> Value {
    let mut b = json!({"model": model, "stream": true, "input": "Hello"});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn messages(model: &str, extra: Value) -> Value {
    let mut b = json!({"model": model, "stream": true, "max_tokens": 4096,
        "messages": [{"role": "user", "content": "Hello"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

// ---------------------------------------------------------------------------
// Anthropic: thinking, signatures, redacted thinking, padded events, pings

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_claude_thinking_signature_reaches_messages_clients_and_rides_responses_items() {
    let e = Rec::start().await;
    let rec = "pydantic-ai/anthropic-thinking.sse";
    let want = claude(rec);
    assert!(!want.thinking.is_empty() && !want.signature.is_empty() && !want.text.is_empty());

    // A messages client that asked for thinking gets the block, signed.
    let thinking = json!({"thinking": {"type": "enabled", "budget_tokens": 1024}});
    let r = e
        .replay("c1", rec, "/v1/messages", &messages("rec-claude", thinking))
        .await;
    let v = r.view(messages_view);
    let blocks = v["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 2, "{v}");
    assert_eq!(blocks[0]["type"], "thinking", "{v}");
    assert_eq!(blocks[0]["thinking"], want.thinking.as_str());
    assert_eq!(blocks[0]["signature"], want.signature.as_str());
    assert_eq!(blocks[1]["type"], "text", "{v}");
    assert_eq!(blocks[1]["text"], want.text.as_str());
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(
        (&v["input_tokens"], &v["output_tokens"]),
        (&json!(43), &json!(282))
    );
    r.billed(43, 282, 0);

    // A chat client: the thinking as reasoning_content, never the signature.
    let r = e
        .replay(
            "c1",
            rec,
            "/v1/chat/completions",
            &chat("rec-claude", json!({"reasoning_effort": "low"})),
        )
        .await;
    let v = r.view(chat_view);
    assert_eq!(v["text"], want.text.as_str(), "{v}");
    assert_eq!(v["reasoning"], want.thinking.as_str(), "{v}");
    assert_eq!(v["finish_reason"], "stop");
    assert_eq!(
        (
            &v["usage"]["prompt_tokens"],
            &v["usage"]["completion_tokens"]
        ),
        (&json!(43), &json!(282))
    );
    for a in [&r.whole, &r.pieces] {
        assert!(
            a.frames.iter().all(|(_, d)| !d.contains(&want.signature)),
            "the signature reached a chat client"
        );
    }
    r.billed(43, 282, 0);

    // A responses client (that did not ask for encrypted reasoning): the thinking
    // as a reasoning summary, the text as the message, the signature nowhere.
    let r = e
        .replay(
            "c1",
            rec,
            "/v1/responses",
            &responses(
                "rec-claude",
                json!({"reasoning": {"effort": "low", "summary": "auto"}}),
            ),
        )
        .await;
    let v = r.view(responses_view);
    assert_eq!(v["text"], want.text.as_str(), "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    let output = v["output"].as_array().unwrap();
    let kinds: Vec<&str> = output.iter().map(|o| o["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["reasoning", "message"], "{v}");
    assert_eq!(shown_text(&json!([output[0]])), want.thinking, "{v}");
    assert_eq!(shown_text(&json!([output[1]])), want.text, "{v}");
    for a in [&r.whole, &r.pieces] {
        assert!(
            a.frames.iter().all(|(_, d)| !d.contains(&want.signature)),
            "the signature reached a responses client"
        );
    }
    assert_eq!(
        (&v["usage"]["input_tokens"], &v["usage"]["output_tokens"]),
        (&json!(43), &json!(282))
    );
    r.billed(43, 282, 0);

    // One that asked for encrypted reasoning gets the signature as the reasoning
    // item's encrypted content, the client's to send back, never shown.
    let asks = json!({"reasoning": {"effort": "low", "summary": "auto"}, "store": false,
        "include": ["reasoning.encrypted_content"]});
    let r = e
        .replay(
            "c1",
            rec,
            "/v1/responses",
            &responses("rec-claude", asks.clone()),
        )
        .await;
    let v = r.view(responses_view);
    let output = v["output"].as_array().unwrap().clone();
    assert_eq!(output[0]["type"], "reasoning", "{v}");
    assert_eq!(
        output[0]["encrypted_content"],
        format!("sluice:signed:{}", want.signature),
        "{v}"
    );
    assert_eq!(shown_text(&json!([output[1]])), want.text, "{v}");
    r.billed(43, 282, 0);

    // Its next turn, the items sent back as the SDKs do: Claude gets its thinking
    // block as it came, signed, with thinking on; an OpenAI rung gets neither.
    let mut next = responses("rec-claude", asks);
    next["input"] = json!([
        {"type": "message", "role": "user", "content": "Hello"},
        output[0], output[1],
        {"type": "message", "role": "user", "content": "And once more?"},
    ]);
    e.replay("c1", rec, "/v1/responses", &next).await;
    let sent = e.mock.requests_for("c1").last().unwrap().json().unwrap();
    assert_eq!(
        sent["messages"][1]["content"][0],
        json!({"type": "thinking", "thinking": want.thinking, "signature": want.signature}),
        "{sent}"
    );
    assert!(sent["thinking"]["budget_tokens"].is_u64(), "{sent}");
    let rec_gpt = "pydantic-ai/openai-responses-function-call.sse";
    next["model"] = json!("rec-gpt");
    next.as_object_mut().unwrap().remove("reasoning");
    let r = e.replay("o1", rec_gpt, "/v1/responses", &next).await;
    let sent = e.mock.requests_for("o1").last().unwrap().json().unwrap();
    let kinds: Vec<&str> = sent["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap_or("message"))
        .collect();
    assert_eq!(kinds, ["message", "message", "message"], "{sent}");
    assert_eq!(
        r.whole.header("x-gateway-replay-repair"),
        "encrypted_reasoning_stripped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_claude_redacted_thinking_stays_opaque_in_every_format() {
    let e = Rec::start().await;
    let rec = "pydantic-ai/anthropic-redacted-thinking.sse";
    let want = claude(rec);
    assert_eq!(want.redacted.len(), 2);
    assert!(want.thinking.is_empty());

    // Messages: both redacted blocks as Anthropic sent them, then the text.
    let thinking = json!({"thinking": {"type": "enabled", "budget_tokens": 1024}});
    let r = e
        .replay("c1", rec, "/v1/messages", &messages("rec-claude", thinking))
        .await;
    let v = r.view(messages_view);
    let blocks = v["blocks"].as_array().unwrap();
    let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["redacted_thinking", "redacted_thinking", "text"],
        "{v}"
    );
    assert_eq!(blocks[0]["data"], want.redacted[0].as_str());
    assert_eq!(blocks[1]["data"], want.redacted[1].as_str());
    assert_eq!(blocks[2]["text"], want.text.as_str());
    assert_eq!(v["stop_reason"], "end_turn");
    r.billed(92, 189, 0);

    // Chat: the text; the opaque data is neither content nor reasoning.
    let r = e
        .replay(
            "c1",
            rec,
            "/v1/chat/completions",
            &chat("rec-claude", json!({"reasoning_effort": "low"})),
        )
        .await;
    let v = r.view(chat_view);
    assert_eq!(v["text"], want.text.as_str(), "{v}");
    assert_eq!(v["reasoning"], "", "{v}");
    assert_eq!(v["finish_reason"], "stop");
    r.billed(92, 189, 0);

    // Responses: the text, and the data nowhere for a client that did not ask for
    // encrypted reasoning...
    let r = e
        .replay(
            "c1",
            rec,
            "/v1/responses",
            &responses("rec-claude", json!({"reasoning": {"effort": "low"}})),
        )
        .await;
    let v = r.view(responses_view);
    assert_eq!(v["text"], want.text.as_str(), "{v}");
    assert_eq!(shown_text(&v["output"]), want.text, "{v}");
    for a in [&r.whole, &r.pieces] {
        for data in &want.redacted {
            assert!(
                a.frames.iter().all(|(_, d)| !d.contains(data.as_str())),
                "redacted thinking reached a client that did not ask for it"
            );
        }
    }
    r.billed(92, 189, 0);
    // ...and only as a reasoning item's encrypted content (the client's to send
    // back, never shown as text) for one that did.
    let asks = json!({"reasoning": {"effort": "low"}, "store": false,
        "include": ["reasoning.encrypted_content"]});
    let r = e
        .replay("c1", rec, "/v1/responses", &responses("rec-claude", asks))
        .await;
    let v = r.view(responses_view);
    let output = &v["output"];
    assert_eq!(shown_text(output), want.text, "{v}");
    for data in &want.redacted {
        let carried = output.as_array().unwrap().iter().any(|o| {
            o["type"] == "reasoning"
                && o["encrypted_content"]
                    .as_str()
                    .is_some_and(|c| c.ends_with(data.as_str()))
        });
        assert!(
            carried,
            "redacted thinking {data} is kept for the next turn: {v}"
        );
    }
    r.billed(92, 189, 0);
}

// ---------------------------------------------------------------------------
// OpenAI chat: tool-call arguments split across chunks

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_parallel_tool_calls_split_across_chunks_arrive_whole_in_every_format() {
    let e = Rec::start().await;
    let rec = "openai-python/chat-parallel-tool-calls.sse";
    let (_, want) = openai_chat(rec);
    assert_eq!(want.len(), 2);
    let weather = json!({"type": "object", "properties": {"city": {"type": "string"},
        "country": {"type": "string"}, "units": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "country", "units"]});
    let stock = json!({"type": "object", "properties": {"ticker": {"type": "string"},
        "exchange": {"type": "string"}}, "required": ["ticker", "exchange"]});
    let chat_tools = json!({"tools": [
        {"type": "function", "function": {"name": "GetWeatherArgs", "parameters": weather}},
        {"type": "function", "function": {"name": "get_stock_price", "parameters": stock}}]});

    // Chat, native: each call's pieces concatenate to the recorded arguments.
    let r = e
        .replay(
            "o1",
            rec,
            "/v1/chat/completions",
            &chat("rec-gpt", chat_tools),
        )
        .await;
    let v = r.view(chat_view);
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{v}");
    for (call, (id, name, args)) in calls.iter().zip(want.values()) {
        assert_eq!(call["id"], id.as_str(), "{v}");
        assert_eq!(call["name"], name.as_str(), "{v}");
        assert_eq!(call["arguments"], args.as_str(), "{v}");
        serde_json::from_str::<Value>(args).expect("the arguments are JSON");
    }
    assert_eq!(v["text"], "", "{v}");
    assert_eq!(v["finish_reason"], "tool_calls");
    assert_eq!(
        (
            &v["usage"]["prompt_tokens"],
            &v["usage"]["completion_tokens"]
        ),
        (&json!(149), &json!(60))
    );
    r.billed(149, 60, 0);

    // Messages, translated: one tool_use block per call, its input the arguments.
    let tools = json!({"tools": [
        {"name": "GetWeatherArgs", "input_schema": weather},
        {"name": "get_stock_price", "input_schema": stock}]});
    let r = e
        .replay("o1", rec, "/v1/messages", &messages("rec-gpt", tools))
        .await;
    let v = r.view(messages_view);
    let uses: Vec<&Value> = v["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(uses.len(), 2, "{v}");
    for (block, (id, name, args)) in uses.iter().zip(want.values()) {
        assert_eq!(block["id"], id.as_str(), "{v}");
        assert_eq!(block["name"], name.as_str(), "{v}");
        let input: Value = serde_json::from_str(block["partial_json"].as_str().unwrap())
            .expect("the input is JSON");
        assert_eq!(input, serde_json::from_str::<Value>(args).unwrap(), "{v}");
    }
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(v["output_tokens"], 60);
    r.billed(149, 60, 0);

    // Responses, on Azure's chat wire: one function_call item per call.
    let tools = json!({"tools": [
        {"type": "function", "name": "GetWeatherArgs", "parameters": weather},
        {"type": "function", "name": "get_stock_price", "parameters": stock}]});
    let r = e
        .replay("az1", rec, "/v1/responses", &responses("rec-azure", tools))
        .await;
    let v = r.view(responses_view);
    let calls: Vec<&Value> = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 2, "{v}");
    let streamed: Vec<&Value> = v["arguments"].as_object().unwrap().values().collect();
    let done: Vec<&Value> = v["arguments_done"].as_object().unwrap().values().collect();
    for (i, (id, name, args)) in want.values().enumerate() {
        assert_eq!(calls[i]["call_id"], id.as_str(), "{v}");
        assert_eq!(calls[i]["name"], name.as_str(), "{v}");
        assert_eq!(calls[i]["arguments"], args.as_str(), "{v}");
        assert_eq!(streamed[i], args.as_str(), "{v}");
        assert_eq!(done[i], args.as_str(), "{v}");
    }
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(
        (&v["usage"]["input_tokens"], &v["usage"]["output_tokens"]),
        (&json!(149), &json!(60))
    );
    r.billed(149, 60, 0);
}

// ---------------------------------------------------------------------------
// OpenAI chat: obfuscation and moderation members

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_openai_moderation_after_the_usage_chunk_is_no_content_in_any_format() {
    let e = Rec::start().await;
    let rec = "pydantic-ai/openai-chat-moderation.sse";
    let (want, _) = openai_chat(rec);
    assert_eq!(want, "Paris.");

    // Chat, native: every chunk parses, the text is the recorded text.
    let r = e
        .replay(
            "o1",
            rec,
            "/v1/chat/completions",
            &chat("rec-gpt", json!({})),
        )
        .await;
    let v = r.view(chat_view);
    assert_eq!(v["text"], want.as_str(), "{v}");
    assert_eq!(v["finish_reason"], "stop");
    assert_eq!(
        (
            &v["usage"]["prompt_tokens"],
            &v["usage"]["completion_tokens"]
        ),
        (&json!(13), &json!(11))
    );
    r.billed(13, 11, 0);

    // Messages and responses, translated (responses on Azure's chat wire): the
    // same text, nothing of the obfuscation or the moderation results in it.
    let r = e
        .replay("o1", rec, "/v1/messages", &messages("rec-gpt", json!({})))
        .await;
    let v = r.view(messages_view);
    let blocks = v["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 1, "{v}");
    assert_eq!(blocks[0]["text"], want.as_str(), "{v}");
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["output_tokens"], 11);
    r.billed(13, 11, 0);

    let r = e
        .replay(
            "az1",
            rec,
            "/v1/responses",
            &responses("rec-azure", json!({})),
        )
        .await;
    let v = r.view(responses_view);
    assert_eq!(v["text"], want.as_str(), "{v}");
    assert_eq!(shown_text(&v["output"]), want, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    for a in [&r.whole, &r.pieces] {
        assert!(
            a.frames
                .iter()
                .all(|(_, d)| !d.contains("obfuscation") && !d.contains("omni-moderation")),
            "a provider member echoed to a responses client"
        );
    }
    r.billed(13, 11, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_azure_content_filter_results_and_an_empty_first_chunk_are_no_content() {
    let e = Rec::start().await;
    let rec = "vercel-ai/azure-model-router.chunks.txt";
    let (want, _) = openai_chat(rec);
    assert_eq!(want, "Capital of Denmark.");
    // The first chunk has no choices, only the prompt's filter results.
    assert_eq!(recorded(rec)[0].1["choices"], json!([]));

    for (path, body) in [
        ("/v1/chat/completions", chat("rec-azure", json!({}))),
        ("/v1/messages", messages("rec-azure", json!({}))),
        ("/v1/responses", responses("rec-azure", json!({}))),
    ] {
        let r = e.replay("az1", rec, path, &body).await;
        let text = match path {
            "/v1/chat/completions" => {
                let v = r.view(chat_view);
                assert_eq!(v["finish_reason"], "stop", "{v}");
                assert_eq!(
                    v["usage"]["completion_tokens_details"]["reasoning_tokens"], 64,
                    "{v}"
                );
                v["text"].clone()
            }
            "/v1/messages" => {
                let v = r.view(messages_view);
                assert_eq!(v["stop_reason"], "end_turn", "{v}");
                let blocks = v["blocks"].as_array().unwrap();
                assert_eq!(blocks.len(), 1, "{v}");
                blocks[0]["text"].clone()
            }
            _ => {
                let v = r.view(responses_view);
                assert_eq!(v["status"], "completed", "{v}");
                assert_eq!(shown_text(&v["output"]), want, "{v}");
                assert_eq!(
                    v["usage"]["output_tokens_details"]["reasoning_tokens"], 64,
                    "{v}"
                );
                v["text"].clone()
            }
        };
        assert_eq!(text, want.as_str(), "{path}");
        r.billed(15, 78, 64);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_azure_answers_in_other_formats_name_a_model() {
    let e = Rec::start().await;
    let rec = "vercel-ai/azure-model-router.chunks.txt";
    // The model Azure names in every chunk after the first.
    let named = recorded(rec)[1].1["model"].as_str().unwrap().to_string();
    assert_eq!(named, "gpt-5-nano-2025-08-07");
    // The provider's model (what the gateway reports on every other recording)
    // or the route's slug; never an empty name.
    let fine = |model: &Value| model == named.as_str() || model == "rec-azure";
    let r = e
        .replay(
            "az1",
            rec,
            "/v1/messages",
            &messages("rec-azure", json!({})),
        )
        .await;
    for a in [&r.whole, &r.pieces] {
        let start = &frames(a).0[0].1;
        assert_eq!(start["type"], "message_start");
        let model = &start["message"]["model"];
        assert!(
            fine(model),
            "a messages client is told the model is {model}"
        );
    }
    let r = e
        .replay(
            "az1",
            rec,
            "/v1/responses",
            &responses("rec-azure", json!({})),
        )
        .await;
    for a in [&r.whole, &r.pieces] {
        for (_, d) in frames(a)
            .0
            .iter()
            .filter(|(_, d)| d["response"].is_object())
        {
            let model = &d["response"]["model"];
            assert!(
                fine(model),
                "{} tells a responses client the model is {model}",
                d["type"]
            );
        }
    }
}

// ---------------------------------------------------------------------------
// OpenAI responses, native: obfuscation, sequence numbers, moderation

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_responses_function_call_reaches_a_responses_client_as_sent() {
    let e = Rec::start().await;
    let rec = "pydantic-ai/openai-responses-function-call.sse";
    let recorded = recorded(rec);
    let want: String = recorded
        .iter()
        .filter(|(_, d)| d["type"] == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(want, r#"{"result":6666}"#);
    let tools = json!({"tools": [{"type": "function", "name": "final_result",
        "parameters": {"type": "object", "properties": {"result": {"type": "integer"}}, "required": ["result"]}}]});
    // The recording carries the reasoning's encrypted content: a client gets it
    // when it asked for it, and only then.
    let mut encrypted: Vec<String> = recorded
        .iter()
        .filter_map(|(_, d)| d["item"]["encrypted_content"].as_str().map(str::to_string))
        .collect();
    // The completed response's reasoning carries content of its own.
    let completed = recorded.last().unwrap().1["response"]["output"][0]["encrypted_content"]
        .as_str()
        .unwrap()
        .to_string();
    encrypted.push(completed.clone());
    assert!(!encrypted.is_empty());
    for include in [false, true] {
        let mut body = responses("rec-gpt", tools.clone());
        if include {
            body["include"] = json!(["reasoning.encrypted_content"]);
            body["store"] = json!(false);
        }
        let r = e.replay("o1", rec, "/v1/responses", &body).await;
        let v = r.view(responses_view);
        assert_eq!(v["arguments"]["1"], want.as_str(), "{v}");
        assert_eq!(v["arguments_done"]["1"], want.as_str(), "{v}");
        assert_eq!(v["text"], "", "{v}");
        let output = v["output"].as_array().unwrap();
        let kinds: Vec<&str> = output.iter().map(|o| o["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "function_call"], "{v}");
        assert_eq!(output[1]["name"], "final_result");
        assert_eq!(output[1]["arguments"], want.as_str());
        if include {
            assert_eq!(output[0]["encrypted_content"], completed.as_str(), "{v}");
            let done = &v["items"][0]["encrypted_content"];
            assert_eq!(done, encrypted[1].as_str(), "{v}");
        } else {
            for a in [&r.whole, &r.pieces] {
                for c in &encrypted {
                    assert!(
                        a.frames.iter().all(|(_, d)| !d.contains(c.as_str())),
                        "encrypted reasoning reached a client that did not ask for it"
                    );
                }
            }
        }
        assert_eq!(v["status"], "completed");
        assert_eq!(
            v["usage"]["output_tokens_details"]["reasoning_tokens"], 448,
            "{v}"
        );
        r.billed(53, 469, 448);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_responses_moderation_reaches_a_responses_client_as_sent() {
    let e = Rec::start().await;
    let rec = "pydantic-ai/openai-responses-moderation.sse";
    let r = e
        .replay("o1", rec, "/v1/responses", &responses("rec-gpt", json!({})))
        .await;
    let v = r.view(responses_view);
    assert_eq!(v["text"], "Paris.", "{v}");
    assert_eq!(shown_text(&v["output"]), "Paris.", "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(
        (&v["usage"]["input_tokens"], &v["usage"]["output_tokens"]),
        (&json!(13), &json!(59))
    );
    r.billed(13, 59, 0);
}

// ---------------------------------------------------------------------------
// Gemini: CRLF framing, grounding in the last chunk

/// Gemini's grounding supports in the recording: each supported segment's text
/// and the URLs of its sources.
fn gemini_supports(rec: &str) -> Vec<(String, Vec<String>)> {
    let (_, last) = recorded(rec).pop().unwrap();
    let g = &last["candidates"][0]["groundingMetadata"];
    let chunks = g["groundingChunks"].as_array().unwrap();
    g["groundingSupports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let urls = s["groundingChunkIndices"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| {
                    chunks[i.as_u64().unwrap() as usize]["web"]["uri"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .collect();
            (s["segment"]["text"].as_str().unwrap().to_string(), urls)
        })
        .collect()
}

/// The text `citation` (start and end in characters) covers in `text`.
fn cited(text: &str, c: &Value) -> String {
    let (start, end) = (
        c["start_index"].as_u64().unwrap() as usize,
        c["end_index"].as_u64().unwrap() as usize,
    );
    text.chars().skip(start).take(end - start).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_gemini_grounding_cites_inside_the_text_in_every_format() {
    let e = Rec::start().await;
    let rec = "pydantic-ai/gemini-google-search.sse";
    let text: String = recorded(rec)
        .iter()
        .flat_map(|(_, c)| {
            c["candidates"][0]["content"]["parts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect();
    let supports = gemini_supports(rec);
    // Each citation a client gets: the span's text and the URL.
    let want: Vec<(String, String)> = supports
        .iter()
        .flat_map(|(t, urls)| urls.iter().map(move |u| (t.clone(), u.clone())))
        .collect();
    assert_eq!(want.len(), 9);
    // Spans are in UTF-8 bytes at Gemini, in characters for a client: the text
    // has "°" before them.
    assert_ne!(text.len(), text.chars().count());

    // Chat: the annotations cover the text Gemini grounded.
    let r = e
        .replay(
            "g1",
            rec,
            "/v1/chat/completions",
            &chat("rec-gemini", json!({"web_search_options": {}})),
        )
        .await;
    let v = r.view(chat_view);
    assert_eq!(v["text"], text.as_str(), "{v}");
    let got: Vec<(String, String)> = v["annotations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                cited(&text, &a["url_citation"]),
                a["url_citation"]["url"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(got, want, "{v}");
    assert_eq!(v["finish_reason"], "stop");
    assert_eq!(
        (
            &v["usage"]["prompt_tokens"],
            &v["usage"]["completion_tokens"]
        ),
        (&json!(119), &json!(653))
    );
    r.billed(119, 653, 412);

    // Responses: each annotation announced before its message item is done, the
    // done item carrying them, their spans over the text.
    let r = e
        .replay(
            "g1",
            rec,
            "/v1/responses",
            &responses("rec-gemini", json!({"tools": [{"type": "web_search"}]})),
        )
        .await;
    let v = r.view(responses_view);
    assert_eq!(v["text"], text.as_str(), "{v}");
    for a in [&r.whole, &r.pieces] {
        let added = position(a, "annotation", |n, _| {
            n == "response.output_text.annotation.added"
        });
        let done = position(a, "message done", |n, d| {
            n == "response.output_item.done" && d["item"]["type"] == "message"
        });
        assert!(
            added < done,
            "annotation at {added}, message done at {done}"
        );
    }
    let message = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "message")
        .cloned()
        .unwrap();
    let got: Vec<(String, String)> = message["content"][0]["annotations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (cited(&text, a), a["url"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(got, want, "{v}");
    assert_eq!(
        v["annotations"].as_array().unwrap().len(),
        want.len(),
        "{v}"
    );
    r.billed(119, 653, 412);

    // Messages: each citation a delta of the text block it cites, before that
    // block stops (the view holds every delta to its open block).
    let search = json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]});
    let r = e
        .replay("g1", rec, "/v1/messages", &messages("rec-gemini", search))
        .await;
    let v = r.view(messages_view);
    let texts: Vec<&Value> = v["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "text")
        .collect();
    let all: String = texts.iter().map(|b| b["text"].as_str().unwrap()).collect();
    assert_eq!(all, text, "{v}");
    let urls: Vec<String> = texts
        .iter()
        .flat_map(|b| b["citations"].as_array().cloned().unwrap_or_default())
        .map(|c| c["url"].as_str().unwrap().to_string())
        .collect();
    let want_urls: Vec<String> = want.iter().map(|(_, u)| u.clone()).collect();
    assert_eq!(urls, want_urls, "{v}");
    assert_eq!(v["stop_reason"], "end_turn");
    r.billed(119, 653, 412);
}
