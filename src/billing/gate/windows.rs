//! The rate and spend windows of keys and orgs: guardrails from the key and the
//! config, each window's measure and limit, and the refusal a full window answers.

use super::*;

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
pub(super) enum Measure {
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
pub(super) enum Limit {
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
    pub(super) fn is_free(self) -> bool {
        matches!(
            self,
            Limit::FreeHour | Limit::FreeDay | Limit::FreeMonth | Limit::FreeLifetime
        )
    }
}

#[derive(Clone)]
pub(super) struct Window {
    pub(super) req: WindowReq,
    pub(super) limit: Limit,
    pub(super) measure: Measure,
}

impl Window {
    /// The key's daily spend cap, org and free-allowance windows count
    /// platform-funded traffic only.
    pub(super) fn platform(&self) -> bool {
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

pub(super) fn window(
    key: String,
    secs: u64,
    amount: i64,
    limit: i64,
    l: Limit,
    m: Measure,
) -> Window {
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

pub(super) fn key_windows(ask: &Ask<'_>, billing: &BillingConfig) -> Vec<Window> {
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

pub(super) fn org_windows(ask: &Ask<'_>, billing: &BillingConfig) -> Vec<Window> {
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

/// The model's payment requirement, judged over the lanes the org can reach (the
/// platform lane, until the org brings its own keys for the model).
pub(super) fn requirement(ask: &Ask<'_>) -> Result<(), ApiError> {
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
pub(super) fn throttled(reason: &'static str, message: String) -> ApiError {
    ApiError::new(ErrorCode::UnavailableRoute, message)
        .with_status(429)
        .with_extra("reason", reason)
}

pub(super) fn window_error(w: &Window, current: i64, ask: &Ask<'_>) -> ApiError {
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
