//! Bring your own keys: an org's provider accounts (sealed at rest), its own order
//! of rungs per model, and the active route each request is served on.

pub(crate) mod active_route;
pub(crate) mod connections;
pub(crate) mod secrets;
pub(crate) mod store;
pub(crate) mod waterfalls;

pub(crate) use active_route::{Lane, RouteRung};
pub(crate) use store::{ByokStore, Live, Routing};
