//! `otlp`: a generic OTLP/JSON trace export (see `otel`). A generic export may
//! carry any LLM convention, so this kind reads every one it knows: gen_ai.*
//! (`otel_genai`), OpenInference (`phoenix`) and the AI SDK's ai.* (`mastra`).

use super::otel;
use crate::telemetry::model::Trace;

pub fn parse(bytes: &[u8]) -> Result<Vec<Trace>, String> {
    Ok(otel::project(
        otel::read(bytes)?,
        &[
            super::otel_genai::convention,
            super::phoenix::convention,
            super::mastra::ai_sdk_convention,
        ],
    ))
}
