//! One inference request's bookkeeping while the attempt loop runs: deadline,
//! time spent waiting on providers (so the gateway's own overhead can be told
//! apart), the attempts receipt, usage, and how the request ended.

use crate::catalog::model::Price;
use pingora::http::ResponseHeader;
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
pub enum Outcome {
    /// An answer went out with this status.
    Written(u16),
    /// Nothing committed: answer with this error (in-band if the header went out).
    Error(ApiError),
    ClientGone,
    /// The model called `tool_search`: a search round follows, then another call.
    Round(Box<crate::search::Turn>),
}

pub struct Tally {
    /// The request's place under `[limits] max_pending`, until it commits.
    pub pending: Option<crate::downstream::pending::Place>,
    pub started: Instant,
    pub deadline: Instant,
    /// Time spent waiting on providers.
    pub upstream_wait: Duration,
    /// `x-gateway-attempts`: `provider:outcome` pairs in order.
    pub attempts: String,
    /// Whether the 200 header of a stream already went out (early keep-alives).
    pub header_sent: bool,
    pub rung: Option<String>,
    pub usage: Usage,
    pub incomplete: bool,
    pub empty_attempts: u32,
    pub first_token: Option<Duration>,
    /// `x-service-ignored-parameters` of the current attempt: the fields its rung
    /// does not receive.
    pub ignored: Option<String>,
    /// The current attempt's history lost hidden reasoning of another maker
    /// (`x-gateway-replay-repair: encrypted_reasoning_stripped`).
    pub replay_repaired: bool,
    /// Hidden reasoning the client replayed without its content was removed
    /// before any attempt (the store could not complete it).
    pub history_repaired: bool,
    /// The price the serving rung bills at: every answer's usage is priced with
    /// it (zero on the org's own accounts and on free allowances).
    pub price: Price,
    /// What platform rungs bill at for this request.
    pub platform_price: Price,
    /// The lane of the rung being tried (then of the one that served).
    pub lane: crate::byok::Lane,
    /// A rung served content: only then is the call billed (failed and empty
    /// attempts cost nothing).
    pub billable: bool,
    /// What went to the client, kept only for a request with an Idempotency-Key;
    /// dropped (`None`) once it outgrows `tape_cap`.
    pub tape: Option<Box<Tape>>,
    /// What went to the client, kept whole for the responses store when it keeps
    /// this turn (encrypted reasoning included, whatever the client sees).
    pub capture: Option<Vec<u8>>,
    /// Responses: the client did not ask for `reasoning.encrypted_content`, so its
    /// answer goes without it.
    pub hide_encrypted: bool,
    /// The prompt's size in tokens as the gateway estimates it (body bytes / 4):
    /// a cut stream whose provider never reported its count bills this.
    pub prompt_estimate: u64,
    pub tape_cap: usize,
    /// What web search and tool search add (none on the common request).
    pub orch: Option<Box<crate::search::Spent>>,
    /// The attempt spans and the `traceparent` providers get (empty when the
    /// request is neither traced nor carries one).
    pub trace: crate::trace::Attempts,
    /// The batch line (`<batch id>:<line>`) this request serves, sent by this
    /// instance's runner: its usage event names it, and is stored once.
    pub batch_line: Option<Box<str>>,
}

