//! The OpenAI responses format end to end: inbound parsing, the responses wire's
//! request rendering (translated and native), answer decoding (whole and streamed)
//! and re-encoding for a responses client, against golden files under
//! `tests/golden/responses/`. Set `UPDATE_GOLDEN=1` to rewrite the expected files
//! (then review every change by hand).

use proptest::prelude::*;
use serde_json::{json, Value};
use sluice_filters::inbound::responses as inbound;
use sluice_filters::ir::{
    Event, Extra, Message, Meta, Part, Reasoning, Request, Response, ResponseFormat, Role,
    StreamDecoder, StreamEncoder, Tail, Tool, ToolChoice,
};
use sluice_filters::sse::SseDecoder;
use sluice_filters::upstream::openai_responses as wire;
use sluice_filters::usage::Usage;
use std::fs;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------
// Golden files

fn dir(area: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/responses")
        .join(area)
}

fn updating() -> bool {
    std::env::var_os("UPDATE_GOLDEN").is_some()
}

/// The cases of an area: the stems of the files ending in `suffix`.
fn cases(area: &str, suffix: &str) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(dir(area))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(suffix).map(str::to_string)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no {suffix} cases in {area}");
    out
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Compares `actual` with the expected file (as JSON values: member order does not
/// matter), or writes it when updating.
fn check(path: &Path, actual: &Value) {
    if updating() {
        fs::write(path, serde_json::to_string_pretty(actual).unwrap() + "\n").unwrap();
        return;
    }
    let expected: Value =
        serde_json::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        &expected == actual,
        "{} differs:\n--- expected\n{}\n--- actual\n{}",
        path.display(),
        serde_json::to_string_pretty(&expected).unwrap(),
        serde_json::to_string_pretty(actual).unwrap()
    );
}

fn value(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

// ---------------------------------------------------------------------------
// What the gateway gives the client side

fn meta() -> Meta {
    Meta {
        provider: "openai:gpt-5".into(),
        slug: "gpt-5".into(),
        created: 1_767_225_600,
        fallback_id: "gen_0001".into(),
        include_usage: false,
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
        receipt: r#"{"attempts":[{"provider":"openai","status":"ok"}]}"#.into(),
        ignored: Some("top_k".into()),
    }
}

/// The stream as the client reads it: one `{event, data}` per SSE event. Checks
/// the format's invariants on the way: `type` names the event and
/// `sequence_number` counts from 0.
fn frames(sse: &[u8]) -> Value {
    let mut d = SseDecoder::new();
    d.push(sse);
    let mut out = Vec::new();
    while let Some(ev) = d.next_event() {
        let name = ev.event.expect("every responses event is named");
        let data: Value = serde_json::from_str(&ev.data).unwrap();
        assert_eq!(data["type"], name.as_str(), "type of {name}");
        assert_eq!(
            data["sequence_number"],
            out.len() as u64,
            "sequence of {name}"
        );
        out.push(json!({"event": name, "data": data}));
    }
    assert!(sse.ends_with(b"\n\n"), "the stream ends with a whole event");
    Value::Array(out)
}

/// Feeds events to a fresh encoder as the gateway does after its commit (errors
/// and refusals never reach it), then the tail.
fn encode(events: &[Event], tail: &Tail) -> Vec<u8> {
    let mut enc = inbound::Encoder::new(meta());
    let mut out = Vec::new();
    for ev in events {
        if !matches!(ev, Event::Error { .. } | Event::Refusal { .. }) {
            enc.event(ev, &mut out);
        }
    }
    enc.end(tail, &mut out);
    out
}

fn events_json(events: &[Event]) -> Value {
    serde_json::to_value(events).unwrap()
}

fn settled(events: &[Event]) -> bool {
    !events
        .iter()
        .any(|e| matches!(e, Event::Error { .. } | Event::Refusal { .. }))
}

/// The final event's response must be the whole answer exactly as `render` gives it.
fn assert_stream_matches_render(stream: &Value, events: &[Event], tail: &Tail) {
    let last = stream.as_array().unwrap().last().unwrap();
    let whole = value(&inbound::render(
        &Response::from_events(events),
        &meta(),
        tail,
    ));
    assert_eq!(
        last["data"]["response"], whole,
        "final stream event vs render"
    );
}

// ---------------------------------------------------------------------------
// Requests

#[test]
fn requests_parse_and_render_for_the_responses_wire() {
    for case in cases("request", ".in.json") {
        let d = dir("request");
        let body = read(&d.join(format!("{case}.in.json")));
        let req = inbound::parse(body.as_bytes()).unwrap_or_else(|e| panic!("{case}: {e}"));
        check(
            &d.join(format!("{case}.canonical.json")),
            &serde_json::to_value(&req).unwrap(),
        );
        let native = wire::render_native(body.as_bytes(), "gpt-5-2025-08-07", req.stream);
        check(&d.join(format!("{case}.native.json")), &value(&native));
        let r = wire::render(&req, "gpt-5-2025-08-07", req.stream);
        let rendered = json!({"body": value(&r.body), "dropped": r.dropped});
        check(&d.join(format!("{case}.upstream.json")), &rendered);
        // Never stored upstream, never the gateway's own fields.
        for body in [value(&native), value(&r.body)] {
            assert_eq!(body["store"], false, "{case}");
            assert!(body.get("prompt_cache_key").is_none(), "{case}");
            assert!(body.get("previous_response_id").is_none(), "{case}");
            assert_eq!(body["model"], "gpt-5-2025-08-07");
        }
    }
}

#[test]
fn canonical_requests_of_other_formats_render_for_the_responses_wire() {
    for case in cases("canonical", ".canonical.json") {
        let d = dir("canonical");
        let req: Request = serde_json::from_str(&read(&d.join(format!("{case}.canonical.json"))))
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let r = wire::render(&req, "gpt-5-2025-08-07", req.stream);
        let rendered = json!({"body": value(&r.body), "dropped": r.dropped});
        check(&d.join(format!("{case}.upstream.json")), &rendered);
    }
}

#[test]
fn native_bodies_keep_the_clients_members_verbatim() {
    let body = br#"{"model":"gpt-5","input":"hi","store":true,"stream":false,"prompt_cache_key":"k","previous_response_id":null,"x_future":{"a": 1.50},"text":{"verbosity":"low"}}"#;
    let out = wire::render_native(body, "gpt-5-2025-08-07", true);
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        r#"{"model":"gpt-5-2025-08-07","input":"hi","x_future":{"a": 1.50},"text":{"verbosity":"low"},"store":false,"stream":true}"#
    );
}

