//! Each source parser on a realistic export of its tool (tests/fixtures/telemetry):
//! the traces found, the parent links, the model and provider, the messages, the
//! tokens, cost, tags and errors a user of that tool would expect to see.

use sluice::telemetry::model::{SourceKind, Span, Trace};
use sluice::telemetry::sources::project;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/telemetry/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn parse(kind: SourceKind, file: &str) -> Vec<Trace> {
    project(kind, &fixture(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn trace<'a>(ts: &'a [Trace], id: &str) -> &'a Trace {
    ts.iter().find(|t| t.trace_id == id).unwrap_or_else(|| {
        panic!(
            "no trace {id} in {:?}",
            ts.iter().map(|t| &t.trace_id).collect::<Vec<_>>()
        )
    })
}

fn span<'a>(t: &'a Trace, id: &str) -> &'a Span {
    t.spans
        .iter()
        .find(|s| s.span_id == id)
        .unwrap_or_else(|| panic!("no span {id}"))
}

#[test]
fn otlp_json_with_any_llm_convention() {
    let ts = parse(SourceKind::Otlp, "otlp.json");
    assert_eq!(ts.len(), 2);
    let t = trace(&ts, "5b8efff798038103d269b633813fc60c");
    assert_eq!(t.spans.len(), 2);
    assert_eq!(t.tags, ["service:support-bot"]);
    let root = span(t, "eee19b7ec3c1b174");
    assert_eq!(root.parent_id, None, "an empty parentSpanId is a root");
    let llm = span(t, "eee19b7ec3c1b173");
    assert_eq!(llm.parent_id.as_deref(), Some("eee19b7ec3c1b174"));
    assert_eq!(llm.model.as_deref(), Some("gpt-4o-mini-2024-07-18"));
    assert_eq!(llm.provider.as_deref(), Some("openai"));
    assert_eq!((llm.input_tokens, llm.output_tokens), (24, 9));
    assert_eq!(llm.input.len(), 2);
    assert_eq!(llm.input[0].role, "system");
    assert_eq!(llm.output[0].content, "Sorry about that, let me check.");
    assert_eq!(llm.started_at, Some(1_714_557_600_100));
    assert_eq!(llm.ended_at, Some(1_714_557_602_400));
    // The second line is an OpenInference span with an error status.
    let t2 = trace(&ts, "0af7651916cd43dd8448eb211c80319c");
    let s = &t2.spans[0];
    assert_eq!(s.model.as_deref(), Some("claude-3-5-haiku-20241022"));
    assert_eq!(s.kind, "llm");
    assert_eq!(s.error.as_deref(), Some("rate limited upstream"));
    assert_eq!(t2.input_tokens(), 12);
}

