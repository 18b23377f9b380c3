//! Upstream wire protocols: rendering requests for a rung and reading its answers.
//!
//! Every wire module has the same shape:
//! - `render(req: &Request, model_id: &str, stream: bool) -> Rendered`: the body for
//!   the rung, with the rung's model id; gateway-owned fields (prompt_cache_key,
//!   store, previous_response_id) are never sent; `Rendered::dropped` names every
//!   request field this wire cannot carry (dropped and disclosed).
//! - `decode(body: &[u8]) -> Result<Vec<Event>, DecodeError>`: a whole answer as
//!   the event sequence its stream would give.
//! - `Decoder::new()`: a [`StreamDecoder`](crate::ir::StreamDecoder) over the
//!   wire's stream frames.
//! - `refusal(status: u16, body: &[u8]) -> Option<RefusalReason>`: whether an
//!   error answer is a policy refusal (which does not fail over).

pub mod anthropic;
pub mod bedrock;
mod chat_scan;
pub mod embed;
mod frames;
pub mod gemini;
pub mod native;
pub mod openai_chat;
pub mod openai_responses;
pub mod spliced;

pub use frames::{Frame, Framer};

use crate::inbound::Inbound;
use crate::ir::{DecodeError, Event, ReasoningMaker, RefusalReason, Request, StreamDecoder};

/// A request body rendered for one rung.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rendered {
    pub body: Vec<u8>,
    /// Request fields this wire cannot carry, by their inbound names.
    pub dropped: Vec<String>,
}

/// An upstream wire protocol, and the dispatch to its module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wire {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
    Gemini,
    Bedrock,
}

impl Wire {
    /// The wire a provider's rung speaks for a request in `inbound` format; `None`
    /// for a provider the gateway cannot call yet.
    pub fn of_rung(provider: &str, model_id: &str, inbound: Inbound) -> Option<Wire> {
        Some(match provider {
            // Vertex hosts Claude behind Anthropic's own body, and Gemini.
            "vertex" if model_id.contains("claude") => Wire::Anthropic,
            "vertex" => Wire::Gemini,
            // OpenAI itself serves both of its wires: a responses client gets the
            // responses API (native: reasoning items and include pass through).
            "openai" if inbound == Inbound::Responses => Wire::OpenAiResponses,
            "openai" | "azure" | "mistral" | "openrouter" | "hosted" | "local" => Wire::OpenAiChat,
            "anthropic" => Wire::Anthropic,
            "google" => Wire::Gemini,
            "bedrock" => Wire::Bedrock,
            _ => return None,
        })
    }

    /// Whether a rung of this wire speaks the inbound format itself: the client's
    /// body passes through with only the gateway-owned fields changed.
    pub fn is_native(self, provider: &str, inbound: Inbound) -> bool {
        matches!(
            (inbound, self, provider),
            (Inbound::Chat, Wire::OpenAiChat, _)
                | (Inbound::Responses, Wire::OpenAiResponses, "openai")
                | (Inbound::Messages, Wire::Anthropic, "anthropic")
        )
    }

    /// Whether a rung of this wire can run its provider's own web search (OpenAI's
    /// search models and responses `web_search`, Claude's `web_search` server
    /// tool, Gemini's Google Search grounding).
    pub fn searches_natively(self) -> bool {
        !matches!(self, Wire::Bedrock)
    }

    /// Whether a rung of this wire can run its provider's own tool search over
    /// deferred tools (Claude's tool search tools, the responses `tool_search`,
    /// OpenRouter's server tool).
    pub fn tool_search_natively(self, provider: &str) -> bool {
        match self {
            Wire::Anthropic | Wire::OpenAiResponses => true,
            Wire::OpenAiChat => provider == "openrouter",
            Wire::Gemini | Wire::Bedrock => false,
        }
    }

    /// Renders the canonical request for a rung of this wire served by `provider`.
    pub fn render(self, provider: &str, req: &Request, model_id: &str, stream: bool) -> Rendered {
        match self {
            Wire::OpenAiChat => openai_chat::render(req, model_id, stream),
            Wire::OpenAiResponses => openai_responses::render(req, model_id, stream),
            Wire::Anthropic if provider == "vertex" => {
                let mut r = anthropic::render(req, model_id, stream);
                r.body = anthropic::for_vertex(&r.body);
                r
            }
            Wire::Anthropic => anthropic::render(req, model_id, stream),
            Wire::Gemini => gemini::render(req, model_id, stream),
            Wire::Bedrock => bedrock::render(req, model_id, stream),
        }
    }

