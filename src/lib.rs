//! sluice: a model gateway. One base URL serves many language and embedding models
//! from many providers; this library is the server behind the `sluice` binary.

pub mod accounts;
pub mod api;
pub mod billing;
pub mod byok;
pub mod catalog;
pub mod config;
pub mod gateway;
pub mod ops;
pub mod server;
pub mod state;
pub mod store;
pub mod web;
