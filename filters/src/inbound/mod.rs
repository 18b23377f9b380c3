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