#[derive(serde::Deserialize)]
struct ErrorCase {
    case: String,
    #[serde(default)]
    body: Option<Value>,
    #[serde(default)]
    raw: Option<String>,
    code: String,
    param: Option<String>,
}

#[test]
fn every_parse_error_names_its_code_and_param() {
    let path = dir("").join("errors.json");
    let list: Vec<ErrorCase> = serde_json::from_str(&read(&path)).unwrap();
    for c in list {
        let body = match (&c.raw, &c.body) {
            (Some(raw), _) => raw.clone().into_bytes(),
            (None, Some(b)) => serde_json::to_vec(b).unwrap(),
            _ => panic!("{}: no body", c.case),
        };
        let err = inbound::parse(&body).expect_err(&c.case);
        assert_eq!(err.code.as_str(), c.code, "{}: {err}", c.case);
        assert_eq!(
            err.param.as_deref(),
            c.param.as_deref(),
            "{}: {err}",
            c.case
        );
        assert_eq!(err.status, 400, "{}", c.case);
    }
}

#[test]
fn descriptions_are_capped() {
    let long = "x".repeat(65_537);
    let ok = "x".repeat(65_536);
    let tool = |d: &str| {
        json!({"model": "gpt-5", "input": "hi", "tools": [
            {"type": "function", "name": "a", "parameters": {}},
            {"type": "function", "name": "b", "description": d, "parameters": {}}
        ]})
    };
    let format = |d: &str| {
        json!({"model": "gpt-5", "input": "hi", "text": {"format":
            {"type": "json_schema", "name": "n", "description": d, "schema": {}}}})
    };
    for (make, param) in [
        (&tool as &dyn Fn(&str) -> Value, "tools[1].description"),
        (&format, "text.format.description"),
    ] {
        let err = inbound::parse(&serde_json::to_vec(&make(&long)).unwrap()).unwrap_err();
        assert_eq!(err.code.as_str(), "invalid_parameter");
        assert_eq!(err.param.as_deref(), Some(param));
        assert!(err.message.contains("65537") && err.message.contains("65536"));
        assert!(inbound::parse(&serde_json::to_vec(&make(&ok)).unwrap()).is_ok());
    }
}

