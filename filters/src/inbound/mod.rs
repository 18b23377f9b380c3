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
pub mod messages;
pub mod responses;

use serde_json::value::RawValue;
use std::borrow::Cow;

/// A body's top-level members in document order, values unparsed.
pub type Member<'a> = responses::Member<'a>;

/// Splits a JSON object into its top-level members (keys unescaped, values as raw
/// JSON borrowed from `text`). Errors are serde_json's own, for the caller to
/// classify (syntax: not JSON; data: JSON that is not an object). The common shape
/// is split in one validating pass; anything else is serde's to read.
pub fn split_object(text: &str) -> Result<Vec<Member<'_>>, serde_json::Error> {
    match crate::json_scan::members(text) {
        Some(members) => Ok(members),
        None => serde_json::from_str::<responses::Members>(text).map(|m| m.0),
    }
}

/// Splits a JSON array into its items, as raw JSON; as [`split_object`] does.
pub(crate) fn split_array(text: &str) -> Result<Vec<&RawValue>, serde_json::Error> {
    match crate::json_scan::items(text) {
        Some(items) => Ok(items),
        None => serde_json::from_str(text),
    }
}

/// A JSON string value, borrowed from `text` when it holds no escapes.
pub(crate) fn string_value(text: &str) -> Result<Cow<'_, str>, serde_json::Error> {
    match crate::json_scan::plain_str(text) {
        Some(s) => Ok(Cow::Borrowed(s)),
        None => serde_json::from_str::<String>(text).map(Cow::Owned),
    }
}
