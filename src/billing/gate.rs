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

fn hold(price: &Price, body_bytes: usize, max_output: u64, writes: bool) -> WorstCase {
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
        micro_usd: i64::try_from(super::cost_micro_usd(price, &usage)).unwrap_or(i64::MAX),
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

/// A key's guardrails in force: its own, else the platform default; `None` is
/// uncapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guardrails {
    pub daily_spend_cap_micro_usd: Option<i64>,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
}

pub fn guardrails(key: &KeyRecord, billing: &BillingConfig) -> Guardrails {
    let d = &billing.key_defaults;
    Guardrails {
        daily_spend_cap_micro_usd: key.daily_spend_cap_micro_usd.or_else(|| {
            d.daily_spend_cap_usd
                .map(|usd| crate::money::usd_to_micro(usd).unwrap_or(i64::MAX))
        }),
        rpm: key.rpm.or(d.rpm),
        tpm: key.tpm.or(d.tpm),
    }
}

/// What a held amount is corrected to once the answer is settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Measure {
    /// A request count: stays.
    Request,
    /// What the org is billed.
    Billed,
    /// Weighted tokens.
    Tokens,
    /// The list-price cost (free allowance dollar caps).
    ListCost,
    /// The live balance, which counts down: corrected to the billed cost.
    Balance,
    /// A request in flight: given back whole, on every lane.
    Slot,
}

/// Which limit a window is, for its refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Limit {
    KeyDailyCap,
    KeyRpm,
    KeyTpm,
    OrgRpm,
    OrgTpm,
    OrgTph,
    OrgTpd,
    FreeHour,
    FreeDay,
    FreeMonth,
    FreeLifetime,
    OrgAllRpm,
    OrgConcurrency,
    KeyConcurrency,
}

impl Limit {
    fn is_free(self) -> bool {
        matches!(
            self,
            Limit::FreeHour | Limit::FreeDay | Limit::FreeMonth | Limit::FreeLifetime
        )
    }
}

#[derive(Clone)]
struct Window {
    req: WindowReq,
    limit: Limit,
    measure: Measure,
}

impl Window {
    /// The key's daily spend cap, org and free-allowance windows count
    /// platform-funded traffic only.
    fn platform(&self) -> bool {
        !matches!(
            self.limit,
            Limit::KeyRpm
                | Limit::KeyTpm
                | Limit::OrgAllRpm
                | Limit::OrgConcurrency
                | Limit::KeyConcurrency
        )
    }
}

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

fn window(key: String, secs: u64, amount: i64, limit: i64, l: Limit, m: Measure) -> Window {
    Window {
        req: WindowReq {
            key,
            window_secs: secs,
            amount,
            limit,
            ttl_secs: if m == Measure::Slot { SLOT_TTL } else { 0 },
            // While the shared store is away an instance serves its share of
            // rates and concurrency, and of what money windows (spend caps,
            // allowances) had left.
            down: if !l.is_free() && matches!(m, Measure::Request | Measure::Tokens | Measure::Slot)
            {
                Down::Share
            } else {
                Down::Remaining
            },
        },
        limit: l,
        measure: m,
    }
}

fn key_windows(ask: &Ask<'_>, billing: &BillingConfig) -> Vec<Window> {
    let g = guardrails(ask.key, billing);
    let id = &ask.key.id;
    let w = ask.worst;
    let mut out = Vec::new();
    // The daily cap caps platform spend: a call only the org's own keys may
    // serve neither counts toward it nor is refused by it.
    if let Some(cap) = g.daily_spend_cap_micro_usd.filter(|_| ask.platform) {
        let k = ["kday:", id.as_str()].concat();
        out.push(window(
            k,
            DAY,
            w.micro_usd,
            cap,
            Limit::KeyDailyCap,
            Measure::Billed,
        ));
    }
    if let Some(rpm) = g.rpm {
        let k = ["krpm:", id.as_str()].concat();
        out.push(window(k, MINUTE, 1, rpm, Limit::KeyRpm, Measure::Request));
    }
    if let Some(tpm) = g.tpm {
        let k = ["ktpm:", id.as_str()].concat();
        out.push(window(
            k,
            MINUTE,
            w.tokens,
            tpm,
            Limit::KeyTpm,
            Measure::Tokens,
        ));
    }
    // Every lane: the org's own keys and deployments use the gateway too.
    let org = &ask.org.id;
    if billing.org_requests_per_minute_all_lanes > 0 {
        let k = ["oall:", org.as_str()].concat();
        let limit = billing.org_requests_per_minute_all_lanes;
        out.push(window(
            k,
            MINUTE,
            1,
            limit,
            Limit::OrgAllRpm,
            Measure::Request,
        ));
    }
    // The key's cap first: a refusal names the narrowest limit reached.
    for (name, id, limit, l) in [
        (
            "kconc:",
            id,
            billing.key_defaults.concurrency,
            Limit::KeyConcurrency,
        ),
        (
            "oconc:",
            org,
            billing.org_concurrency_all_lanes,
            Limit::OrgConcurrency,
        ),
    ] {
        if limit > 0 {
            let k = [name, id.as_str()].concat();
            out.push(window(k, 0, 1, limit, l, Measure::Slot));
        }
    }
    out
}

