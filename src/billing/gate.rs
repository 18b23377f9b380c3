//! Spend guardrails checked before a request is sent: a key's daily spend cap
//! (resets 00:00 UTC). The request's worst case (its input estimated from the body,
//! plus its output budget, at list price) is held in the key's daily window with one
//! atomic counters step; once the answer is settled the hold is corrected to the real
//! cost, so the window ends equal to what the key spent.

use crate::accounts::keys::KeyRecord;
use crate::accounts::micro_to_usd;
use crate::catalog::model::Price;
use crate::store::counters::{now_secs, window_index, Counters, WindowOutcome, WindowReq};
use sluice_filters::usage::Usage;
use sluice_filters::{ApiError, ErrorCode};

const DAY_SECS: u64 = 86_400;

/// A worst case held in a spend window, to be corrected once the cost is known.
pub struct Hold {
    /// The window's counter, fixed when the hold was taken (a request that crosses
    /// midnight settles in the day it was admitted).
    counter: String,
    reserved: i64,
}

/// The most a request can cost: every body byte an input token (JSON makes that an
/// overestimate of the text) and the whole output budget, at list price.
pub fn worst_case_micro_usd(price: &Price, body_bytes: usize, max_output: u64) -> i64 {
    let usage = Usage {
        input_tokens: body_bytes.div_ceil(4) as u64,
        output_tokens: max_output,
        ..Usage::default()
    };
    i64::try_from(super::cost_micro_usd(price, &usage)).unwrap_or(i64::MAX)
}

/// Holds `worst` in the key's daily window, or refuses with `insufficient_quota`
/// (`key_daily_cap`). A key without a cap costs no round trip.
pub async fn key_daily_cap(
    counters: &dyn Counters,
    key: &KeyRecord,
    worst: i64,
) -> Result<Option<Hold>, ApiError> {
    let Some(cap) = key.daily_spend_cap_micro_usd else {
        return Ok(None);
    };
    let name = format!("kday:{}", key.id);
    let req = WindowReq {
        key: name.clone(),
        window_secs: DAY_SECS,
        amount: worst,
        limit: cap,
    };
    let day = window_index(now_secs(), DAY_SECS);
    match counters.check_and_add(std::slice::from_ref(&req)).await {
        Ok(WindowOutcome::Added) => Ok(Some(Hold {
            counter: format!("{name}:w{DAY_SECS}:{day}"),
            reserved: worst,
        })),
        Ok(WindowOutcome::Refused { current, .. }) => Err(ApiError::new(
            ErrorCode::InsufficientQuota,
            format!(
                "key_daily_cap: this request could cost up to {:.6} USD, which would take the key past its daily spend cap of {:.2} USD ({:.6} USD spent or held today); the cap resets at 00:00 UTC.",
                micro_to_usd(worst),
                micro_to_usd(cap),
                micro_to_usd(current),
            ),
        )
        .with_extra("reason", "key_daily_cap")),
        Err(e) => {
            // A spend cap is the customer's guardrail: without the store that
            // enforces it, the request is not sent.
            tracing::error!(error = %e, "counters unavailable for the key's daily cap");
            Err(ApiError::new(
                ErrorCode::UnavailableRoute,
                "The limits store is unavailable; retry with backoff.",
            )
            .with_status(503))
        }
    }
}

/// Corrects a hold to the real cost (zero for a failed or refused request).
pub async fn settle(counters: &dyn Counters, hold: Hold, cost: i64) {
    let delta = cost - hold.reserved;
    if delta != 0 {
        if let Err(e) = counters.add(&hold.counter, delta).await {
            tracing::error!(error = %e, "settling a daily-cap hold failed");
        }
    }
}
