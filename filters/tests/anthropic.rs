//! Everything Anthropic: the messages inbound format and the anthropic upstream
//! wire, against golden files in `tests/golden/anthropic/`.
//!
//! Set `UPDATE_GOLDEN=1` to rewrite the expected files from the code under test;
//! review every rewritten file by hand against the Messages API reference.

use proptest::prelude::*;
use serde_json::Value;
use sluice_filters::inbound::messages;
use sluice_filters::ir::{
    Collector, Event, FinishReason, Message, Meta, Part, RefusalReason, Request, Response, Role,
    StreamDecoder, StreamEncoder, Tail, Tool, ToolChoice,
};
use sluice_filters::sse::SseDecoder;
use sluice_filters::upstream::anthropic;
use sluice_filters::usage::Usage;
use sluice_filters::ErrorCode;

#[macro_use]
mod common;

golden!("anthropic");

// ---------------------------------------------------------------------------
// Golden-file plumbing
// ---------------------------------------------------------------------------

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

fn meta() -> Meta {
    Meta {
        provider: "anthropic:claude-sonnet-4-5-20250929".into(),
        slug: "claude-sonnet-4.5".into(),
        created: 1_760_000_000,
        fallback_id: "gw_01abc".into(),
        include_usage: false,
        stop_sequence: None,
        prompt_estimate: 0,
        echo: String::new(),
        search: None,
        hide_reasoning: false,
    }
}

fn tail() -> Tail {
    Tail {
        usage: Usage::default(),
        cut: false,
        receipt: r#"{"attempts":1,"overhead_ms":3}"#.into(),
        ignored: Some("top_k".into()),
    }
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

#[test]
fn messages_body_parses_to_the_canonical_request() {
    let req = messages::parse(&read("request_full.json")).unwrap();
    check_json(
        "request_full.canonical.json",
        &serde_json::to_value(&req).unwrap(),
    );
}

#[test]
fn native_render_swaps_model_and_stream_and_keeps_every_other_byte() {
    let body = read("request_full.json");
    let out = anthropic::render_native(&body, "claude-sonnet-4-5-20250929", true);
    check_json("request_full.native.json", &json(&out));
    // Byte for byte: every other member's value text is in the output as it came.
    let original: serde_json::Map<String, Value> = serde_json::from_slice(&body).unwrap();
    let text = String::from_utf8(out.clone()).unwrap();
    #[derive(serde::Deserialize)]
    struct Raw<'a> {
        #[serde(borrow)]
        messages: &'a serde_json::value::RawValue,
        #[serde(borrow)]
        tools: &'a serde_json::value::RawValue,
        #[serde(borrow)]
        thinking: &'a serde_json::value::RawValue,
    }
    let raw: Raw = serde_json::from_slice(&body).unwrap();
    for r in [raw.messages, raw.tools, raw.thinking] {
        assert!(text.contains(r.get()), "not verbatim: {}", r.get());
    }
    let v = json(&out);
    assert_eq!(v.as_object().unwrap().len(), original.len());
    assert_eq!(v["model"], "claude-sonnet-4-5-20250929");
    assert_eq!(v["stream"], true);
    // Without a stream member, one is added only when streaming.
    let plain = br#"{"model":"claude-sonnet-4.5","max_tokens":5,"messages":[]}"#;
    assert_eq!(
        anthropic::render_native(plain, "m", false),
        br#"{"model":"m","max_tokens":5,"messages":[]}"#
    );
    assert_eq!(
        anthropic::render_native(plain, "m", true),
        br#"{"model":"m","max_tokens":5,"messages":[],"stream":true}"#
    );
}

#[test]
fn messages_body_renders_for_an_anthropic_rung_through_the_canonical_form() {
    let req = messages::parse(&read("request_full.json")).unwrap();
    let out = anthropic::render(&req, "claude-sonnet-4-5-20250929", true);
    check_json(
        "request_full.upstream.json",
        &serde_json::json!({"body": json(&out.body), "dropped": out.dropped}),
    );
}

fn canonical(name: &str) -> Request {
    serde_json::from_slice(&read(name)).unwrap()
}

/// A json_schema format, built in code: the canonical `ResponseFormat` is an
/// internally tagged enum holding a `RawValue`, which serde cannot read back.
fn json_schema_format() -> sluice_filters::ir::ResponseFormat {
    sluice_filters::ir::ResponseFormat::JsonSchema {
        name: "answer".into(),
        description: None,
        schema: serde_json::value::RawValue::from_string(
            r#"{"type":"object","properties":{"a":{"type":"string"}},"required":["a"],"additionalProperties":false}"#.into(),
        )
        .unwrap(),
        strict: Some(true),
    }
}

#[test]
fn canonical_tools_media_and_foreign_fields_render_for_anthropic() {
    let mut req = canonical("canonical_tools.json");
    req.response_format = Some(json_schema_format());
    let out = anthropic::render(&req, "claude-sonnet-4-5-20250929", true);
    let body = json(&out.body);
    assert!(body.get("prompt_cache_key").is_none());
    assert!(body.get("store").is_none());
    check_json(
        "canonical_tools.upstream.json",
        &serde_json::json!({"body": body, "dropped": out.dropped}),
    );
}

#[test]
fn canonical_reasoning_renders_thinking_under_max_tokens() {
    let req = canonical("canonical_reasoning.json");
    let out = anthropic::render(&req, "claude-opus-4-1-20250805", false);
    check_json(
        "canonical_reasoning.upstream.json",
        &serde_json::json!({"body": json(&out.body), "dropped": out.dropped}),
    );
}