fn org_windows(ask: &Ask<'_>, billing: &BillingConfig) -> Vec<Window> {
    let t = billing.tier(ask.org.tier);
    let id = &ask.org.id;
    let tokens = ask.worst.tokens;
    let mut out = Vec::new();
    if let Some(rpm) = t.requests_per_minute {
        let k = ["orpm:", id.as_str()].concat();
        out.push(window(k, MINUTE, 1, rpm, Limit::OrgRpm, Measure::Request));
    }
    for (limit, secs, l, name) in [
        (t.tokens_per_minute, MINUTE, Limit::OrgTpm, "otpm"),
        (t.tokens_per_hour, HOUR, Limit::OrgTph, "otph"),
        (t.tokens_per_day, DAY, Limit::OrgTpd, "otpd"),
    ] {
        if let Some(limit) = limit {
            let k = [name, ":", id.as_str()].concat();
            out.push(window(k, secs, tokens, limit, l, Measure::Tokens));
        }
    }
    out
}

fn has_allowance(f: &FreeAllowance) -> bool {
    f.tokens_per_hour > 0 || f.tokens_per_day > 0 || f.usd_per_month > 0.0 || f.usd_lifetime > 0.0
}

/// The counter names of a model's free allowance for an org.
fn free_base(org_id: &str, slug: &str) -> String {
    format!("free:{org_id}:{slug}")
}

/// The monthly cap counts a calendar month (UTC), named in the counter.
fn month_name(now: u64) -> String {
    crate::time::day_string((now / DAY) as i64)[..7].to_string()
}

/// The first second of `now`'s calendar month (UTC).
pub fn month_start(now: u64) -> u64 {
    let day = crate::time::day_string((now / DAY) as i64);
    let dom: u64 = day[8..].parse().unwrap_or(1);
    (now / DAY - (dom - 1)) * DAY
}

/// One org's use of one model's free allowance in the windows open now, as the
/// ledger has it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FreeUse {
    pub org_id: String,
    pub model: String,
    /// Weighted tokens this hour and today (UTC).
    pub hour_tokens: i64,
    pub day_tokens: i64,
    /// List-price cost this calendar month and ever.
    pub month_list: i64,
    pub life_list: i64,
}

/// Puts free allowance use back into counters that forgot it (an in-process
/// restart), so the allowances stand where the ledger says.
pub async fn restore_free(
    counters: &dyn Counters,
    uses: &[FreeUse],
    now: u64,
) -> anyhow::Result<()> {
    let month = month_name(now);
    for u in uses {
        let base = free_base(&u.org_id, &u.model);
        let windows: Vec<WindowReq> = [
            (format!("{base}:h"), HOUR, u.hour_tokens),
            (format!("{base}:d"), DAY, u.day_tokens),
            (format!("{base}:m:{month}"), 0, u.month_list),
            (format!("{base}:life"), 0, u.life_list),
        ]
        .into_iter()
        .filter(|(_, _, n)| *n > 0)
        .map(|(key, window_secs, amount)| WindowReq {
            key,
            window_secs,
            amount,
            limit: i64::MAX,
            ttl_secs: 0,
            down: Down::Refuse,
        })
        .collect();
        if !windows.is_empty() {
            counters.take(&windows, None).await?;
        }
    }
    Ok(())
}

