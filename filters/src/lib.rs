//! Sans-IO request and response rewriting for sluice.
//!
//! Nothing here knows of sockets, Pingora or databases: bytes and values in, bytes and
//! values out. That keeps the hardest logic (errors, routing, format translation,
//! parameter policy) unit-testable, fuzzable and benchmarkable on its own.

pub mod codec;
pub mod error;
pub mod inbound;
pub mod ir;
pub mod json;
pub mod policy;
pub mod relay;
pub mod route;
pub mod slug;
pub mod sse;
pub mod upstream;
pub mod usage;

pub use error::{ApiError, ErrorCode, Format};
pub use route::Route;
