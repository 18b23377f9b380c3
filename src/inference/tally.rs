//! One inference request's bookkeeping while the attempt loop runs: deadline,
//! time spent waiting on providers (so the gateway's own overhead can be told
//! apart), the attempts receipt, usage, and how the request ended.

use crate::billing::extra::Extra;
use crate::catalog::model::Price;
use crate::hooks::Hooks;
use pingora::http::ResponseHeader;
use sluice_filters::ir::Request;
use sluice_filters::usage::Usage;
use sluice_filters::ApiError;
use std::time::{Duration, Instant};

/// Appends `provider:outcome` to an attempts list.
fn push_attempt(list: &mut String, provider: &str, outcome: &str) {
    if !list.is_empty() {
        list.push(',');
    }
    list.push_str(provider);
    list.push(':');
    list.push_str(outcome);
}

/// How a request ended, for the caller of the attempt loop.
pub(crate) enum Outcome {
    /// An answer went out with this status.
    Written(u16),
    /// Nothing committed: answer with this error (in-band if the header went out).
    Error(ApiError),
    ClientGone,
    /// The model called `tool_search`: a search round follows, then another call.
    Round(Box<crate::hooks::Turn>),
}

pub(crate) struct Tally {
    /// The request's place under `[limits] max_pending`, until it commits.
    pub(crate) pending: Option<crate::downstream::pending::Place>,
    pub(crate) started: Instant,
    pub(crate) deadline: Instant,
    /// Time spent waiting on providers.
    pub(crate) upstream_wait: Duration,
    /// `x-gateway-attempts`: `provider:outcome` pairs in order.
    pub(crate) attempts: String,
    /// Whether the 200 header of a stream already went out (early keep-alives).
    pub(crate) header_sent: bool,
    pub(crate) rung: Option<String>,
    pub(crate) usage: Usage,
    pub(crate) incomplete: bool,
    pub(crate) empty_attempts: u32,
    pub(crate) first_token: Option<Duration>,
    /// `x-service-ignored-parameters` of the current attempt: the fields its rung
    /// does not receive.
    pub(crate) ignored: Option<String>,
    /// Responses: the client's own `store` and `previous_response_id`, which the
    /// answer echoes (the body served may be the rebuilt conversation).
    pub(crate) turn: Option<sluice_filters::inbound::history::TurnAsk>,
    /// The current attempt's history lost hidden reasoning of another maker
    /// (`x-gateway-replay-repair: encrypted_reasoning_stripped`).
    pub(crate) replay_repaired: bool,
    /// The price the serving rung bills at: every answer's usage is priced with
    /// it (zero on the org's own accounts and on free allowances).
    pub(crate) price: Price,
    /// What platform rungs bill at for this request.
    pub(crate) platform_price: Price,
    /// The lane of the rung being tried (then of the one that served).
    pub(crate) lane: crate::byok::Lane,
    /// A rung served content: only then is the call billed (failed and empty
    /// attempts cost nothing).
    pub(crate) billable: bool,
    /// Responses: the client did not ask for `reasoning.encrypted_content`, so its
    /// answer goes without it.
    pub(crate) hide_encrypted: bool,
    /// The prompt's size in tokens as the gateway counts it
    /// (`billing::tokens`), counted the first time an estimate needs it (a cut,
    /// a stream without usage): the common answer reports its own and never
    /// pays for the count.
    prompt_estimate: std::sync::OnceLock<u64>,
    /// The most output the request may bill (its budget, clamped to the model's
    /// maximum): an estimate of a cut's output never goes past it.
    pub(crate) output_cap: u64,
    /// The provider reported no usage (or part of it) for the answer served:
    /// `usage` holds the gateway's count, and the usage event says so.
    pub(crate) estimated: bool,
    /// What features add to the account beyond this call (none on the common
    /// request): earlier rounds, a service-run search and its fee.
    pub(crate) extra: Option<Box<Extra>>,
    /// The attempt spans and the `traceparent` providers get (empty when the
    /// request is neither traced nor carries one).
    pub(crate) trace: crate::trace::Attempts,
    /// The request's features, told of the answer's header and bytes as they go
    /// out (none on the common request).
    pub(crate) hooks: Hooks,
}

