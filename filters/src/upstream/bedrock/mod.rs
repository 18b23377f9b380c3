//! The Bedrock Converse wire, spoken by the bedrock rungs: `POST
//! {base}/model/{modelId}/converse`, streamed as `/converse-stream` in the AWS
//! event-stream binary framing (SigV4 signing is the gateway's). See the module
//! contract in `upstream`; this module also holds the event-stream framing
//! ([`FrameDecoder`], [`encode_frame`]).
//!
//! Rendering notes:
//! - The model id goes in the path ([`path`] percent-encodes it), never the body.
//! - Adjacent turns of one role are merged (Converse wants user and assistant to
//!   alternate); empty text is left out (Converse refuses blank text blocks).
//! - Images and documents travel as bytes (`source.bytes`, the data URL's base64);
//!   an `https:` URL cannot be carried (Converse reads only bytes or S3) and the part
//!   is dropped and disclosed as `image_url` / `file`.
//! - Converse refuses tool blocks in the history without a `toolConfig`: when the
//!   request declares no tools, the called names are declared with an open object
//!   schema. Tool choice `none` has no Converse form: the tools are left out (so
//!   nothing can be called), or, when the history needs them, kept and `tool_choice`
//!   disclosed as dropped.
//! - A tool result's `status` is sent only for errors (`error`) and only to
//!   Anthropic models: Converse documents the field for them alone.
//! - Reasoning reaches only Anthropic models (a model id naming `anthropic` or
//!   `claude`), through `additionalModelRequestFields.thinking {type: enabled,
//!   budget_tokens}`: `budget_tokens` as given, or an effort's budget (at least
//!   Anthropic's 1024, below `max_tokens`). Elsewhere it is dropped and disclosed.
//!   Signed thinking and redacted thinking replay as `reasoningContent` blocks on
//!   Anthropic models; unsigned thinking is not replayed.
//! - Prompt-cache breakpoints (the caller's `cache_control` marks) become
//!   `{"cachePoint":{"type":"default"}}` blocks after the marked system block,
//!   content block or tool, on the models that cache (Claude, Nova); other
//!   models get none (a cachePoint there is a validation error) and cache
//!   nothing, as they would on their own.
//! - Structured output uses `outputConfig.textFormat` (`json_schema`, the schema as
//!   a JSON string); `json_object` asks for the schema `{"type":"object"}`.
//!
//! Decoding notes: stop reasons `end_turn` stop, `tool_use` tool_calls,
//! `max_tokens` / `model_context_window_exceeded` length, `stop_sequence`
//! stop_sequence (the matched sequence read from
//! `additionalModelResponseFields.stop_sequence`, which Claude rungs are asked
//! for through `additionalModelResponseFieldPaths`), `guardrail_intervened` / `content_filtered` a content_policy
//! refusal before any content (a content_filter finish after it),
//! `malformed_model_output` / `malformed_tool_use` an error. Usage: `inputTokens`
//! excludes cache reads and writes, so canonical input adds both; cached tokens are
//! `cacheReadInputTokens`.

use super::gemini::{data_url, effort_budget};
use super::Rendered;
use crate::ir::{
    CacheBreak, DecodeError, Event, FinishReason, Message, Part, RefusalReason, Request,
    ResponseFormat, Role, StreamDecoder, ToolChoice,
};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Anthropic's smallest thinking budget.
const MIN_CLAUDE_BUDGET: u64 = 1024;

/// The path for a model: `/model/{modelId}/converse` or `/converse-stream`, the id
/// percent-encoded (ids hold `:`, and ARNs `/`).
pub fn path(model_id: &str, stream: bool) -> String {
    let mut out = String::with_capacity(model_id.len() * 3 + 24);
    out.push_str("/model/");
    for b in model_id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out.push_str(if stream {
        "/converse-stream"
    } else {
        "/converse"
    });
    out
}

mod decode;
mod eventstream;
mod render;

pub use decode::{decode, refusal, Decoder};
pub use eventstream::{encode_event, encode_exception, encode_frame, Frame, FrameDecoder};
pub use render::render;
