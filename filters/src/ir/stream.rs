//! Canonical answer events, and the two traits every format implements around
//! them: a decoder per upstream wire, an encoder per inbound format.

use super::search::{ServerSearch, UrlCitation};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Why the model stopped, in canonical terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A natural end of turn (chat `stop`, messages `end_turn`, responses completed).
    Stop,
    /// The output budget ran out, or the stream was cut (chat `length`, messages
    /// `max_tokens`, responses `incomplete`).
    Length,
    /// The turn ended to call tools (chat `tool_calls`, messages `tool_use`).
    ToolCalls,
    /// A stop sequence matched (messages `stop_sequence`; chat reports `stop`).
    StopSequence,
    /// The provider filtered the output after it started (chat `content_filter`).
    ContentFilter,
}

/// Why a provider refused, in the spec's `refusal_reason` terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    CyberPolicy,
    Cbrn,
    ContentPolicy,
    Recitation,
    DataInspection,
    Unspecified,
}

impl RefusalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CyberPolicy => "cyber_policy",
            Self::Cbrn => "cbrn",
            Self::ContentPolicy => "content_policy",
            Self::Recitation => "recitation",
            Self::DataInspection => "data_inspection",
            Self::Unspecified => "unspecified",
        }
    }

    /// The one fixed phrase of the refusal message for this reason:
    /// `provider refused the request: <phrase>`.
    pub fn phrase(self) -> &'static str {
        match self {
            Self::CyberPolicy => "cybersecurity policy",
            Self::Cbrn => "chemical, biological, radiological or nuclear policy",
            Self::ContentPolicy => "content policy",
            Self::Recitation => "recitation of protected material",
            Self::DataInspection => "data inspection policy",
            Self::Unspecified => "unspecified policy",
        }
    }
}

/// One thing an answer says, in order. A whole (non-streamed) answer decodes to the
/// same sequence as its stream would.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The answer began: the provider's id for it and the model id it reports.
    Start {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        model: Option<String>,
    },
    /// Visible text. Non-empty text is content: the commit point.
    Text { text: String },
    /// Visible reasoning text (not content: it does not commit).
    Thinking { text: String },
    /// The signature that closes a thinking block.
    ThinkingSignature { signature: String },
    /// Opaque reasoning (Anthropic redacted_thinking, OpenAI encrypted_content).
    EncryptedReasoning {
        data: String,
        #[serde(default)]
        id: Option<String>,
    },
    /// A tool call begins. `index` counts the answer's calls from 0. Content.
    ToolCallStart {
        index: u32,
        id: String,
        name: String,
    },
    /// A piece of a tool call's JSON arguments. Content when non-empty.
    ToolCallArgs { index: u32, arguments: String },
    /// The provider refused; `text` is its own words, when it gave any.
    Refusal {
        reason: RefusalReason,
        #[serde(default)]
        text: Option<String>,
    },
    /// The turn ended. The provider's own reason string is kept for faithful
    /// same-format rendering.
    Finish {
        reason: FinishReason,
        #[serde(default)]
        raw: Option<String>,
        /// The stop sequence that ended the turn, when the provider names it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop_sequence: Option<String>,
    },
    /// Token usage (cumulative: a later one replaces an earlier one).
    Usage(Usage),
    /// An in-band error from the provider.
    Error { message: String },
    /// The answer's text cites a source (`url_citation`).
    Citation(Box<UrlCitation>),
    /// A search ran on the server side (the provider's, or the gateway's).
    ServerSearch(Box<ServerSearch>),
}

impl Event {
    /// Whether this event is content in the commit-point sense: a non-empty text or
    /// tool-call delta.
    pub fn is_content(&self) -> bool {
        match self {
            Event::Text { text } => !text.is_empty(),
            Event::ToolCallStart { .. } => true,
            Event::ToolCallArgs { arguments, .. } => !arguments.is_empty(),
            _ => false,
        }
    }
}

/// A provider's answer could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Decodes one upstream wire's stream, frame by frame, into canonical events.
/// For SSE wires a frame is one SSE event (`name` is its `event:` field); for
/// Bedrock it is one event-stream message (`name` is its `:event-type` header).
/// Stateful: tool-call indexes and block kinds are tracked across frames.
pub trait StreamDecoder: Send {
    fn frame(
        &mut self,
        name: Option<&str>,
        data: &[u8],
        out: &mut Vec<Event>,
    ) -> Result<(), DecodeError>;

    /// True once the wire's own end marker was seen (`[DONE]`, `message_stop`,
    /// `response.completed`, ...): the answer is whole.
    fn done(&self) -> bool;
}

/// The member of a stream's finish chunk (or final event) that names the dropped
/// fields: the same key as the response header.
pub const IGNORED_MEMBER: &str = "x-service-ignored-parameters";

/// The member that carries the receipt (attempts and overhead) in a whole answer
/// and in a stream's finishing event.
pub const RECEIPT_MEMBER: &str = "x_gateway";

/// What the gateway knows that the client's format must carry.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    /// The serving rung's id (`provider:model`), the top-level `provider` member.
    pub provider: String,
    /// The slug the client asked for: the model name when the provider reports none.
    pub slug: String,
    /// Unix seconds when the answer was created.
    pub created: i64,
    /// An id for the answer when the provider gives none.
    pub fallback_id: String,
    /// Chat streams: whether the client asked for the usage chunk.
    pub include_usage: bool,
    /// The caller's stop sequence when it gave exactly one: reported as the one
    /// that matched when a stop-sequence finish does not name it.
    pub stop_sequence: Option<String>,
    /// Responses: the request's members a `response` object repeats (`tools`,
    /// `tool_choice`, `instructions`, ...), as JSON members without braces; empty
    /// for other formats.
    pub echo: String,
    /// The gateway's own count of the prompt's tokens: what a stream reports as
    /// its input before the provider's count arrives (messages `message_start`).
    pub prompt_estimate: u64,
    /// A search the gateway ran for the request: shown in the answer (messages
    /// server tool blocks, a responses `web_search_call`) and cited by it.
    pub search: Option<Arc<ServerSearch>>,
    /// Messages: the client did not enable thinking, so reasoning the model did
    /// anyway is not shown (Anthropic shows thinking blocks only when enabled, and
    /// a mixed route refuses them in the next turn's history).
    pub hide_reasoning: bool,
}

/// How a stream ends, told to the encoder by the gateway.
#[derive(Clone, Debug, Default)]
pub struct Tail {
    /// Final usage (after estimation for a cut stream).
    pub usage: Usage,
    /// The stream died after output: settle it as the provider's cut (`length`).
    pub cut: bool,
    /// The receipt object (`x_gateway`): attempts and overhead, as JSON text.
    pub receipt: String,
    /// Names of dropped fields (`x-service-ignored-parameters`), when any.
    pub ignored: Option<String>,
}

/// Encodes canonical events into one inbound format's SSE, event by event, as they
/// arrive. Nothing is buffered beyond what the format needs to know (e.g. the finish
/// reason of a format that carries it together with usage).
pub trait StreamEncoder: Send {
    fn event(&mut self, ev: &Event, out: &mut Vec<u8>);
    /// The closing frames: finish (with the receipt and disclosure), usage, end
    /// marker.
    fn end(&mut self, tail: &Tail, out: &mut Vec<u8>);
}
