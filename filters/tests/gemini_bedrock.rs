//! Golden-file and property tests of the Gemini and Bedrock upstream wires.
//!
//! Layout under `tests/golden/{gemini,bedrock}/`:
//! - `request/<case>.in.json`: `{model_id, stream, request}` with a canonical
//!   request; `<case>.out.json`: `{path, body, dropped}` as the wire renders it.
//! - `response/<case>.json`: a whole provider answer; `<case>.events.json`: the
//!   canonical events it decodes to.
//! - Gemini `stream/<case>.sse`: an SSE transcript; Bedrock
//!   `stream/<case>.frames.json`: a list of `{message_type, type, payload}`
//!   messages, encoded to the binary event stream by the test; both with
//!   `<case>.events.json`.
//!
//! Outputs are compared as JSON values. `BLESS=1 cargo test` rewrites the expected
//! files (review every change by hand against the provider's documentation).

use serde_json::value::RawValue;
use serde_json::{json, Value};
use sluice_filters::ir::{Collector, Event, RefusalReason, Request, ResponseFormat, StreamDecoder};
use sluice_filters::sse::SseDecoder;
use sluice_filters::upstream::{bedrock, gemini, Rendered};
use std::path::{Path, PathBuf};

fn golden_dir(parts: &[&str]) -> PathBuf {
    let mut p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    for part in parts {
        p.push(part);
    }
    p
}

/// Files in `dir` whose name ends with `suffix`, sorted, as (case name, path).
fn cases(dir: &Path, suffix: &str) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_string();
            let case = name.strip_suffix(suffix)?.to_string();
            Some((case, p))
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no *{suffix} cases in {}", dir.display());
    out
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Compares `actual` with the expected file (or rewrites it under `BLESS`).
/// Returns a description of the mismatch instead of panicking, so every case runs.
fn check(expected: &Path, actual: &Value) -> Option<String> {
    if std::env::var_os("BLESS").is_some() {
        let text = serde_json::to_string_pretty(actual).unwrap() + "\n";
        std::fs::write(expected, text).unwrap();
        return None;
    }
    let want = read_json(expected);
    (want != *actual).then(|| {
        format!(
            "{} differs\n--- expected\n{}\n--- actual\n{}",
            expected.display(),
            serde_json::to_string_pretty(&want).unwrap(),
            serde_json::to_string_pretty(actual).unwrap()
        )
    })
}

