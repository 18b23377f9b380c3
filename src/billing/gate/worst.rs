//! The worst case a request is held for: its body as input, its output budget, at
//! the dearest price it can be billed; and the weighted tokens the windows count.

use super::*;

/// What a request may use at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorstCase {
    pub micro_usd: i64,
    pub tokens: i64,
}

/// The output budget a request is held for: its `max_tokens` clamped to the
/// model's output maximum (a provider writes no more than that), the maximum when
/// it sets none. A model that states no maximum (0) takes the request's figure.
pub fn output_budget(max_tokens: Option<u64>, model_max: u64) -> u64 {
    match (max_tokens, model_max) {
        (Some(n), 0) => n,
        (Some(n), max) => n.min(max),
        (None, max) => max,
    }
}

/// The most a request can use: every body byte an input token (JSON makes that an
/// overestimate of the text) and the whole output budget, at list price.
pub fn worst_case(price: &Price, body_bytes: usize, max_output: u64) -> WorstCase {
    hold(price, body_bytes, max_output, false)
}

/// [`worst_case`] for a request that marks prompt-cache breakpoints: the whole
/// prompt may be written to the cache, at the dearest write price where writes
/// cost more than input.
pub fn worst_case_caching(price: &Price, body_bytes: usize, max_output: u64) -> WorstCase {
    hold(price, body_bytes, max_output, true)
}

pub(super) fn hold(price: &Price, body_bytes: usize, max_output: u64, writes: bool) -> WorstCase {
    let input_tokens = body_bytes.div_ceil(4) as u64;
    let dearer = |p: u64, than: u64| if writes && p > than { input_tokens } else { 0 };
    let usage = Usage {
        input_tokens,
        cache_write_tokens: dearer(price.cache_write().max(price.cache_write_1h()), price.input),
        cache_write_1h_tokens: dearer(price.cache_write_1h(), price.cache_write()),
        output_tokens: max_output,
        ..Usage::default()
    };
    WorstCase {
        micro_usd: i64::try_from(crate::billing::cost_micro_usd(price, &usage)).unwrap_or(i64::MAX),
        tokens: weighted_tokens(price, &usage),
    }
}

/// Tokens as the limits count them: fresh input and output in full, cached input
/// and cache writes at their price weights (a tenth when reads are billed at a
/// tenth, 1.25 when writes cost 1.25x input), each rounded up.
pub fn weighted_tokens(price: &Price, u: &Usage) -> i64 {
    let cached = u.cached_tokens.min(u.input_tokens);
    let written = u.cache_write_tokens.min(u.input_tokens - cached);
    let hour = u.cache_write_1h_tokens.min(written);
    let fresh = u.input_tokens - cached - written;
    let cached_weight = if price.input == 0 || price.cached_input >= price.input {
        cached as u128
    } else {
        (cached as u128 * price.cached_input as u128).div_ceil(price.input as u128)
    };
    // Writes weigh more than a token when they cost more (1.25x on Claude).
    let written_weight = if price.input == 0 {
        written as u128
    } else {
        let cost = (written - hour) as u128 * price.cache_write() as u128
            + hour as u128 * price.cache_write_1h() as u128;
        cost.div_ceil(price.input as u128)
    };
    let n = fresh as u128 + cached_weight + written_weight + u.output_tokens as u128;
    i64::try_from(n).unwrap_or(i64::MAX)
}
