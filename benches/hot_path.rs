//! Criterion benches of the per-request and per-chunk work the gateway adds:
//! parsing a chat body, rendering it for a rung, and rewriting one stream chunk
//! (decode, inspect, splice the provider, encode). `cargo bench --bench hot_path`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sluice_filters::json::edit::set_member as splice_member;
use sluice_filters::json::RawObject;
use sluice_filters::sse::{data_frame, SseDecoder};
use sluice_filters::upstream::openai_chat::{inspect, render_request};
use std::hint::black_box;

const BODY: &str = r#"{"model":"gpt-4.1-mini","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello in five words."}],"temperature":0.2,"max_tokens":64}"#;
const CHUNK: &str = r#"{"id":"chatcmpl-abc","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4.1-mini-2025-04-14","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null}]}"#;

fn request(c: &mut Criterion) {
    let mut g = c.benchmark_group("request");
    g.throughput(Throughput::Bytes(BODY.len() as u64));
    g.bench_function("parse_and_render_chat_body", |b| {
        b.iter(|| {
            let obj = RawObject::parse(black_box(BODY)).unwrap();
            black_box(render_request(&obj, "gpt-4.1-mini-2025-04-14", false))
        })
    });
    let big = BODY.replace("Say hello in five words.", &"lorem ipsum ".repeat(80_000));
    g.throughput(Throughput::Bytes(big.len() as u64));
    g.bench_function("parse_and_render_1mb_body", |b| {
        b.iter(|| {
            let obj = RawObject::parse(black_box(&big)).unwrap();
            black_box(render_request(&obj, "m", true))
        })
    });
    g.finish();
}

fn stream_chunk(c: &mut Criterion) {
    let frame = data_frame(CHUNK.as_bytes());
    let provider = br#""openai:gpt-4.1-mini-2025-04-14""#;
    let mut g = c.benchmark_group("stream");
    g.throughput(Throughput::Elements(1));
    g.bench_function("rewrite_one_chunk", |b| {
        let mut d = SseDecoder::new();
        b.iter(|| {
            d.push(black_box(&frame));
            let ev = d.next_event().unwrap();
            let info = inspect(ev.data.as_bytes()).unwrap();
            black_box(info.has_content);
            black_box(data_frame(&splice_member(
                ev.data.as_bytes(),
                "provider",
                provider,
            )))
        })
    });
    g.finish();
}

criterion_group!(benches, request, stream_chunk);
criterion_main!(benches);
