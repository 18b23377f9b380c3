//! Key guardrails checked before a request is sent: the daily spend cap (resets
//! 00:00 UTC), requests per minute and tokens per minute; a null guardrail is
//! uncapped. One atomic counters step takes every window of the key at once: the
//! request's worst case (its input estimated from the body, plus its output budget,
//! at list price) is held in the spend and token windows, and once the answer is
//! settled the holds are corrected to the real cost and tokens, so each window ends
//! equal to what the key really used.

use crate::accounts::keys::KeyRecord;
use crate::accounts::micro_to_usd;
use crate::catalog::model::Price;
use crate::store::counters::{now_secs, window_index, Counters, WindowOutcome, WindowReq};
use sluice_filters::usage::Usage;
use sluice_filters::{ApiError, ErrorCode};

const DAY_SECS: u64 = 86_400;
const MINUTE_SECS: u64 = 60;

/// What a request may use at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorstCase {
    pub micro_usd: i64,
    pub tokens: i64,
}

/// The most a request can use: every body byte an input token (JSON makes that an
/// overestimate of the text) and the whole output budget, at list price.
pub fn worst_case(price: &Price, body_bytes: usize, max_output: u64) -> WorstCase {
    let usage = Usage {
        input_tokens: body_bytes.div_ceil(4) as u64,
        output_tokens: max_output,
        ..Usage::default()
    };
    WorstCase {
        micro_usd: i64::try_from(super::cost_micro_usd(price, &usage)).unwrap_or(i64::MAX),
        tokens: i64::try_from(usage.total()).unwrap_or(i64::MAX),
    }
}

/// Held amounts, to be corrected once the real use is known. The window counters are
/// fixed when the holds were taken (a request that crosses a window boundary settles
/// in the window it was admitted to).
pub struct Hold {
    spend: Option<(String, i64)>,
    tokens: Option<(String, i64)>,
}

fn counter(name: &str, window_secs: u64, now: u64) -> String {
    format!("{name}:w{window_secs}:{}", window_index(now, window_secs))
}

/// Takes the key's windows for this request, or refuses with `insufficient_quota`
/// (`key_daily_cap`, `key_rate_limit`, `key_token_rate_limit`). A key without
/// guardrails costs no round trip.
pub async fn key_guardrails(
    counters: &dyn Counters,
    key: &KeyRecord,
    worst: WorstCase,
) -> Result<Option<Hold>, ApiError> {
    let mut windows = Vec::new();
    let mut kinds = Vec::new();
    if let Some(cap) = key.daily_spend_cap_micro_usd {
        windows.push(WindowReq {
            key: format!("kday:{}", key.id),
            window_secs: DAY_SECS,
            amount: worst.micro_usd,
            limit: cap,
        });
        kinds.push("key_daily_cap");
    }
    if let Some(rpm) = key.rpm {
        windows.push(WindowReq {
            key: format!("krpm:{}", key.id),
            window_secs: MINUTE_SECS,
            amount: 1,
            limit: rpm,
        });
        kinds.push("key_rate_limit");
    }
    if let Some(tpm) = key.tpm {
        windows.push(WindowReq {
            key: format!("ktpm:{}", key.id),
            window_secs: MINUTE_SECS,
            amount: worst.tokens,
            limit: tpm,
        });
        kinds.push("key_token_rate_limit");
    }
    if windows.is_empty() {
        return Ok(None);
    }
    let now = now_secs();
    match counters.check_and_add(&windows).await {
        Ok(WindowOutcome::Added) => {
            let held = |prefix: &str, secs: u64, amount: i64| {
                windows
                    .iter()
                    .find(|w| w.key.starts_with(prefix))
                    .map(|w| (counter(&w.key, secs, now), amount))
            };
            Ok(Some(Hold {
                spend: held("kday:", DAY_SECS, worst.micro_usd),
                tokens: held("ktpm:", MINUTE_SECS, worst.tokens),
            }))
        }
        Ok(WindowOutcome::Refused { index, current }) => {
            let w = &windows[index];
            let message = match kinds[index] {
                "key_daily_cap" => format!(
                    "key_daily_cap: this request could cost up to {:.6} USD, which would take the key past its daily spend cap of {:.2} USD ({:.6} USD spent or held today); the cap resets at 00:00 UTC.",
                    micro_to_usd(worst.micro_usd),
                    micro_to_usd(w.limit),
                    micro_to_usd(current),
                ),
                "key_rate_limit" => format!(
                    "key_rate_limit: this key allows {} requests per minute; retry in the next minute.",
                    w.limit
                ),
                _ => format!(
                    "key_token_rate_limit: this request could use up to {} tokens, which would take the key past its {} tokens per minute; retry in the next minute.",
                    worst.tokens, w.limit
                ),
            };
            Err(ApiError::new(ErrorCode::InsufficientQuota, message)
                .with_extra("reason", kinds[index]))
        }
        Err(e) => {
            // Guardrails are the customer's: without the store that enforces them,
            // the request is not sent.
            tracing::error!(error = %e, "counters unavailable for the key's guardrails");
            Err(ApiError::new(
                ErrorCode::UnavailableRoute,
                "The limits store is unavailable; retry with backoff.",
            )
            .with_status(503))
        }
    }
}

/// Corrects the holds to the real use (zero for a failed or refused request).
pub async fn settle(counters: &dyn Counters, hold: Hold, cost_micro_usd: i64, tokens: i64) {
    for (held, used) in [(hold.spend, cost_micro_usd), (hold.tokens, tokens)] {
        let Some((counter, reserved)) = held else {
            continue;
        };
        let delta = used - reserved;
        if delta != 0 {
            if let Err(e) = counters.add(&counter, delta).await {
                tracing::error!(error = %e, "settling a guardrail hold failed");
            }
        }
    }
}
