//! The gates a request passes before it is sent, taken in one atomic counters step
//! and settled to the real use afterwards:
//! - on every lane, the key's requests and tokens per minute (the key's own value,
//!   else the platform default, else uncapped), the org's requests per minute
//!   across every lane, and the requests the org and the key may have in flight
//!   (slots, given back when the request is settled, however it ended);
//! - on the platform lane only: the key's daily spend cap (resets 00:00 UTC; it
//!   caps what the org pays, and its own provider keys cost it nothing here), the
//!   model's payment requirement, the org's tier windows (requests per minute;
//!   tokens per minute, hour and day), the model's free allowance, and the credit
//!   balance, which must cover the request's worst case.
//!
//! Holds are taken at the worst case (input estimated from the body, the whole
//! output budget, list price); settling corrects each to the real cost or tokens,
//! so every window ends equal to what was really used. Token windows count cached
//! input at its price weight.

use crate::accounts::keys::KeyRecord;
use crate::accounts::orgs::OrgRecord;
use crate::catalog::model::{FreeAllowance, ModelSpec, Price, Requires};
use crate::config::BillingConfig;
use crate::error::Error;
use crate::money::micro_to_usd;
use crate::store::counters::{
    now_secs, window_counter, BalanceReq, Counters, Down, WindowOutcome, WindowReq,
};
use crate::store::usage::UsageEvent;
use crate::store::Db;
use sluice_filters::usage::Usage;
use sluice_filters::{ApiError, ErrorCode};

const MINUTE: u64 = 60;
const HOUR: u64 = 3_600;
const DAY: u64 = 86_400;

/// How long Redis keeps a concurrency counter that no take gave an expiry to: the
/// slots of an instance that died holding them count at most this long. (A slot
/// released after the counter expired leaves it one lower until it expires again.)
const SLOT_TTL: u64 = 900;

mod worst;
pub use worst::{output_budget, weighted_tokens, worst_case, worst_case_caching, WorstCase};
mod windows;
use windows::*;
pub use windows::{guardrails, Guardrails};
mod free;
use free::*;
pub use free::{free_use, month_start, restore_free, FreeUse};
mod settle;
pub use settle::{restore_money, settle};

#[derive(Debug)]
struct Held {
    counter: String,
    amount: i64,
    measure: Measure,
    platform: bool,
}

/// The amounts held for one request, to be corrected by [`settle`].
#[derive(Debug, Default)]
pub struct Hold {
    held: Vec<Held>,
}

/// A request let through.
#[derive(Debug)]
pub struct Admission {
    pub hold: Hold,
    /// Served on the model's free allowance: the org is billed nothing.
    pub free: bool,
}

/// What the request really used.
#[derive(Clone, Copy, Debug, Default)]
pub struct Used {
    pub billed_micro_usd: i64,
    pub list_micro_usd: i64,
    pub tokens: i64,
    /// A platform rung served it (else the org's own account did, or nothing).
    pub platform: bool,
}

/// Everything the gates need to judge one request.
pub struct Ask<'a> {
    pub key: &'a KeyRecord,
    pub org: &'a OrgRecord,
    pub model: &'a ModelSpec,
    pub worst: WorstCase,
    /// The request may be served on platform credit (false: only the org's own
    /// provider keys, which no platform gate counts).
    pub platform: bool,
}

/// `insufficient_quota` with the prefix in the message and as `error.reason`.
fn refuse(prefix: &'static str, message: String) -> ApiError {
    refuse_as(prefix, message)
}

fn refuse_as(reason: &'static str, message: String) -> ApiError {
    ApiError::new(ErrorCode::InsufficientQuota, message).with_extra("reason", reason)
}

