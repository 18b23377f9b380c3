//! Web search and tool search at the flow's seam: a parsed request that asks for
//! either (or names a model with `:online`) gets the hold its searches may add
//! before the gates, then the one service-run search after them; what tool search
//! does between model calls is its part in the attempt loop ([`super::Prepared`]).

use super::Searcher;
use crate::hooks::{Admitted, Before, Go, HookFor, LoopPart, RequestHook, Settled, Step};
use sluice_filters::inbound::common::want_web_search;
use sluice_filters::ir::{Request, SearchForm};
use sluice_filters::ApiError;
use std::sync::Arc;

/// The feature as registered.
pub struct Searching {
    searcher: Arc<Searcher>,
}

impl Searching {
    pub fn new(searcher: Searcher) -> Searching {
        Searching {
            searcher: Arc::new(searcher),
        }
    }
}

impl HookFor for Searching {
    fn on_parsed(&self, req: &mut Request, online: bool) -> Option<Box<dyn RequestHook>> {
        if online {
            want_web_search(req, SearchForm::Online);
        }
        req.orchestrated().then(|| {
            Box::new(PreStep {
                searcher: self.searcher.clone(),
            }) as Box<dyn RequestHook>
        })
    }
}

/// One orchestrated request's searches.
struct PreStep {
    searcher: Arc<Searcher>,
}

impl RequestHook for PreStep {
    fn before<'a>(&'a mut self, b: &'a mut Before<'_>) -> Step<'a, Result<Go, ApiError>> {
        *b.worst = self.searcher.hold(*b.worst, b.req, &b.model.spec.price);
        Box::pin(async { Ok(Go::On) })
    }

    fn admitted<'a>(&'a mut self, a: &'a mut Admitted<'_>) -> Step<'a, ()> {
        Box::pin(async move {
            // The one service-run search runs here, before the first attempt
            // (never again on fail-over).
            let prep = self
                .searcher
                .prepare(a.upstreams, a.req, a.inbound, a.rungs, a.deadline)
                .await;
            *a.extra = prep.spent(!a.free);
            *a.part = Some(Box::new(prep) as Box<dyn LoopPart>);
        })
    }

    fn after<'a>(self: Box<Self>, _s: &'a Settled<'a>) -> Step<'a, ()> {
        Box::pin(async {})
    }
}
