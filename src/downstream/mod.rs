//! The client side of a gateway request, below both the proxy and the inference
//! flow: reading the request body under its limits and writing whole answers.

pub mod answer;
pub mod body;
pub mod client;
pub mod listener;

/// What answering a request gave: the status written, or the error still to write.
pub type Handled = Result<u16, sluice_filters::ApiError>;