fn report(failures: Vec<String>) {
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn events_json(events: &[Event]) -> Value {
    serde_json::to_value(events).unwrap()
}

/// A canonical request from its JSON form. Raw values (schemas, extras)
/// deserialize from text only, and `response_format` (an internally tagged enum
/// holding a raw schema) not even from text: it is built here.
fn canonical(json: &Value, case: &str) -> Request {
    let mut json = json.clone();
    let format = json.as_object_mut().unwrap().remove("response_format");
    let mut req: Request = serde_json::from_str(&json.to_string())
        .unwrap_or_else(|e| panic!("{case}: bad canonical request: {e}"));
    req.response_format = format.map(|f| match f["type"].as_str().unwrap() {
        "text" => ResponseFormat::Text,
        "json_object" => ResponseFormat::JsonObject,
        "json_schema" => ResponseFormat::JsonSchema {
            name: f["name"].as_str().unwrap().to_string(),
            description: f["description"].as_str().map(str::to_string),
            schema: RawValue::from_string(f["schema"].to_string()).unwrap(),
            strict: f["strict"].as_bool(),
        },
        other => panic!("{case}: unknown response format {other}"),
    });
    req
}

type RenderFn = fn(&Request, &str, bool) -> Rendered;
type PathFn = fn(&str, bool) -> String;

fn request_goldens(wire: &str, render: RenderFn, path: PathFn) {
    let dir = golden_dir(&[wire, "request"]);
    let mut failures = Vec::new();
    for (case, input) in cases(&dir, ".in.json") {
        let spec = read_json(&input);
        let model_id = spec["model_id"].as_str().unwrap();
        let stream = spec["stream"].as_bool().unwrap();
        let req = canonical(&spec["request"], &case);
        let out = render(&req, model_id, stream);
        let body: Value = serde_json::from_slice(&out.body)
            .unwrap_or_else(|e| panic!("{case}: body is not JSON: {e}"));
        let actual = json!({
            "path": path(model_id, stream),
            "body": body,
            "dropped": out.dropped,
        });
        failures.extend(check(&dir.join(format!("{case}.out.json")), &actual));
    }
    report(failures);
}

#[test]
fn gemini_request_goldens() {
    request_goldens("gemini", gemini::render, gemini::path);
}

#[test]
fn bedrock_request_goldens() {
    request_goldens("bedrock", bedrock::render, bedrock::path);
}

type DecodeFn = fn(&[u8]) -> Result<Vec<Event>, sluice_filters::ir::DecodeError>;

fn response_goldens(wire: &str, decode: DecodeFn) {
    let dir = golden_dir(&[wire, "response"]);
    let mut failures = Vec::new();
    for (case, input) in cases(&dir, ".json") {
        if case.ends_with(".events") {
            continue;
        }
        let body = std::fs::read(&input).unwrap();
        let events = decode(&body).unwrap_or_else(|e| panic!("{case}: {e}"));
        failures.extend(check(
            &dir.join(format!("{case}.events.json")),
            &events_json(&events),
        ));
    }
    report(failures);
}

#[test]
fn gemini_response_goldens() {
    response_goldens("gemini", gemini::decode);
}

#[test]
fn bedrock_response_goldens() {
    response_goldens("bedrock", bedrock::decode);
}

/// Runs an SSE transcript through the Gemini decoder, fed `piece` bytes at a time.
fn gemini_stream(transcript: &[u8], piece: usize) -> (Vec<Event>, bool) {
    let mut sse = SseDecoder::new();
    let mut d = gemini::Decoder::new();
    let mut out = Vec::new();
    for chunk in transcript.chunks(piece) {
        sse.push(chunk);
        while let Some(ev) = sse.next_event() {
            if ev.comment {
                continue;
            }
            d.frame(ev.event.as_deref(), ev.data.as_bytes(), &mut out)
                .unwrap();
        }
    }
    (out, d.done())
}

#[test]
fn gemini_stream_goldens() {
    let dir = golden_dir(&["gemini", "stream"]);
    let mut failures = Vec::new();
    for (case, input) in cases(&dir, ".sse") {
        let transcript = std::fs::read(&input).unwrap();
        let (events, done) = gemini_stream(&transcript, transcript.len());
        for piece in [1, 7, 64] {
            let (again, _) = gemini_stream(&transcript, piece);
            assert_eq!(again, events, "{case}: split into {piece}-byte pieces");
        }
        let ends = events.iter().any(|e| matches!(e, Event::Finish { .. }));
        assert_eq!(done, ends, "{case}: done() after a finish reason only");
        failures.extend(check(
            &dir.join(format!("{case}.events.json")),
            &events_json(&events),
        ));
    }
    report(failures);
}

/// Encodes a `frames.json` list into the binary event stream.
fn encode_frames(spec: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    for f in spec.as_array().unwrap() {
        let name = f["type"].as_str().unwrap();
        let payload = serde_json::to_vec(&f["payload"]).unwrap();
        let bytes = match f["message_type"].as_str().unwrap() {
            "event" => bedrock::encode_event(name, &payload),
            "exception" => bedrock::encode_exception(name, &payload),
            other => panic!("unknown message type {other}"),
        };
        out.extend_from_slice(&bytes);
    }
    out
}

/// Runs a binary event stream through framing and decoding, split at `cuts`.
fn bedrock_stream(bytes: &[u8], cuts: &[usize]) -> (Vec<Event>, bool) {
    let mut frames = bedrock::FrameDecoder::new();
    let mut d = bedrock::Decoder::new();
    let mut out = Vec::new();
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&bytes.len())) {
        frames.push(&bytes[from..to]);
        from = to;
        while let Some(frame) = frames.next_frame() {
            let frame = frame.unwrap();
            d.frame(Some(&frame.event_type), &frame.payload, &mut out)
                .unwrap();
        }
    }
    (out, d.done())
}

