//! Telemetry trace intake (SPEC "Telemetry trace intake"): teams bring the traces
//! they already have (OpenTelemetry, Phoenix, Braintrust, Langfuse, LangSmith,
//! Mastra, PostHog, plain chat logs) into the org, by uploading an export to a
//! signed URL and finalizing it, or by having the gateway pull it from the source
//! with a one-time credential. Either way the bytes land in the object store and
//! are projected into one trace model (`model`), one parser per source
//! (`sources`).
//!
//! Its doors: `routes()` (mounted by the management router, which authenticates
//! and passes the org as [`Caller`]), `upload::serve` (the signed PUT, dispatched
//! by the gateway before `/api` reaches the management router, so the body
//! streams), and `worker::spawn` (started by `server.rs`).

mod answers;
pub mod ingests;
pub mod model;
mod pull;
mod routes;
pub mod sources;
pub mod tickets;
pub mod upload;
pub mod worker;

pub(crate) use routes::routes;

/// The authenticated caller of a management route (its org is what the room
/// reads).
pub use crate::accounts::Caller;