impl Tally {
    /// A request's account as its waterfall starts: a request for `model`,
    /// holding its `place` under `[limits] max_pending`.
    pub(crate) fn new(
        started: Instant,
        deadline: Duration,
        place: Option<crate::downstream::pending::Place>,
        model: &crate::catalog::Model,
    ) -> Tally {
        Tally {
            pending: place,
            started,
            deadline: started + deadline,
            upstream_wait: Duration::ZERO,
            attempts: String::new(),
            header_sent: false,
            rung: None,
            usage: Usage::default(),
            incomplete: false,
            empty_attempts: 0,
            first_token: None,
            ignored: None,
            turn: None,
            replay_repaired: false,
            price: Price::default(),
            platform_price: model.spec.price,
            lane: crate::byok::Lane::Platform,
            billable: false,
            hide_encrypted: false,
            prompt_estimate: std::sync::OnceLock::new(),
            output_cap: u64::MAX,
            estimated: false,
            extra: None,
            trace: Default::default(),
            hooks: Hooks::default(),
        }
    }

    /// A free allowance serves the request: platform rungs bill nothing.
    pub(crate) fn free(&mut self, free: bool) {
        if free {
            self.platform_price = Price::default();
        }
    }

    /// A feature's vendor time (a service-run search) is not the gateway's
    /// overhead.
    pub(crate) fn count_vendor_time(&mut self) {
        if let Some(us) = self.extra.as_ref().and_then(|o| o.search_us) {
            self.upstream_wait += Duration::from_micros(us);
        }
    }

    /// The answer's header, about to go out: the features see it (and may add
    /// to it).
    pub(crate) fn header_out(&mut self, h: &mut ResponseHeader) {
        self.hooks.header(h);
    }

    /// Bytes about to go to the client: the features see them as rendered, then
    /// without encrypted reasoning when the client did not ask for it, as
    /// written; handed back to be written.
    pub(crate) fn outgoing(&mut self, bytes: Vec<u8>, streamed: bool) -> Vec<u8> {
        self.hooks.rendered(&bytes);
        let bytes = if self.hide_encrypted {
            sluice_filters::inbound::responses::without_encrypted_content(&bytes, streamed)
                .unwrap_or(bytes)
        } else {
            bytes
        };
        self.hooks.wrote(&bytes);
        bytes
    }

    /// Body bytes sent to the client as they are (no output rule applies).
    pub(crate) fn body_out(&mut self, bytes: &[u8]) {
        self.hooks.rendered(bytes);
        self.hooks.wrote(bytes);
    }

    /// The usage of an answer cut short: what the provider reported, with the
    /// prompt and the delivered output estimated where it reported nothing (the
    /// provider bills a prompt it was sent, and the output it streamed).
    pub(crate) fn cut_usage(
        &self,
        req: &Request,
        seen: Option<Usage>,
        content_chars: usize,
    ) -> Usage {
        let mut u = seen.unwrap_or_default();
        if u.input_tokens == 0 {
            u.input_tokens = self.prompt_tokens(req);
        }
        if u.output_tokens == 0 {
            u.output_tokens = (content_chars.div_ceil(4) as u64).min(self.output_cap);
        }
        u
    }

    /// Counts the prompt for an estimate when the provider's usage (`seen`)
    /// has none, with the tokenizer of the serving rung's model (`model_id`)
    /// where the gateway holds it, once; [`Tally::cut_usage`] then bills it.
    pub(crate) async fn count_prompt(
        &mut self,
        req: &Request,
        seen: Option<Usage>,
        model_id: &str,
    ) {
        if self.prompt_estimate.get().is_some() || seen.is_some_and(|u| u.input_tokens > 0) {
            return;
        }
        let n = crate::billing::tokens::prompt_tokens(req, model_id).await;
        let _ = self.prompt_estimate.set(n);
    }

    /// The prompt's estimated size in tokens: the text `req` (the request as
    /// the rungs get it, history a feature added included) gives a model, as
    /// [`Tally::count_prompt`] counted it, else by the approximation.
    fn prompt_tokens(&self, req: &Request) -> u64 {
        *self
            .prompt_estimate
            .get_or_init(|| req.estimated_prompt_tokens())
    }

    /// `usage` with its cost at this model's price; an orchestrated request's
    /// answer reports what all of it used (earlier rounds, searches, the fee).
    pub(crate) fn priced(&self, usage: Usage) -> Usage {
        let mut u = crate::billing::priced(&self.price, usage);
        if let Some(o) = &self.extra {
            o.add_to(&mut u, self.lane == crate::byok::Lane::Platform);
        }
        u
    }