#[test]
fn null_fields_count_as_absent() {
    let body = br#"{"model":"gpt-5","input":"hi","previous_response_id":null,"temperature":null,"tools":null,"tool_choice":null,"reasoning":null,"text":null,"metadata":null,"store":null,"stream":null}"#;
    let req = inbound::parse(body).unwrap();
    assert!(!req.stream && req.temperature.is_none() && req.tools.is_empty());
    assert!(req.reasoning.is_none() && req.extras.is_empty());
}

// ---------------------------------------------------------------------------
// Whole answers

#[test]
fn whole_answers_decode_and_render() {
    for case in cases("answer", ".upstream.json") {
        let d = dir("answer");
        let body = read(&d.join(format!("{case}.upstream.json")));
        let events = wire::decode(body.as_bytes()).unwrap_or_else(|e| panic!("{case}: {e}"));
        check(
            &d.join(format!("{case}.events.json")),
            &events_json(&events),
        );
        if !settled(&events) {
            continue;
        }
        let resp = Response::from_events(&events);
        let t = tail(resp.usage.unwrap_or_default(), false);
        let client = value(&inbound::render(&resp, &meta(), &t));
        check(&d.join(format!("{case}.client.json")), &client);
        // The same events streamed end with the same response.
        let stream = frames(&encode(&events, &t));
        assert_stream_matches_render(&stream, &events, &t);
    }
}

// ---------------------------------------------------------------------------
// Streams

/// Decodes a transcript delivered in the given pieces, as the gateway does: SSE
/// events (keep-alives skipped) through the wire's decoder.
fn decode_pieces<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> (Vec<Event>, bool) {
    let mut sse = SseDecoder::new();
    let mut dec = wire::Decoder::new();
    let mut events = Vec::new();
    for piece in pieces {
        sse.push(piece);
        while let Some(ev) = sse.next_event() {
            if ev.data.is_empty() {
                continue;
            }
            dec.frame(ev.event.as_deref(), ev.data.as_bytes(), &mut events)
                .unwrap();
        }
    }
    (events, dec.done())
}

/// Decodes a transcript whole, then split at many byte boundaries (inside names,
/// JSON and multi-byte characters), and in small pieces: always the same events.
fn decode_everywhere(sse: &[u8]) -> (Vec<Event>, bool) {
    let whole = decode_pieces([sse]);
    let step = (sse.len() / 400).max(1);
    for at in (1..sse.len()).step_by(step) {
        let (a, b) = sse.split_at(at);
        assert_eq!(decode_pieces([a, b]), whole, "split at byte {at}");
    }
    for size in [1, 3, 7, 64] {
        assert_eq!(decode_pieces(sse.chunks(size)), whole, "pieces of {size}");
    }
    whole
}

#[test]
fn streams_decode_and_encode() {
    for case in cases("stream", ".sse") {
        let d = dir("stream");
        let sse = fs::read(d.join(format!("{case}.sse"))).unwrap();
        let (events, done) = decode_everywhere(&sse);
        check(
            &d.join(format!("{case}.events.json")),
            &events_json(&events),
        );
        if !settled(&events) {
            continue;
        }
        // As the gateway settles it: a stream without its end marker or finish is cut.
        let finished = events.iter().any(|e| matches!(e, Event::Finish { .. }));
        let cut = !done && !finished;
        assert_eq!(case == "cut", cut, "{case}");
        let usage = Response::from_events(&events).usage.unwrap_or_default();
        let t = tail(usage, cut);
        let out = encode(&events, &t);
        let stream = frames(&out);
        check(&d.join(format!("{case}.client.json")), &stream);
        assert_stream_matches_render(&stream, &events, &t);
        // What the client reads decodes back to the same content.
        let (again, done_again) = decode_pieces([out.as_slice()]);
        assert!(
            done_again,
            "{case}: the encoded stream ends with its end marker"
        );
        assert_eq!(
            Response::from_events(&again).parts,
            Response::from_events(&events).parts,
            "{case}: re-decoded content"
        );
    }
}

