//! The client side of a gateway request, below both the proxy and the inference
//! flow: reading the request body under its limits and writing whole answers;
//! and the listeners' own limits (connection caps, the web and ops HTTP/1 loop).

pub(crate) mod answer;
pub(crate) mod body;
pub(crate) mod cap;
pub mod client;
pub(crate) mod http1;
pub(crate) mod listener;
pub(crate) mod pending;

/// What answering a request gave: the status written, or the error still to write.
pub(crate) type Handled = Result<u16, sluice_filters::ApiError>;