fn free_windows(ask: &Ask<'_>, now: u64) -> Vec<Window> {
    let f = &ask.model.free;
    let base = free_base(&ask.org.id, &ask.model.slug);
    let w = ask.worst;
    let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let micro = |usd: f64| crate::money::usd_to_micro(usd).unwrap_or(i64::MAX);
    let month = month_name(now);
    [
        (
            tokens(f.tokens_per_hour),
            HOUR,
            "h".to_string(),
            Limit::FreeHour,
            Measure::Tokens,
            w.tokens,
        ),
        (
            tokens(f.tokens_per_day),
            DAY,
            "d".to_string(),
            Limit::FreeDay,
            Measure::Tokens,
            w.tokens,
        ),
        (
            micro(f.usd_per_month),
            0,
            format!("m:{month}"),
            Limit::FreeMonth,
            Measure::ListCost,
            w.micro_usd,
        ),
        (
            micro(f.usd_lifetime),
            0,
            "life".to_string(),
            Limit::FreeLifetime,
            Measure::ListCost,
            w.micro_usd,
        ),
    ]
    .into_iter()
    .filter(|(limit, ..)| *limit > 0)
    .map(|(limit, secs, name, l, m, amount)| {
        window(format!("{base}:{name}"), secs, amount, limit, l, m)
    })
    .collect()
}

/// The model's payment requirement, judged over the lanes the org can reach (the
/// platform lane, until the org brings its own keys for the model).
fn requirement(ask: &Ask<'_>) -> Result<(), ApiError> {
    let org = ask.org;
    let slug = &ask.model.slug;
    match ask.model.requires {
        Requires::None => Ok(()),
        Requires::Payment if org.settled || org.purchased_micro_usd > 0 => Ok(()),
        Requires::Payment => Err(refuse(
            "model_requires_payment",
            format!("model_requires_payment: {slug} needs a completed top-up on every lane this organization can reach; the 1 USD card verification counts."),
        )),
        Requires::Purchase if org.purchased_micro_usd > 0 => Ok(()),
        Requires::Purchase => Err(refuse(
            "model_requires_purchase",
            format!("model_requires_purchase: {slug} needs a credit purchase on every lane this organization can reach; the 1 USD card verification is not enough."),
        )),
    }
}

/// 429 `unavailable_route` for the all-lane caps: throttles, gone as soon as a
/// minute turns or a request ends, so retrying with backoff helps (unlike
/// `insufficient_quota`).
fn throttled(reason: &'static str, message: String) -> ApiError {
    ApiError::new(ErrorCode::UnavailableRoute, message)
        .with_status(429)
        .with_extra("reason", reason)
}

fn window_error(w: &Window, current: i64, ask: &Ask<'_>) -> ApiError {
    let limit = w.req.limit;
    match w.limit {
        Limit::OrgAllRpm => return throttled("org_request_rate", format!(
            "org_request_rate: this organization may send {limit} requests per minute across every lane, its own provider keys included; retry with backoff in the next minute."
        )),
        Limit::OrgConcurrency => return throttled("org_concurrency", format!(
            "org_concurrency: this organization already has {limit} requests in flight, the most it may have on every lane together; retry with backoff when one ends."
        )),
        Limit::KeyConcurrency => return throttled("key_concurrency", format!(
            "key_concurrency: this key already has {limit} requests in flight, the most one key may have; retry with backoff when one ends."
        )),
        _ => {}
    }
    let tokens = ask.worst.tokens;
    let tier = ask.org.tier;
    let (prefix, message) = match w.limit {
        Limit::KeyDailyCap => ("key_daily_cap", format!(
            "key_daily_cap: this request could cost up to {:.6} USD, which would take the key past its daily spend cap of {:.2} USD ({:.6} USD spent or held today); the cap resets at 00:00 UTC.",
            micro_to_usd(ask.worst.micro_usd), micro_to_usd(limit), micro_to_usd(current),
        )),
        Limit::KeyRpm => ("key_rate_limit", format!(
            "key_rate_limit: this key allows {limit} requests per minute; retry in the next minute."
        )),
        Limit::KeyTpm => ("key_token_rate_limit", format!(
            "key_token_rate_limit: this request could use up to {tokens} tokens, which would take the key past its {limit} tokens per minute; retry in the next minute."
        )),
        Limit::OrgRpm => ("org_rate_limit", format!(
            "org_rate_limit: tier {tier} allows {limit} platform-funded requests per minute across all the organization's keys; retry in the next minute, or buy credits to move up a tier."
        )),
        Limit::OrgTpm => ("org_token_rate_limit", format!(
            "org_token_rate_limit: this request could use up to {tokens} tokens, which would take the organization past tier {tier}'s {limit} platform-funded tokens per minute; retry in the next minute."
        )),
        Limit::OrgTph => ("org_token_rate_limit_hour", format!(
            "org_token_rate_limit_hour: this request could use up to {tokens} tokens, which would take the organization past tier {tier}'s {limit} platform-funded tokens per hour; the window resets at the top of the hour (UTC)."
        )),
        Limit::OrgTpd => ("org_token_rate_limit_day", format!(
            "org_token_rate_limit_day: this request could use up to {tokens} tokens, which would take the organization past tier {tier}'s {limit} platform-funded tokens per day; the window resets at 00:00 UTC."
        )),
        _ => return free_limit_error(w, ask),
    };
    refuse(prefix, message)
}