#[test]
fn the_empty_completion_shape_streams_and_renders() {
    // What the gateway writes when no rung had content.
    let events = [
        Event::Start {
            id: None,
            model: None,
        },
        Event::Finish {
            reason: sluice_filters::ir::FinishReason::Stop,
            raw: None,
            stop_sequence: None,
        },
    ];
    let t = tail(Usage::default(), false);
    let stream = frames(&encode(&events, &t));
    let names: Vec<&str> = stream
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.completed"
        ]
    );
    let done = &stream[2]["data"]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"], json!([]));
    assert_eq!(done["id"], "resp_gen_0001");
    assert_eq!(done["model"], "gpt-5");
    assert_eq!(done["provider"], "openai:gpt-5");
    assert_eq!(done["x-service-ignored-parameters"], "top_k");
    assert_eq!(done["x_gateway"]["attempts"][0]["status"], "ok");
    let whole = value(&inbound::render(
        &Response::from_events(&events),
        &meta(),
        &t,
    ));
    assert_eq!(&whole, done);
}

#[test]
fn answers_of_other_makers_encode_as_responses() {
    use sluice_filters::ir::FinishReason;
    // An Anthropic-style answer: thinking with a signature, redacted thinking, text,
    // and two tool calls whose argument pieces interleave.
    let events = vec![
        Event::Start {
            id: Some("msg_01XFD".into()),
            model: Some("claude-sonnet-4-5".into()),
        },
        Event::Thinking { text: "hmm".into() },
        Event::ThinkingSignature {
            signature: "sig".into(),
        },
        Event::EncryptedReasoning {
            data: "redacted".into(),
            id: None,
        },
        Event::Text { text: "Hi".into() },
        Event::ToolCallStart {
            index: 0,
            id: "toolu_a".into(),
            name: "f".into(),
        },
        Event::ToolCallStart {
            index: 1,
            id: "toolu_b".into(),
            name: "g".into(),
        },
        Event::ToolCallArgs {
            index: 0,
            arguments: "{}".into(),
        },
        Event::ToolCallArgs {
            index: 1,
            arguments: "{\"a\":1}".into(),
        },
        Event::Finish {
            reason: FinishReason::ToolCalls,
            raw: Some("tool_use".into()),
            stop_sequence: None,
        },
        Event::Usage(Usage {
            input_tokens: 5,
            cached_tokens: 1,
            cache_write_tokens: 0,
            cache_write_1h_tokens: 0,
            output_tokens: 7,
            reasoning_tokens: 0,
            web_search_requests: 0,
            cost_micro_usd: None,
        }),
    ];
    let t = tail(
        Usage {
            input_tokens: 5,
            cached_tokens: 1,
            cache_write_tokens: 0,
            cache_write_1h_tokens: 0,
            output_tokens: 7,
            reasoning_tokens: 0,
            web_search_requests: 0,
            cost_micro_usd: None,
        },
        false,
    );
    let stream = frames(&encode(&events, &t));
    assert_stream_matches_render(&stream, &events, &t);
    let done = &stream.as_array().unwrap().last().unwrap()["data"]["response"];
    assert_eq!(done["id"], "resp_msg_01XFD");
    assert_eq!(done["status"], "completed");
    assert_eq!(
        done["output"],
        json!([
            // Each block its own item: the signed thinking, then the redacted one.
            {"type": "reasoning", "id": "rs_msg_01XFD_0", "encrypted_content": "sluice:signed:sig",
             "summary": [{"type": "summary_text", "text": "hmm"}]},
            {"type": "reasoning", "id": "rs_msg_01XFD_1", "encrypted_content": "sluice:anthropic:redacted",
             "summary": []},
            {"type": "message", "id": "msg_msg_01XFD_2", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Hi", "annotations": [], "logprobs": []}]},
            {"type": "function_call", "id": "fc_msg_01XFD_3", "call_id": "toolu_a", "name": "f",
             "arguments": "{}", "status": "completed"},
            {"type": "function_call", "id": "fc_msg_01XFD_4", "call_id": "toolu_b", "name": "g",
             "arguments": "{\"a\":1}", "status": "completed"}
        ])
    );
    assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 1);
    assert_eq!(done["usage"]["total_tokens"], 12);
}

