//! The OpenAI responses wire (`POST {base}/responses`): request bodies rendered
//! from
//! the canonical form (or passed through from a responses client), and answers, whole
//! or streamed as named SSE events, decoded into canonical events (see the module
//! contract in `upstream`).
//!
//! Nothing is ever stored with the provider: `store` is always false, and neither
//! `previous_response_id` nor the gateway's `prompt_cache_key` is sent. Reasoning is
//! replayed through encrypted reasoning items instead.

use super::openai_chat::policy_reason;
use crate::ir::{
    DecodeError, Event, FinishReason, Message, Part, RefusalReason, Request, ResponseFormat, Role,
    StreamDecoder, ToolChoice,
};
use crate::json::append_member;
use crate::json::Members;
use crate::upstream::Rendered;
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Extras forwarded verbatim as top-level members: fields of this API the
/// canonical form does not model.
const FORWARDED: [&str; 8] = [
    "metadata",
    "service_tier",
    "truncation",
    "client_metadata",
    "background",
    "top_logprobs",
    "safety_identifier",
    "max_tool_calls",
];

/// Extras that are neither forwarded nor disclosed: the gateway owns them.
const GATEWAY_OWNED: [&str; 3] = ["store", "previous_response_id", "prompt_cache_key"];

/// The smallest `max_output_tokens` the API accepts; a smaller budget is raised to
/// it rather than failing the rung.
const MIN_OUTPUT_TOKENS: u64 = 16;

mod answer;
mod request;
mod stream;

use answer::*;
pub use answer::{decode, refusal};
pub use request::{render, render_native};
pub use stream::Decoder;