#[test]
fn bedrock_stream_goldens() {
    let dir = golden_dir(&["bedrock", "stream"]);
    let mut failures = Vec::new();
    for (case, input) in cases(&dir, ".frames.json") {
        let bytes = encode_frames(&read_json(&input));
        let (events, done) = bedrock_stream(&bytes, &[]);
        // Awkward boundaries: inside every prelude, header and CRC, one byte at a
        // time, and in two pieces at every offset.
        let singles: Vec<usize> = (1..bytes.len()).collect();
        assert_eq!(
            bedrock_stream(&bytes, &singles).0,
            events,
            "{case}: bytewise"
        );
        for cut in 1..bytes.len() {
            assert_eq!(
                bedrock_stream(&bytes, &[cut]).0,
                events,
                "{case}: split at {cut}"
            );
        }
        let ends = events.iter().any(|e| matches!(e, Event::Usage(_)));
        assert_eq!(done, ends, "{case}: done() after metadata only");
        failures.extend(check(
            &dir.join(format!("{case}.events.json")),
            &events_json(&events),
        ));
    }
    report(failures);
}

/// A whole answer and its stream fold to the same response.
#[test]
fn whole_and_streamed_answers_agree() {
    let fold = |events: &[Event]| {
        let mut c = Collector::default();
        events.iter().for_each(|e| c.push(e));
        c.finish()
    };
    let g = golden_dir(&["gemini"]);
    let whole = gemini::decode(&std::fs::read(g.join("response/tool_thinking.json")).unwrap());
    let transcript = std::fs::read(g.join("stream/tool_thinking.sse")).unwrap();
    let (streamed, _) = gemini_stream(&transcript, 5);
    assert_eq!(fold(&whole.unwrap()), fold(&streamed));

    let b = golden_dir(&["bedrock"]);
    let whole = bedrock::decode(&std::fs::read(b.join("response/tool_reasoning.json")).unwrap());
    let bytes = encode_frames(&read_json(&b.join("stream/tool_reasoning.frames.json")));
    let (streamed, _) = bedrock_stream(&bytes, &[3, 40, 41, 200]);
    assert_eq!(fold(&whole.unwrap()), fold(&streamed));
}

#[test]
fn paths() {
    assert_eq!(
        gemini::path("gemini-2.5-flash", false),
        "/v1beta/models/gemini-2.5-flash:generateContent"
    );
    assert_eq!(
        gemini::path("models/gemini-2.5-pro", true),
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    );
    assert_eq!(
        bedrock::path("anthropic.claude-3-5-haiku-20241022-v1:0", false),
        "/model/anthropic.claude-3-5-haiku-20241022-v1%3A0/converse"
    );
    assert_eq!(
        bedrock::path(
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-pro-v1:0",
            true
        ),
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.amazon.nova-pro-v1%3A0/converse-stream"
    );
}

