//! The Anthropic Messages wire (`POST {base}/v1/messages`), spoken by rungs of
//! provider `anthropic` (see the module contract in `upstream`).
//!
//! Rendering from the canonical form:
//! - `system` (and any stray system turn) becomes the top-level `system`;
//!   canonical tool turns become user turns of `tool_result` blocks; consecutive
//!   turns of one role are merged (Anthropic requires alternation), with a merged
//!   user turn's `tool_result` blocks first (Anthropic requires that too).
//! - `max_tokens` is required by Anthropic: without one the request gets
//!   [`DEFAULT_MAX_TOKENS`] (plus the thinking budget when thinking is on).
//! - `reasoning.budget_tokens`, else `reasoning.effort` through [`effort_budget`],
//!   becomes `thinking: {type: enabled, budget_tokens}`. Anthropic refuses sampling
//!   changes and forced tool use next to thinking, so those combinations drop
//!   `temperature` / `top_p` / `top_k` (with thinking on) or the thinking (with a
//!   forced tool), and say so in `dropped`; recent Claude models also refuse
//!   `temperature` with `top_p`, so `top_p` gives way.
//! - `response_format` json_schema becomes `output_config.format` (Anthropic's
//!   structured outputs); json_object has no Anthropic form and is dropped.
//! - The caller's cache breakpoints ([`CacheBreak`]) become `cache_control:
//!   {type: ephemeral}` on the marked system block, content block or tool (a
//!   messages body translated for Claude on Vertex keeps its caching).
//! - `extras` are forwarded only when they are Anthropic request fields (the
//!   messages inbound keeps those; another format's extras are dropped and
//!   disclosed); server tools kept as `tools.<type>` extras join `tools`.
//!
//! When the client itself spoke the Messages API, [`render_native`] forwards its
//! body instead, only swapping `model` and `stream`.
//!
//! Decoding reads a whole `message` or the named SSE events. Anthropic reports
//! `input_tokens` without cache reads and writes; the canonical input is their sum.

use crate::inbound::messages::{members, Input, MIN_THINKING_BUDGET, SERVER_TOOL_PREFIX};
use crate::ir::{
    CacheBreak, DecodeError, Event, FinishReason, Part, RefusalReason, Request, ResponseFormat,
    Role, StreamDecoder, ToolChoice,
};
use crate::upstream::Rendered;
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// The output budget sent when the request names none: Anthropic requires one, and
/// 4096 is within the output limit of every Claude model still served.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Request fields of the Messages API that an extra may carry to an Anthropic rung.
const ANTHROPIC_FIELDS: [&str; 6] = [
    "thinking",
    "output_config",
    "service_tier",
    "container",
    "mcp_servers",
    "context_management",
];

/// Fields the gateway owns: never sent, never disclosed.
const GATEWAY_OWNED: [&str; 3] = ["prompt_cache_key", "store", "previous_response_id"];

/// The thinking budget for a reasoning effort (OpenAI's names, plus `max`):
/// minimal 1024, low 2048, medium 8192, high 16384, xhigh and max 32000.
/// `None` for an effort this wire has no budget for.
pub fn effort_budget(effort: &str) -> Option<u64> {
    Some(match effort {
        "minimal" => 1024,
        "low" => 2048,
        "medium" => 8192,
        "high" => 16384,
        "xhigh" | "max" => 32000,
        _ => return None,
    })
}

mod answer;
mod request;

pub use answer::{decode, for_vertex, refusal, Decoder};
pub use request::{render, render_native};

#[cfg(test)]
mod tests {
    use super::request::unbase64;
    use super::*;

    #[test]
    fn unbase64_round_trips_text() {
        assert_eq!(unbase64("Zm9vYmFy").as_deref(), Some("foobar"));
        assert_eq!(unbase64("Zm8=").as_deref(), Some("fo"));
        assert_eq!(unbase64("Zg==").as_deref(), Some("f"));
        assert_eq!(unbase64("").as_deref(), Some(""));
        assert_eq!(unbase64("Z"), None);
        assert_eq!(unbase64("Zm9v!"), None);
    }

    #[test]
    fn refusal_only_for_the_output_filter() {
        let blocked = br#"{"type":"error","error":{"type":"invalid_request_error","message":"Output blocked by content filtering policy"}}"#;
        assert_eq!(refusal(400, blocked), Some(RefusalReason::ContentPolicy));
        assert_eq!(refusal(500, blocked), None);
        let other = br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too large"}}"#;
        assert_eq!(refusal(400, other), None);
        assert_eq!(refusal(400, b"not json"), None);
    }

    #[test]
    fn effort_map_is_monotonic() {
        let b: Vec<u64> = ["minimal", "low", "medium", "high", "xhigh"]
            .iter()
            .filter_map(|e| effort_budget(e))
            .collect();
        assert_eq!(b.len(), 5);
        assert!(b.windows(2).all(|w| w[0] < w[1]));
        assert!(b[0] >= MIN_THINKING_BUDGET);
        assert_eq!(effort_budget("ultra"), None);
    }
}
