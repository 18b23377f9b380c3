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
pub mod gemini;
pub mod openai_chat;
pub mod openai_responses;

/// A request body rendered for one rung.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rendered {
    pub body: Vec<u8>,
    /// Request fields this wire cannot carry, by their inbound names.
    pub dropped: Vec<String>,
}