/// An answer as the client received it: status, the headers worth replaying, and
/// the body bytes (a stream's frames in order).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tape {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Tally {
    pub fn new(started: Instant, deadline: Duration) -> Tally {
        Tally {
            pending: None,
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
            replay_repaired: false,
            history_repaired: false,
            price: Price::default(),
            platform_price: Price::default(),
            lane: crate::byok::Lane::Platform,
            billable: false,
            tape: None,
            capture: None,
            hide_encrypted: false,
            prompt_estimate: 0,
            tape_cap: usize::MAX,
            orch: None,
            trace: Default::default(),
            batch_line: None,
        }
    }

    /// Records the answer's header when the request is being taped.
    pub fn tape_header(&mut self, h: &ResponseHeader) {
        if let Some(t) = self.tape.as_deref_mut() {
            t.status = h.status.as_u16();
            t.headers = h
                .headers
                .iter()
                .filter(|(n, _)| *n != http::header::CONTENT_LENGTH)
                .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
                .collect();
        }
    }

    /// Bytes about to go to the client: kept for the store as they are, then
    /// without encrypted reasoning when the client did not ask for it, taped, and
    /// handed back to be written.
    pub fn outgoing(&mut self, bytes: Vec<u8>, streamed: bool) -> Vec<u8> {
        if let Some(c) = self.capture.as_mut() {
            c.extend_from_slice(&bytes);
        }
        let bytes = if self.hide_encrypted {
            sluice_filters::inbound::responses::without_encrypted_content(&bytes, streamed)
                .unwrap_or(bytes)
        } else {
            bytes
        };
        self.tape_only(&bytes);
        bytes
    }

    /// Whether the body sent to the client is being recorded (for a replay, or
    /// for the responses store).
    pub fn records_body(&self) -> bool {
        self.tape.is_some() || self.capture.is_some()
    }

    /// Records body bytes sent to the client when the request is being taped or
    /// captured.
    pub fn tape_body(&mut self, bytes: &[u8]) {
        if let Some(c) = self.capture.as_mut() {
            c.extend_from_slice(bytes);
        }
        self.tape_only(bytes);
    }

    fn tape_only(&mut self, bytes: &[u8]) {
        if let Some(t) = self.tape.as_deref_mut() {
            if t.body.len().saturating_add(bytes.len()) > self.tape_cap {
                // Too large to keep for a replay: free it now, not at the end.
                self.tape = None;
            } else {
                t.body.extend_from_slice(bytes);
            }
        }
    }

    /// The usage of an answer cut short: what the provider reported, with the
    /// prompt and the delivered output estimated where it reported nothing (the
    /// provider bills a prompt it was sent, and the output it streamed).
    pub fn cut_usage(&self, seen: Option<Usage>, content_chars: usize) -> Usage {
        let mut u = seen.unwrap_or_default();
        if u.input_tokens == 0 {
            u.input_tokens = self.prompt_estimate;
        }
        if u.output_tokens == 0 {
            u.output_tokens = content_chars.div_ceil(4) as u64;
        }
        u
    }

    /// `usage` with its cost at this model's price; an orchestrated request's
    /// answer reports what all of it used (earlier rounds, searches, the fee).
    pub fn priced(&self, usage: Usage) -> Usage {
        let mut u = crate::billing::priced(&self.price, usage);
        if let Some(o) = &self.orch {
            o.add_to(&mut u, self.lane == crate::byok::Lane::Platform);
        }
        u
    }

    /// A search round's model call is banked: billed at its rung's price, its
    /// usage kept for the request's total, and this call's count started over.
    pub fn bank_round(&mut self, list: &Price) {
        let u = std::mem::take(&mut self.usage);
        let billed = crate::billing::cost_micro_usd(&self.price, &u);
        let listed = crate::billing::cost_micro_usd(list, &u);
        let tokens = crate::billing::gate::weighted_tokens(list, &u);
        let platform = self.lane == crate::byok::Lane::Platform;
        let o = self.orch.get_or_insert_with(Box::default);
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
    pub fn take_resume(&mut self) -> Option<Box<dyn sluice_filters::ir::StreamEncoder>> {
        self.orch.as_mut().and_then(|o| o.take_stream())
    }

    /// What the request is billed beyond this call's usage at its price: earlier
    /// rounds (model calls the provider billed, whatever came after), and the
    /// search fee when an answer was served.
    pub fn billed_extra(&self) -> i64 {
        self.orch.as_ref().map_or(0, |o| {
            o.rounds_billed + i64::try_from(self.search_fee()).unwrap_or(i64::MAX)
        })
    }

    /// The web search fee this request is billed (none unless a rung served it).
    pub fn search_fee(&self) -> u64 {
        match &self.orch {
            Some(o) if self.billable => o.fee(self.lane == crate::byok::Lane::Platform),
            _ => 0,
        }
    }

    /// A platform rung served a model call of the request (this one, or an
    /// earlier round's): the request draws credits.
    pub fn platform_served(&self) -> bool {
        self.lane == crate::byok::Lane::Platform
            || self.orch.as_ref().is_some_and(|o| o.rounds_platform)
    }

    /// All the request used: this call's usage and earlier rounds', with the web
    /// searches the gateway ran.
    pub fn total_usage(&self) -> Usage {
        let mut u = self.usage;
        if let Some(o) = &self.orch {
            let cost = u.cost_micro_usd;
            o.add_to(&mut u, false);
            u.cost_micro_usd = cost;
        }
        u
    }

    pub fn attempt(&mut self, provider: &str, outcome: &str) {
        push_attempt(&mut self.attempts, provider, outcome);
    }

    /// Microseconds spent in the gateway itself so far.
    pub fn overhead_us(&self) -> u64 {
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
    pub fn receipt_headers(&self, h: &mut ResponseHeader, provider: &str, outcome: &str) {
        let _ = h.insert_header("x-gateway-attempts", self.attempts_with(provider, outcome));
        let _ = h.insert_header(
            "x-gateway-overhead-us",
            http::HeaderValue::from(self.overhead_us()),
        );
        if let Some(ignored) = &self.ignored {
            let _ = h.insert_header("x-service-ignored-parameters", ignored.as_str());
        }
        if self.replay_repaired || self.history_repaired {
            let _ = h.insert_header("x-gateway-replay-repair", "encrypted_reasoning_stripped");
        }
        if let Some(us) = self.search_us() {
            let _ = h.insert_header("x-gateway-search-us", http::HeaderValue::from(us));
        }
    }

    /// The service-run web search's time, when one ran.
    fn search_us(&self) -> Option<u64> {
        self.orch.as_ref().and_then(|o| o.search_us)
    }

    /// The receipt as a JSON member for a stream's final chunk.
    pub fn receipt_json(&self, provider: &str, outcome: &str) -> Vec<u8> {
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
