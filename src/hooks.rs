//! The seam per-request features plug into. A feature (the Idempotency-Key store,
//! the responses store, web search and tool search, whatever comes next) is a
//! module with state of its own that the request flow calls at named phases, in
//! the manner of Pingora's HTTP modules; `server.rs` registers each once, and the
//! flow names none of them.
//!
//! The phases, in the order a request meets them:
//! 1. `body`: the body as read, before anything parses it (a stored conversation
//!    is put in front of the client's input);
//! 2. `before`: parsed, before the gates (a feature raises the hold, or answers
//!    the request itself: a replayed answer);
//! 3. `admitted`: the gates taken, before the first rung (the service-run web
//!    search; a feature that takes part in the attempt loop hands over its part);
//! 4. the answer's bytes as they go out (`header`, `rendered`, `wrote`);
//! 5. `after`: settled, with what was served.
//!
//! A feature says at arrival or once the request is parsed whether this request
//! needs it; a plain request builds an empty list and allocates nothing.

use crate::accounts::OrgRecord;
use crate::billing::extra::Extra;
use crate::billing::gate::WorstCase;
use crate::byok::RouteRung;
use crate::catalog::Model;
use crate::downstream::answer::Tape;
use crate::upstream::Upstreams;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use sluice_filters::inbound::Inbound;
use sluice_filters::ir::watch::Watch;
use sluice_filters::ir::{Request, Response, ServerSearch, StreamEncoder};
use sluice_filters::json::Member;
use sluice_filters::{ApiError, Route};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

/// A phase's work that may wait.
pub(crate) type Step<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The request as it arrived: its route, its org and its headers.
pub(crate) struct Arrival<'a> {
    pub(crate) route: Route,
    pub(crate) org: &'a OrgRecord,
    pub(crate) headers: &'a http::HeaderMap,
}

/// Phase 1: the body as read, split into its members.
pub(crate) struct Body<'a> {
    pub(crate) org: &'a OrgRecord,
    pub(crate) members: &'a [Member<'a>],
    /// The body to serve instead, when a feature rebuilt it.
    pub(crate) rebuilt: Option<Bytes>,
}

/// Phase 2: the parsed request, before the gates are taken.
pub(crate) struct Before<'a> {
    pub(crate) route: Route,
    pub(crate) org: &'a OrgRecord,
    pub(crate) model: &'a Model,
    /// The body the request is served from (as rebuilt in phase 1).
    pub(crate) body: &'a [u8],
    pub(crate) req: &'a Request,
    pub(crate) deadline: Instant,
    /// What the gates hold: a feature that may cost more raises it.
    pub(crate) worst: &'a mut WorstCase,
    /// Hidden reasoning is asked of reasoning rungs to be kept (and the client
    /// did not ask for it itself).
    pub(crate) keep_reasoning: &'a mut bool,
}

/// What phase 2 decided.
pub(crate) enum Go {
    On,
    /// The request is answered with this, as it was the first time.
    Replay(Tape),
}

/// Phase 3: the gates taken, before the first rung.
pub(crate) struct Admitted<'a> {
    pub(crate) upstreams: &'a Upstreams,
    pub(crate) req: &'a mut Request,
    pub(crate) inbound: Inbound,
    pub(crate) rungs: &'a [RouteRung],
    pub(crate) deadline: Instant,
    /// A free allowance serves the request (no fee applies).
    pub(crate) free: bool,
    /// What the request's account starts with beyond its model calls.
    pub(crate) extra: &'a mut Option<Box<Extra>>,
    /// A feature's part in the attempt loop (at most one).
    pub(crate) part: &'a mut Option<Box<dyn LoopPart>>,
}

/// Phase 5: how the request ended.
pub(crate) struct Settled<'a> {
    /// An answer was served whole (200, written to the end).
    pub(crate) served: bool,
    /// Something may have been billed: a rung served content, the header went
    /// out, or the status is a success.
    pub(crate) billed: bool,
    pub(crate) streamed: bool,
    pub(crate) org_id: &'a str,
    pub(crate) model: &'a Model,
}

/// One request's instance of a feature.
pub(crate) trait RequestHook: Send {
    fn body<'a>(&'a mut self, _b: &'a mut Body<'_>) -> Step<'a, Result<(), ApiError>> {
        Box::pin(async { Ok(()) })
    }
    fn before<'a>(&'a mut self, _b: &'a mut Before<'_>) -> Step<'a, Result<Go, ApiError>> {
        Box::pin(async { Ok(Go::On) })
    }
    fn admitted<'a>(&'a mut self, _a: &'a mut Admitted<'_>) -> Step<'a, ()> {
        Box::pin(async {})
    }
    /// The answer's header, about to go out: a feature may add to it.
    fn header(&mut self, _h: &mut ResponseHeader) {}
    /// The answer's bytes as the gateway rendered them (encrypted reasoning
    /// included, whatever the client sees).
    fn rendered(&mut self, _bytes: &[u8]) {}
    /// The answer's bytes as the client receives them.
    fn wrote(&mut self, _bytes: &[u8]) {}
    fn after<'a>(self: Box<Self>, s: &'a Settled<'a>) -> Step<'a, ()>;
}

