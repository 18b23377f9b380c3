//! Free allowances: the monthly free use of a model per org, its windows, their
//! refusals, and the use restored from the ledger.

use super::*;

pub(super) fn has_allowance(f: &FreeAllowance) -> bool {
    f.tokens_per_hour > 0 || f.tokens_per_day > 0 || f.usd_per_month > 0.0 || f.usd_lifetime > 0.0
}

/// The counter names of a model's free allowance for an org.
pub(super) fn free_base(org_id: &str, slug: &str) -> String {
    format!("free:{org_id}:{slug}")
}

/// The monthly cap counts a calendar month (UTC), named in the counter.
pub(super) fn month_name(now: u64) -> String {
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

pub(super) fn free_windows(ask: &Ask<'_>, now: u64) -> Vec<Window> {
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

pub(super) fn free_limit_error(w: &Window, ask: &Ask<'_>) -> ApiError {
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

pub(super) fn promo_error(ask: &Ask<'_>) -> ApiError {
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