fn free_limit_error(w: &Window, ask: &Ask<'_>) -> ApiError {
    let limit = w.req.limit;
    let what = match w.limit {
        Limit::FreeHour => {
            format!("{limit} tokens per hour; it resets at the top of the hour (UTC)")
        }
        Limit::FreeDay => format!("{limit} tokens per day; it resets at 00:00 UTC"),
        Limit::FreeMonth => format!(
            "{:.2} USD per month; it resets on the 1st of the month at 00:00 UTC",
            micro_to_usd(limit)
        ),
        _ => format!("{:.2} USD lifetime; it does not reset", micro_to_usd(limit)),
    };
    refuse(
        "free_limit_reached",
        format!(
            "free_limit_reached: the free allowance of {} ({what}) is spent or cannot cover this request; enable credits overflow to continue on credits.",
            ask.model.slug
        ),
    )
}

fn promo_error(ask: &Ask<'_>) -> ApiError {
    refuse(
        "promo_byok_only",
        format!(
            "promo_byok_only: the free allowance of {} does not cover this request (up to {} tokens, {:.6} USD) and credits cannot cover the rest; lower max_tokens, add credits with overflow on, or use your own provider key.",
            ask.model.slug,
            ask.worst.tokens,
            micro_to_usd(ask.worst.micro_usd)
        ),
    )
}

/// Corrects the holds to the real use (zero for a failed or refused request), in
/// one round trip. A request the org's own account served counts in no platform
/// window: those holds are given back whole.
pub async fn settle(counters: &dyn Counters, hold: Hold, used: Used) {
    let adds: Vec<(String, i64)> = hold
        .held
        .into_iter()
        .filter_map(|h| {
            let held = h.amount;
            let delta = if h.platform && !used.platform {
                match h.measure {
                    Measure::Balance => held,
                    _ => -held,
                }
            } else {
                match h.measure {
                    Measure::Request => 0,
                    Measure::Billed => used.billed_micro_usd - held,
                    Measure::Tokens => used.tokens - held,
                    Measure::ListCost => used.list_micro_usd - held,
                    Measure::Balance => held - used.billed_micro_usd,
                    Measure::Slot => -held,
                }
            };
            (delta != 0).then_some((h.counter, delta))
        })
        .collect();
    if adds.is_empty() {
        return;
    }
    // A hold whose counter is gone (its window closed, a slot counter expired)
    // needs no correction, and must not bring the counter back without expiry.
    if let Err(e) = counters.correct_many(&adds).await {
        tracing::error!(error = %e, "settling the request's holds failed");
    }
}

/// Puts the money windows back where the ledger says, into counters that lost them
/// (an in-process restart, a Redis that came back empty): each model's free
/// allowance use and each key's platform spend today (its daily cap's window).
/// Amounts are added to what the windows hold now, so spend taken between the loss
/// and this call counts on top (the conservative side). `unstored`: usage events
/// the database does not have yet (a spool, a journal).
pub async fn restore_money(
    counters: &dyn Counters,
    db: &Db,
    now: u64,
    unstored: &[UsageEvent],
) -> anyhow::Result<()> {
    let uses = free_use(db, now, unstored).await?;
    restore_free(counters, &uses, now).await?;
    let spend = key_day_spend(db, now, unstored).await?;
    let windows: Vec<WindowReq> = spend
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(key_id, amount)| WindowReq {
            key: ["kday:", key_id.as_str()].concat(),
            window_secs: DAY,
            amount,
            limit: i64::MAX,
            ttl_secs: 0,
            down: Down::Refuse,
        })
        .collect();
    for chunk in windows.chunks(64) {
        counters.take(chunk, None).await?;
    }
    Ok(())
}

