//! The client-facing formats: parse and validate a body into the canonical
//! [`Request`](crate::ir::Request); encode canonical answers back, whole or streamed.
//!
//! Every format module has the same shape:
//! - `parse(body: &[u8]) -> Result<Request, ApiError>`: structural validation, each
//!   failure a stable code naming its `param`; nothing route-dependent (capabilities
//!   are judged later by `policy`).
//! - `render(resp: &Response, meta: &Meta, tail: &Tail) -> Vec<u8>`: one whole JSON
//!   answer. An answer with no parts and finish `Stop` is the spec's empty shape.
//! - `Encoder::new(meta: Meta)`: a [`StreamEncoder`](crate::ir::StreamEncoder).
//! - `error_frame(err: &ApiError) -> Vec<u8>`: the in-band error event that ends a
//!   stream whose header already went out.

//!
//! A gateway that also needs the body's top-level members (to forward them to a
//! native rung untouched) splits the object once with [`split_object`] and hands
//! the members to `chat::parse_members`, instead of reading the body twice.

pub mod chat;
pub mod common;
pub mod embeddings;
pub mod history;
pub mod messages;
pub mod responses;

use crate::error::{ApiError, Format};
use crate::ir::{Meta, Request, Response, StreamEncoder, Tail};
use crate::json::Member;

/// The client-facing format a request came in, and the dispatch to its module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inbound {
    Chat,
    Responses,
    Messages,
}

impl Inbound {
    /// The route's name in metrics and labels.
    pub fn label(self) -> &'static str {
        match self {
            Inbound::Chat => "chat",
            Inbound::Responses => "responses",
            Inbound::Messages => "messages",
        }
    }

    /// The error envelope family of the format.
    pub fn format(self) -> Format {
        match self {
            Inbound::Messages => Format::Anthropic,
            _ => Format::OpenAi,
        }
    }

    /// Parses and validates a body in this format; `members` is the body already
    /// split (the chat format reads those rather than the body again).
    pub fn parse(self, body: &[u8], members: &[Member<'_>]) -> Result<Request, ApiError> {
        match self {
            Inbound::Chat => chat::parse_members(members),
            Inbound::Responses => responses::parse(body),
            Inbound::Messages => messages::parse(body),
        }
    }

    /// Renders a whole answer in this format; a search the gateway ran for it
    /// (`meta.search`) is shown and cited.
    pub fn render(self, resp: &Response, meta: &Meta, tail: &Tail) -> Vec<u8> {
        if let Some(search) = &meta.search {
            let cited = crate::ir::cite::cited_response(resp, search);
            let meta = Meta {
                search: None,
                ..meta.clone()
            };
            return self.render(&cited, &meta, tail);
        }
        match self {
            Inbound::Chat => chat::render(resp, meta, tail),
            Inbound::Responses => responses::render(resp, meta, tail),
            Inbound::Messages => messages::render(resp, meta, tail),
        }
    }

    /// A stream encoder in this format; a search the gateway ran for the answer
    /// (`meta.search`) is shown and cited.
    pub fn encoder(self, mut meta: Meta) -> Box<dyn StreamEncoder> {
        let search = meta.search.take();
        let enc: Box<dyn StreamEncoder> = match self {
            Inbound::Chat => Box::new(chat::Encoder::new(meta)),
            Inbound::Responses => Box::new(responses::Encoder::new(meta)),
            Inbound::Messages => Box::new(messages::Encoder::new(meta)),
        };
        match search {
            Some(s) => Box::new(crate::ir::cite::Cited::new(enc, s)),
            None => enc,
        }
    }

    /// The in-band error event that ends a stream whose header already went out.
    pub fn error_frame(self, err: &ApiError) -> Vec<u8> {
        match self {
            Inbound::Chat => chat::error_frame(err),
            Inbound::Responses => responses::error_frame(err),
            Inbound::Messages => messages::error_frame(err),
        }
    }
}
