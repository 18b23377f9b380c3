//! Every inbound format against every upstream wire, both ways: a rich request of
//! each format rendered for each wire, and a tool-calling stream of each wire
//! re-encoded in each format (streamed and whole). Golden files in
//! `tests/golden/matrix/`; set `UPDATE_GOLDEN=1` to rewrite them, then review.

use serde_json::{json, Value};
use sluice_filters::inbound::{chat, messages, responses};
use sluice_filters::ir::{Event, Meta, Request, Response, StreamDecoder, StreamEncoder, Tail};
use sluice_filters::sse::SseDecoder;
use sluice_filters::upstream::{
    anthropic, bedrock, gemini, openai_chat, openai_responses, Rendered,
};
use sluice_filters::usage::Usage;

#[macro_use]
mod common;

golden!("");

const WIRES: [&str; 5] = [
    "openai_chat",
    "openai_responses",
    "anthropic",
    "gemini",
    "bedrock",
];

fn render(wire: &str, req: &Request) -> Rendered {
    match wire {
        "openai_chat" => openai_chat::render(req, "gpt-4.1-2025-04-14", true),
        "openai_responses" => openai_responses::render(req, "gpt-5-2025-08-07", true),
        "anthropic" => anthropic::render(req, "claude-sonnet-4-5-20250929", true),
        "gemini" => gemini::render(req, "gemini-2.5-pro", true),
        _ => bedrock::render(req, "anthropic.claude-sonnet-4-5-20250929-v1:0", true),
    }
}

fn inbound_requests() -> Vec<(&'static str, Request)> {
    vec![
        (
            "chat",
            chat::parse(&read("chat/request_full.json")).unwrap(),
        ),
        (
            "responses",
            responses::parse(&read("responses/request/conversation.in.json")).unwrap(),
        ),
        (
            "messages",
            messages::parse(&read("anthropic/request_full.json")).unwrap(),
        ),
    ]
}

#[test]
fn every_inbound_request_renders_for_every_wire() {
    for (inbound, req) in inbound_requests() {
        for wire in WIRES {
            let r = render(wire, &req);
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            // Gateway-owned fields never travel.
            for owned in ["prompt_cache_key", "previous_response_id"] {
                assert!(body.get(owned).is_none(), "{inbound}->{wire} sent {owned}");
            }
            check_json(
                &format!("matrix/request/{inbound}_to_{wire}.json"),
                &json!({"body": body, "dropped": r.dropped}),
            );
        }
    }
}

/// A tool-calling stream of each wire, decoded to canonical events.
fn wire_streams() -> Vec<(&'static str, Vec<Event>)> {
    fn sse(dec: &mut dyn StreamDecoder, bytes: &[u8]) -> Vec<Event> {
        let mut d = SseDecoder::new();
        d.push(bytes);
        let mut out = Vec::new();
        while let Some(ev) = d.next_event() {
            if !ev.data.is_empty() {
                dec.frame(ev.event.as_deref(), ev.data.as_bytes(), &mut out)
                    .unwrap();
            }
        }
        out
    }
    let frames: Vec<Value> =
        serde_json::from_slice(&read("bedrock/stream/tool_reasoning.frames.json")).unwrap();
    let mut wire = Vec::new();
    for f in &frames {
        let payload = serde_json::to_vec(&f["payload"]).unwrap();
        wire.extend(bedrock::encode_event(f["type"].as_str().unwrap(), &payload));
    }
    let mut fd = bedrock::FrameDecoder::new();
    fd.push(&wire);
    let mut bd = bedrock::Decoder::new();
    let mut bedrock_events = Vec::new();
    while let Some(frame) = fd.next_frame() {
        let frame = frame.unwrap();
        bd.frame(Some(&frame.event_type), &frame.payload, &mut bedrock_events)
            .unwrap();
    }
    vec![
        (
            "openai_chat",
            sse(
                &mut openai_chat::Decoder::new(),
                &read("chat/stream_tools.sse"),
            ),
        ),
        (
            "openai_responses",
            sse(
                &mut openai_responses::Decoder::new(),
                &read("responses/stream/function_calls.sse"),
            ),
        ),
        (
            "anthropic",
            sse(
                &mut anthropic::Decoder::new(),
                &read("anthropic/stream_tool_use.sse"),
            ),
        ),
        (
            "gemini",
            sse(
                &mut gemini::Decoder::new(),
                &read("gemini/stream/tool_thinking.sse"),
            ),
        ),
        ("bedrock", bedrock_events),
    ]
}

fn meta() -> Meta {
    Meta {
        provider: "rung:model".into(),
        slug: "the-model".into(),
        created: 1_760_000_000,
        fallback_id: "gw_1".into(),
        include_usage: true,
        stop_sequence: None,
        prompt_estimate: 0,
        echo: String::new(),
        search: None,
        hide_reasoning: false,
    }
}

fn encoder(inbound: &str) -> Box<dyn StreamEncoder> {
    match inbound {
        "chat" => Box::new(chat::Encoder::new(meta())),
        "responses" => Box::new(responses::Encoder::new(meta())),
        _ => Box::new(messages::Encoder::new(meta())),
    }
}

fn render_whole(inbound: &str, resp: &Response, tail: &Tail) -> Vec<u8> {
    match inbound {
        "chat" => chat::render(resp, &meta(), tail),
        "responses" => responses::render(resp, &meta(), tail),
        _ => messages::render(resp, &meta(), tail),
    }
}

#[test]
fn every_wire_stream_reencodes_in_every_format() {
    for (wire, events) in wire_streams() {
        assert!(
            events
                .iter()
                .any(|e| matches!(e, Event::ToolCallStart { .. })),
            "{wire}: no tool call"
        );
        let usage = events
            .iter()
            .rev()
            .find_map(|e| match e {
                Event::Usage(u) => Some(*u),
                _ => None,
            })
            .unwrap_or(Usage::default());
        let tail = Tail {
            usage,
            cut: false,
            receipt: r#"{"attempts":"rung:ok","overhead_us":90}"#.into(),
            ignored: None,
        };
        for inbound in ["chat", "responses", "messages"] {
            let mut enc = encoder(inbound);
            let mut out = Vec::new();
            for e in &events {
                enc.event(e, &mut out);
            }
            enc.end(&tail, &mut out);
            check_text(
                &format!("matrix/stream/{wire}_to_{inbound}.sse"),
                &String::from_utf8(out).unwrap(),
            );
            let whole = render_whole(inbound, &Response::from_events(&events), &tail);
            check_json(
                &format!("matrix/stream/{wire}_to_{inbound}.whole.json"),
                &serde_json::from_slice(&whole).unwrap(),
            );
        }
    }
}