/// Each key's platform spend today (UTC) as the ledger has it, plus `unstored`.
async fn key_day_spend(
    db: &Db,
    now: u64,
    unstored: &[UsageEvent],
) -> anyhow::Result<Vec<(String, i64)>> {
    use sqlx::Row;
    let day = i64::try_from(now / DAY * DAY * 1000).unwrap_or(i64::MAX);
    let platform = crate::byok::active_route::Lane::Platform.as_str();
    let rows = sqlx::query(
        "SELECT key_id, CAST(SUM(cost_micro_usd) AS BIGINT) AS spent FROM usage_events \
         WHERE created_at >= $1 AND lane = $2 GROUP BY key_id",
    )
    .bind(day)
    .bind(platform)
    .fetch_all(&db.pool)
    .await?;
    let mut out = std::collections::HashMap::<String, i64>::new();
    for r in &rows {
        let spent: Option<i64> = r.try_get("spent")?;
        out.insert(r.try_get("key_id")?, spent.unwrap_or(0));
    }
    for e in unstored
        .iter()
        .filter(|e| e.at_ms >= day && e.lane == platform)
    {
        let n = out.entry(e.key_id.clone()).or_default();
        *n = n.saturating_add(e.cost_micro_usd);
    }
    Ok(out.into_iter().collect())
}

/// Each org's use of each model's free allowance in the windows open at `now`
/// (Unix seconds): the stored rows, plus `unstored` events (a spool not replayed
/// yet).
pub async fn free_use(db: &Db, now: u64, unstored: &[UsageEvent]) -> anyhow::Result<Vec<FreeUse>> {
    use sqlx::Row;
    let ms = |secs: u64| i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    let hour = ms(now / 3_600 * 3_600);
    let day = ms(now / 86_400 * 86_400);
    let month = ms(month_start(now));
    // Sums cast back to BIGINT: PostgreSQL widens SUM(BIGINT) to NUMERIC.
    let rows = sqlx::query(
        "SELECT org_id, model, \
         CAST(SUM(CASE WHEN created_at >= $1 THEN weighted_tokens ELSE 0 END) AS BIGINT) AS h, \
         CAST(SUM(CASE WHEN created_at >= $2 THEN weighted_tokens ELSE 0 END) AS BIGINT) AS d, \
         CAST(SUM(CASE WHEN created_at >= $3 THEN list_micro_usd ELSE 0 END) AS BIGINT) AS m, \
         CAST(SUM(list_micro_usd) AS BIGINT) AS l \
         FROM usage_events WHERE free = 1 GROUP BY org_id, model",
    )
    .bind(hour)
    .bind(day)
    .bind(month)
    .fetch_all(&db.pool)
    .await?;
    let mut out: Vec<FreeUse> = Vec::with_capacity(rows.len());
    for r in &rows {
        out.push(FreeUse {
            org_id: r.try_get("org_id")?,
            model: r.try_get("model")?,
            hour_tokens: r.try_get::<Option<i64>, _>("h")?.unwrap_or(0),
            day_tokens: r.try_get::<Option<i64>, _>("d")?.unwrap_or(0),
            month_list: r.try_get::<Option<i64>, _>("m")?.unwrap_or(0),
            life_list: r.try_get::<Option<i64>, _>("l")?.unwrap_or(0),
        });
    }
    for e in unstored.iter().filter(|e| e.free) {
        let i = match out
            .iter()
            .position(|u| u.org_id == e.org_id && u.model == e.model)
        {
            Some(i) => i,
            None => {
                out.push(FreeUse {
                    org_id: e.org_id.clone(),
                    model: e.model.clone(),
                    ..FreeUse::default()
                });
                out.len() - 1
            }
        };
        let u = &mut out[i];
        let at = e.at_ms;
        if at >= hour {
            u.hour_tokens = u.hour_tokens.saturating_add(e.weighted_tokens);
        }
        if at >= day {
            u.day_tokens = u.day_tokens.saturating_add(e.weighted_tokens);
        }
        if at >= month {
            u.month_list = u.month_list.saturating_add(e.list_micro_usd);
        }
        u.life_list = u.life_list.saturating_add(e.list_micro_usd);
    }
    Ok(out)
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
