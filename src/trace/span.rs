//! Spans as the exporter sends them, and the attempt spans one request gathers
//! while its waterfall runs (carried in the request's tally; nothing at all when
//! tracing is off and the client sent no `traceparent`).

use super::context::{nonzero, Header, TraceContext};

pub const KIND_SERVER: u8 = 2;
pub const KIND_CLIENT: u8 = 3;

/// One finished span.
#[derive(Clone, Debug)]
pub struct SpanRecord {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub kind: u8,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attrs: Vec<(&'static str, Attr)>,
    /// An error span's `error.type` (status ERROR); `None`: status OK.
    pub error: Option<&'static str>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Str(String),
    Int(i64),
    Bool(bool),
}

/// Now in Unix nanoseconds.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The `gen_ai.provider.name` of the GenAI semantic conventions for a provider
/// of ours (our own name where the conventions list none).
pub fn genai_provider(provider: &str) -> &'static str {
    match provider {
        "openai" => "openai",
        "anthropic" => "anthropic",
        "google" => "gcp.gemini",
        "vertex" => "gcp.vertex_ai",
        "bedrock" => "aws.bedrock",
        "azure" => "azure.ai.openai",
        "mistral" => "mistral_ai",
        "openrouter" => "openrouter",
        "hosted" => "hosted",
        "local" => "local",
        _ => "other",
    }
}

/// What one attempt on a rung was.
pub struct AttemptFacts<'a> {
    pub provider: &'a str,
    pub model_id: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub rung: &'a str,
    pub outcome: &'static str,
}

/// The request's trace while its waterfall runs.
struct Spans {
    /// Our trace, and the request span's id (the parent of every attempt).
    ctx: TraceContext,
    /// Spans are made and exported; else only the client's `traceparent` is
    /// passed on unchanged.
    export: bool,
    /// The attempt in progress: its span id and start.
    current: Option<([u8; 8], u64)>,
    done: Vec<SpanRecord>,
}

/// The attempt spans of one request (empty: nothing traced, nothing passed on).
#[derive(Default)]
pub struct Attempts(Option<Box<Spans>>);

impl Attempts {
    /// `ctx`: the request span's context; `export`: make spans.
    pub(super) fn new(ctx: TraceContext, export: bool) -> Attempts {
        Attempts(Some(Box::new(Spans {
            ctx,
            export,
            current: None,
            done: Vec::new(),
        })))
    }

    /// The `traceparent` the provider gets now: the attempt span as the parent
    /// when we trace, else the client's own.
    pub fn header(&self) -> Option<Header> {
        let s = self.0.as_deref()?;
        let mut ctx = s.ctx;
        if let Some((id, _)) = s.current {
            ctx.span_id = id;
        }
        Some(ctx.header())
    }

    /// An attempt starts.
    pub fn begin(&mut self) {
        if let Some(s) = self.0.as_deref_mut().filter(|s| s.export) {
            s.current = Some((nonzero(), now_ns()));
        }
    }

    /// The attempt begun last ended.
    pub fn end(&mut self, a: AttemptFacts) {
        let Some(s) = self.0.as_deref_mut().filter(|s| s.export) else {
            return;
        };
        let Some((span_id, start_ns)) = s.current.take() else {
            return;
        };
        let ok = a.outcome == "ok";
        s.done.push(SpanRecord {
            trace_id: s.ctx.trace_id,
            span_id,
            parent: Some(s.ctx.span_id),
            name: format!("chat {}", a.model_id),
            kind: KIND_CLIENT,
            start_ns,
            end_ns: now_ns(),
            attrs: vec![
                ("gen_ai.operation.name", Attr::Str("chat".into())),
                (
                    "gen_ai.provider.name",
                    Attr::Str(genai_provider(a.provider).into()),
                ),
                ("gen_ai.request.model", Attr::Str(a.model_id.into())),
                ("server.address", Attr::Str(a.host.into())),
                ("server.port", Attr::Int(a.port.into())),
                ("sluice.rung", Attr::Str(a.rung.into())),
                ("sluice.attempt.outcome", Attr::Str(a.outcome.into())),
            ],
            error: (!ok).then_some(a.outcome),
        });
    }

    /// The finished attempt spans, for the request's export.
    pub(super) fn take(&mut self) -> Vec<SpanRecord> {
        self.0
            .as_deref_mut()
            .map(|s| std::mem::take(&mut s.done))
            .unwrap_or_default()
    }
}