#[test]
fn gemini_refusal_mapping() {
    use RefusalReason::*;
    let finish = |reason: &str| {
        let body = json!({"candidates": [{"finishReason": reason, "index": 0}]});
        let events = gemini::decode(body.to_string().as_bytes()).unwrap();
        events.iter().find_map(|e| match e {
            Event::Refusal { reason, .. } => Some(*reason),
            _ => None,
        })
    };
    for (reason, want) in [
        ("SAFETY", Some(ContentPolicy)),
        ("BLOCKLIST", Some(ContentPolicy)),
        ("PROHIBITED_CONTENT", Some(ContentPolicy)),
        ("IMAGE_SAFETY", Some(ContentPolicy)),
        ("RECITATION", Some(Recitation)),
        ("SPII", Some(DataInspection)),
        ("MODEL_ARMOR", Some(DataInspection)),
        ("STOP", None),
        ("MAX_TOKENS", None),
        ("OTHER", None),
    ] {
        assert_eq!(finish(reason), want, "finishReason {reason}");
    }
    let blocked = |reason: &str| {
        let body = json!({"promptFeedback": {"blockReason": reason}});
        match gemini::decode(body.to_string().as_bytes())
            .unwrap()
            .as_slice()
        {
            [Event::Start { .. }, Event::Refusal { reason, .. }, Event::Finish { .. }] => *reason,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(blocked("SAFETY"), ContentPolicy);
    assert_eq!(blocked("OTHER"), Unspecified);
    assert_eq!(blocked("PROHIBITED_CONTENT"), ContentPolicy);

    // Error answers.
    let err = |status: u16, message: &str| {
        let body =
            json!({"error": {"code": status, "message": message, "status": "INVALID_ARGUMENT"}});
        gemini::refusal(status, body.to_string().as_bytes())
    };
    assert_eq!(
        err(400, "The request was blocked due to safety reasons."),
        Some(ContentPolicy)
    );
    assert_eq!(
        err(400, "Prohibited content detected."),
        Some(ContentPolicy)
    );
    assert_eq!(err(400, "Invalid JSON payload received."), None);
    assert_eq!(err(500, "blocked for safety"), None);
    assert_eq!(err(429, "Resource has been exhausted"), None);
    let feedback = json!({"promptFeedback": {"blockReason": "SAFETY"}});
    assert_eq!(
        gemini::refusal(400, feedback.to_string().as_bytes()),
        Some(ContentPolicy)
    );
    assert_eq!(gemini::refusal(400, b"not json"), None);
}

#[test]
fn bedrock_refusal_mapping() {
    use RefusalReason::*;
    let stop = |reason: &str, with_text: bool| {
        let content = if with_text {
            json!([{"text": "Partial"}])
        } else {
            json!([])
        };
        let body = json!({
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": reason,
            "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}
        });
        bedrock::decode(body.to_string().as_bytes()).unwrap()
    };
    let refusal = |events: &[Event]| {
        events.iter().find_map(|e| match e {
            Event::Refusal { reason, .. } => Some(*reason),
            _ => None,
        })
    };
    assert_eq!(
        refusal(&stop("guardrail_intervened", false)),
        Some(ContentPolicy)
    );
    assert_eq!(
        refusal(&stop("content_filtered", false)),
        Some(ContentPolicy)
    );
    assert_eq!(refusal(&stop("content_filtered", true)), None);
    assert_eq!(refusal(&stop("end_turn", false)), None);
    assert!(stop("malformed_tool_use", false)
        .iter()
        .any(|e| matches!(e, Event::Error { .. })));

    let err = |status: u16, message: &str| {
        bedrock::refusal(status, json!({"message": message}).to_string().as_bytes())
    };
    assert_eq!(
        err(400, "Output blocked by content filtering policy"),
        Some(ContentPolicy)
    );
    assert_eq!(err(400, "Malformed input request"), None);
    assert_eq!(err(429, "Too many requests, please wait."), None);
    assert_eq!(err(503, "content filtering policy"), None);
}

#[test]
fn crc_failures_are_detected() {
    let frame = bedrock::encode_event(
        "contentBlockDelta",
        br#"{"contentBlockIndex":0,"delta":{"text":"Hi"}}"#,
    );
    // Flip one bit in the prelude, its CRC, a header, the payload and the message CRC.
    for at in [1, 9, 14, frame.len() - 8, frame.len() - 1] {
        let mut bad = frame.clone();
        bad[at] ^= 0x10;
        let mut d = bedrock::FrameDecoder::new();
        d.push(&bad);
        assert!(
            matches!(d.next_frame(), Some(Err(_))),
            "corruption at byte {at} not detected"
        );
        // The stream cannot be resynchronized: nothing more comes out of it.
        d.push(&frame);
        assert!(d.next_frame().is_none());
    }
    // A good frame after a good frame.
    let mut d = bedrock::FrameDecoder::new();
    d.push(&[frame.clone(), frame.clone()].concat());
    assert!(matches!(d.next_frame(), Some(Ok(_))));
    assert!(matches!(d.next_frame(), Some(Ok(_))));
    assert!(d.next_frame().is_none());
}

#[test]
fn frame_headers_and_error_messages() {
    // Non-string headers are skipped, and an error message becomes the payload.
    let mut bytes = bedrock::encode_frame(
        &[
            (":message-type", "error"),
            (":error-code", "InternalFailure"),
            (":error-message", "boom"),
        ],
        b"",
    );
    let mut d = bedrock::FrameDecoder::new();
    d.push(&bytes);
    let f = d.next_frame().unwrap().unwrap();
    assert_eq!(f.message_type, "error");
    assert_eq!(f.event_type, "InternalFailure");
    assert_eq!(
        serde_json::from_slice::<Value>(&f.payload).unwrap(),
        json!({"message": "boom"})
    );

    // A frame with a bool, an int and a timestamp header before the event type.
    let mut headers = Vec::new();
    headers.extend_from_slice(b"\x04flag\x00");
    headers.extend_from_slice(b"\x01n\x04\x00\x00\x00\x2a");
    headers.extend_from_slice(b"\x02ts\x08\x00\x00\x01\x8f\x00\x00\x00\x00");
    headers.extend_from_slice(b"\x0b:event-type\x07\x00\x0cmessageStart");
    let payload = br#"{"role":"assistant"}"#;
    let total = (16 + headers.len() + payload.len()) as u32;
    bytes = Vec::new();
    bytes.extend_from_slice(&total.to_be_bytes());
    bytes.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    let crc = crc32(&bytes);
    bytes.extend_from_slice(&crc.to_be_bytes());
    bytes.extend_from_slice(&headers);
    bytes.extend_from_slice(payload);
    let crc = crc32(&bytes);
    bytes.extend_from_slice(&crc.to_be_bytes());
    let mut d = bedrock::FrameDecoder::new();
    d.push(&bytes);
    let f = d.next_frame().unwrap().unwrap();
    assert_eq!(
        (f.event_type.as_str(), f.message_type.as_str()),
        ("messageStart", "event")
    );
    assert_eq!(f.payload, payload);
}

/// A plain bitwise CRC-32 (IEEE), independent of the crate's.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn encoder_matches_the_reference_crc() {
    let frame = bedrock::encode_event("metadata", b"{}");
    let n = frame.len();
    assert_eq!(
        u32::from_be_bytes(frame[8..12].try_into().unwrap()),
        crc32(&frame[..8])
    );
    assert_eq!(
        u32::from_be_bytes(frame[n - 4..].try_into().unwrap()),
        crc32(&frame[..n - 4])
    );
}

#[test]
fn gemini_tool_result_names_come_from_the_history() {
    let req: Request = serde_json::from_str(&json!({
        "model": "m",
        "stream": false,
        "messages": [
            {"role": "user", "parts": [{"type": "text", "text": "go"}]},
            {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_0", "name": "first", "arguments": "{}"}]},
            {"role": "tool", "parts": [{"type": "tool_result", "call_id": "call_0", "content": [{"type": "text", "text": "1"}]}]},
            {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_0", "name": "second", "arguments": "{}"}]},
            {"role": "tool", "parts": [{"type": "tool_result", "call_id": "call_0", "content": [{"type": "text", "text": "2"}]}]},
            {"role": "tool", "parts": [{"type": "tool_result", "call_id": "lost", "content": []}]}
        ]
    })
    .to_string())
    .unwrap();
    let body: Value = serde_json::from_slice(&gemini::render(&req, "m", false).body).unwrap();
    let names: Vec<&str> = body["contents"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["parts"].as_array().unwrap())
        .filter_map(|p| p["functionResponse"]["name"].as_str())
        .collect();
    // The nearest earlier call wins when ids repeat; an unknown id names itself.
    assert_eq!(names, ["first", "second", "lost"]);
}

mod framing_props {
    use super::*;
    use proptest::prelude::*;

    fn frame() -> impl Strategy<Value = bedrock::Frame> {
        (
            "[a-zA-Z]{1,24}",
            prop_oneof![Just("event"), Just("exception")],
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(|(event_type, message_type, payload)| bedrock::Frame {
                event_type,
                message_type: message_type.to_string(),
                payload,
            })
    }

    fn encode(f: &bedrock::Frame) -> Vec<u8> {
        let type_header = if f.message_type == "exception" {
            ":exception-type"
        } else {
            ":event-type"
        };
        bedrock::encode_frame(
            &[
                (type_header, &f.event_type),
                (":content-type", "application/json"),
                (":message-type", &f.message_type),
            ],
            &f.payload,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary frames, encoded and split arbitrarily, decode back the same.
        #[test]
        fn frames_survive_arbitrary_splits(
            frames in proptest::collection::vec(frame(), 0..8),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let bytes: Vec<u8> = frames.iter().flat_map(encode).collect();
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            at.sort_unstable();
            let mut d = bedrock::FrameDecoder::new();
            let mut got = Vec::new();
            let mut from = 0;
            for to in at.into_iter().chain(std::iter::once(bytes.len())) {
                d.push(&bytes[from..to]);
                from = to;
                while let Some(f) = d.next_frame() {
                    got.push(f.unwrap());
                }
            }
            prop_assert_eq!(got, frames);
        }
    }
}
