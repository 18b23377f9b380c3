//! The canonical form every format is translated through.
//!
//! An inbound parser (`inbound::*`) turns a client's body into a [`Request`]; an
//! upstream adapter (`upstream::*`) renders that for its provider and decodes the
//! provider's answer into [`Event`]s (a whole answer is decoded the same way, as
//! one burst of events); the inbound side encodes events back into the client's
//! format, either as a stream ([`StreamEncoder`]) or, folded by [`Collector`],
//! as one [`Response`].

pub mod cite;
mod request;
mod response;
pub mod search;
mod stream;
pub mod watch;

pub use request::*;
pub use response::*;
pub use search::{
    SearchForm, SearchResult, ServerSearch, ToolSearch, ToolSearchKind, UrlCitation, WebSearch,
};
pub use stream::*;