#[test]
fn error_frames_are_the_streams_error_event() {
    let err = sluice_filters::ApiError::new(
        sluice_filters::ErrorCode::Refusal,
        "provider refused the request: content policy",
    )
    .with_extra("refusal_reason", "content_policy");
    let frame = inbound::error_frame(&err);
    let text = std::str::from_utf8(&frame).unwrap();
    assert!(text.starts_with("event: error\ndata: "), "{text}");
    let v = frames(&frame);
    assert_eq!(
        v[0]["data"],
        json!({
            "type": "error",
            "sequence_number": 0,
            "code": "refusal",
            "message": "provider refused the request: content policy",
            "param": null,
            "refusal_reason": "content_policy"
        })
    );
}

#[test]
fn policy_errors_are_refusals() {
    use sluice_filters::ir::RefusalReason::*;
    let body = |code: &str| {
        format!(
            r#"{{"error":{{"message":"m","type":"invalid_request_error","param":null,"code":"{code}"}}}}"#
        )
    };
    assert_eq!(
        wire::refusal(400, body("cyber_policy").as_bytes()),
        Some(CyberPolicy)
    );
    assert_eq!(
        wire::refusal(400, body("bio_policy").as_bytes()),
        Some(Cbrn)
    );
    assert_eq!(
        wire::refusal(400, body("invalid_prompt").as_bytes()),
        Some(ContentPolicy)
    );
    assert_eq!(
        wire::refusal(400, body("content_policy_violation").as_bytes()),
        Some(ContentPolicy)
    );
    // Azure OpenAI's content filter.
    let azure = br#"{"error":{"message":"filtered","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{"hate":{"filtered":true,"severity":"high"}}}}}"#;
    assert_eq!(wire::refusal(400, azure), Some(ContentPolicy));
    assert_eq!(
        wire::refusal(400, body("context_length_exceeded").as_bytes()),
        None
    );
    assert_eq!(wire::refusal(500, body("cyber_policy").as_bytes()), None);
    assert_eq!(wire::refusal(400, b"<html>bad gateway</html>"), None);
}

#[test]
fn the_decoder_ignores_unknown_events_and_reads_unnamed_ones() {
    let mut dec = wire::Decoder::new();
    let mut out = Vec::new();
    dec.frame(
        Some("response.web_search_call.searching"),
        br#"{"type":"response.web_search_call.searching","item_id":"ws_1","output_index":0,"sequence_number":3}"#,
        &mut out,
    )
    .unwrap();
    dec.frame(
        Some("response.future_thing"),
        br#"{"type":"response.future_thing","delta":{"not":"a string"}}"#,
        &mut out,
    )
    .unwrap();
    assert!(out.is_empty());
    // Without `event:` lines the data's `type` names the event.
    dec.frame(
        None,
        br#"{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"hi","sequence_number":4}"#,
        &mut out,
    )
    .unwrap();
    assert_eq!(out, [Event::Text { text: "hi".into() }]);
    assert!(!dec.done());
    assert!(dec
        .frame(Some("response.output_text.delta"), b"{oops", &mut out)
        .is_err());
}

#[test]
fn the_decoder_fills_in_from_done_events_when_no_deltas_came() {
    // A provider that only sends the finished pieces.
    let frames = [
        (
            "response.output_item.added",
            r#"{"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[]}}"#,
        ),
        (
            "response.output_item.done",
            r#"{"output_index":0,"item":{"id":"rs_1","type":"reasoning","summary":[{"type":"summary_text","text":"a"},{"type":"summary_text","text":"b"}],"encrypted_content":"enc"}}"#,
        ),
        (
            "response.output_item.added",
            r#"{"output_index":1,"item":{"id":"fc_1","type":"function_call","call_id":"call_1","name":"f","arguments":""}}"#,
        ),
        (
            "response.function_call_arguments.done",
            r#"{"item_id":"fc_1","output_index":1,"arguments":"{\"x\":1}"}"#,
        ),
        (
            "response.output_item.done",
            r#"{"output_index":1,"item":{"id":"fc_1","type":"function_call","call_id":"call_1","name":"f","arguments":"{\"x\":1}"}}"#,
        ),
        (
            "response.output_item.done",
            r#"{"output_index":2,"item":{"id":"fc_2","type":"function_call","call_id":"call_2","name":"g","arguments":"{}"}}"#,
        ),
        (
            "response.output_text.done",
            r#"{"item_id":"msg_1","output_index":3,"content_index":0,"text":"done text"}"#,
        ),
        (
            "error",
            r#"{"type":"error","error":{"type":"invalid_request_error","code":"cyber_policy","message":"flagged"}}"#,
        ),
    ];
    let mut dec = wire::Decoder::new();
    let mut out = Vec::new();
    for (name, data) in frames {
        dec.frame(Some(name), data.as_bytes(), &mut out).unwrap();
    }
    let call = |index: u32, id: &str, name: &str| Event::ToolCallStart {
        index,
        id: id.into(),
        name: name.into(),
    };
    let args = |index: u32, a: &str| Event::ToolCallArgs {
        index,
        arguments: a.into(),
    };
    assert_eq!(
        out,
        [
            Event::Thinking {
                text: "a\n\nb".into()
            },
            Event::EncryptedReasoning {
                data: "enc".into(),
                id: Some("rs_1".into())
            },
            call(0, "call_1", "f"),
            args(0, "{\"x\":1}"),
            call(1, "call_2", "g"),
            args(1, "{}"),
            Event::Text {
                text: "done text".into()
            },
            Event::Refusal {
                reason: sluice_filters::ir::RefusalReason::CyberPolicy,
                text: Some("flagged".into())
            },
        ]
    );
}