/// Takes every gate for the request, or refuses with the gate's own error.
pub async fn admit(
    counters: &dyn Counters,
    billing: &BillingConfig,
    ask: &Ask<'_>,
) -> Result<Admission, ApiError> {
    let now = now_secs();
    let mut windows = key_windows(ask, billing);
    if !ask.platform {
        return take(counters, windows, None, now, ask, false).await;
    }
    requirement(ask)?;
    windows.extend(org_windows(ask, billing));
    let free = &ask.model.free;
    let mut free_refused = false;
    if has_allowance(free) {
        let org = ask.org;
        let no_card = free.needs_card && !org.card_on_file;
        let unsettled = free.needs_settled && !org.settled;
        if no_card || unsettled {
            if !org.credits_overflow {
                let missing = match (no_card, unsettled) {
                    (true, true) => "a card on file and a settled 1 USD verification charge",
                    (true, false) => "a card on file",
                    _ => "a settled 1 USD verification charge",
                };
                // `reason` reads card_required where the card is what is missing.
                let reason = if no_card {
                    "card_required"
                } else {
                    "free_tier_requires_payment"
                };
                return Err(refuse_as(
                    reason,
                    format!(
                        "free_tier_requires_payment: the free allowance of {} needs {missing}, which this organization does not have yet.",
                        ask.model.slug
                    ),
                ));
            }
        } else {
            let mut with_free = windows.clone();
            with_free.extend(free_windows(ask, now));
            match counters
                .take(&reqs(&with_free), None)
                .await
                .map_err(store_down)?
            {
                WindowOutcome::Added => return Ok(admitted(with_free, None, now, true)),
                WindowOutcome::Unseeded => return Err(store_down(unseeded())),
                WindowOutcome::Refused { index, current } => {
                    let w = &with_free[index];
                    if !w.limit.is_free() {
                        return Err(window_error(w, current, ask));
                    }
                    // The allowance cannot cover this request: without overflow
                    // that is the end; with it, credits must cover all of it.
                    if !org.credits_overflow {
                        return Err(free_limit_error(w, ask));
                    }
                    free_refused = true;
                }
            }
        }
    }
    // No snapshot balance: a counter that lost it is seeded from the ledger.
    let balance = BalanceReq {
        key: ["bal:", ask.org.id.as_str()].concat(),
        org_id: ask.org.id.clone(),
        credited: ask.org.credited_micro_usd,
        amount: ask.worst.micro_usd,
        floor: 0,
    };
    match take(counters, windows, Some(balance), now, ask, false).await {
        Err(e) if free_refused && e.message.starts_with("insufficient_credits") => {
            Err(promo_error(ask))
        }
        other => other,
    }
}

async fn take(
    counters: &dyn Counters,
    windows: Vec<Window>,
    balance: Option<BalanceReq>,
    now: u64,
    ask: &Ask<'_>,
    free: bool,
) -> Result<Admission, ApiError> {
    if windows.is_empty() && balance.is_none() {
        return Ok(Admission {
            hold: Hold::default(),
            free,
        });
    }
    match counters
        .take(&reqs(&windows), balance.as_ref())
        .await
        .map_err(store_down)?
    {
        WindowOutcome::Added => Ok(admitted(windows, balance, now, free)),
        WindowOutcome::Unseeded => Err(store_down(unseeded())),
        WindowOutcome::Refused { index, current } => match windows.get(index) {
            Some(w) => Err(window_error(w, current, ask)),
            None => Err(refuse(
                "insufficient_credits",
                format!(
                    "insufficient_credits: the balance ({:.6} USD available) cannot cover this request's worst case of {:.6} USD; add credits or lower max_tokens.",
                    micro_to_usd(current.max(0)),
                    micro_to_usd(ask.worst.micro_usd),
                ),
            )),
        },
    }
}

fn admitted(windows: Vec<Window>, balance: Option<BalanceReq>, now: u64, free: bool) -> Admission {
    let mut held: Vec<Held> = windows
        .into_iter()
        .filter(|w| w.measure != Measure::Request || w.platform())
        .map(|w| Held {
            counter: window_counter(&w.req.key, w.req.window_secs, now),
            amount: w.req.amount,
            measure: w.measure,
            platform: w.platform(),
        })
        .collect();
    if let Some(b) = balance {
        held.push(Held {
            counter: b.key,
            amount: b.amount,
            measure: Measure::Balance,
            platform: true,
        });
    }
    Admission {
        hold: Hold { held },
        free,
    }
}

