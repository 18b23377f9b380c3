//! The chat-completions inbound format and the canonical side of the OpenAI chat
//! wire, against golden files in `tests/golden/chat/`.
//!
//! Set `UPDATE_GOLDEN=1` to rewrite the expected files from the code under test;
//! review every rewritten file by hand against the chat-completions reference.

use proptest::prelude::*;
use serde_json::{json, Value};
use sluice_filters::inbound::chat;
use sluice_filters::ir::{
    Event, Message, Meta, Part, RefusalReason, Request, Response, Role, StreamDecoder,
    StreamEncoder, Tail, Tool, ToolChoice,
};
use sluice_filters::sse::SseDecoder;
use sluice_filters::upstream::{anthropic, openai_chat};
use sluice_filters::usage::Usage;
use sluice_filters::ErrorCode;

#[macro_use]
mod common;

golden!("chat");

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

fn meta(include_usage: bool) -> Meta {
    Meta {
        provider: "openai:gpt-4.1-2025-04-14".into(),
        slug: "gpt-4.1".into(),
        created: 1_760_000_000,
        fallback_id: "gw_01abc".into(),
        include_usage,
        stop_sequence: None,
        prompt_estimate: 0,
        echo: String::new(),
        search: None,
        hide_reasoning: false,
    }
}

fn tail(usage: Usage, cut: bool) -> Tail {
    Tail {
        usage,
        cut,
        receipt: r#"{"attempts":"openai:ok","overhead_us":120}"#.into(),
        ignored: Some("top_k".into()),
    }
}

// ---------------------------------------------------------------------------
// Requests

#[test]
fn a_rich_chat_body_parses_to_the_canonical_form_and_renders_for_each_wire() {
    let body = read("request_full.json");
    let req = chat::parse(&body).unwrap();
    check_json(
        "request_full.canonical.json",
        &serde_json::to_value(&req).unwrap(),
    );
    let r = openai_chat::render(&req, "gpt-4.1-2025-04-14", true);
    check_json("request_full.openai_chat.json", &json_of(&r.body));
    assert!(r.dropped.is_empty(), "{:?}", r.dropped);
    let r = anthropic::render(&req, "claude-sonnet-4-5-20250929", true);
    check_json("request_full.anthropic.json", &json_of(&r.body));
    assert!(
        r.dropped.contains(&"metadata".to_string()),
        "{:?}",
        r.dropped
    );
    // The routing hint is the gateway's.
    assert_eq!(req.prompt_cache_key.as_deref(), Some("conv-7"));
    assert!(!String::from_utf8_lossy(&r.body).contains("conv-7"));
}

#[test]
fn structured_output_and_reasoning_render_in_openai_terms() {
    let req = chat::parse(&read("request_structured.json")).unwrap();
    check_json(
        "request_structured.canonical.json",
        &serde_json::to_value(&req).unwrap(),
    );
    let r = openai_chat::render(&req, "gpt-5-2025-08-07", false);
    check_json("request_structured.openai_chat.json", &json_of(&r.body));
}

#[test]
fn parse_errors_name_their_param_with_a_stable_code() {
    let base = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let cases: Vec<(Value, ErrorCode, &str)> = vec![
        (json!({"seed": 1}), ErrorCode::UnsupportedParameter, "seed"),
        (
            json!({"audio": {}}),
            ErrorCode::UnsupportedParameter,
            "audio",
        ),
        (
            json!({"functions": []}),
            ErrorCode::UnsupportedParameter,
            "functions",
        ),
        (
            json!({"function_call": "auto"}),
            ErrorCode::UnsupportedParameter,
            "function_call",
        ),
        (
            json!({"prediction": {}}),
            ErrorCode::UnsupportedParameter,
            "prediction",
        ),
        (
            json!({"prompt_cache_retention": "24h"}),
            ErrorCode::UnsupportedParameter,
            "prompt_cache_retention",
        ),
        (
            json!({"provider": {"order": ["a"]}}),
            ErrorCode::UnsupportedParameter,
            "provider",
        ),
        (
            json!({"route": "fallback"}),
            ErrorCode::UnsupportedParameter,
            "route",
        ),
        (
            json!({"no_such_field": 1}),
            ErrorCode::UnsupportedParameter,
            "no_such_field",
        ),
        (json!({"n": 2}), ErrorCode::UnsupportedParameter, "n"),
        (
            json!({"temperature": 3}),
            ErrorCode::InvalidParameter,
            "temperature",
        ),
        (
            json!({"temperature": "hot"}),
            ErrorCode::InvalidParameter,
            "temperature",
        ),
        (json!({"top_p": 1.5}), ErrorCode::InvalidParameter, "top_p"),
        (
            json!({"stream": "yes"}),
            ErrorCode::InvalidParameter,
            "stream",
        ),
        (
            json!({"stop": ["a", "b", "c", "d", "e"]}),
            ErrorCode::InvalidParameter,
            "stop",
        ),
        (
            json!({"max_tokens": 10, "max_completion_tokens": 20}),
            ErrorCode::InvalidParameter,
            "max_completion_tokens",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            ErrorCode::InvalidParameter,
            "response_format.type",
        ),
        (
            json!({"tool_choice": "sometimes"}),
            ErrorCode::InvalidParameter,
            "tool_choice",
        ),
        (
            json!({"tools": [{"type": "web_search"}]}),
            ErrorCode::UnsupportedParameter,
            "tools[0].type",
        ),
        (
            json!({"messages": []}),
            ErrorCode::InvalidParameter,
            "messages",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi", "agent": "x"}]}),
            ErrorCode::InvalidParameter,
            "messages[0].agent",
        ),
        (
            json!({"messages": [{"role": "robot", "content": "hi"}]}),
            ErrorCode::InvalidParameter,
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            ErrorCode::InvalidParameter,
            "messages[0].tool_call_id",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}),
            ErrorCode::UnsupportedParameter,
            "messages[0].content[0].type",
        ),
        (json!({"model": 7}), ErrorCode::InvalidParameter, "model"),
    ];
    for (patch, code, param) in cases {
        let mut body = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        let e = chat::parse(&serde_json::to_vec(&body).unwrap()).unwrap_err();
        assert_eq!(
            (e.code, e.param.as_deref()),
            (code, Some(param)),
            "{patch}: {}",
            e.message
        );
    }
    let long = "x".repeat(65_537);
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": long}}]});
    let e = chat::parse(&serde_json::to_vec(&body).unwrap()).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tools[0].function.description"));
    assert!(
        e.message.contains("65537") && e.message.contains("65536"),
        "{}",
        e.message
    );
    assert_eq!(
        chat::parse(b"{not json").unwrap_err().code,
        ErrorCode::InvalidJson
    );
}