// ---------------------------------------------------------------------------
// Round trip: canonical -> responses wire -> responses inbound

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 ,.!?\"\\\\\n\u{e9}\u{4e16}]{0,12}"
}

fn raw(s: &str) -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(s.to_string()).unwrap()
}

fn user_part() -> impl Strategy<Value = Part> {
    prop_oneof![
        3 => text().prop_map(Part::text),
        1 => (prop::sample::select(vec![
                "https://example.com/a.png",
                "data:image/png;base64,iVBORw0KGgo="
            ]), prop::option::of(prop::sample::select(vec!["low", "high", "auto"])))
            .prop_map(|(u, d)| Part::Image { url: u.into(), detail: d.map(Into::into) }),
        1 => prop::sample::select(vec![
                ("https://example.com/a.pdf", None),
                ("https://example.com/b.pdf", Some("b.pdf")),
                ("data:application/pdf;base64,JVBERi0=", Some("c.pdf")),
            ])
            .prop_map(|(u, n)| Part::Document { url: u.into(), name: n.map(Into::into) }),
    ]
}

fn call_id() -> impl Strategy<Value = String> {
    "call_[a-z0-9]{1,6}"
}

/// Assistant content this wire can carry: text, calls, and visible reasoning only
/// as the summary of an OpenAI encrypted reasoning item.
fn assistant_parts() -> impl Strategy<Value = Vec<Part>> {
    let reasoning = (
        prop::collection::vec(text(), 0..3),
        "[A-Za-z0-9+/=]{1,16}",
        "rs_[a-z0-9]{1,6}",
    )
        .prop_map(|(summary, data, id)| {
            let mut parts: Vec<Part> = summary
                .into_iter()
                .map(|t| Part::Thinking {
                    text: t,
                    signature: None,
                })
                .collect();
            parts.push(Part::EncryptedReasoning { data, id: Some(id) });
            parts
        });
    let group = prop_oneof![
        text().prop_map(|t| vec![Part::text(t)]),
        (call_id(), "[a-z_]{1,8}", text()).prop_map(|(id, name, arguments)| vec![Part::ToolCall {
            id,
            name,
            arguments
        }]),
        reasoning,
    ];
    prop::collection::vec(group, 1..4).prop_map(|g| g.concat())
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        prop::collection::vec(user_part(), 0..4).prop_map(|parts| Message {
            role: Role::User,
            parts
        }),
        assistant_parts().prop_map(|parts| Message {
            role: Role::Assistant,
            parts
        }),
        prop::collection::vec((call_id(), prop::collection::vec(user_part(), 0..3)), 1..3)
            .prop_map(|results| Message {
                role: Role::Tool,
                parts: results
                    .into_iter()
                    .map(|(call_id, content)| Part::ToolResult {
                        call_id,
                        content,
                        is_error: false
                    })
                    .collect()
            }),
    ]
}

fn tool() -> impl Strategy<Value = Tool> {
    (
        "[a-z_]{1,10}",
        prop::option::of(text()),
        prop::sample::select(vec![
            r#"{"type":"object","properties":{}}"#,
            r#"{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}"#,
        ]),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(name, description, p, strict)| Tool {
            name,
            description,
            parameters: raw(p),
            strict,
        })
}

