//! One parser per `source_kind`, each reading that tool's export (JSON or JSONL)
//! into the one trace model. `project` is what the worker and the pulls call.

pub mod braintrust;
pub mod chat_json;
pub mod common;
pub mod langfuse;
pub mod langsmith;
pub mod mastra;
pub mod otel;
pub mod otel_genai;
pub mod otlp;
pub mod phoenix;
pub mod posthog;

use super::model::{SourceKind, Trace};

/// The traces of an export of `kind`; `Err` says why the file is not one.
pub fn project(kind: SourceKind, bytes: &[u8]) -> Result<Vec<Trace>, String> {
    let traces = match kind {
        SourceKind::Otlp => otlp::parse(bytes),
        SourceKind::OtelGenai => otel_genai::parse(bytes),
        SourceKind::Phoenix => phoenix::parse(bytes),
        SourceKind::Braintrust => braintrust::parse(bytes),
        SourceKind::Langfuse => langfuse::parse(bytes),
        SourceKind::Langsmith => langsmith::parse(bytes),
        SourceKind::Mastra => mastra::parse(bytes),
        SourceKind::Posthog => posthog::parse(bytes),
        SourceKind::ChatJson => chat_json::parse(bytes),
    }?;
    Ok(traces)
}