fn reqs(windows: &[Window]) -> Vec<WindowReq> {
    windows.iter().map(|w| w.req.clone()).collect()
}

/// Counters used without the seeding layer (`SeededCounters`) cannot start a
/// balance: refuse rather than guess it.
fn unseeded() -> anyhow::Error {
    anyhow::anyhow!("the balance counter is not seeded")
}

fn store_down(e: anyhow::Error) -> ApiError {
    Error::counters("the request's gates")(e).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_start_on_their_first_day() {
        // 2025-11-22 12:00 UTC.
        let now = 20_414 * DAY + 43_200;
        assert_eq!(month_start(now), (20_414 - 21) * DAY);
        assert_eq!(
            crate::time::day_string((month_start(now) / DAY) as i64),
            "2025-11-01"
        );
        assert_eq!(month_start(20_393 * DAY), 20_393 * DAY);
    }

    #[test]
    fn cached_input_counts_at_its_price_weight() {
        let p = Price {
            input: 1_000_000,
            cached_input: 100_000,
            output: 5_000_000,
            cache_write_input: None,
            cache_write_1h_input: None,
        };
        let u = Usage {
            input_tokens: 1_000,
            cached_tokens: 900,
            output_tokens: 50,
            ..Usage::default()
        };
        // 100 fresh + 900 / 10 cached + 50 out.
        assert_eq!(weighted_tokens(&p, &u), 240);
        // A model without a cached discount counts cached input in full.
        let flat = Price {
            cached_input: 1_000_000,
            ..p
        };
        assert_eq!(weighted_tokens(&flat, &u), 1_050);
        // Rounded up: 1 cached token at a tenth is one token.
        let one = Usage {
            input_tokens: 1,
            cached_tokens: 1,
            ..Usage::default()
        };
        assert_eq!(weighted_tokens(&p, &one), 1);
    }

    #[test]
    fn cache_writes_count_at_their_price_weight() {
        let p = Price {
            input: 1_000_000,
            cached_input: 100_000,
            output: 5_000_000,
            cache_write_input: Some(1_250_000),
            cache_write_1h_input: None,
        };
        let u = Usage {
            input_tokens: 1_000,
            cached_tokens: 100,
            cache_write_tokens: 800,
            output_tokens: 50,
            ..Usage::default()
        };
        // 100 fresh + 100 / 10 read + 800 x 1.25 written + 50 out.
        assert_eq!(weighted_tokens(&p, &u), 1_160);
        // Absent, a write weighs one token.
        let plain = Price {
            cache_write_input: None,
            ..p
        };
        assert_eq!(weighted_tokens(&plain, &u), 960);
        // A request marking breakpoints may write its whole prompt; one that
        // marks none is held as fresh input.
        let w = worst_case_caching(&p, 4_000, 100);
        assert_eq!(w.tokens, 1_250 + 100);
        assert_eq!(w.micro_usd, 1_250 + 500);
        assert_eq!(worst_case(&p, 4_000, 100).tokens, 1_100);
        assert_eq!(worst_case_caching(&plain, 4_000, 100).tokens, 1_100);
        // One-hour writes at their own weight (2x): 200 of the 800.
        let hour = Price {
            cache_write_1h_input: Some(2_000_000),
            ..p
        };
        let u1h = Usage {
            cache_write_1h_tokens: 200,
            ..u
        };
        // 100 + 10 + 600 x 1.25 + 200 x 2 + 50.
        assert_eq!(weighted_tokens(&hour, &u1h), 1_310);
        // The worst case holds the whole prompt at the dearest write.
        assert_eq!(worst_case_caching(&hour, 4_000, 100).tokens, 2_000 + 100);
    }
}
