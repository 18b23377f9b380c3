//! Bring your own keys: an org's provider accounts (sealed at rest), its own order
//! of rungs per model, and the active route each request is served on.

pub mod connections;
pub mod route;
pub mod secrets;
pub mod store;
pub mod waterfalls;

pub use route::{Lane, RouteRung};
pub use store::{ByokStore, Live, Routing};
