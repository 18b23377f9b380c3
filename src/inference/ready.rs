//! Before the rungs: the request parsed in the client's format (or as
//! embeddings); the features' phase before the gates (a raised hold, or a replay
//! that answers the request); the gates of the lanes taken; and the features'
//! phase after them (a service-run search, a part in the attempt loop).

use super::admit::{self, Asked};
use super::plan::{ParsedRequest, CACHEABLE_BYTES, CONTEXT_1M};
use super::tally::Tally;
use super::Engine;
use crate::accounts::Caller;
use crate::billing::gate::{self, Admission, WorstCase};
use crate::byok::RouteRung;
use crate::downstream::answer::Tape;
use crate::hooks::{Admitted, Before, Go, Hooks};
use bytes::Bytes;
use sluice_filters::inbound::embeddings::EmbedRequest;
use sluice_filters::inbound::Inbound;
use sluice_filters::json::{with_long_strings, LongStrings, Member, RawObject};
use sluice_filters::{ApiError, Route};

/// The request as admitted: who asks, on which route, for which model, and its
/// body (as the features rebuilt it) with its members.
pub(crate) struct Asking<'a> {
    pub(crate) caller: &'a Caller,
    pub(crate) route: Route,
    /// The client's format; `None` for embeddings.
    pub(crate) inbound: Option<Inbound>,
    pub(crate) asked: &'a Asked,
    pub(crate) body: &'a Bytes,
    pub(crate) members: &'a [Member<'a>],
    pub(crate) long: &'a LongStrings<'a>,
}

impl<'a> Asking<'a> {
    pub(crate) fn new(
        caller: &'a Caller,
        route: Route,
        asked: &'a Asked,
        body: &'a Bytes,
        members: &'a [Member<'a>],
        long: &'a LongStrings<'a>,
    ) -> Asking<'a> {
        let inbound = match route {
            Route::Chat => Some(Inbound::Chat),
            Route::Responses => Some(Inbound::Responses),
            Route::Messages => Some(Inbound::Messages),
            _ => None,
        };
        Asking {
            caller,
            route,
            inbound,
            asked,
            body,
            members,
            long,
        }
    }

    fn ask(&self, worst: WorstCase, platform: bool) -> gate::Ask<'_> {
        gate::Ask {
            key: &self.caller.key,
            org: &self.caller.org,
            model: &self.asked.model.spec,
            worst,
            platform,
        }
    }
}

/// What the phase decided.
pub(crate) enum Ready<'a> {
    /// The gates are taken: serve this.
    Go(Admission, Work<'a>),
    /// A feature answers the request with what it answered the first time.
    Replay(Tape),
}

/// What the waterfall serves.
pub(crate) enum Work<'a> {
    Rungs(Box<ParsedRequest<'a>>),
    Embed(EmbedRequest, Vec<RouteRung>),
}

impl Work<'_> {
    pub(crate) fn streams(&self) -> bool {
        matches!(self, Work::Rungs(p) if p.stream)
    }
}

impl Engine {
    /// Parses the request, runs the features' phases around the gates and takes
    /// them.
    pub(super) async fn ready<'a>(
        &self,
        a: &Asking<'a>,
        hooks: &mut Hooks,
        tally: &mut Tally,
        mut rungs: Vec<RouteRung>,
    ) -> Result<Ready<'a>, ApiError> {
        let state = &*self.state;
        let model = &*a.asked.model;
        let Some(inbound) = a.inbound else {
            let req = sluice_filters::inbound::embeddings::parse(a.body)?;
            let worst = gate::worst_case(&model.spec.price, a.body.len(), 0);
            let admission = admit::admit_lanes(state, &mut rungs, |p| a.ask(worst, p)).await?;
            tally.free(admission.free);
            return Ok(Ready::Go(admission, Work::Embed(req, rungs)));
        };
        // Structural validation before anything is charged or sent. The body's
        // long strings were found by the split: the parse jumps over them.
        let mut req = with_long_strings(a.long, || inbound.parse(a.body, a.members))?;
        req.model = a.asked.name.clone();

        if a.asked.long_context {
            // Converse takes Anthropic's beta flags in its body.
            req.anthropic_beta.push(CONTEXT_1M.into());
        }
        // Encrypted reasoning reaches a responses client only when it asks.
        tally.hide_encrypted = inbound == Inbound::Responses
            && !req
                .include
                .iter()
                .any(|i| i == "reasoning.encrypted_content");
        self.hooks.on_parsed(hooks, &mut req, a.asked.online);
        let mut worst = admit::worst_case(model, &req, a.body.len());
        let mut keep_reasoning = false;
        if !hooks.is_empty() {
            let mut b = Before {
                route: a.route,
                org: &a.caller.org,
                model,
                body: a.body,
                req: &req,
                deadline: tally.deadline,
                worst: &mut worst,
                keep_reasoning: &mut keep_reasoning,
            };
            if let Go::Replay(tape) = hooks.before(&mut b).await? {
                return Ok(Ready::Replay(tape));
            }
        }
        let admission = admit::admit_lanes(state, &mut rungs, |p| a.ask(worst, p)).await?;
        tally.free(admission.free);
        // A cut or a stream without usage bills its output no more than the
        // budget.
        tally.output_cap = match gate::output_budget(req.max_tokens, model.spec.max_output_tokens) {
            0 => u64::MAX,
            cap => cap,
        };
        let mut parsed = ParsedRequest {
            inbound,
            stream: req.stream,
            req,
            object: RawObject::from_members(a.members),
            source: a.body.clone(),
            long_context: a.asked.long_context,
            anthropic: a.asked.anthropic.clone(),
            rungs,
            org_id: a.caller.org.id.clone(),
            cacheable: a.body.len() >= CACHEABLE_BYTES,
            keep_reasoning,
            part: None,
        };
        if !hooks.is_empty() {
            let mut after = Admitted {
                upstreams: &self.upstreams,
                req: &mut parsed.req,
                inbound,
                rungs: &parsed.rungs,
                deadline: tally.deadline,
                free: admission.free,
                extra: &mut tally.extra,
                part: &mut parsed.part,
            };
            hooks.admitted(&mut after).await;
            tally.count_vendor_time();
        }
        Ok(Ready::Go(admission, Work::Rungs(Box::new(parsed))))
    }
}