    /// A search round's model call is banked: billed at its rung's price, its
    /// usage kept for the request's total, and this call's count started over.
    pub(crate) fn bank_round(&mut self, list: &Price) {
        let u = std::mem::take(&mut self.usage);
        let billed = crate::billing::cost_micro_usd(&self.price, &u);
        let listed = crate::billing::cost_micro_usd(list, &u);
        let tokens = crate::billing::gate::weighted_tokens(list, &u);
        let platform = self.lane == crate::byok::Lane::Platform;
        let o = self.extra.get_or_insert_with(Box::default);
        o.bank(
            &u,
            i64::try_from(billed).unwrap_or(i64::MAX),
            i64::try_from(listed).unwrap_or(i64::MAX),
            tokens,
            platform,
        );
        self.billable = false;
    }

    /// The stream an earlier round began, for this call to continue.
    pub(crate) fn take_resume(&mut self) -> Option<Box<dyn sluice_filters::ir::StreamEncoder>> {
        self.extra.as_mut().and_then(|o| o.take_stream())
    }

    /// What the request is billed beyond this call's usage at its price: earlier
    /// rounds (model calls the provider billed, whatever came after), and the
    /// search fee when an answer was served.
    pub(crate) fn billed_extra(&self) -> i64 {
        self.extra.as_ref().map_or(0, |o| {
            o.rounds_billed + i64::try_from(self.search_fee()).unwrap_or(i64::MAX)
        })
    }

    /// The web search fee this request is billed (none unless a rung served it).
    pub(crate) fn search_fee(&self) -> u64 {
        match &self.extra {
            Some(o) if self.billable => o.fee(self.lane == crate::byok::Lane::Platform),
            _ => 0,
        }
    }

    /// A platform rung served a model call of the request (this one, or an
    /// earlier round's): the request draws credits.
    pub(crate) fn platform_served(&self) -> bool {
        self.lane == crate::byok::Lane::Platform
            || self.extra.as_ref().is_some_and(|o| o.rounds_platform)
    }

    /// All the request used: this call's usage and earlier rounds', with the web
    /// searches the gateway ran.
    pub(crate) fn total_usage(&self) -> Usage {
        let mut u = self.usage;
        if let Some(o) = &self.extra {
            let cost = u.cost_micro_usd;
            o.add_to(&mut u, false);
            u.cost_micro_usd = cost;
        }
        u
    }

    pub(crate) fn attempt(&mut self, provider: &str, outcome: &str) {
        push_attempt(&mut self.attempts, provider, outcome);
    }

    /// Microseconds spent in the gateway itself so far.
    pub(crate) fn overhead_us(&self) -> u64 {
        self.started
            .elapsed()
            .saturating_sub(self.upstream_wait)
            .as_micros() as u64
    }

    /// The attempts so far plus the current one.
    fn attempts_with(&self, provider: &str, outcome: &str) -> String {
        let mut a = String::with_capacity(self.attempts.len() + provider.len() + outcome.len() + 2);
        a.push_str(&self.attempts);
        if !provider.is_empty() {
            push_attempt(&mut a, provider, outcome);
        }
        a
    }

    /// Adds the receipt headers to an answer's header.
    pub(crate) fn receipt_headers(&self, h: &mut ResponseHeader, provider: &str, outcome: &str) {
        let _ = h.insert_header("x-gateway-attempts", self.attempts_with(provider, outcome));
        let _ = h.insert_header(
            "x-gateway-overhead-us",
            http::HeaderValue::from(self.overhead_us()),
        );
        if let Some(ignored) = &self.ignored {
            let _ = h.insert_header("x-service-ignored-parameters", ignored.as_str());
        }
        if self.replay_repaired {
            let _ = h.insert_header("x-gateway-replay-repair", "encrypted_reasoning_stripped");
        }
        if let Some(us) = self.search_us() {
            let _ = h.insert_header("x-gateway-search-us", http::HeaderValue::from(us));
        }
    }

    /// The service-run web search's time, when one ran.
    fn search_us(&self) -> Option<u64> {
        self.extra.as_ref().and_then(|o| o.search_us)
    }

    /// The receipt as a JSON member for a stream's final chunk.
    pub(crate) fn receipt_json(&self, provider: &str, outcome: &str) -> Vec<u8> {
        let mut v = serde_json::json!({
            "attempts": self.attempts_with(provider, outcome),
            "overhead_us": self.overhead_us(),
        });
        if let Some(us) = self.search_us() {
            v["search_us"] = us.into();
        }
        serde_json::to_vec(&v).unwrap_or_default()
    }
}