#[test]
fn reasoning_without_max_tokens_adds_the_budget_to_the_default() {
    let mut req = canonical("canonical_reasoning.json");
    req.max_tokens = None;
    req.reasoning = Some(sluice_filters::ir::Reasoning {
        effort: Some("low".into()),
        ..Default::default()
    });
    let body = json(&anthropic::render(&req, "m", false).body);
    assert_eq!(body["thinking"]["budget_tokens"], 2048);
    assert_eq!(body["max_tokens"], 2048 + anthropic::DEFAULT_MAX_TOKENS);
    // A forced tool call excludes thinking: thinking is dropped and disclosed.
    req.tools.push(Tool {
        name: "f".into(),
        description: None,
        parameters: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
        strict: None,
    });
    req.tool_choice = Some(ToolChoice::Required);
    let out = anthropic::render(&req, "m", false);
    let body = json(&out.body);
    assert!(body.get("thinking").is_none());
    assert_eq!(body["tool_choice"]["type"], "any");
    assert_eq!(body["temperature"], 0.7);
    assert!(out.dropped.contains(&"reasoning.effort".to_string()));
    // No tools: no tool_choice either (Anthropic refuses one alone).
    req.tools.clear();
    let body = json(&anthropic::render(&req, "m", false).body);
    assert!(body.get("tool_choice").is_none());
    assert!(body.get("tools").is_none());
}

#[test]
fn thinking_waits_for_a_tool_turn_whose_signed_reasoning_came_back() {
    let mut req = canonical("canonical_reasoning.json");
    req.max_tokens = None;
    req.reasoning = Some(sluice_filters::ir::Reasoning {
        effort: Some("low".into()),
        ..Default::default()
    });
    let call = Part::ToolCall {
        id: "toolu_1".into(),
        name: "f".into(),
        arguments: "{}".into(),
    };
    let result = Message {
        role: Role::User,
        parts: vec![Part::ToolResult {
            call_id: "toolu_1".into(),
            content: vec![Part::text("4")],
            is_error: false,
        }],
    };
    let thinking = |signature: Option<&str>| Part::Thinking {
        text: "two and two".into(),
        signature: signature.map(String::from),
    };
    let turn = |parts: Vec<Part>| {
        let mut r = req.clone();
        r.messages.push(Message {
            role: Role::Assistant,
            parts,
        });
        r.messages.push(result.clone());
        anthropic::render(&r, "m", false)
    };
    // Signed thinking first (or redacted thinking): thinking stays on, and the
    // block goes back as it came.
    for opening in [
        thinking(Some("sig")),
        Part::EncryptedReasoning {
            data: "opaque".into(),
            id: None,
        },
    ] {
        let out = turn(vec![opening, call.clone()]);
        let body = json(&out.body);
        assert_eq!(body["thinking"]["budget_tokens"], 2048, "{body}");
        let last = &body["messages"][body["messages"].as_array().unwrap().len() - 2];
        assert!(
            matches!(
                last["content"][0]["type"].as_str(),
                Some("thinking" | "redacted_thinking")
            ),
            "{body}"
        );
        assert!(
            !out.dropped.contains(&"reasoning.effort".to_string()),
            "{:?}",
            out.dropped
        );
    }
    // The reasoning lost (no signature, or none at all): Anthropic would refuse
    // the history with thinking on, so it goes without, and says so.
    for parts in [
        vec![call.clone()],
        vec![thinking(None), call.clone()],
        vec![
            Part::text("let me see"),
            thinking(Some("sig")),
            call.clone(),
        ],
    ] {
        let out = turn(parts);
        let body = json(&out.body);
        assert!(body.get("thinking").is_none(), "{body}");
        assert!(out.dropped.contains(&"reasoning.effort".to_string()));
    }
    // A tool turn answered and closed by a text turn needs nothing.
    let mut r = req.clone();
    r.messages.push(Message {
        role: Role::Assistant,
        parts: vec![call.clone()],
    });
    r.messages.push(result.clone());
    r.messages.push(Message {
        role: Role::Assistant,
        parts: vec![Part::text("It is 4.")],
    });
    r.messages.push(Message {
        role: Role::User,
        parts: vec![Part::text("thanks")],
    });
    let body = json(&anthropic::render(&r, "m", false).body);
    assert_eq!(body["thinking"]["budget_tokens"], 2048, "{body}");
}

// ---------------------------------------------------------------------------
// Parse errors
// ---------------------------------------------------------------------------

fn body_with(extra: &str) -> String {
    format!(
        r#"{{"model":"claude-sonnet-4.5","max_tokens":100,"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#
    )
}