#[test]
fn otel_genai_semantic_conventions() {
    let ts = parse(SourceKind::OtelGenai, "otel-genai.json");
    assert_eq!(ts.len(), 2);
    let t = trace(&ts, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(t.spans.len(), 3);
    assert_eq!(span(t, "00f067aa0ba902b7").kind, "agent");
    assert_eq!(span(t, "6a3b9f4e2c1d0e8f").kind, "tool");
    let chat = span(t, "53995c3f42cd8ad8");
    assert_eq!(chat.kind, "llm");
    assert_eq!(chat.parent_id.as_deref(), Some("00f067aa0ba902b7"));
    assert_eq!(chat.model.as_deref(), Some("gemini-2.0-flash-001"));
    assert_eq!(chat.provider.as_deref(), Some("gcp.gemini"));
    assert_eq!((chat.input_tokens, chat.output_tokens), (97, 52));
    assert_eq!(chat.input[0].role, "system");
    assert_eq!(chat.input[0].content, "You plan trips.");
    assert_eq!(chat.input[1].content, "Weekend in Lisbon?");
    assert_eq!(chat.output[0].content, "Day 1: Alfama. Day 2: Belem.");
    assert_eq!(t.model(), Some("gemini-2.0-flash-001"));
    // The older event form of the messages.
    let t2 = trace(&ts, "a1b2c3d4e5f60718293a4b5c6d7e8f90");
    let s = &t2.spans[0];
    assert_eq!(s.provider.as_deref(), Some("openai"));
    assert_eq!(
        s.input.iter().map(|m| m.role.as_str()).collect::<Vec<_>>(),
        ["system", "user"]
    );
    assert_eq!(s.output[0].content, "Lima.");
}

#[test]
fn phoenix_span_records() {
    let ts = parse(SourceKind::Phoenix, "phoenix.json");
    assert_eq!(ts.len(), 2);
    let t = trace(&ts, "6c1a0f6b5b0d4e3f9a8b7c6d5e4f3a2b");
    assert_eq!(t.spans.len(), 3);
    let root = span(t, "8f7e6d5c4b3a2910");
    assert_eq!(root.kind, "chain");
    assert_eq!(root.tags, ["rag", "prod"]);
    assert_eq!(root.input[0].content, "What is our refund window?");
    assert_eq!(span(t, "1a2b3c4d5e6f7081").kind, "retriever");
    let llm = span(t, "9a8b7c6d5e4f3021");
    assert_eq!(llm.parent_id.as_deref(), Some("8f7e6d5c4b3a2910"));
    assert_eq!(llm.model.as_deref(), Some("gpt-4o-2024-08-06"));
    assert_eq!((llm.input_tokens, llm.output_tokens), (412, 8));
    assert_eq!(llm.input.len(), 2);
    assert_eq!(llm.output[0].content, "30 days from delivery.");
    assert_eq!(t.cost_micro_usd(), Some(1110));
    assert_eq!(llm.started_at, Some(1_741_082_400_700));
    let bad = trace(&ts, "ffeeddccbbaa99887766554433221100");
    assert_eq!(
        bad.spans[0].error.as_deref(),
        Some("context length exceeded")
    );
    assert_eq!(bad.spans[0].input[0].content, "(very long)");
}

#[test]
fn phoenix_reads_otlp_too() {
    let ts = parse(SourceKind::Phoenix, "otlp.json");
    let t = trace(&ts, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(
        t.spans[0].output[0].content,
        "Customer disputes an invoice."
    );
}

#[test]
fn braintrust_log_events() {
    let ts = parse(SourceKind::Braintrust, "braintrust.jsonl");
    assert_eq!(ts.len(), 2);
    let t = trace(&ts, "c2f6e1a0-5b1e-4a3e-9d2f-1b2c3d4e5f60");
    assert_eq!(t.name.as_deref(), Some("answer_question"));
    assert_eq!(t.tags, ["faq", "prod"]);
    assert_eq!(t.spans.len(), 2);
    let llm = span(t, "7d1e9c3b-2f4a-4b8e-8c1d-0e9f8a7b6c5d");
    assert_eq!(
        llm.parent_id.as_deref(),
        Some("c2f6e1a0-5b1e-4a3e-9d2f-1b2c3d4e5f60")
    );
    assert_eq!(llm.kind, "llm");
    assert_eq!(llm.model.as_deref(), Some("gpt-4o"));
    assert_eq!((llm.input_tokens, llm.output_tokens), (180, 11));
    assert_eq!(llm.output[0].content, "The Enterprise plan includes SSO.");
    assert_eq!(llm.started_at, Some(1_739_178_900_120));
    assert_eq!(t.cost_micro_usd(), Some(560));
    let t2 = trace(&ts, "0b7a9e1f-3c2d-4e5f-8a9b-1c2d3e4f5a6b");
    assert_eq!(t2.spans[0].input[0].content, "Translate 'hello' to French");
    assert_eq!(t2.spans[0].output[0].content, "Bonjour");
}

#[test]
fn langfuse_traces_with_observations() {
    let ts = parse(SourceKind::Langfuse, "langfuse.json");
    assert_eq!(ts.len(), 2);
    let t = trace(&ts, "trace-7f3a2b1c");
    assert_eq!(t.name.as_deref(), Some("rag-pipeline"));
    assert_eq!(t.tags, ["production", "rag"]);
    assert_eq!(t.spans.len(), 2);
    let gen = span(t, "obs-gen-1");
    assert_eq!(gen.kind, "llm");
    assert_eq!(gen.parent_id.as_deref(), Some("obs-span-1"));
    assert_eq!(gen.model.as_deref(), Some("gpt-4o-mini"));
    assert_eq!(gen.provider.as_deref(), Some("openai"));
    assert_eq!((gen.input_tokens, gen.output_tokens), (350, 12));
    assert_eq!(gen.output[0].content, "Use the 'Forgot password' link.");
    assert_eq!(t.cost_micro_usd(), Some(60));
    let t2 = trace(&ts, "trace-1d2e3f4a");
    assert_eq!(t2.spans[0].error.as_deref(), Some("retried once"));
}

#[test]
fn langsmith_runs() {
    let ts = parse(SourceKind::Langsmith, "langsmith.jsonl");
    assert_eq!(ts.len(), 2);
    let t = trace(&ts, "1f0c6a2e-8b3d-4c5e-9f7a-2b3c4d5e6f70");
    assert_eq!(t.name.as_deref(), Some("RunnableSequence"));
    assert_eq!(t.spans.len(), 2);
    let llm = span(t, "2a1b3c4d-5e6f-4708-9a1b-2c3d4e5f6a7b");
    assert_eq!(llm.model.as_deref(), Some("gpt-4o"));
    assert_eq!(llm.provider.as_deref(), Some("openai"));
    assert_eq!(
        llm.input
            .iter()
            .map(|m| m.role.as_str())
            .collect::<Vec<_>>(),
        ["system", "user"]
    );
    assert_eq!(llm.output[0].content, "It's 4°C and cloudy in Oslo.");
    // The chain's rolled-up counts are not counted again.
    assert_eq!((t.input_tokens(), t.output_tokens()), (130, 15));
    assert_eq!(t.cost_micro_usd(), Some(425));
    assert_eq!(llm.started_at, Some(1_743_494_400_200));
    let t2 = trace(&ts, "3b2c4d5e-6f70-4819-8a2b-3c4d5e6f7a8b");
    assert_eq!(
        t2.spans[0].error.as_deref(),
        Some("APIConnectionError: retried")
    );
    assert_eq!(t2.spans[0].output[0].content, "Hi!");
}

#[test]
fn mastra_ai_spans_and_otel_rows() {
    let ts = parse(SourceKind::Mastra, "mastra.json");
    assert_eq!(ts.len(), 2);
    let t = trace(&ts, "8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d");
    assert_eq!(t.spans.len(), 3);
    assert_eq!(t.name.as_deref(), Some("agent run: 'weather-agent'"));
    let llm = span(t, "b2c3d4e5f6071829");
    assert_eq!(llm.kind, "llm");
    assert_eq!(llm.model.as_deref(), Some("gpt-4o-mini"));
    assert_eq!((llm.input_tokens, llm.output_tokens), (58, 9));
    assert_eq!(llm.input.len(), 2);
    assert_eq!(llm.output[0].content, "Sunny, 24°C.");
    assert_eq!(span(t, "c3d4e5f607182930").kind, "tool_call");
    let t2 = trace(&ts, "1234abcd5678ef901234abcd5678ef90");
    let s = &t2.spans[0];
    assert_eq!(s.model.as_deref(), Some("claude-3-5-sonnet-20241022"));
    assert_eq!((s.input_tokens, s.output_tokens), (11, 2));
    assert_eq!(s.input[0].content, "Name a color");
    assert_eq!(s.output[0].content, "Blue");
    assert_eq!(s.started_at, Some(1_748_779_200_000));
}

#[test]
fn posthog_ai_events() {
    let ts = parse(SourceKind::Posthog, "posthog.json");
    assert_eq!(ts.len(), 2);
    let t = trace(&ts, "trace_5f4e3d2c");
    assert_eq!(t.name.as_deref(), Some("checkout-assistant"));
    assert_eq!(t.spans.len(), 2);
    let gen = span(t, "gen_1");
    assert_eq!(gen.parent_id.as_deref(), Some("span_lookup"));
    assert_eq!(
        span(t, "span_lookup").parent_id,
        None,
        "the trace id as parent is a root"
    );
    assert_eq!(gen.model.as_deref(), Some("gpt-4o-mini"));
    assert_eq!((gen.input_tokens, gen.output_tokens), (42, 10));
    assert_eq!(gen.output[0].content, "A sleeping bag and a lantern.");
    assert_eq!(gen.ended_at.unwrap() - gen.started_at.unwrap(), 1800);
    assert_eq!(t.cost_micro_usd(), Some(12));
    // Properties as JSON text, as the query API returns them.
    let t2 = trace(&ts, "trace_aa11bb22");
    assert_eq!(t2.spans[0].output[0].content, "pong");
    assert_eq!(t2.spans[0].error.as_deref(), Some("overloaded_error"));
}

#[test]
fn chat_json_lines() {
    let ts = parse(SourceKind::ChatJson, "chat-json.jsonl");
    assert_eq!(ts.len(), 3);
    let t = trace(&ts, "chatcmpl-AXa1");
    let s = &t.spans[0];
    assert_eq!(s.model.as_deref(), Some("gpt-4o-mini-2024-07-18"));
    assert_eq!((s.input_tokens, s.output_tokens), (20, 1));
    assert_eq!(s.output[0].content, "4");
    assert_eq!(t.tags, ["math"]);
    assert_eq!(ts[1].spans[0].input[0].content, "Name a fruit");
    let conv = &ts[2].spans[0];
    assert_eq!(conv.input[0].content, "hello");
    assert_eq!(conv.output[0].content, "Hi! How can I help?");
    assert_eq!(conv.model.as_deref(), Some("llama-3.1-8b"));
}

#[test]
fn a_file_of_another_tool_is_refused_with_a_reason() {
    for (kind, file) in [
        (SourceKind::Otlp, "langsmith.jsonl"),
        (SourceKind::OtelGenai, "braintrust.jsonl"),
        (SourceKind::Braintrust, "otlp.json"),
        (SourceKind::Langfuse, "braintrust.jsonl"),
        (SourceKind::Langsmith, "posthog.json"),
        (SourceKind::Mastra, "chat-json.jsonl"),
        (SourceKind::Posthog, "langfuse.json"),
        (SourceKind::Phoenix, "chat-json.jsonl"),
    ] {
        let e = project(kind, &fixture(file)).expect_err(file);
        assert!(!e.is_empty());
    }
    let e = project(SourceKind::ChatJson, b"{\"a\": 1}\n{oops\n").unwrap_err();
    assert!(e.contains("line 2"), "{e}");
}
