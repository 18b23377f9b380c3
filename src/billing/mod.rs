//! Prices and costs. All arithmetic is in integers: catalog prices are micro-USD
//! per million tokens, a call's cost is micro-USD, rounded to the nearest micro-USD
//! (half up) once per call, so there is no systematic markup either way.

pub mod extra;
pub mod gate;
pub mod payments;
pub mod tokens;

use crate::catalog::model::Price;
use sluice_filters::usage::Usage;

/// What `usage` costs at `price`: fresh input at the input rate, cached input at
/// the cached rate, cache writes at the cache-write rate (one-hour writes at
/// theirs), output (reasoning
/// included) at the output rate. Reads and writes are parts of `input_tokens`,
/// never billed twice.
pub fn cost_micro_usd(price: &Price, usage: &Usage) -> u64 {
    let cached = usage.cached_tokens.min(usage.input_tokens);
    let written = usage.cache_write_tokens.min(usage.input_tokens - cached);
    let hour = usage.cache_write_1h_tokens.min(written);
    let fresh = usage.input_tokens - cached - written;
    // u64 x u64 products summed can pass u128: saturate (the result caps anyway).
    let per_million = (fresh as u128 * price.input as u128)
        .saturating_add(cached as u128 * price.cached_input as u128)
        .saturating_add((written - hour) as u128 * price.cache_write() as u128)
        .saturating_add(hour as u128 * price.cache_write_1h() as u128)
        .saturating_add(usage.output_tokens as u128 * price.output as u128);
    let micro = per_million.saturating_add(500_000) / 1_000_000;
    u64::try_from(micro).unwrap_or(u64::MAX)
}

/// `usage` with its cost filled in.
pub fn priced(price: &Price, mut usage: Usage) -> Usage {
    usage.cost_micro_usd = Some(cost_micro_usd(price, &usage));
    usage
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, cached: u64, output: u64) -> Usage {
        Usage {
            input_tokens: input,
            cached_tokens: cached,
            output_tokens: output,
            ..Usage::default()
        }
    }

    #[test]
    fn costs_match_hand_computed_values() {
        // gpt-4.1: $2 in, $0.50 cached, $8 out per million tokens.
        let p = Price {
            input: 2_000_000,
            cached_input: 500_000,
            output: 8_000_000,
            cache_write_input: None,
            cache_write_1h_input: None,
        };
        // 1,000 fresh in = $0.002; 500 out = $0.004 -> 6,000 micro-USD.
        assert_eq!(cost_micro_usd(&p, &usage(1000, 0, 500)), 6000);
        // 1,000 in of which 800 cached: 200 x 2 + 800 x 0.5 = 800 micro-USD.
        assert_eq!(cost_micro_usd(&p, &usage(1000, 800, 0)), 800);
        // One output token = 8 micro-USD exactly.
        assert_eq!(cost_micro_usd(&p, &usage(0, 0, 1)), 8);
        // Rounding to the nearest micro-USD: 1 input token of a $0.40/M model is
        // 0.4 micro-USD -> 0; 2 tokens 0.8 -> 1.
        let cheap = Price {
            input: 400_000,
            cached_input: 100_000,
            output: 1_600_000,
            cache_write_input: None,
            cache_write_1h_input: None,
        };
        assert_eq!(cost_micro_usd(&cheap, &usage(1, 0, 0)), 0);
        assert_eq!(cost_micro_usd(&cheap, &usage(2, 0, 0)), 1);
        assert_eq!(cost_micro_usd(&cheap, &usage(0, 0, 0)), 0);
        // Huge counts do not overflow.
        let big = usage(u64::MAX / 2, 0, u64::MAX / 2);
        assert!(cost_micro_usd(&p, &big) > 0);
    }

    #[test]
    fn priced_usage_carries_its_cost_in_usd() {
        let p = Price {
            input: 3_000_000,
            cached_input: 300_000,
            output: 15_000_000,
            cache_write_input: None,
            cache_write_1h_input: None,
        };
        let u = priced(&p, usage(2000, 1000, 100));
        // 1000 x 3 + 1000 x 0.3 + 100 x 15 = 4800 micro-USD.
        assert_eq!(u.cost_micro_usd, Some(4800));
        assert_eq!(u.cost_usd(), Some(0.0048));
    }

    #[test]
    fn cache_writes_cost_the_write_price_and_are_not_billed_as_input() {
        // Claude Sonnet: $3 in, $0.30 cached read, $3.75 5-minute write, $15 out.
        let p = Price {
            input: 3_000_000,
            cached_input: 300_000,
            output: 15_000_000,
            cache_write_input: Some(3_750_000),
            cache_write_1h_input: None,
        };
        // 10,000 in: 1,000 read, 8,000 written, 1,000 fresh; 100 out.
        let u = Usage {
            cache_write_tokens: 8000,
            ..usage(10_000, 1000, 100)
        };
        // 1000 x 3 + 1000 x 0.3 + 8000 x 3.75 + 100 x 15 = 34,800 micro-USD.
        assert_eq!(cost_micro_usd(&p, &u), 34_800);
        // One-hour writes at their own price: 2,000 of the 8,000 at $6.
        let hour = Price {
            cache_write_1h_input: Some(6_000_000),
            ..p
        };
        let u1h = Usage {
            cache_write_1h_tokens: 2000,
            ..u
        };
        assert_eq!(cost_micro_usd(&hour, &u1h), 34_800 + 2000 * 2250 / 1000);
        // Absent, a one-hour write costs the write price.
        assert_eq!(cost_micro_usd(&p, &u1h), 34_800);
        // Absent, a write costs the input price.
        let plain = Price {
            cache_write_input: None,
            ..p
        };
        // 1000 x 3 + 1000 x 0.3 + 8000 x 3 + 100 x 15 = 28,800.
        assert_eq!(cost_micro_usd(&plain, &u), 28_800);
        // A count past the input is clamped: never more than the input billed.
        let over = Usage {
            cache_write_tokens: 50_000,
            ..usage(10_000, 1000, 0)
        };
        assert_eq!(cost_micro_usd(&p, &over), 300 + 9000 * 3750 / 1000);
    }
}
