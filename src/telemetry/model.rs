//! The one trace model every source is projected into: a trace is a tree of spans
//! (parent links, times, model and provider, the messages in and out, tokens, cost,
//! tags), whatever tool recorded it. Times are Unix milliseconds; cost is USD.

use serde::Serialize;
use std::collections::HashMap;

/// The nine export formats the intake reads (SPEC's `source_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceKind {
    Otlp,
    OtelGenai,
    Phoenix,
    Braintrust,
    Langfuse,
    Langsmith,
    Mastra,
    Posthog,
    ChatJson,
}

impl SourceKind {
    pub const ALL: [SourceKind; 9] = [
        SourceKind::Otlp,
        SourceKind::OtelGenai,
        SourceKind::Phoenix,
        SourceKind::Braintrust,
        SourceKind::Langfuse,
        SourceKind::Langsmith,
        SourceKind::Mastra,
        SourceKind::Posthog,
        SourceKind::ChatJson,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Otlp => "otlp",
            SourceKind::OtelGenai => "otel-genai",
            SourceKind::Phoenix => "phoenix",
            SourceKind::Braintrust => "braintrust",
            SourceKind::Langfuse => "langfuse",
            SourceKind::Langsmith => "langsmith",
            SourceKind::Mastra => "mastra",
            SourceKind::Posthog => "posthog",
            SourceKind::ChatJson => "chat-json",
        }
    }

    pub fn parse(s: &str) -> Option<SourceKind> {
        SourceKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// One message of a conversation, text only (parts joined).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Span {
    pub span_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    pub name: String,
    /// What the span did: `llm`, `tool`, `chain`, `agent`, `retrieval`, `span`, ...
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub input: Vec<Message>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub output: Vec<Message>,
    pub input_tokens: i64,
    pub output_tokens: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Trace {
    pub trace_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub tags: Vec<String>,
    pub spans: Vec<Span>,
}

impl Trace {
    pub fn started_at(&self) -> Option<i64> {
        self.spans.iter().filter_map(|s| s.started_at).min()
    }

    pub fn ended_at(&self) -> Option<i64> {
        self.spans
            .iter()
            .filter_map(|s| s.ended_at.or(s.started_at))
            .max()
    }

    /// The first model any span names (the root's generation, usually).
    pub fn model(&self) -> Option<&str> {
        self.spans.iter().find_map(|s| s.model.as_deref())
    }

    pub fn provider(&self) -> Option<&str> {
        self.spans.iter().find_map(|s| s.provider.as_deref())
    }

    pub fn input_tokens(&self) -> i64 {
        self.spans.iter().map(|s| s.input_tokens).sum()
    }

    pub fn output_tokens(&self) -> i64 {
        self.spans.iter().map(|s| s.output_tokens).sum()
    }

    /// The cost the spans report, in micro-USD; `None` when none reports one.
    pub fn cost_micro_usd(&self) -> Option<i64> {
        let costs: Vec<f64> = self.spans.iter().filter_map(|s| s.cost_usd).collect();
        (!costs.is_empty()).then(|| (costs.iter().sum::<f64>() * 1e6).round() as i64)
    }

    /// The trace's name: its own, else its root span's.
    pub fn display_name(&self) -> Option<&str> {
        self.name.as_deref().or_else(|| {
            self.spans
                .iter()
                .find(|s| s.parent_id.is_none())
                .or(self.spans.first())
                .map(|s| s.name.as_str())
        })
    }
}

/// Spans gathered into traces by trace id, in the order traces first appear.
#[derive(Default)]
pub struct TraceSet {
    index: HashMap<String, usize>,
    traces: Vec<Trace>,
}

impl TraceSet {
    /// The trace of this id, created when new.
    pub fn trace(&mut self, trace_id: &str) -> &mut Trace {
        let i = match self.index.get(trace_id) {
            Some(&i) => i,
            None => {
                self.traces.push(Trace {
                    trace_id: trace_id.to_string(),
                    ..Trace::default()
                });
                self.index
                    .insert(trace_id.to_string(), self.traces.len() - 1);
                self.traces.len() - 1
            }
        };
        &mut self.traces[i]
    }

    pub fn push(&mut self, trace_id: &str, span: Span) {
        self.trace(trace_id).spans.push(span);
    }

    /// The traces, each with its spans in time order and parent links that point
    /// inside the trace (a parent the export did not include is dropped, so the
    /// span becomes a root rather than dangling).
    pub fn finish(self) -> Vec<Trace> {
        let mut traces = self.traces;
        for t in &mut traces {
            let ids: std::collections::HashSet<String> =
                t.spans.iter().map(|s| s.span_id.clone()).collect();
            for s in &mut t.spans {
                if s.parent_id
                    .as_ref()
                    .is_some_and(|p| !ids.contains(p) || *p == s.span_id)
                {
                    s.parent_id = None;
                }
            }
            t.spans.sort_by_key(|s| s.started_at.unwrap_or(i64::MAX));
            t.tags.sort();
            t.tags.dedup();
        }
        traces
    }
}