fn msgs(messages: &str) -> String {
    format!(r#"{{"model":"m","max_tokens":100,"messages":{messages}}}"#)
}

#[test]
fn parse_errors_name_the_field_with_a_stable_code() {
    use ErrorCode::*;
    let long = "x".repeat(65_537);
    let cases: Vec<(String, ErrorCode, Option<&str>)> = vec![
        ("{not json".into(), InvalidJson, None),
        ("[1,2]".into(), InvalidRequest, None),
        (
            r#"{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}"#.into(),
            InvalidParameter,
            Some("model"),
        ),
        (
            r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#.into(),
            InvalidParameter,
            Some("max_tokens"),
        ),
        (
            r#"{"model":"m","max_tokens":"ten","messages":[]}"#.into(),
            InvalidParameter,
            Some("max_tokens"),
        ),
        (
            r#"{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#.into(),
            InvalidParameter,
            Some("max_tokens"),
        ),
        (
            r#"{"model":"m","max_tokens":10}"#.into(),
            InvalidParameter,
            Some("messages"),
        ),
        (msgs("[]"), InvalidParameter, Some("messages")),
        (msgs(r#"{"a":1}"#), InvalidParameter, Some("messages")),
        (
            msgs(r#"[{"role":"user","content":"x","agent":"me"}]"#),
            InvalidParameter,
            Some("messages[0].agent"),
        ),
        (
            msgs(r#"[{"role":"system","content":"x"}]"#),
            InvalidParameter,
            Some("messages[0].role"),
        ),
        (
            msgs(r#"[{"role":7,"content":"x"}]"#),
            InvalidParameter,
            Some("messages[0].role"),
        ),
        (
            msgs(r#"[{"role":"user"}]"#),
            InvalidParameter,
            Some("messages[0].content"),
        ),
        (
            msgs(r#"[{"role":"user","content":[{"type":"video"}]}]"#),
            InvalidParameter,
            Some("messages[0].content[0].type"),
        ),
        (
            msgs(r#"[{"role":"user","content":[{"type":"text"}]}]"#),
            InvalidParameter,
            Some("messages[0].content[0].text"),
        ),
        (
            msgs(
                r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":5}]}]"#,
            ),
            InvalidParameter,
            Some("messages[0].content[1]"),
        ),
        (
            msgs(
                r#"[{"role":"user","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]}]"#,
            ),
            InvalidParameter,
            Some("messages[0].content[0].type"),
        ),
        (
            msgs(r#"[{"role":"assistant","content":[{"type":"tool_use","name":"f","input":{}}]}]"#),
            InvalidParameter,
            Some("messages[0].content[0].id"),
        ),
        (
            msgs(
                r#"[{"role":"user","content":"x"},{"role":"user","content":[{"type":"tool_result","content":"r"}]}]"#,
            ),
            InvalidParameter,
            Some("messages[1].content[0].tool_use_id"),
        ),
        (
            msgs(
                r#"[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"tool_use"}]}]}]"#,
            ),
            InvalidParameter,
            Some("messages[0].content[0].content[0].type"),
        ),
        (
            msgs(
                r#"[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]"#,
            ),
            UnsupportedCapability,
            Some("messages[0].content[0]"),
        ),
        (
            msgs(
                r#"[{"role":"user","content":[{"type":"text","text":"x"},{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"AA=="}}]}]"#,
            ),
            UnsupportedCapability,
            Some("messages[0].content[1]"),
        ),
        (
            msgs(
                r#"[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]}]"#,
            ),
            UnsupportedCapability,
            Some("messages[0].content[0].content[0]"),
        ),
        (
            body_with(r#","temperature":1.5"#),
            InvalidParameter,
            Some("temperature"),
        ),
        (
            body_with(r#","top_p":"x""#),
            InvalidParameter,
            Some("top_p"),
        ),
        (body_with(r#","top_k":-1"#), InvalidParameter, Some("top_k")),
        (
            body_with(r#","stream":"yes""#),
            InvalidParameter,
            Some("stream"),
        ),
        (
            body_with(r#","stop_sequences":"END""#),
            InvalidParameter,
            Some("stop_sequences"),
        ),
        (
            body_with(r#","seed":42"#),
            UnsupportedParameter,
            Some("seed"),
        ),
        (
            body_with(r#","logit_bias":{}"#),
            UnsupportedParameter,
            Some("logit_bias"),
        ),
        (
            body_with(r#","provider":{"order":["a"]}"#),
            UnsupportedParameter,
            Some("provider"),
        ),
        (
            body_with(r#","system":[{"type":"image"}]"#),
            InvalidParameter,
            Some("system[0].type"),
        ),
        (
            body_with(r#","system":5"#),
            InvalidParameter,
            Some("system"),
        ),
        (
            body_with(r#","tools":[{"name":"f"}]"#),
            InvalidParameter,
            Some("tools[0].input_schema"),
        ),
        (
            body_with(r#","tools":[{"name":"f","input_schema":{}},{"input_schema":{}}]"#),
            InvalidParameter,
            Some("tools[1].name"),
        ),
        (
            body_with(&format!(
                r#","tools":[{{"name":"f","description":"{long}","input_schema":{{}}}}]"#
            )),
            InvalidParameter,
            Some("tools[0].description"),
        ),
        (
            body_with(r#","tools":[5]"#),
            InvalidParameter,
            Some("tools[0]"),
        ),
        (
            body_with(r#","tool_choice":{"type":"required"}"#),
            InvalidParameter,
            Some("tool_choice.type"),
        ),
        (
            body_with(r#","tool_choice":{"type":"tool"}"#),
            InvalidParameter,
            Some("tool_choice.name"),
        ),
        (
            body_with(r#","thinking":{"type":"enabled","budget_tokens":10}"#),
            InvalidParameter,
            Some("thinking.budget_tokens"),
        ),
        (
            body_with(r#","thinking":{"type":"enabled"}"#),
            InvalidParameter,
            Some("thinking.budget_tokens"),
        ),
        (
            body_with(r#","thinking":{"type":"deep"}"#),
            InvalidParameter,
            Some("thinking.type"),
        ),
        (
            body_with(r#","output_config":{"format":{"type":"json_object"}}"#),
            InvalidParameter,
            Some("output_config.format.type"),
        ),
        (
            body_with(r#","output_config":{"format":{"type":"json_schema"}}"#),
            InvalidParameter,
            Some("output_config.format.schema"),
        ),
        (
            body_with(r#","metadata":"u""#),
            InvalidParameter,
            Some("metadata"),
        ),
    ];
    for (body, code, param) in &cases {
        let err = messages::parse(body.as_bytes())
            .expect_err(&format!("accepted: {}", &body[..body.len().min(200)]));
        assert_eq!(err.code, *code, "{body:.200}: {err}");
        assert_eq!(err.param.as_deref(), *param, "{body:.200}: {err}");
        assert_eq!(err.status, 400);
        // The messages envelope of every parse error.
        let env = json(&err.to_body(sluice_filters::Format::Anthropic));
        assert_eq!(env["type"], "error");
        assert_eq!(env["error"]["type"], "invalid_request_error");
    }
}

#[test]
fn parse_keeps_unknowns_and_nulls_mean_absent() {
    let req = messages::parse(
        body_with(r#","temperature":null,"seed":null,"container":"c_1","top_k":5"#).as_bytes(),
    )
    .unwrap();
    assert_eq!(req.temperature, None);
    assert_eq!(req.top_k, Some(5));
    assert_eq!(req.extras.len(), 1);
    assert_eq!(req.extras[0].name, "container");
    assert_eq!(req.extras[0].value.get(), r#""c_1""#);
    // Adaptive thinking asks for reasoning without a budget; disabled asks nothing.
    let req = messages::parse(body_with(r#","thinking":{"type":"adaptive"}"#).as_bytes()).unwrap();
    assert_eq!(req.reasoning, Some(Default::default()));
    assert_eq!(req.extras[0].name, "thinking");
    let req = messages::parse(body_with(r#","thinking":{"type":"disabled"}"#).as_bytes()).unwrap();
    assert_eq!(req.reasoning, None);
    assert!(req.extras.is_empty());
    // output_config with more than a format stays whole for Anthropic rungs.
    let req = messages::parse(
        body_with(r#","output_config":{"effort":"low","format":{"type":"json_schema","schema":{"type":"object"}}}"#)
            .as_bytes(),
    )
    .unwrap();
    assert!(req.wants_structured());
    assert_eq!(req.extras[0].name, "output_config");
}

// ---------------------------------------------------------------------------
// Whole answers
// ---------------------------------------------------------------------------

fn answer_case(name: &str, tail: &Tail) -> Response {
    let events = anthropic::decode(&read(&format!("{name}.json"))).unwrap();
    check_json(
        &format!("{name}.events.json"),
        &serde_json::to_value(&events).unwrap(),
    );
    let resp = Response::from_events(&events);
    let out = messages::render(&resp, &meta(), tail);
    check_json(&format!("{name}.message.json"), &json(&out));
    resp
}

#[test]
fn whole_tool_use_answer_renders_as_a_message() {
    let resp = answer_case("answer_tool_use", &tail());
    assert_eq!(resp.finish, Some(FinishReason::ToolCalls));
    // Canonical input includes cache reads; the message splits them out again.
    assert_eq!(resp.usage.unwrap().input_tokens, 412 + 1800);
    assert_eq!(resp.usage.unwrap().cached_tokens, 1800);
}

#[test]
fn whole_thinking_answer_keeps_signature_and_redacted_data() {
    let resp = answer_case("answer_thinking", &Tail::default());
    assert!(matches!(
        &resp.parts[0],
        Part::Thinking { signature: Some(s), .. } if s.starts_with("ErUB")
    ));
    assert!(matches!(
        &resp.parts[1],
        Part::EncryptedReasoning { id: None, .. }
    ));
    // Another maker's unsigned thinking renders with an empty signature; replayed,
    // it is read (the route's policy decides) but never sent to Claude.
    let foreign = Response {
        parts: vec![
            Part::Thinking {
                text: "hmm".into(),
                signature: None,
            },
            Part::text("ok"),
        ],
        finish: Some(FinishReason::Stop),
        ..Response::default()
    };
    let v = json(&messages::render(&foreign, &meta(), &Tail::default()));
    assert_eq!(
        v["content"][0],
        serde_json::json!({"type":"thinking","thinking":"hmm","signature":""})
    );
    let replay = format!(
        r#"{{"model":"m","max_tokens":9,"messages":[{{"role":"user","content":"q"}},{{"role":"assistant","content":{}}}]}}"#,
        v["content"]
    );
    let req = messages::parse(replay.as_bytes()).unwrap();
    assert_eq!(req.messages[1].parts[1], Part::text("ok"));
    assert!(matches!(
        &req.messages[1].parts[0],
        Part::Thinking {
            signature: None,
            ..
        }
    ));
    let sent = json(&anthropic::render(&req, "claude-x", false).body);
    assert_eq!(sent["messages"][1]["content"], "ok");
}

#[test]
fn whole_empty_answer_is_the_empty_shape() {
    let resp = answer_case("answer_empty", &Tail::default());
    assert!(resp.parts.is_empty());
    assert!(!resp.has_content());
}

#[test]
fn whole_refusal_answer_refuses() {
    let resp = answer_case("answer_refusal", &Tail::default());
    assert_eq!(resp.refusal, Some((RefusalReason::Unspecified, None)));
    assert_eq!(resp.finish, Some(FinishReason::ContentFilter));
}

#[test]
fn whole_max_tokens_answer_is_a_length_stop() {
    let resp = answer_case("answer_max_tokens", &Tail::default());
    assert_eq!(resp.finish, Some(FinishReason::Length));
}

#[test]
fn error_objects_decode_to_errors_or_refusals() {
    let overloaded =
        br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    assert_eq!(
        anthropic::decode(overloaded).unwrap(),
        vec![Event::Error {
            message: "overloaded_error: Overloaded".into()
        }]
    );
    let blocked = br#"{"type":"error","error":{"details":null,"type":"invalid_request_error","message":"Output blocked by content filtering policy"},"request_id":"req_1"}"#;
    assert_eq!(
        anthropic::decode(blocked).unwrap(),
        vec![Event::Refusal {
            reason: RefusalReason::ContentPolicy,
            text: None
        }]
    );
    assert!(anthropic::decode(b"<html>").is_err());
}

#[test]
fn render_maps_foreign_finishes_and_cuts() {
    let mut resp = Response {
        id: Some("chatcmpl-1".into()),
        model: None,
        parts: vec![Part::text("Hi")],
        finish: Some(FinishReason::Stop),
        finish_raw: Some("stop".into()),
        usage: Some(Usage {
            input_tokens: 10,
            cached_tokens: 4,
            cache_write_tokens: 3,
            cache_write_1h_tokens: 0,
            output_tokens: 2,
            reasoning_tokens: 0,
            web_search_requests: 0,
            cost_micro_usd: None,
        }),
        ..Response::default()
    };
    let v = json(&messages::render(&resp, &meta(), &Tail::default()));
    assert_eq!(v["id"], "msg_gw_01abc");
    assert_eq!(v["model"], "claude-sonnet-4.5");
    assert_eq!(v["stop_reason"], "end_turn");
    // Anthropic's input_tokens leaves out cache reads and writes alike.
    assert_eq!(v["usage"]["input_tokens"], 3);
    assert_eq!(v["usage"]["cache_read_input_tokens"], 4);
    assert_eq!(v["usage"]["cache_creation_input_tokens"], 3);
    assert!(v.get("x_gateway").is_none());
    let cut = Tail {
        cut: true,
        ..Tail::default()
    };
    let v = json(&messages::render(&resp, &meta(), &cut));
    assert_eq!(v["stop_reason"], "max_tokens");
    resp.finish = Some(FinishReason::StopSequence);
    resp.finish_raw = None;
    let v = json(&messages::render(&resp, &meta(), &Tail::default()));
    assert_eq!(v["stop_reason"], "stop_sequence");
    // A tool call with arguments that are not a JSON object gets `{}`.
    resp.parts = vec![Part::ToolCall {
        id: "call_1".into(),
        name: "f".into(),
        arguments: "[1,".into(),
    }];
    resp.finish = Some(FinishReason::ToolCalls);
    let v = json(&messages::render(&resp, &meta(), &Tail::default()));
    assert_eq!(v["content"][0]["input"], serde_json::json!({}));
    assert_eq!(v["stop_reason"], "tool_use");
}

// ---------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------

/// Feeds SSE bytes in the given pieces through the SSE decoder and the wire's
/// stream decoder.
fn decode_pieces<'a>(pieces: impl Iterator<Item = &'a [u8]>) -> (Vec<Event>, bool) {
    let mut sse = SseDecoder::new();
    let mut dec = anthropic::Decoder::new();
    let mut events = Vec::new();
    for p in pieces {
        sse.push(p);
        while let Some(ev) = sse.next_event() {
            dec.frame(ev.event.as_deref(), ev.data.as_bytes(), &mut events)
                .unwrap();
        }
    }
    (events, dec.done())
}

fn encode(events: &[Event], tail: &Tail) -> String {
    let mut enc = messages::Encoder::new(meta());
    let mut out = Vec::new();
    for e in events {
        enc.event(e, &mut out);
    }
    enc.end(tail, &mut out);
    String::from_utf8(out).unwrap()
}

/// Checks the Messages SSE protocol: start, blocks opened in index order and
/// closed before the next opens, deltas only into the open block, delta, stop.
fn assert_valid_messages_sse(text: &str) -> Vec<Value> {
    let mut sse = SseDecoder::new();
    sse.push(text.as_bytes());
    let frames: Vec<(String, Value)> = std::iter::from_fn(|| sse.next_event())
        .map(|e| (e.event.unwrap(), json(e.data.as_bytes())))
        .collect();
    assert!(frames.len() >= 3, "{text}");
    assert_eq!(frames[0].0, "message_start");
    assert_eq!(frames[frames.len() - 2].0, "message_delta");
    assert_eq!(frames[frames.len() - 1].0, "message_stop");
    let mut open: Option<u64> = None;
    let mut next = 0u64;
    for (name, data) in &frames {
        assert_eq!(data["type"], name.as_str(), "type mirrors the event name");
        match name.as_str() {
            "content_block_start" => {
                assert_eq!(open, None, "a block is still open: {text}");
                assert_eq!(data["index"], next);
                open = Some(next);
                next += 1;
            }
            "content_block_delta" => assert_eq!(data["index"].as_u64(), open),
            "content_block_stop" => {
                assert_eq!(data["index"].as_u64(), open);
                open = None;
            }
            "message_delta" | "message_stop" => assert_eq!(open, None),
            _ => {}
        }
    }
    frames.into_iter().map(|(_, d)| d).collect()
}

fn stream_case(name: &str, tail: &Tail) -> Vec<Event> {
    let bytes = read(&format!("{name}.sse"));
    let (events, done) = decode_pieces(std::iter::once(&bytes[..]));
    // The same events whatever the read boundaries: every two-piece split, and
    // runs of small pieces (which split multi-byte characters too).
    for at in 0..=bytes.len() {
        let (a, b) = bytes.split_at(at);
        let (split, split_done) = decode_pieces([a, b].into_iter());
        assert_eq!(split, events, "{name} split at byte {at}");
        assert_eq!(split_done, done);
    }
    for size in [1, 2, 3, 5, 7, 13, 64] {
        assert_eq!(
            decode_pieces(bytes.chunks(size)).0,
            events,
            "{name} in {size}s"
        );
    }
    check_json(
        &format!("{name}.events.json"),
        &serde_json::to_value(&events).unwrap(),
    );
    let out = encode(&events, tail);
    assert_valid_messages_sse(&out);
    check_text(&format!("{name}.out.sse"), &out);
    events
}

/// Our own SSE read back with our decoder folds to the same answer.
fn assert_reads_back(events: &[Event], tail: &Tail) {
    let out = encode(events, tail);
    let (again, done) = decode_pieces(std::iter::once(out.as_bytes()));
    assert!(done);
    let (a, b) = (Response::from_events(events), Response::from_events(&again));
    assert_eq!(a.parts, b.parts);
    assert_eq!(a.finish, b.finish);
    assert_eq!(a.refusal, b.refusal);
    assert_eq!(a.usage, b.usage);
}

#[test]
fn stream_with_text_and_two_tool_calls() {
    let events = stream_case("stream_tool_use", &tail());
    let resp = Response::from_events(&events);
    assert_eq!(
        resp.parts[1],
        Part::ToolCall {
            id: "toolu_01Qw3eR5tY7uI9oP2aS4dF6g".into(),
            name: "weather".into(),
            arguments: r#"{"city": "Lyon", "day": "tomorrow"}"#.into()
        }
    );
    assert!(matches!(&resp.parts[2], Part::ToolCall { name, .. } if name == "air_quality"));
    assert_eq!(resp.usage.unwrap().cached_tokens, 2048);
    assert_reads_back(&events, &Tail::default());
}

#[test]
fn stream_with_thinking_signature_and_redacted_thinking() {
    let events = stream_case("stream_thinking", &Tail::default());
    let resp = Response::from_events(&events);
    assert!(matches!(
        &resp.parts[0],
        Part::Thinking { signature: Some(s), text } if s.ends_with("+/==") && text.contains('…')
    ));
    assert_reads_back(&events, &Tail::default());
}

#[test]
fn stream_refusal_ends_with_stop_reason_refusal() {
    let events = stream_case("stream_refusal", &Tail::default());
    assert!(events.contains(&Event::Refusal {
        reason: RefusalReason::Unspecified,
        text: None
    }));
    // message_delta carried only output_tokens: input stays from message_start.
    let usage = Response::from_events(&events).usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (33, 4));
    assert_reads_back(&events, &Tail::default());
}

#[test]
fn stream_max_tokens_with_crlf_lines() {
    let events = stream_case("stream_max_tokens", &Tail::default());
    assert_eq!(
        Response::from_events(&events).finish,
        Some(FinishReason::Length)
    );
    assert_reads_back(&events, &Tail::default());
}

#[test]
fn stream_empty_answer() {
    let events = stream_case("stream_empty", &Tail::default());
    assert!(!Response::from_events(&events).has_content());
    assert_reads_back(&events, &Tail::default());
}

#[test]
fn stream_error_mid_answer_settles_as_a_cut() {
    let cut = Tail {
        usage: Usage {
            input_tokens: 20,
            cached_tokens: 0,
            cache_write_tokens: 0,
            cache_write_1h_tokens: 0,
            output_tokens: 2,
            reasoning_tokens: 0,
            web_search_requests: 0,
            cost_micro_usd: None,
        },
        cut: true,
        ..tail()
    };
    let events = stream_case("stream_error", &cut);
    assert_eq!(
        events.last(),
        Some(&Event::Error {
            message: "overloaded_error: Overloaded".into()
        })
    );
}

#[test]
fn encoder_switches_blocks_with_fresh_indexes() {
    let events = vec![
        Event::Start {
            id: None,
            model: None,
        },
        Event::Thinking { text: "a".into() },
        Event::ThinkingSignature {
            signature: "sig".into(),
        },
        Event::Text { text: "".into() },
        Event::Text { text: "b".into() },
        Event::ToolCallStart {
            index: 0,
            id: "call_1".into(),
            name: "f".into(),
        },
        Event::ToolCallArgs {
            index: 0,
            arguments: "{}".into(),
        },
        Event::ToolCallStart {
            index: 1,
            id: "call_2".into(),
            name: "g".into(),
        },
        Event::EncryptedReasoning {
            data: "x".into(),
            id: None,
        },
        Event::Text { text: "c".into() },
        Event::Refusal {
            reason: RefusalReason::ContentPolicy,
            text: Some("no".into()),
        },
    ];
    let out = encode(&events, &Tail::default());
    let frames = assert_valid_messages_sse(&out);
    let starts: Vec<&str> = frames
        .iter()
        .filter(|f| f["type"] == "content_block_start")
        .map(|f| f["content_block"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        starts,
        [
            "thinking",
            "text",
            "tool_use",
            "tool_use",
            "redacted_thinking",
            "text"
        ]
    );
    // Thinking after a signed thinking block opens a new block.
    let again = encode(
        &[
            Event::Thinking { text: "a".into() },
            Event::ThinkingSignature {
                signature: "s1".into(),
            },
            Event::Thinking { text: "b".into() },
        ],
        &Tail::default(),
    );
    let thinking_blocks = assert_valid_messages_sse(&again)
        .iter()
        .filter(|f| f["type"] == "content_block_start")
        .count();
    assert_eq!(thinking_blocks, 2);
    let start = &frames[0]["message"];
    assert_eq!(start["id"], "msg_gw_01abc");
    assert_eq!(start["model"], "claude-sonnet-4.5");
    assert_eq!(start["provider"], "anthropic:claude-sonnet-4-5-20250929");
    let delta = &frames[frames.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "refusal");
    assert!(delta.get("x_gateway").is_none());
}

#[test]
fn error_frame_is_a_messages_error_event() {
    let err = sluice_filters::ApiError::new(ErrorCode::AllRoutesFailed, "every rung failed");
    let frame = String::from_utf8(messages::error_frame(&err)).unwrap();
    let data = frame
        .strip_prefix("event: error\ndata: ")
        .and_then(|r| r.strip_suffix("\n\n"))
        .unwrap();
    assert_eq!(
        json(data.as_bytes()),
        serde_json::json!({"type":"error","error":{"type":"api_error","message":"every rung failed"}})
    );
}

// ---------------------------------------------------------------------------
// Round trip: canonical -> anthropic body -> messages parse
// ---------------------------------------------------------------------------

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,?é]{1,12}"
}

fn image() -> impl Strategy<Value = Part> {
    prop_oneof![
        "[A-Za-z0-9+/]{4,12}".prop_map(|d| Part::Image {
            url: format!("data:image/png;base64,{d}"),
            detail: None
        }),
        "[a-z]{1,8}".prop_map(|n| Part::Image {
            url: format!("https://img.test/{n}.png"),
            detail: Some("low".into())
        }),
    ]
}

fn arguments() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::btree_map("[a-z]{1,5}", any::<i32>(), 0..3)
            .prop_map(|m| serde_json::to_string(&m).unwrap()),
        1 => Just("not json".to_string()),
    ]
}

fn user_part() -> impl Strategy<Value = Part> {
    prop_oneof![3 => text().prop_map(Part::text), 1 => image()]
}

fn assistant_part() -> impl Strategy<Value = Part> {
    prop_oneof![
        3 => text().prop_map(Part::text),
        2 => ("[a-z0-9]{4}", "[a-z_]{1,8}", arguments()).prop_map(|(id, name, arguments)| {
            Part::ToolCall { id: format!("toolu_{id}"), name, arguments }
        }),
        1 => (text(), proptest::option::of("[A-Za-z0-9+/=]{8}"))
            .prop_map(|(text, signature)| Part::Thinking { text, signature }),
        1 => (text(), proptest::option::of("rs_[0-9]{2}"))
            .prop_map(|(data, id)| Part::EncryptedReasoning { data, id }),
    ]
}

fn tool_result() -> impl Strategy<Value = Part> {
    (
        "[a-z0-9]{4}",
        prop::collection::vec(
            prop_oneof![3 => text().prop_map(Part::text), 1 => image()],
            0..3,
        ),
        any::<bool>(),
    )
        .prop_map(|(id, content, is_error)| Part::ToolResult {
            call_id: format!("toolu_{id}"),
            content,
            is_error,
        })
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        prop::collection::vec(user_part(), 1..4).prop_map(|parts| Message {
            role: Role::User,
            parts
        }),
        prop::collection::vec(assistant_part(), 1..4).prop_map(|parts| Message {
            role: Role::Assistant,
            parts
        }),
        prop::collection::vec(tool_result(), 1..3).prop_map(|parts| Message {
            role: Role::Tool,
            parts
        }),
    ]
}

fn tool() -> impl Strategy<Value = Tool> {
    (
        "[a-z_]{1,8}",
        proptest::option::of(text()),
        proptest::option::of(any::<bool>()),
    )
        .prop_map(|(name, description, strict)| Tool {
            name,
            description,
            parameters: serde_json::value::RawValue::from_string(
                r#"{"type":"object","properties":{"q":{"type":"string"}}}"#.into(),
            )
            .unwrap(),
            strict,
        })
}

fn tool_choice() -> impl Strategy<Value = Option<ToolChoice>> {
    proptest::option::of(prop_oneof![
        Just(ToolChoice::Auto),
        Just(ToolChoice::None),
        Just(ToolChoice::Required),
        "[a-z]{1,6}".prop_map(|name| ToolChoice::Tool { name }),
    ])
}

prop_compose! {
    fn request()(
        stream in any::<bool>(),
        system in prop::collection::vec(text(), 0..3),
        messages in prop::collection::vec(message(), 1..8),
        tools in prop::collection::vec(tool(), 0..3),
        tool_choice in tool_choice(),
        parallel_tool_calls in proptest::option::of(any::<bool>()),
        max_tokens in proptest::option::of(1u64..200_000),
        temperature in proptest::option::of(prop_oneof![Just(0.0), Just(0.25), Just(0.7), Just(1.0)]),
        top_p in proptest::option::of(prop_oneof![Just(0.5), Just(0.95)]),
        top_k in proptest::option::of(0u64..100),
        stop in prop::collection::vec(text(), 0..2),
        user in proptest::option::of("[a-z0-9-]{1,10}"),
    ) -> Request {
        Request {
            model: "alpha-1.0".into(),
            stream,
            system,
            messages,
            tools,
            tool_choice,
            parallel_tool_calls,
            max_tokens,
            temperature,
            top_p,
            top_k,
            stop,
            user,
            ..Request::default()
        }
    }
}

/// What survives the Anthropic wire: unsigned thinking and item-id reasoning are
/// left out, image detail is lost, turns of one Anthropic role merge (tool results
/// first), invalid arguments become `{}`.
fn normalize_messages(messages: &[Message]) -> Vec<Message> {
    let keep = |p: &Part| -> Option<Part> {
        match p {
            Part::Text { text } if text.is_empty() => None,
            Part::Thinking {
                signature: None, ..
            } => None,
            Part::EncryptedReasoning { id: Some(_), .. } => None,
            Part::Image { url, .. } => Some(Part::Image {
                url: url.clone(),
                detail: None,
            }),
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                let object = serde_json::from_str::<Value>(arguments).is_ok_and(|v| v.is_object());
                Some(Part::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: if object {
                        arguments.clone()
                    } else {
                        "{}".into()
                    },
                })
            }
            Part::ToolResult {
                call_id,
                content,
                is_error,
            } => {
                let content = match content.as_slice() {
                    [Part::Text { .. }] => content.clone(),
                    _ => content.iter().filter_map(keep_inner).collect(),
                };
                Some(Part::ToolResult {
                    call_id: call_id.clone(),
                    content,
                    is_error: *is_error,
                })
            }
            other => Some(other.clone()),
        }
    };
    let mut merged: Vec<(bool, Vec<Part>)> = Vec::new();
    for m in messages {
        let assistant = m.role == Role::Assistant;
        let parts: Vec<Part> = m.parts.iter().filter_map(keep).collect();
        match merged.last_mut() {
            Some((a, ps)) if *a == assistant => ps.extend(parts),
            _ if parts.is_empty() => {}
            _ => merged.push((assistant, parts)),
        }
    }
    let mut out = Vec::new();
    for (assistant, parts) in merged {
        if assistant {
            out.push(Message {
                role: Role::Assistant,
                parts,
            });
            continue;
        }
        let (results, rest): (Vec<Part>, Vec<Part>) = parts
            .into_iter()
            .partition(|p| matches!(p, Part::ToolResult { .. }));
        if !results.is_empty() {
            out.push(Message {
                role: Role::Tool,
                parts: results,
            });
        }
        if !rest.is_empty() {
            out.push(Message {
                role: Role::User,
                parts: rest,
            });
        }
    }
    out
}

fn keep_inner(p: &Part) -> Option<Part> {
    match p {
        Part::Text { text } if text.is_empty() => None,
        Part::Image { url, .. } => Some(Part::Image {
            url: url.clone(),
            detail: None,
        }),
        other => Some(other.clone()),
    }
}

fn expected_after_round_trip(req: &Request, model: &str) -> Request {
    let has_tools = !req.tools.is_empty();
    let no_parallel = has_tools
        && req.parallel_tool_calls == Some(false)
        && req.tool_choice != Some(ToolChoice::None);
    let tool_choice = match &req.tool_choice {
        _ if !has_tools => None,
        None if no_parallel => Some(ToolChoice::Auto),
        c => c.clone(),
    };
    Request {
        model: model.into(),
        stream: req.stream,
        system: req.system.clone(),
        messages: normalize_messages(&req.messages),
        tools: req.tools.clone(),
        tool_choice,
        parallel_tool_calls: no_parallel.then_some(false),
        max_tokens: Some(req.max_tokens.unwrap_or(anthropic::DEFAULT_MAX_TOKENS)),
        temperature: req.temperature,
        // Recent Claude models refuse both: temperature wins.
        top_p: req.top_p.filter(|_| req.temperature.is_none()),
        top_k: req.top_k,
        stop: req.stop.clone(),
        user: req.user.clone(),
        ..Request::default()
    }
}

/// Removes image and document parts, inside tool results too.
fn strip_media(parts: &mut Vec<Part>) {
    parts.retain(|p| !matches!(p, Part::Image { .. } | Part::Document { .. }));
    for p in parts {
        if let Part::ToolResult { content, .. } = p {
            strip_media(content);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn canonical_survives_the_anthropic_wire(mut req in request()) {
        // The messages route reads text only: media parts are rendered (golden
        // files check them) but cannot come back through its parser.
        for m in &mut req.messages {
            strip_media(&mut m.parts);
        }
        req.messages.retain(|m| !m.parts.is_empty());
        // Anthropic needs a message; a request of only droppable parts has none.
        prop_assume!(!normalize_messages(&req.messages).is_empty());
        let rendered = anthropic::render(&req, "claude-x", req.stream);
        let both = req.temperature.is_some() && req.top_p.is_some();
        let dropped: &[&str] = if both { &["top_p"] } else { &[] };
        prop_assert_eq!(&rendered.dropped, dropped);
        let mut parsed = messages::parse(&rendered.body).map_err(|e| {
            TestCaseError::fail(format!("{e}: {}", String::from_utf8_lossy(&rendered.body)))
        })?;
        // Where each part sat in the body is the parser's note for errors.
        parsed.origins.clear();
        prop_assert_eq!(parsed, expected_after_round_trip(&req, "claude-x"));
    }

    #[test]
    fn whole_answer_and_its_stream_fold_alike(req in request()) {
        // Any answer the encoder writes reads back through the stream decoder.
        let mut events = vec![Event::Start { id: Some("msg_1".into()), model: Some("m".into()) }];
        let mut calls = 0;
        for m in req.messages.iter().filter(|m| m.role == Role::Assistant) {
            for p in &m.parts {
                match p {
                    Part::Text { text } => events.push(Event::Text { text: text.clone() }),
                    Part::ToolCall { id, name, arguments } => {
                        events.push(Event::ToolCallStart { index: calls, id: id.clone(), name: name.clone() });
                        events.push(Event::ToolCallArgs { index: calls, arguments: arguments.clone() });
                        calls += 1;
                    }
                    _ => {}
                }
            }
        }
        events.push(Event::Finish { reason: FinishReason::Stop, raw: Some("end_turn".into()), stop_sequence: None });
        let out = encode(&events, &Tail::default());
        assert_valid_messages_sse(&out);
        let (again, done) = decode_pieces(out.as_bytes().chunks(17));
        prop_assert!(done);
        let mut c = Collector::default();
        again.iter().for_each(|e| c.push(e));
        prop_assert_eq!(c.finish().parts, Response::from_events(&events).parts);
    }
}

#[test]
fn stop_sequence_names_the_sequence_that_matched() {
    // Anthropic names it, whole and streamed; the message repeats it.
    let resp = answer_case("answer_stop_sequence", &Tail::default());
    assert_eq!(resp.finish, Some(FinishReason::StopSequence));
    assert_eq!(resp.stop_sequence.as_deref(), Some("\n3."));
    let v = json(&messages::render(&resp, &meta(), &Tail::default()));
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "\n3.");
    let events = stream_case("stream_stop_sequence", &Tail::default());
    let frames = assert_valid_messages_sse(&encode(&events, &Tail::default()));
    let delta = frames
        .iter()
        .find(|f| f["type"] == "message_delta")
        .unwrap();
    assert_eq!(delta["delta"]["stop_sequence"], "\n3.");

    // A provider that does not name the match: the caller's only sequence.
    let unnamed = vec![
        Event::Start {
            id: None,
            model: None,
        },
        Event::Text { text: "a".into() },
        Event::Finish {
            reason: FinishReason::StopSequence,
            raw: None,
            stop_sequence: None,
        },
    ];
    let one = Meta {
        stop_sequence: Some("END".into()),
        prompt_estimate: 0,
        echo: String::new(),
        ..meta()
    };
    let resp = Response::from_events(&unnamed);
    let v = json(&messages::render(&resp, &one, &Tail::default()));
    assert_eq!(v["stop_sequence"], "END");
    let mut enc = messages::Encoder::new(one.clone());
    let mut out = Vec::new();
    for e in &unnamed {
        enc.event(e, &mut out);
    }
    enc.end(&Tail::default(), &mut out);
    let frames = assert_valid_messages_sse(std::str::from_utf8(&out).unwrap());
    let delta = frames
        .iter()
        .find(|f| f["type"] == "message_delta")
        .unwrap();
    assert_eq!(delta["delta"]["stop_sequence"], "END");
    // Several given and none named, or a turn that ended on its own: null.
    let v = json(&messages::render(&resp, &meta(), &Tail::default()));
    assert!(v["stop_sequence"].is_null());
    let natural = Response {
        finish: Some(FinishReason::Stop),
        ..resp
    };
    let v = json(&messages::render(&natural, &one, &Tail::default()));
    assert_eq!(v["stop_reason"], "end_turn");
    assert!(v["stop_sequence"].is_null());
}

#[test]
fn one_hour_cache_writes_are_told_apart() {
    let body = br#"{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":120,"cache_read_input_tokens":30,"cache_creation":{"ephemeral_5m_input_tokens":80,"ephemeral_1h_input_tokens":40},"output_tokens":2}}"#;
    let u = Response::from_events(&anthropic::decode(body).unwrap())
        .usage
        .unwrap();
    assert_eq!(u.input_tokens, 160);
    assert_eq!(u.cached_tokens, 30);
    assert_eq!(u.cache_write_tokens, 120);
    assert_eq!(u.cache_write_1h_tokens, 40);
    // Streamed: message_start carries the split, message_delta only output.
    let sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":120,\"cache_read_input_tokens\":0,\"cache_creation\":{\"ephemeral_5m_input_tokens\":80,\"ephemeral_1h_input_tokens\":40},\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":5}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let (events, done) = decode_pieces(std::iter::once(sse.as_bytes()));
    assert!(done);
    let u = Response::from_events(&events).usage.unwrap();
    assert_eq!(u.cache_write_tokens, 120);
    assert_eq!(u.cache_write_1h_tokens, 40);
    assert_eq!(u.output_tokens, 5);
}
