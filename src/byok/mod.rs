//! Bring your own keys: an org's provider accounts (sealed at rest), its own order
//! of rungs per model, and the active route each request is served on.

pub mod active_route;
pub mod connections;
pub mod secrets;
pub mod store;
pub mod waterfalls;

pub use active_route::{Lane, RouteRung};
pub use store::{ByokStore, Live, Routing};
