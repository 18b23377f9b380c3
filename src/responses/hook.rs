//! The responses store at the flow's seam: a responses request's conversation is
//! rebuilt before anything parses its body, hidden reasoning is asked of the rungs
//! when the turn is kept, and the answer as rendered is kept once it is whole at
//! the client (a cut stream as incomplete; a client gone mid-stream leaves
//! nothing).

use super::{Keeper, Keeping};
use crate::hooks::{Arrival, Before, Body, Go, HookFor, RequestHook, Settled, Step};
use bytes::Bytes;
use pingora::http::ResponseHeader;
use sluice_filters::{ApiError, Route};
use std::sync::Arc;

/// The feature as registered: every request of the responses route.
pub struct Store {
    keeper: Arc<Keeper>,
    /// `[responses] prompt_capture_default`, for an org that set nothing.
    capture_default: bool,
}

impl Store {
    pub fn new(keeper: Arc<Keeper>, capture_default: bool) -> Store {
        Store {
            keeper,
            capture_default,
        }
    }
}

impl HookFor for Store {
    fn on_arrival(&self, a: &Arrival<'_>) -> Option<Box<dyn RequestHook>> {
        (a.route == Route::Responses).then(|| {
            Box::new(OneTurn {
                keeper: self.keeper.clone(),
                capture: a.org.captures_prompts(self.capture_default),
                keeping: None,
                repaired: false,
                answer: Vec::new(),
            }) as Box<dyn RequestHook>
        })
    }
}

/// One responses request's turn.
struct OneTurn {
    keeper: Arc<Keeper>,
    capture: bool,
    keeping: Option<Keeping>,
    /// Hidden reasoning the client replayed without its content was removed
    /// before any attempt (the store could not complete it).
    repaired: bool,
    /// The answer as rendered, encrypted reasoning included (only when kept).
    answer: Vec<u8>,
}

impl RequestHook for OneTurn {
    fn body<'a>(&'a mut self, b: &'a mut Body<'_>) -> Step<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let begun = self
                .keeper
                .begin(&b.org.id, self.capture, b.members)
                .await?;
            self.keeping = begun.keeping;
            self.repaired = begun.repaired;
            b.rebuilt = begun.body.map(Bytes::from);
            Ok(())
        })
    }

    fn before<'a>(&'a mut self, b: &'a mut Before<'_>) -> Step<'a, Result<Go, ApiError>> {
        // The store keeps encrypted reasoning whatever the client sees: asked of
        // the rungs unless the client asked for it itself.
        let asked = b
            .req
            .include
            .iter()
            .any(|i| i == "reasoning.encrypted_content");
        if self.keeping.is_some() && !asked {
            *b.keep_reasoning = true;
        }
        Box::pin(async { Ok(Go::On) })
    }

    fn header(&mut self, h: &mut ResponseHeader) {
        if self.repaired {
            let _ = h.insert_header("x-gateway-replay-repair", "encrypted_reasoning_stripped");
        }
    }

    fn rendered(&mut self, bytes: &[u8]) {
        if self.keeping.is_some() {
            self.answer.extend_from_slice(bytes);
        }
    }

    fn after<'a>(self: Box<Self>, s: &'a Settled<'a>) -> Step<'a, ()> {
        if let (Some(k), true) = (self.keeping, s.served) {
            let slug = &s.model.spec.slug;
            self.keeper
                .finish(s.org_id, slug, k, &self.answer, s.streamed);
        }
        Box::pin(async {})
    }
}
