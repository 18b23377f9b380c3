//! What features add to a request's account beyond its model call, kept by the
//! flow's tally: a service-run web search (count, fee, latency) and the usage of
//! earlier model calls of a tool search (each billed at its own rung's price).
//! The common request carries none.

use sluice_filters::ir::StreamEncoder;
use sluice_filters::usage::Usage;

#[derive(Default)]
pub struct Extra {
    pub web_searches: u64,
    /// The search fee, charged when a platform rung served the answer.
    pub fee_micro_usd: u64,
    /// The search vendor's time, in the receipt.
    pub search_us: Option<u64>,
    /// Earlier rounds: their usage, billed cost, list-price cost and weighted
    /// tokens, and whether a platform rung served one.
    pub rounds_usage: Usage,
    pub rounds_billed: i64,
    pub rounds_list: i64,
    pub rounds_tokens: i64,
    pub rounds_platform: bool,
    /// The stream an earlier round began (text before a `tool_search` call):
    /// the next call continues it. (In a mutex only so the account can be shared
    /// across awaits; it is only ever taken through `&mut`.)
    pub resume: std::sync::Mutex<Option<Box<dyn StreamEncoder>>>,
}

impl Extra {
    /// The fee, when a platform rung serves the answer (this call's, or an
    /// earlier round's).
    pub fn fee(&self, platform: bool) -> u64 {
        if platform || self.rounds_platform {
            self.fee_micro_usd
        } else {
            0
        }
    }

    /// Keeps the stream a round began, for the next call to continue.
    pub fn keep_stream(&mut self, enc: Box<dyn StreamEncoder>) {
        *self.resume.get_mut().unwrap_or_else(|e| e.into_inner()) = Some(enc);
    }

    /// The stream an earlier round began, if any.
    pub fn take_stream(&mut self) -> Option<Box<dyn StreamEncoder>> {
        self.resume
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Banks one round's model call.
    pub fn bank(&mut self, usage: &Usage, billed: i64, list: i64, tokens: i64, platform: bool) {
        add_usage(&mut self.rounds_usage, usage);
        self.rounds_billed += billed;
        self.rounds_list += list;
        self.rounds_tokens += tokens;
        self.rounds_platform |= platform;
    }

    /// `u` (this call's usage, priced) with everything else the request used:
    /// earlier rounds, the searches and the fee.
    pub fn add_to(&self, u: &mut Usage, platform: bool) {
        add_usage(u, &self.rounds_usage);
        u.web_search_requests += self.web_searches;
        if let Some(c) = u.cost_micro_usd.as_mut() {
            *c += self.rounds_billed.max(0) as u64 + self.fee(platform);
        }
    }
}

/// Adds `b`'s tokens to `a` (cost is not summed here: each call is priced at its
/// own rung).
fn add_usage(a: &mut Usage, b: &Usage) {
    a.input_tokens = a.input_tokens.saturating_add(b.input_tokens);
    a.cached_tokens = a.cached_tokens.saturating_add(b.cached_tokens);
    a.cache_write_tokens = a.cache_write_tokens.saturating_add(b.cache_write_tokens);
    a.cache_write_1h_tokens = a
        .cache_write_1h_tokens
        .saturating_add(b.cache_write_1h_tokens);
    a.output_tokens = a.output_tokens.saturating_add(b.output_tokens);
    a.reasoning_tokens = a.reasoning_tokens.saturating_add(b.reasoning_tokens);
    a.web_search_requests = a.web_search_requests.saturating_add(b.web_search_requests);
}