    /// Decodes a whole answer of this wire.
    pub fn decode(self, body: &[u8]) -> Result<Vec<Event>, DecodeError> {
        match self {
            Wire::OpenAiChat => openai_chat::decode(body),
            Wire::OpenAiResponses => openai_responses::decode(body),
            Wire::Anthropic => anthropic::decode(body),
            Wire::Gemini => gemini::decode(body),
            Wire::Bedrock => bedrock::decode(body),
        }
    }

    /// Whether an error answer of this wire is a policy refusal.
    pub fn refusal(self, status: u16, body: &[u8]) -> Option<RefusalReason> {
        match self {
            Wire::OpenAiChat => openai_chat::refusal(status, body),
            Wire::OpenAiResponses => openai_responses::refusal(status, body),
            Wire::Anthropic => anthropic::refusal(status, body),
            Wire::Gemini => gemini::refusal(status, body),
            Wire::Bedrock => bedrock::refusal(status, body),
        }
    }

    /// A stream decoder for this wire.
    pub fn decoder(self) -> Box<dyn StreamDecoder> {
        match self {
            Wire::OpenAiChat => Box::new(openai_chat::Decoder::new()),
            Wire::OpenAiResponses => Box::new(openai_responses::Decoder::new()),
            Wire::Anthropic => Box::new(anthropic::Decoder::new()),
            Wire::Gemini => Box::new(gemini::Decoder::new()),
            Wire::Bedrock => Box::new(bedrock::Decoder::new()),
        }
    }

    /// What splits this wire's stream bytes into frames.
    pub fn framer(self) -> Framer {
        Framer::new(self)
    }
}

/// Whether a rung serves a model of the Anthropic family (extended thinking).
pub fn is_claude(provider: &str, model_id: &str) -> bool {
    provider == "anthropic" || model_id.contains("claude")
}

/// Whose hidden reasoning a rung takes back: OpenAI's on its responses API,
/// Anthropic's on Claude (Anthropic, Claude on Vertex, Claude on Bedrock); no other
/// rung takes any.
pub fn reasoning_maker(wire: Wire, provider: &str, model_id: &str) -> Option<ReasoningMaker> {
    match wire {
        Wire::OpenAiResponses => Some(ReasoningMaker::OpenAi),
        Wire::Anthropic => Some(ReasoningMaker::Anthropic),
        Wire::Bedrock if is_claude(provider, model_id) => Some(ReasoningMaker::Anthropic),
        _ => None,
    }
}

/// What a provider said when it refused a request as malformed (400, 413, 422):
/// its message, and the field it named, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct Rejection {
    pub message: String,
    pub param: Option<String>,
}

/// Reads a provider's error answer for its message and named field, in any
/// maker's shape: `{error: {message, param?}}` (OpenAI, Gemini), `{type: "error",
/// error: {message}}` (Anthropic), `{message}` (Bedrock).
pub fn rejection(body: &[u8]) -> Option<Rejection> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let err = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
    let message = err.get("message")?.as_str()?.trim();
    if message.is_empty() {
        return None;
    }
    let param = err
        .get("param")
        .and_then(|p| p.as_str())
        .filter(|p| !p.is_empty())
        .map(str::to_string);
    Some(Rejection {
        message: message.to_string(),
        param,
    })
}

#[cfg(test)]
mod rejection_tests {
    use super::*;

    #[test]
    fn every_makers_error_shape_gives_its_message_and_param() {
        let openai = br#"{"error":{"message":"Unsupported value: 'reasoning.effort' does not support 'ultra' with this model. Supported values are: 'low', 'medium', and 'high'.","type":"invalid_request_error","param":"reasoning.effort","code":"unsupported_value"}}"#;
        let r = rejection(openai).unwrap();
        assert_eq!(r.param.as_deref(), Some("reasoning.effort"));
        assert!(r.message.contains("Supported values are"));
        let anthropic = br#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: too large"}}"#;
        assert_eq!(
            rejection(anthropic),
            Some(Rejection {
                message: "max_tokens: too large".into(),
                param: None
            })
        );
        let gemini = br#"{"error":{"code":400,"message":"Invalid JSON payload","status":"INVALID_ARGUMENT"}}"#;
        assert_eq!(rejection(gemini).unwrap().message, "Invalid JSON payload");
        assert_eq!(
            rejection(br#"{"message":"ValidationException"}"#)
                .unwrap()
                .param,
            None
        );
        assert_eq!(rejection(b"<html>bad gateway</html>"), None);
        assert_eq!(rejection(br#"{"error":{"message":"  "}}"#), None);
    }
}
