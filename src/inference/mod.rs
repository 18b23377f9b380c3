//! One inference request's life, as named phases (DESIGN.md's request path):
//! 1. admit: who asks, the body under its limits, the model, the org's route
//!    (`admit.rs`);
//! 2. before the rungs: the request parsed, the gates of its lanes taken
//!    (`ready.rs`);
//! 3. the waterfall with its attempts (`rounds.rs`, `waterfall.rs`, `plan.rs`,
//!    `attempt.rs`, `native_chat.rs`, `translated.rs`, `embeddings.rs`);
//! 4. the answer's bytes, through the request's account (`tally.rs`);
//! 5. settle and record (`settle.rs`).
//!
//! Per-request features (the Idempotency-Key store, the responses store, web
//! search and tool search) plug into these phases through `crate::hooks`;
//! `server.rs` registers them and this folder names none of them. `handle`
//! reads as the list of the phases.

mod admit;
mod attempt;
mod embeddings;
mod native_chat;
mod plan;
mod ready;
mod rounds;
mod settle;
mod tally;
mod translated;
mod waterfall;

pub(crate) use admit::granted;

use crate::billing::gate::Admission;
use crate::catalog::Model;
use crate::downstream::answer;
use crate::downstream::pending::Place;
use crate::downstream::Handled;
use crate::hooks::{Arrival, Hooks, Registry, Settled};
use crate::state::AppState;
use crate::trace::Trail;
use crate::upstream::breaker::Breaker;
use crate::upstream::Upstreams;
use pingora::proxy::Session;
use ready::{Asking, Ready, Work};
use settle::Settling;
use sluice_filters::{ApiError, Route};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tally::{Outcome, Tally};

/// What serving inference needs beyond the shared state: the provider client,
/// the health of every rung it calls, and the features registered at start.
pub(crate) struct Engine {
    pub(crate) state: Arc<AppState>,
    upstreams: Upstreams,
    breaker: Breaker,
    hooks: Registry,
}

impl Engine {
    pub(crate) fn new(state: Arc<AppState>, hooks: Registry) -> Engine {
        let upstreams = Upstreams::new(&state.config);
        let b = &state.config.breaker;
        let breaker = Breaker::new(b.failure_threshold, Duration::from_millis(b.cooldown_ms));
        Engine {
            state,
            upstreams,
            breaker,
            hooks,
        }
    }

    /// Serves one request of an inference route (chat, responses, messages,
    /// embeddings); returns the status the client saw. `trail` learns what the
    /// operator's metrics, access line and trace report.
    pub(crate) async fn handle(
        &self,
        session: &mut Session,
        route: Route,
        started: Instant,
        trail: &mut Trail,
        place: Option<Place>,
    ) -> Handled {
        let state = &*self.state;
        // 1. Admit.
        let caller = admit::caller(state, session, route).await?;
        trail.identify(&caller.key, &caller.org);
        admit::not_under_review(&caller.org)?;
        let (org, headers) = (&caller.org, &session.req_header().headers);
        let mut hooks = self.hooks.on_arrival(&Arrival {
            route,
            org,
            headers,
        });
        let read = admit::read_body(state, session, route, started).await?;
        let (members, long) = admit::split_object(&read)?;
        let turn = (route == Route::Responses)
            .then(|| sluice_filters::inbound::history::turn_ask(&members));
        let rebuilt = hooks.body(&caller.org, &members).await?;
        let body = rebuilt.as_ref().unwrap_or(&read);
        let (members, long) = match &rebuilt {
            Some(b) => admit::split_object(b)?,
            None => (members, long),
        };
        let asked = admit::model(state, session, &caller.org, &members, route)?;
        let model = &*asked.model;
        trail.model(&asked.model);
        let rungs = admit::active_route(state, session, &caller.org, model)?;
        let deadline = Duration::from_millis(state.config.limits.request_deadline_ms);
        let mut tally = Tally::new(started, deadline, place, model);
        tally.turn = turn;
        tally.trace = std::mem::take(&mut trail.attempts);
        // 2. Before the rungs.
        let ask = Asking::new(&caller, route, &asked, body, &members, &long);
        let (admission, work) =
            match Box::pin(self.ready(&ask, &mut hooks, &mut tally, rungs)).await {
                Ok(Ready::Go(admission, work)) => (admission, work),
                Ok(Ready::Replay(tape)) => return Ok(Box::pin(answer::replay(session, tape)).await),
                Err(e) => return Err(ask.refused(hooks, e).await),
            };
        let streamed = work.streams();
        trail.streaming(streamed);
        // 3, 4. The waterfall, and the answer's bytes.
        tally.hooks = hooks;
        let outcome = Box::pin(self.serve(session, &mut tally, model, work)).await;
        // 5. Settle and record.
        let served = matches!(outcome, Outcome::Written(200));
        let who = ask.settling(admission);
        let status = settle::settle(state, session, &mut tally, who, outcome, trail).await;
        let billed = tally.billable || tally.header_sent || (200..300).contains(&status);
        let done = ask.settled(served, billed, streamed);
        std::mem::take(&mut tally.hooks).after(&done).await;
        Ok(status)
    }
}

impl Engine {
    /// The waterfall: in rounds when a feature's loop part runs them.
    async fn serve(
        &self,
        session: &mut Session,
        tally: &mut Tally,
        model: &Model,
        work: Work<'_>,
    ) -> Outcome {
        match work {
            Work::Rungs(parsed) => rounds::serve(self, session, tally, model, *parsed).await,
            Work::Embed(req, rungs) => embeddings::serve(self, session, tally, &rungs, req).await,
        }
    }
}

impl Asking<'_> {
    /// What settlement records the request under.
    fn settling(&self, admission: Admission) -> Settling<'_> {
        Settling {
            route: self.route,
            inbound: self.inbound,
            model: &self.asked.model,
            caller: self.caller,
            admission,
        }
    }

    /// A request refused before the waterfall: the features hear of it (a
    /// claimed key is released).
    async fn refused(&self, hooks: Hooks, e: ApiError) -> ApiError {
        hooks.after(&self.settled(false, false, false)).await;
        e
    }

    /// How the request ended, for the features' `after`.
    fn settled(&self, served: bool, billed: bool, streamed: bool) -> Settled<'_> {
        Settled {
            served,
            billed,
            streamed,
            org_id: &self.caller.org.id,
            model: &self.asked.model,
        }
    }
}
