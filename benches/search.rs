//! Criterion benches of web search and tool search (issue 21):
//! - tool search over 10,000 deferred tools: the index built once per request
//!   (target: at most 5 ms) and one BM25 query (target: p50 under 200 µs), with
//!   the regular-expression variant beside it;
//! - the gateway's own overhead of a service-run search beside a plain call:
//!   building the results prompt and citing the answer, whole and streamed (target:
//!   under 100 µs p50 more than the plain call).
//!
//! `cargo bench --bench search`. Figures from a busy machine are indicative only.

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, value::RawValue};
use sluice::search::{prompt, tools};
use sluice_filters::inbound::Inbound;
use sluice_filters::ir::{
    Event, FinishReason, Meta, Response, SearchResult, ServerSearch, Tail, Tool,
};
use std::hint::black_box;
use std::sync::Arc;

const VERBS: [&str; 12] = [
    "get", "list", "create", "update", "delete", "send", "search", "fetch", "sync", "archive",
    "resolve", "schedule",
];
const NOUNS: [&str; 16] = [
    "weather",
    "invoice",
    "customer",
    "ticket",
    "calendarEvent",
    "email",
    "file",
    "repository",
    "pullRequest",
    "deployment",
    "metric",
    "alert",
    "order",
    "shipment",
    "userProfile",
    "document",
];
const WORDS: [&str; 24] = [
    "returns",
    "current",
    "records",
    "matching",
    "given",
    "filters",
    "workspace",
    "account",
    "history",
    "status",
    "latest",
    "owner",
    "region",
    "forecast",
    "billing",
    "priority",
    "attachments",
    "team",
    "project",
    "timeline",
    "summary",
    "details",
    "archive",
    "queue",
];

/// 10,000 tools like an MCP-heavy agent's: snake_case and camelCase names,
/// one-sentence descriptions, three described parameters each.
fn catalog(n: usize) -> Vec<Tool> {
    (0..n)
        .map(|i| {
            let verb = VERBS[i % VERBS.len()];
            let noun = NOUNS[(i / VERBS.len()) % NOUNS.len()];
            let name = if i % 2 == 0 {
                format!("{verb}_{}_{i}", noun.to_lowercase())
            } else {
                format!("{verb}{}{i}", noun[..1].to_uppercase() + &noun[1..])
            };
            let w = |k: usize| WORDS[(i * 7 + k * 5) % WORDS.len()];
            let description = format!(
                "{verb} the {noun} {} by {} and {} for the {}.",
                w(0),
                w(1),
                w(2),
                w(3)
            );
            let params = json!({"type": "object", "properties": {
                format!("{}Id", noun): {"type": "string", "description": format!("The {noun} to {verb}")},
                w(4): {"type": "string", "description": format!("Filter by {}", w(5))},
                "limit": {"type": "integer", "description": "How many to return"},
            }, "required": [format!("{}Id", noun)]});
            Tool {
                name,
                description: Some(description),
                parameters: RawValue::from_string(params.to_string()).unwrap(),
                strict: None,
            }
        })
        .collect()
}

fn tool_search(c: &mut Criterion) {
    let tools = catalog(10_000);
    let mut g = c.benchmark_group("tool_search_10k");
    g.bench_function("bm25_index_build", |b| {
        b.iter(|| black_box(tools::ToolIndex::build(black_box(&tools))))
    });
    let index = tools::ToolIndex::build(&tools);
    g.bench_function("bm25_query", |b| {
        b.iter(|| black_box(index.search(black_box("weather forecast for a region"), 5, |_| false)))
    });
    let re = tools::compile("weather.*forecast|forecast.*weather").unwrap();
    g.bench_function("regex_query", |b| {
        b.iter(|| black_box(tools::regex_search(&tools, black_box(&re), 5, |_| false)))
    });
    g.finish();
}

fn results() -> Vec<SearchResult> {
    (1..=5)
        .map(|i| SearchResult {
            title: format!("Result {i}: what changed in the latest release"),
            url: format!("https://site{i}.example/articles/release-notes-{i}"),
            snippet: "The release brings faster builds, a new borrow checker mode and \
                      several library stabilizations that users asked for."
                .repeat(2),
            page_age: Some("2 days ago".into()),
        })
        .collect()
}

/// An answer of about 1 KB that cites two of the results.
fn answer_text() -> String {
    let filler = "The release focuses on compile times and ergonomics. ".repeat(8);
    format!(
        "{filler}According to [site1.example](https://site1.example/articles/release-notes-1) builds are faster, \
         and [3] lists the stabilized APIs. {filler}"
    )
}

fn events(text: &str) -> Vec<Event> {
    let mut out = vec![Event::Start {
        id: Some("chatcmpl-1".into()),
        model: Some("m".into()),
    }];
    // Fifty chunks, as a streamed answer arrives.
    let step = text.len() / 50;
    let mut at = 0;
    while at < text.len() {
        let mut end = (at + step.max(1)).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(Event::Text {
            text: text[at..end].to_string(),
        });
        at = end;
    }
    out.push(Event::Finish {
        reason: FinishReason::Stop,
        raw: Some("stop".into()),
        stop_sequence: None,
    });
    out
}

fn meta(search: Option<Arc<ServerSearch>>) -> Meta {
    Meta {
        provider: "openai:m".into(),
        slug: "m".into(),
        created: 1,
        fallback_id: "x".into(),
        include_usage: true,
        stop_sequence: None,
        search,
        ..Meta::default()
    }
}

fn web_search_overhead(c: &mut Criterion) {
    let text = answer_text();
    let evs = events(&text);
    let resp = Response::from_events(&evs);
    let tail = Tail::default();
    let results = results();
    let mut g = c.benchmark_group("web_search_overhead");
    // Whole answers: the plain render, and the render of a searched request (the
    // prompt built, the search shown and the answer cited).
    g.bench_function("whole_plain", |b| {
        b.iter(|| black_box(Inbound::Chat.render(black_box(&resp), &meta(None), &tail)))
    });
    g.bench_function("whole_searched", |b| {
        b.iter(|| {
            let system = vec![prompt::web_results(black_box(&results), None, "2026-01-02")];
            let search = Arc::new(ServerSearch {
                id: "srch_1".into(),
                query: "what changed".into(),
                results: results.clone(),
            });
            black_box(system);
            black_box(Inbound::Chat.render(&resp, &meta(Some(search)), &tail))
        })
    });
    // Streams: fifty chunks encoded, plain and cited.
    let stream = |search: Option<Arc<ServerSearch>>| {
        let mut enc = Inbound::Chat.encoder(meta(search));
        let mut out = Vec::with_capacity(16 * 1024);
        for e in &evs {
            enc.event(e, &mut out);
        }
        enc.end(&tail, &mut out);
        out
    };
    g.bench_function("stream_plain", |b| b.iter(|| black_box(stream(None))));
    g.bench_function("stream_searched", |b| {
        b.iter(|| {
            let p = prompt::web_results(black_box(&results), None, "2026-01-02");
            black_box(p);
            black_box(stream(Some(Arc::new(ServerSearch {
                id: "srch_1".into(),
                query: "what changed".into(),
                results: results.clone(),
            }))))
        })
    });
    g.finish();
}

criterion_group!(benches, tool_search, web_search_overhead);
criterion_main!(benches);
