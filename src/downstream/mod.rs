//! The client side of a gateway request, below both the proxy and the inference
//! flow: reading the request body under its limits and writing whole answers;
//! and the listeners' own limits (connection caps, the web and ops HTTP/1 loop).

pub mod answer;
pub mod body;
pub mod cap;
pub mod client;
pub mod http1;
pub mod listener;
pub mod pending;

/// What answering a request gave: the status written, or the error still to write.
pub type Handled = Result<u16, sluice_filters::ApiError>;
