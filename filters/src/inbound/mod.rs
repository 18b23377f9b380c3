//! The client-facing formats: parse and validate a body into the canonical
//! [`Request`](crate::ir::Request); encode canonical answers back, whole or streamed.
//!
//! Every format has the same shape, the [`ClientFormat`] trait: `parse` (structural
//! validation, each failure a stable code naming its `param`; nothing
//! route-dependent, capabilities are judged later by `policy`), `render` (one whole
//! JSON answer; an answer with no parts and finish `Stop` is the spec's empty
//! shape), `encoder` (a [`StreamEncoder`](crate::ir::StreamEncoder)) and
//! `error_frame` (the in-band error event that ends a stream whose header already
//! went out). [`Inbound`] names the format a request came in and dispatches to its
//! implementation statically.
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

/// What every client-facing format does.
pub trait ClientFormat {
    type Encoder: StreamEncoder + 'static;
    /// The route's name in metrics and labels.
    const LABEL: &'static str;
    /// The error envelope family.
    const ENVELOPE: Format;
    /// Parses and validates a body; `members` is the body already split.
    fn parse(body: &[u8], members: &[Member<'_>]) -> Result<Request, ApiError>;
    /// One whole answer.
    fn render(resp: &Response, meta: &Meta, tail: &Tail) -> Vec<u8>;
    /// A stream encoder.
    fn encoder(meta: Meta) -> Self::Encoder;
    /// The in-band error event that ends a stream whose header already went out.
    fn error_frame(err: &ApiError) -> Vec<u8>;
}

/// Implements [`ClientFormat`] for a format module's marker type.
macro_rules! client_format {
    ($ty:ident, $module:ident, $label:literal, $envelope:expr, |$body:ident, $members:ident| $parse:expr) => {
        /// The format of its module, as a [`ClientFormat`].
        pub struct $ty;
        impl ClientFormat for $ty {
            type Encoder = $module::Encoder;
            const LABEL: &'static str = $label;
            const ENVELOPE: Format = $envelope;
            fn parse($body: &[u8], $members: &[Member<'_>]) -> Result<Request, ApiError> {
                $parse
            }
            fn render(resp: &Response, meta: &Meta, tail: &Tail) -> Vec<u8> {
                $module::render(resp, meta, tail)
            }
            fn encoder(meta: Meta) -> Self::Encoder {
                $module::Encoder::new(meta)
            }
            fn error_frame(err: &ApiError) -> Vec<u8> {
                $module::error_frame(err)
            }
        }
    };
}

client_format!(
    ChatFormat,
    chat,
    "chat",
    Format::OpenAi,
    |_body, members| chat::parse_members(members)
);
client_format!(
    ResponsesFormat,
    responses,
    "responses",
    Format::OpenAi,
    |body, _members| responses::parse(body)
);
client_format!(
    MessagesFormat,
    messages,
    "messages",
    Format::Anthropic,
    |body, _members| messages::parse(body)
);

/// Runs `$f` with `F` the [`ClientFormat`] of `$inbound`.
macro_rules! with_format {
    ($inbound:expr, $f:ident => $e:expr) => {
        match $inbound {
            Inbound::Chat => {
                type $f = ChatFormat;
                $e
            }
            Inbound::Responses => {
                type $f = ResponsesFormat;
                $e
            }
            Inbound::Messages => {
                type $f = MessagesFormat;
                $e
            }
        }
    };
}

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
        with_format!(self, F => F::LABEL)
    }

    /// The error envelope family of the format.
    pub fn format(self) -> Format {
        with_format!(self, F => F::ENVELOPE)
    }

    /// Parses and validates a body in this format; `members` is the body already
    /// split (the chat format reads those rather than the body again).
    pub fn parse(self, body: &[u8], members: &[Member<'_>]) -> Result<Request, ApiError> {
        with_format!(self, F => F::parse(body, members))
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
        with_format!(self, F => F::render(resp, meta, tail))
    }

    /// A stream encoder in this format; a search the gateway ran for the answer
    /// (`meta.search`) is shown and cited.
    pub fn encoder(self, mut meta: Meta) -> Box<dyn StreamEncoder> {
        let search = meta.search.take();
        let enc: Box<dyn StreamEncoder> = with_format!(self, F => Box::new(F::encoder(meta)));
        match search {
            Some(s) => Box::new(crate::ir::cite::Cited::new(enc, s)),
            None => enc,
        }
    }

    /// The in-band error event that ends a stream whose header already went out.
    pub fn error_frame(self, err: &ApiError) -> Vec<u8> {
        with_format!(self, F => F::error_frame(err))
    }
}
