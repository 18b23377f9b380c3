//! sluice: a model gateway. One base URL serves many language and embedding models
//! from many providers; this library is the server behind the `sluice` binary.
//!
//! The rooms, from the top floor down (a room imports only rooms below it; the
//! floor rules are held by `tests/architecture.rs`):
//! - wiring: `server` starts every listener and background job and registers the
//!   per-request features.
//! - listeners: `proxy` (the gateway listener, a Pingora service), `api` (the
//!   management API), `web` (the web app), `ops` (metrics, health, admin).
//! - rooms with a door of their own: `batches` (the Files and Batch APIs and their
//!   runner), `telemetry` (trace intake: signed uploads, the projecting worker,
//!   pulls).
//! - the request flow: `inference` (one inference request, admit to settle, as
//!   named phases) over `downstream` (the client's body and answers).
//! - per-request features, reached only through the seam `hooks`: `idempotency`
//!   (Idempotency-Key), `responses` (the responses store), `search` (web search
//!   and tool search).
//! - the provider client: `upstream` (targets, calls, pooling, provider auth, the
//!   egress guard, the breaker).
//! - `state` (what every service shares) and `trace` (each request's metrics,
//!   access line and spans).
//! - the domain: `accounts` (orgs, keys, the one key authentication), `catalog`
//!   (models, rungs), `byok` (org provider connections and waterfalls), `billing`
//!   (prices, gates, settlement).
//! - the ground: `store` (database, counters, the usage writer), `config` (read
//!   once), `error`, `metrics` (the registry), `money` (micro-USD), `time` (dates),
//!   `deadline` (timeouts with a bounded number of live timers) and `priority`
//!   (background threads yield the core to requests).
//!
//! `sluice-filters` (the sans-IO formats, wires and policy) is under all of them.

// Wiring.
pub mod server;

// Listeners.
mod api;
mod ops;
mod proxy;
mod web;

// Rooms with a door of their own.
mod batches;
pub mod telemetry;

// The request flow.
pub mod downstream;
mod inference;

// Per-request features, each reached only through the seam.
mod hooks;
mod idempotency;
pub mod responses;
pub mod search;

// The provider client.
pub mod upstream;

// Shared state, and what each request leaves for operators.
mod state;
pub mod trace;

// The domain.
pub mod accounts;
pub mod billing;
mod byok;
pub mod catalog;

// The ground.
pub mod config;
mod deadline;
mod error;
mod metrics;
mod money;
mod priority;
pub mod store;
mod time;