/// A feature as registered: whether a request needs it, and its instance.
pub(crate) trait HookFor: Send + Sync {
    /// At arrival, before the body is read.
    fn on_arrival(&self, _a: &Arrival<'_>) -> Option<Box<dyn RequestHook>> {
        None
    }
    /// Once the request is parsed (`online`: the model was asked with `:online`);
    /// a feature may rewrite the request for what its model name asked.
    fn on_parsed(&self, _req: &mut Request, _online: bool) -> Option<Box<dyn RequestHook>> {
        None
    }
}

/// A feature's part in the attempt loop: what planning and the attempts ask of
/// it, and the round it runs between two model calls of one request.
pub(crate) trait LoopPart: Send + Sync {
    /// Every rung takes the canonical path (no native fast path or relay).
    fn canonical(&self) -> bool;
    /// Request-level drops, disclosed with each rung's own.
    fn disclosed(&self) -> &[String];
    /// A search the gateway ran, shown and cited in the answer.
    fn search(&self) -> Option<Arc<ServerSearch>>;
    /// Model calls loop through rounds.
    fn rounds(&self) -> bool;
    /// The watch for the next model call's round calls.
    fn watch(&self) -> Option<Watch>;
    /// One round, after a model call that asked for it.
    fn round(&mut self, req: &mut Request, turn: Response);
}

/// A model call that ended in a round rather than an answer: what it said, and
/// the stream's encoder when part of the answer already reached the client.
pub(crate) struct Turn {
    pub(crate) response: Response,
    pub(crate) encoder: Option<Box<dyn StreamEncoder>>,
}

/// The features, in the order `server.rs` registered them.
#[derive(Clone, Default)]
pub(crate) struct Registry(Arc<[Arc<dyn HookFor>]>);

impl Registry {
    pub(crate) fn new(features: Vec<Arc<dyn HookFor>>) -> Registry {
        Registry(features.into())
    }

    /// The features this request needs from its arrival.
    pub(crate) fn on_arrival(&self, a: &Arrival<'_>) -> Hooks {
        Hooks(self.0.iter().filter_map(|f| f.on_arrival(a)).collect())
    }

    /// Adds the features the parsed request needs.
    pub(crate) fn on_parsed(&self, hooks: &mut Hooks, req: &mut Request, online: bool) {
        for f in self.0.iter() {
            if let Some(h) = f.on_parsed(req, online) {
                hooks.0.push(h);
            }
        }
    }
}

/// One request's features.
#[derive(Default)]
pub(crate) struct Hooks(Vec<Box<dyn RequestHook>>);

impl Hooks {
    /// Phase 1: the body to serve instead of the one read, when a feature
    /// rebuilt it.
    pub(crate) async fn body(
        &mut self,
        org: &OrgRecord,
        members: &[Member<'_>],
    ) -> Result<Option<Bytes>, ApiError> {
        let mut b = Body {
            org,
            members,
            rebuilt: None,
        };
        for h in &mut self.0 {
            h.body(&mut b).await?;
        }
        Ok(b.rebuilt)
    }

    pub(crate) async fn before(&mut self, b: &mut Before<'_>) -> Result<Go, ApiError> {
        for h in &mut self.0 {
            if let Go::Replay(t) = h.before(b).await? {
                return Ok(Go::Replay(t));
            }
        }
        Ok(Go::On)
    }

    pub(crate) async fn admitted(&mut self, a: &mut Admitted<'_>) {
        for h in &mut self.0 {
            h.admitted(a).await;
        }
    }

    pub(crate) fn header(&mut self, h: &mut ResponseHeader) {
        for f in &mut self.0 {
            f.header(h);
        }
    }

    pub(crate) fn rendered(&mut self, bytes: &[u8]) {
        for f in &mut self.0 {
            f.rendered(bytes);
        }
    }

    pub(crate) fn wrote(&mut self, bytes: &[u8]) {
        for f in &mut self.0 {
            f.wrote(bytes);
        }
    }

    pub(crate) async fn after(self, s: &Settled<'_>) {
        for h in self.0 {
            h.after(s).await;
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
