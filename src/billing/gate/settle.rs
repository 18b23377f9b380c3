//! Settlement: the real cost replaces the hold, and the money windows restored from
//! the ledger after the counters lost them.

use super::*;

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
pub(super) async fn key_day_spend(
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
