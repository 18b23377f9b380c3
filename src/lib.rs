//! sluice: a model gateway. One base URL serves many language and embedding models
//! from many providers; this library is the server behind the `sluice` binary.
//!
//! The rooms, from the top floor down (a room imports only rooms below it):
//! - wiring: `server` starts every listener and background job; `config` is read once.
//! - listeners: `proxy` (the gateway listener, a Pingora service), `api` (the
//!   management API), `web` (the web app), `ops` (metrics, health, admin).
//! - feature rooms: `telemetry` (trace intake: signed uploads, the projecting
//!   worker, pulls).
//! - the request flow: `inference` (one inference request, admit to settle) over
//!   `downstream` (the client's body and answers); its feature rooms: `search`
//!   (web search and tool search).
//! - the provider client: `upstream` (targets, calls, pooling, provider auth, the
//!   egress guard, the breaker).
//! - the domain: `accounts` (orgs, keys), `catalog` (models, rungs), `byok` (org
//!   provider connections and waterfalls), `billing` (prices, gates, settlement).
//! - state: `state` (what every service shares), `store` (database, counters,
//!   the usage writer).
//! - `trace`: each request's metrics, access line and spans (under `state`, over
//!   the domain); `metrics` (the registry), `deadline` (timeouts with a bounded
//!   number of live timers) and `priority` (background threads yield the core to
//!   requests) are on the ground floor.
//!
//! `sluice-filters` (the sans-IO formats, wires and policy) is under all of them.

// Wiring.
pub mod config;
mod deadline;
mod error;
mod metrics;
mod money;
mod priority;
pub mod server;

// Listeners.
mod api;
mod ops;
mod proxy;
mod web;

// Feature rooms.
mod batches;
pub mod telemetry;

// The request flow.
pub mod downstream;
mod inference;

// Per-request features, each a room the flow reaches only through the seam.
mod hooks;
mod idempotency;
pub mod responses;
pub mod search;

// What each request leaves for operators: metrics series, access line, trace.
pub mod trace;

// The provider client.
pub mod upstream;

// The domain.
pub mod accounts;
pub mod billing;
mod byok;
pub mod catalog;

// State.
mod state;
pub mod store;
mod time;