// ---------------------------------------------------------------------------
// Answers

#[test]
fn a_whole_completion_decodes_and_renders_back() {
    let events = openai_chat::decode(&read("answer_tool_calls.json")).unwrap();
    check_json(
        "answer_tool_calls.events.json",
        &serde_json::to_value(&events).unwrap(),
    );
    let resp = Response::from_events(&events);
    let out = chat::render(&resp, &meta(false), &tail(resp.usage.unwrap(), false));
    check_json("answer_tool_calls.rendered.json", &json_of(&out));
}

#[test]
fn a_refusal_decodes_as_a_refusal_and_content_filters_are_refusals() {
    let events = openai_chat::decode(&read("answer_refusal.json")).unwrap();
    let resp = Response::from_events(&events);
    assert!(!resp.has_content());
    assert_eq!(
        resp.refusal.as_ref().map(|r| r.0),
        Some(RefusalReason::ContentPolicy)
    );
    let azure = br#"{"error":{"message":"The response was filtered","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"violence":{"filtered":true,"severity":"high"}}}}}"#;
    assert_eq!(
        openai_chat::refusal(400, azure),
        Some(RefusalReason::ContentPolicy)
    );
    assert_eq!(openai_chat::refusal(500, azure), None);
    assert_eq!(
        openai_chat::refusal(400, br#"{"error":{"code":"invalid_value"}}"#),
        None
    );
}

#[test]
fn empty_answers_render_the_spec_shape() {
    let resp = Response {
        finish: Some(sluice_filters::ir::FinishReason::Stop),
        ..Response::default()
    };
    let v = json_of(&chat::render(
        &resp,
        &meta(false),
        &tail(Usage::default(), false),
    ));
    assert_eq!(v["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["provider"], "openai:gpt-4.1-2025-04-14");
}

/// Decodes an SSE transcript fed in two pieces split at `at`.
fn decode_split(sse: &[u8], at: usize) -> Vec<Event> {
    let mut d = SseDecoder::new();
    let mut dec = openai_chat::Decoder::new();
    let mut events = Vec::new();
    for piece in [&sse[..at], &sse[at..]] {
        d.push(piece);
        while let Some(ev) = d.next_event() {
            dec.frame(ev.event.as_deref(), ev.data.as_bytes(), &mut events)
                .unwrap();
        }
    }
    assert!(dec.done());
    events
}

#[test]
fn a_chunk_stream_decodes_the_same_at_every_split_and_reencodes() {
    let sse = read("stream_tools.sse");
    let whole = decode_split(&sse, sse.len());
    check_json(
        "stream_tools.events.json",
        &serde_json::to_value(&whole).unwrap(),
    );
    for at in 0..sse.len() {
        assert_eq!(decode_split(&sse, at), whole, "split at {at}");
    }
    for (include_usage, name) in [
        (true, "stream_tools.out_usage.sse"),
        (false, "stream_tools.out.sse"),
    ] {
        let mut enc = chat::Encoder::new(meta(include_usage));
        let mut out = Vec::new();
        let mut usage = Usage::default();
        for e in &whole {
            if let Event::Usage(u) = e {
                usage = *u;
            }
            enc.event(e, &mut out);
        }
        enc.end(&tail(usage, false), &mut out);
        check_text(name, &String::from_utf8(out).unwrap());
    }
}

#[test]
fn a_cut_stream_ends_with_length_and_done_and_its_usage_only_when_asked() {
    for include_usage in [false, true] {
        let mut enc = chat::Encoder::new(meta(include_usage));
        let mut out = Vec::new();
        enc.event(
            &Event::Start {
                id: Some("c1".into()),
                model: Some("gpt".into()),
            },
            &mut out,
        );
        enc.event(&Event::Text { text: "Hel".into() }, &mut out);
        let usage = Usage {
            input_tokens: 5,
            output_tokens: 1,
            ..Usage::default()
        };
        enc.end(&tail(usage, true), &mut out);
        let text = String::from_utf8(out).unwrap();
        let frames: Vec<Value> = text
            .split("\n\n")
            .filter(|f| !f.is_empty() && *f != "data: [DONE]")
            .map(|f| serde_json::from_str(f.trim_start_matches("data: ")).unwrap())
            .collect();
        assert!(text.ends_with("data: [DONE]\n\n"));
        let (fin, usage_chunk) = if include_usage {
            (&frames[frames.len() - 2], frames.last())
        } else {
            (frames.last().unwrap(), None)
        };
        assert_eq!(fin["choices"][0]["finish_reason"], "length");
        assert_eq!(fin["x-service-ignored-parameters"], "top_k");
        assert_eq!(fin["x_gateway"]["attempts"], "openai:ok");
        match usage_chunk {
            // The usage in a chunk of its own, every other chunk `usage: null`.
            Some(u) => {
                assert_eq!(u["choices"], json!([]));
                assert_eq!(u["usage"]["completion_tokens"], 1);
                for f in &frames[..frames.len() - 1] {
                    assert_eq!(f["usage"], Value::Null, "{f}");
                    assert!(f.get("usage").is_some(), "{f}");
                }
            }
            // Not asked: no chunk carries a usage.
            None => assert!(frames.iter().all(|f| f.get("usage").is_none()), "{text}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Round trip: canonical -> chat wire -> chat parse keeps the meaning.

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,!?]{1,24}"
}

fn request() -> impl Strategy<Value = Request> {
    let turn = prop_oneof![
        text().prop_map(|t| Message {
            role: Role::User,
            parts: vec![Part::text(t)]
        }),
        (text(), text()).prop_map(|(t, args)| Message {
            role: Role::Assistant,
            parts: vec![
                Part::text(t),
                Part::ToolCall {
                    id: "call_1".into(),
                    name: "f".into(),
                    arguments: format!("{{\"q\":{args:?}}}")
                },
            ],
        }),
        text().prop_map(|t| Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: "call_1".into(),
                content: vec![Part::text(t)],
                is_error: false
            }],
        }),
    ];
    (
        proptest::collection::vec(text(), 0..3),
        proptest::collection::vec(turn, 1..6),
        proptest::option::of(1u64..4096),
        proptest::option::of((0u32..=20).prop_map(|t| t as f64 / 10.0)),
        proptest::bool::ANY,
    )
        .prop_map(
            |(system, messages, max_tokens, temperature, tools)| Request {
                model: "m".into(),
                system,
                messages,
                max_tokens,
                temperature,
                tools: if tools {
                    vec![Tool {
                        name: "f".into(),
                        description: Some("finds".into()),
                        parameters: serde_json::value::RawValue::from_string(
                            r#"{"type":"object"}"#.into(),
                        )
                        .unwrap(),
                        strict: None,
                    }]
                } else {
                    Vec::new()
                },
                tool_choice: tools.then_some(ToolChoice::Auto),
                ..Request::default()
            },
        )
}

proptest! {
    #[test]
    fn canonical_requests_survive_the_chat_wire(req in request()) {
        let r = openai_chat::render(&req, "m", false);
        let back = chat::parse(&r.body).unwrap();
        prop_assert_eq!(&back.system, &req.system);
        prop_assert_eq!(&back.messages, &req.messages);
        prop_assert_eq!(back.max_tokens, req.max_tokens);
        prop_assert_eq!(back.temperature, req.temperature);
        prop_assert_eq!(&back.tools, &req.tools);
        prop_assert_eq!(&back.tool_choice, &req.tool_choice);
    }
}

#[test]
fn cache_writes_are_reported_in_prompt_tokens_details() {
    let written = Usage {
        input_tokens: 100,
        cached_tokens: 10,
        cache_write_tokens: 60,
        output_tokens: 5,
        ..Usage::default()
    };
    let resp = Response {
        parts: vec![Part::text("Hi")],
        usage: Some(written),
        ..Response::default()
    };
    let v: Value =
        serde_json::from_slice(&chat::render(&resp, &meta(false), &tail(written, false))).unwrap();
    // Writes, like reads, are part of prompt_tokens.
    assert_eq!(v["usage"]["prompt_tokens"], 100);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 10);
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cache_write_tokens"],
        60
    );
    // Absent when nothing was written, as OpenAI's own answers are.
    let plain = sluice_filters::usage::usage_json(&Usage {
        input_tokens: 100,
        ..Usage::default()
    });
    assert!(plain["prompt_tokens_details"]
        .get("cache_write_tokens")
        .is_none());
}
