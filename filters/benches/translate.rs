//! Translation costs on the hot path: parse + translate + render of a 4 KB and a
//! 200 KB chat request (to the OpenAI chat wire and across to Anthropic's), and
//! stream rewriting per chunk (an upstream SSE chunk decoded and re-encoded in
//! another format), and encoding a large embeddings answer.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::json;
use sluice_filters::inbound::{chat, embeddings, messages, Inbound};
use sluice_filters::ir::{Event, Meta, StreamDecoder, StreamEncoder};
use sluice_filters::json::{edit as json_edit, split_object_bytes, with_long_strings, RawObject};
use sluice_filters::sse::SseDecoder;
use sluice_filters::upstream::{anthropic, openai_chat};
use std::hint::black_box;

/// A chat body of about `bytes`: a system prompt, a tool, and alternating turns.
fn chat_body(bytes: usize) -> Vec<u8> {
    let turn = "The quick brown fox jumps over the lazy dog while the gateway counts tokens. ";
    let mut messages = vec![json!({"role": "system", "content": "You are a careful assistant."})];
    let mut size = 0;
    let mut i = 0;
    while size < bytes {
        let text = turn.repeat(3);
        size += text.len() + 40;
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": text}));
        i += 1;
    }
    if i % 2 == 0 {
        messages.push(json!({"role": "user", "content": "Sum it up."}));
    }
    serde_json::to_vec(&json!({
        "model": "claude-sonnet-4.5", "stream": true, "temperature": 0.7, "max_tokens": 1024,
        "tools": [{"type": "function", "function": {"name": "lookup", "description": "Looks a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}],
        "messages": messages,
    }))
    .unwrap()
}

fn requests(c: &mut Criterion) {
    let mut g = c.benchmark_group("request");
    for size in [4 * 1024, 200 * 1024] {
        let body = chat_body(size);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("chat_to_openai_chat", size),
            &body,
            |b, body| {
                b.iter(|| {
                    let req = chat::parse(black_box(body)).unwrap();
                    black_box(openai_chat::render(&req, "gpt-4.1-2025-04-14", true))
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("chat_to_anthropic", size),
            &body,
            |b, body| {
                b.iter(|| {
                    let req = chat::parse(black_box(body)).unwrap();
                    black_box(anthropic::render(&req, "claude-sonnet-4-5-20250929", true))
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("native_chat_passthrough", size),
            &body,
            |b, body| {
                b.iter(|| {
                    let text = std::str::from_utf8(black_box(body)).unwrap();
                    let o = RawObject::parse(text).unwrap();
                    black_box(openai_chat::render_request(&o, "gpt-4.1-2025-04-14", true))
                })
            },
        );
    }
    g.finish();
}

fn streams(c: &mut Criterion) {
    let chunk = br#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1-2025-04-14","choices":[{"index":0,"delta":{"content":"Hello there, "},"finish_reason":null}]}

"#;
    let anthropic_chunk = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello there, \"}}\n\n";
    let meta = Meta {
        provider: "openai:gpt-4.1".into(),
        slug: "gpt-4.1".into(),
        created: 1,
        fallback_id: "x".into(),
        include_usage: false,
        stop_sequence: None,
        prompt_estimate: 0,
        echo: String::new(),
        search: None,
        hide_reasoning: false,
    };
    let mut g = c.benchmark_group("stream_chunk");
    g.throughput(Throughput::Elements(1));
    g.bench_function("openai_chat_to_messages", |b| {
        let mut sse = SseDecoder::new();
        let mut dec = openai_chat::Decoder::new();
        let mut enc = messages::Encoder::new(meta.clone());
        let mut events: Vec<Event> = Vec::new();
        let mut out = Vec::with_capacity(4096);
        b.iter(|| {
            sse.push(black_box(chunk));
            while let Some(ev) = sse.next_event() {
                dec.frame(ev.event.as_deref(), ev.data.as_bytes(), &mut events)
                    .unwrap();
            }
            for e in events.drain(..) {
                enc.event(&e, &mut out);
            }
            out.clear();
        })
    });
    // A native stream's chunk as the gateway passes it on: read (inspect), and
    // rewritten with the rung named, into the pending write.
    g.bench_function("openai_chat_native", |b| {
        let native = br#"{"id":"chatcmpl-mock312001","object":"chat.completion.chunk","created":1795466564,"model":"bench-model-2025-04-14","service_tier":"default","system_fingerprint":"fp_mock0001","choices":[{"index":0,"delta":{"content":"Hello there, "},"logprobs":null,"finish_reason":null}]}"#;
        let mut out = Vec::with_capacity(4096);
        b.iter(|| {
            let info = openai_chat::inspect(black_box(native)).unwrap();
            json_edit::set_member_into(&mut out, native, "provider", br#""openai:bench-model""#);
            black_box(info);
            out.clear();
        })
    });
    g.bench_function("anthropic_to_chat", |b| {
        let mut sse = SseDecoder::new();
        let mut dec = anthropic::Decoder::new();
        let mut enc = chat::Encoder::new(meta.clone());
        let mut events: Vec<Event> = Vec::new();
        let mut out = Vec::with_capacity(4096);
        // The stream's opening frames, once.
        let start = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
        sse.push(start);
        while let Some(ev) = sse.next_event() {
            dec.frame(ev.event.as_deref(), ev.data.as_bytes(), &mut events).unwrap();
        }
        events.clear();
        b.iter(|| {
            sse.push(black_box(anthropic_chunk));
            while let Some(ev) = sse.next_event() {
                dec.frame(ev.event.as_deref(), ev.data.as_bytes(), &mut events).unwrap();
            }
            for e in events.drain(..) {
                enc.event(&e, &mut out);
            }
            out.clear();
        })
    });
    g.finish();
}

/// Encoding an embeddings answer: 2,048 vectors of 3,072 dimensions, as JSON floats
/// and as base64 of little-endian f32.
fn embeddings(c: &mut Criterion) {
    let vectors: Vec<Vec<f32>> = (0..2048)
        .map(|i| {
            (0..3072)
                .map(|j| ((i * 3072 + j) as f32 * 0.618).sin() * 0.05)
                .collect()
        })
        .collect();
    let mut g = c.benchmark_group("embeddings_2048x3072");
    g.sample_size(10);
    g.bench_function("json_floats", |b| {
        b.iter(|| {
            black_box(embeddings::render(
                "m",
                black_box(&vectors),
                false,
                1,
                None,
                "p",
            ))
        })
    });
    g.bench_function("base64", |b| {
        b.iter(|| {
            black_box(embeddings::render(
                "m",
                black_box(&vectors),
                true,
                1,
                None,
                "p",
            ))
        })
    });
    g.finish();
}

/// The load bench's small exchange, whole (not streamed): the request read twice
/// (its members for a native rung and the canonical form that validates it), the
/// body rendered for the rung, and the completion read and spliced (cost, provider).
fn small_exchange(c: &mut Criterion) {
    let body =
        br#"{"model":"bench-1","messages":[{"role":"user","content":"Say hello in five words."}]}"#;
    let answer = br#"{"choices":[{"finish_reason":"stop","index":0,"logprobs":null,"message":{"annotations":[],"content":"Hello from mock bench-model. The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog.","refusal":null,"role":"assistant"}}],"created":1795466564,"id":"chatcmpl-mock312001","model":"bench-model-2025-04-14","object":"chat.completion","service_tier":"default","system_fingerprint":"fp_mock0001","usage":{"completion_tokens":64,"completion_tokens_details":{"accepted_prediction_tokens":0,"audio_tokens":0,"reasoning_tokens":0,"rejected_prediction_tokens":0},"prompt_tokens":23,"prompt_tokens_details":{"audio_tokens":0,"cached_tokens":0},"total_tokens":87}}"#;
    let mut g = c.benchmark_group("small_exchange");
    g.bench_function("request_parse_and_render", |b| {
        b.iter(|| {
            let o = RawObject::parse(std::str::from_utf8(black_box(body)).unwrap()).unwrap();
            let req = chat::parse(black_box(body)).unwrap();
            black_box(&req);
            black_box(openai_chat::render_request(&o, "bench-model", false))
        })
    });
    g.bench_function("answer_inspect_and_splice", |b| {
        b.iter(|| {
            let info = openai_chat::inspect(black_box(answer)).unwrap();
            let out = json_edit::set_nested(answer, &["usage"], "cost", b"0.000151").unwrap();
            let out = json_edit::set_member(&out, "provider", br#""openai:bench-model""#);
            black_box((info, out))
        })
    });
    g.finish();
}

/// The load bench's 100 KB body (one long user turn) to a native rung: the split
/// alone (the one pass that checks JSON and UTF-8), then the request read as the
/// gateway reads it (split once, the chat form parsed from the members with the
/// long strings held) and rendered.
fn large_exchange(c: &mut Criterion) {
    let text = "lorem ipsum dolor sit amet ".repeat(4000)[..100_000].to_string();
    let body = serde_json::to_vec(&serde_json::json!({
        "model": "bench-1",
        "messages": [{"role": "user", "content": text}],
    }))
    .unwrap();
    let mut g = c.benchmark_group("large_exchange");
    g.throughput(criterion::Throughput::Bytes(body.len() as u64));
    g.bench_function("split_100kb_body", |b| {
        b.iter(|| split_object_bytes(black_box(&body)).map(drop))
    });
    g.bench_function("request_parse_and_render_100kb", |b| {
        b.iter(|| {
            let (members, long) = split_object_bytes(black_box(&body)).unwrap();
            let req = with_long_strings(&long, || Inbound::Chat.parse(&body, &members)).unwrap();
            black_box(&req);
            let o = RawObject::from_members(&members);
            black_box(openai_chat::render_request(&o, "bench-model", false))
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    requests,
    streams,
    embeddings,
    small_exchange,
    large_exchange
);
criterion_main!(benches);