fn response_format() -> impl Strategy<Value = ResponseFormat> {
    prop_oneof![
        Just(ResponseFormat::Text),
        Just(ResponseFormat::JsonObject),
        (
            "[a-z_]{1,8}",
            prop::option::of(text()),
            prop::option::of(any::<bool>())
        )
            .prop_map(|(name, description, strict)| ResponseFormat::JsonSchema {
                name,
                description,
                schema: raw(r#"{"type":"object","additionalProperties":false}"#),
                strict,
            }),
    ]
}

fn extras() -> impl Strategy<Value = Vec<Extra>> {
    let candidates = vec![
        ("metadata", r#"{"k":"v"}"#),
        ("service_tier", r#""flex""#),
        ("truncation", r#""auto""#),
        ("top_logprobs", "3"),
        ("text.verbosity", r#""low""#),
        ("safety_identifier", r#""u-1""#),
    ];
    prop::sample::subsequence(candidates, 0..4).prop_map(|v| {
        v.into_iter()
            .map(|(n, val)| Extra {
                name: n.into(),
                value: raw(val),
            })
            .collect()
    })
}

prop_compose! {
    fn request()(
        model in "[a-z0-9.-]{1,12}",
        stream in any::<bool>(),
        system in prop::collection::vec(text(), 0..3),
        messages in prop::collection::vec(message(), 0..6),
        tools in prop::collection::vec(tool(), 0..3),
        tool_choice in prop::option::of(prop_oneof![
            Just(ToolChoice::Auto), Just(ToolChoice::None), Just(ToolChoice::Required),
            "[a-z_]{1,8}".prop_map(|name| ToolChoice::Tool { name }),
        ]),
        parallel_tool_calls in prop::option::of(any::<bool>()),
        max_tokens in prop::option::of(16u64..100_000),
        // Values as clients write them (serde_json's default float parsing is not
        // exact to the last bit for arbitrary doubles).
        temperature in prop::option::of((0u32..=200).prop_map(|k| f64::from(k) / 100.0)),
        top_p in prop::option::of((0u32..=100).prop_map(|k| f64::from(k) / 100.0)),
        response_format in prop::option::of(response_format()),
        reasoning in prop::option::of((
            prop::option::of(prop::sample::select(vec!["minimal", "low", "medium", "high"])),
            prop::option::of(prop::sample::select(vec!["auto", "concise", "detailed"])),
        ).prop_filter("some control", |(e, s)| e.is_some() || s.is_some())),
        user in prop::option::of("[a-z0-9-]{1,10}"),
        prompt_cache_key in prop::option::of("[a-z0-9]{1,8}"),
        include in prop::collection::vec(prop::sample::select(vec![
            "reasoning.encrypted_content".to_string(),
            "message.output_text.logprobs".to_string(),
        ]), 0..2),
        extras in extras(),
    ) -> Request {
        Request {
            model, stream, system, messages, tools, tool_choice, parallel_tool_calls,
            max_tokens, temperature, top_p, response_format,
            reasoning: reasoning.map(|(e, s)| Reasoning {
                effort: e.map(Into::into), summary: s.map(Into::into), budget_tokens: None,
            }),
            user, prompt_cache_key, include, extras,
            ..Request::default()
        }
    }
}

/// Images without a detail level are sent as `auto`, the API's default; an empty
/// tool result as an empty string.
fn normal_part(p: &mut Part) {
    match p {
        Part::Image { detail, .. } if detail.is_none() => *detail = Some("auto".into()),
        Part::ToolResult { content, .. } if content.is_empty() => content.push(Part::text("")),
        Part::ToolResult { content, .. } => content.iter_mut().for_each(normal_part),
        _ => {}
    }
}

/// What survives the trip, in one normal form: assistant items and function call
/// outputs regroup into one turn each; an omitted `strict` is sent as false (the
/// API's default is strict); an image's default detail is explicit; extras are
/// compared by name.
fn normal(mut r: Request) -> Request {
    r.messages
        .iter_mut()
        .for_each(|m| m.parts.iter_mut().for_each(normal_part));
    let mut merged: Vec<Message> = Vec::new();
    for m in r.messages {
        match merged.last_mut() {
            Some(last) if last.role == m.role && matches!(m.role, Role::Assistant | Role::Tool) => {
                last.parts.extend(m.parts)
            }
            _ => merged.push(m),
        }
    }
    r.messages = merged;
    for t in &mut r.tools {
        t.strict = Some(t.strict.unwrap_or(false));
    }
    r.extras.sort_by(|a, b| a.name.cmp(&b.name));
    r.prompt_cache_key = None;
    r
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn canonical_requests_survive_the_responses_wire(req in request()) {
        let rendered = wire::render(&req, &req.model, req.stream);
        prop_assert!(rendered.dropped.is_empty());
        let back = inbound::parse(&rendered.body).map_err(|e| {
            TestCaseError::fail(format!("{e}: {}", String::from_utf8_lossy(&rendered.body)))
        })?;
        prop_assert_eq!(normal(back), normal(req));
    }
}

/// One piece of an answer, as a group of events in stream order.
fn answer_piece() -> impl Strategy<Value = Vec<Event>> {
    let text = "[a-z \u{e9}\u{1f44b}]{1,8}";
    prop_oneof![
        prop::collection::vec(text, 1..4)
            .prop_map(|t| t.into_iter().map(|text| Event::Text { text }).collect()),
        (
            prop::collection::vec(text, 0..3),
            prop::option::of(("[a-zA-Z0-9=]{1,12}", "rs_[a-z0-9]{1,6}"))
        )
            .prop_filter("some reasoning", |(t, e)| !t.is_empty() || e.is_some())
            .prop_map(|(t, enc)| {
                let mut out: Vec<Event> =
                    t.into_iter().map(|text| Event::Thinking { text }).collect();
                if let Some((data, id)) = enc {
                    out.push(Event::EncryptedReasoning { data, id: Some(id) });
                }
                out
            }),
        (
            call_id(),
            "[a-z_]{1,8}",
            prop::collection::vec("[a-z{}\":0-9]{1,6}", 0..3)
        )
            .prop_map(|(id, name, args)| {
                // The call's index is filled in by the caller.
                let mut out = vec![Event::ToolCallStart {
                    index: u32::MAX,
                    id,
                    name,
                }];
                out.extend(args.into_iter().map(|arguments| Event::ToolCallArgs {
                    index: u32::MAX,
                    arguments,
                }));
                out
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn encoded_streams_decode_to_the_same_answer(
        pieces in prop::collection::vec(answer_piece(), 0..6),
        length in any::<bool>(),
    ) {
        use sluice_filters::ir::FinishReason;
        let mut events = vec![Event::Start { id: Some("resp_p".into()), model: Some("m".into()) }];
        let mut calls = 0u32;
        for piece in pieces {
            let is_call = matches!(piece.first(), Some(Event::ToolCallStart { .. }));
            for mut ev in piece {
                if let Event::ToolCallStart { index, .. } | Event::ToolCallArgs { index, .. } = &mut ev {
                    *index = calls;
                }
                events.push(ev);
            }
            calls += u32::from(is_call);
        }
        let reason = if length { FinishReason::Length } else { FinishReason::Stop };
        events.push(Event::Finish {
            reason,
            raw: None,
            stop_sequence: None,
        });
        let t = tail(Usage::default(), false);
        let out = encode(&events, &t);
        let stream = frames(&out);
        assert_stream_matches_render(&stream, &events, &t);
        let (back, done) = decode_pieces(out.chunks(5));
        prop_assert!(done);
        let (a, b) = (Response::from_events(&back), Response::from_events(&events));
        prop_assert_eq!(a.parts, b.parts);
        prop_assert_eq!(a.finish == Some(FinishReason::Length), length);
    }
}

#[test]
fn cache_writes_are_reported_in_input_tokens_details() {
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
        serde_json::from_slice(&inbound::render(&resp, &meta(), &tail(written, false))).unwrap();
    assert_eq!(v["usage"]["input_tokens"], 100);
    assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 10);
    assert_eq!(v["usage"]["input_tokens_details"]["cache_write_tokens"], 60);
    let plain = Usage {
        input_tokens: 100,
        ..Usage::default()
    };
    let v: Value =
        serde_json::from_slice(&inbound::render(&resp, &meta(), &tail(plain, false))).unwrap();
    // Always there (OpenAI's schema requires it), zero when nothing was written.
    assert_eq!(v["usage"]["input_tokens_details"]["cache_write_tokens"], 0);
}
