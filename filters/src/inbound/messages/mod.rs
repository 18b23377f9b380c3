//! The messages inbound format: clients of the Anthropic Messages API calling
//! `/v1/messages` (see the module contract in `inbound`).
//!
//! Parsing maps the body onto the canonical [`Request`]. Fields the canonical form
//! does not model stay verbatim in `extras` (they reach Anthropic rungs only):
//! unknown top-level fields, the `thinking` object (also read into
//! `Request::reasoning`), an `output_config` carrying more than `format`, and server
//! tools (tool entries whose `type` is not `custom`), each kept whole under the name
//! `tools.<type>` (see [`SERVER_TOOL_PREFIX`]).
//!
//! A user turn is split into runs: `tool_result` blocks become a canonical
//! [`Role::Tool`] turn, other blocks a [`Role::User`] turn, in their order.
//! `server_tool_use` and `web_search_tool_result` blocks of assistant history (what a
//! search turn left behind) are skipped: the canonical form has no place for them.
//! Thinking blocks without a signature (only another maker's reasoning, as this
//! gateway renders it, lacks one) are kept: the route's policy refuses thinking
//! history where not every rung is Claude, and Claude rungs leave them out (no one
//! can verify them). Each part records its block's position ([`Origin`]), so a
//! refusal names the block the client sent.
//!
//! Reasoning is shown as thinking blocks only when the client enabled thinking
//! (as Anthropic does): a reasoning model on a mixed route would otherwise hand
//! the client blocks its next turn could not send back.
//!
//! Rendering writes the `message` object, or the Messages SSE sequence. Anthropic's
//! `usage.input_tokens` excludes cache reads while the canonical `input_tokens`
//! includes them: `input_tokens = canonical input - cached`,
//! `cache_read_input_tokens = cached`.

use crate::error::{ApiError, ErrorCode, Format};
use crate::inbound::common::{check_description, invalid, malformed, refused_everywhere};
use crate::ir::{
    CacheBreak, Event, Extra, FinishReason, Message, Meta, Origin, Part, Reasoning, Request,
    Response, ResponseFormat, Role, SearchForm, SearchResult, ServerSearch, StreamEncoder, Tail,
    Tool, ToolChoice, ToolSearch, ToolSearchKind, UrlCitation,
};
use crate::json::{Member, Members};
use crate::usage::Usage;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
use std::io::Write;

/// Top-level members of Anthropic's messages API the canonical form does not
/// model: kept verbatim for Anthropic rungs (dropped and disclosed elsewhere).
const ANTHROPIC_ONLY: [&str; 5] = [
    "service_tier",
    "container",
    "mcp_servers",
    "context_management",
    "inference_geo",
];

/// The `extras` name prefix of a server tool (`tools.web_search_20250305`): the
/// whole tool entry is the value. Anthropic rungs append it to `tools`; other rungs
/// drop and disclose it under that name.
pub const SERVER_TOOL_PREFIX: &str = "tools.";

/// The smallest thinking budget Anthropic accepts.
pub const MIN_THINKING_BUDGET: u64 = 1024;

/// Every `stop_reason` of the Messages API: a provider's raw finish string among
/// these is rendered as is.
pub const STOP_REASONS: [&str; 7] = [
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
    "model_context_window_exceeded",
];

mod parse;
mod render;
mod stream;

use render::*;

pub(crate) use parse::members;
pub use parse::parse;
pub use render::render;
pub(crate) use render::Input;
pub(crate) use stream::put_usage;
pub use stream::{error_frame, Encoder};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_message_ids() {
        let meta = Meta {
            fallback_id: "abc".into(),
            ..Meta::default()
        };
        assert_eq!(message_id(Some("msg_1"), &meta), "msg_1");
        assert_eq!(message_id(Some("chatcmpl-1"), &meta), "msg_abc");
        assert_eq!(message_id(None, &Meta::default()), "msg_");
    }
}
