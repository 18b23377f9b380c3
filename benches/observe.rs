//! What recording one request costs the gateway when tracing is off and logs are
//! text (the defaults): the trail opened, settled (time and token families) and
//! closed (requests, duration, in-flight gauges). `cargo bench --bench observe`.

use criterion::{criterion_group, criterion_main, Criterion};
use pingora::http::RequestHeader;
use sluice::config::ObservabilityConfig;
use sluice::trace::Tracer;
use sluice_filters::usage::Usage;
use sluice_filters::Route;
use std::hint::black_box;
use std::time::{Duration, Instant};

fn request(c: &mut Criterion) {
    let tracer = Tracer::new(&ObservabilityConfig::default(), "inst_bench").unwrap();
    let mut req = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
    req.insert_header("x-request-id", "0123456789abcdef0123456789abcdef")
        .unwrap();
    let usage = Usage {
        input_tokens: 1200,
        cached_tokens: 800,
        output_tokens: 300,
        ..Usage::default()
    };
    let times = (
        Some(Duration::from_millis(180)),
        Duration::from_micros(45),
        Duration::from_millis(900),
    );
    let mut g = c.benchmark_group("observe");
    g.bench_function("one_request_recorded", |b| {
        b.iter(|| {
            let mut t = tracer.start(Route::Chat, black_box(&req), || None, Instant::now());
            t.streaming(true);
            t.settled(
                "platform_funded",
                None,
                black_box("openai:ok"),
                Some("openai:gpt-4.1-mini"),
                &usage,
                1234,
                times,
                false,
            );
            tracer.finish(t, 200);
        })
    });
    g.finish();
}

criterion_group!(benches, request);
criterion_main!(benches);
