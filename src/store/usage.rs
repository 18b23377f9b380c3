//! The usage record: one event per inference request, written after the answer
//! completed, off the client's path. Events are appended to an in-process buffer
//! (no wake-up, no syscall per request) that a writer task drains in batches every
//! few tens of milliseconds.

use super::db::Engine;
use super::{new_ordered_id, now_ms, Db};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the writer drains the buffer.
const FLUSH_EVERY: Duration = Duration::from_millis(50);

#[derive(Clone, Debug, Default, PartialEq)]
pub struct UsageEvent {
    pub org_id: String,
    pub key_id: String,
    pub route: &'static str,
    pub model: String,
    /// The rung that served, if one did.
    pub rung: Option<String>,
    /// `platform_funded` or `pass_through`.
    pub lane: &'static str,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    pub cost_micro_usd: i64,
    pub status: u16,
    pub error_class: Option<String>,
    /// A stream cut after output: settled as the provider's cut.
    pub incomplete: bool,
    /// `x-gateway-attempts`: each rung tried with its outcome.
    pub attempts: String,
    /// Attempts that ended their turn empty (recorded at zero cost).
    pub empty_attempts: u32,
    pub latency_ms: u64,
}

/// Where requests leave their events; cheap to clone.
#[derive(Clone, Default)]
pub struct UsageSink {
    pending: Arc<Mutex<Vec<UsageEvent>>>,
}

impl UsageSink {
    pub fn record(&self, ev: UsageEvent) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ev);
    }

    fn take(&self) -> Vec<UsageEvent> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Starts the writer on the current runtime.
pub fn spawn_writer(db: Db) -> UsageSink {
    let sink = UsageSink::default();
    let drained = sink.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let batch = drained.take();
            for part in batch.chunks(200) {
                if let Err(e) = insert(&db, part).await {
                    tracing::error!(error = %e, events = part.len(), "writing usage events failed; retrying once");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if let Err(e) = insert(&db, part).await {
                        tracing::error!(error = %e, events = part.len(), "usage events lost");
                    }
                }
            }
        }
    });
    sink
}

/// Inserts a batch with one multi-row statement and draws each org's platform-funded
/// cost from its balance, in one transaction: a retried batch can neither lose an
/// event nor charge it twice.
async fn insert(db: &Db, events: &[UsageEvent]) -> anyhow::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    const COLS: usize = 19;
    let mut sql = String::from(
        "INSERT INTO usage_events (id, org_id, key_id, route, model, rung, lane, input_tokens, \
         cached_tokens, output_tokens, reasoning_tokens, cost_micro_usd, status, error_class, \
         incomplete, attempts, empty_attempts, latency_ms, created_at) VALUES ",
    );
    for i in 0..events.len() {
        if i > 0 {
            sql.push(',');
        }
        sql.push('(');
        for c in 0..COLS {
            if c > 0 {
                sql.push(',');
            }
            // SQLite binds anonymous `?` in order at no cost; its lookup of
            // numbered names is linear per parameter, quadratic per statement.
            match db.engine {
                Engine::Sqlite => sql.push('?'),
                Engine::Postgres => sql.push_str(&format!("${}", i * COLS + c + 1)),
            }
        }
        sql.push(')');
    }
    let now = now_ms();
    let mut q = sqlx::query(&sql);
    for e in events {
        q = q
            .bind(new_ordered_id("ue"))
            .bind(e.org_id.clone())
            .bind(e.key_id.clone())
            .bind(e.route)
            .bind(e.model.clone())
            .bind(e.rung.clone())
            .bind(e.lane)
            .bind(e.input_tokens as i64)
            .bind(e.cached_tokens as i64)
            .bind(e.output_tokens as i64)
            .bind(e.reasoning_tokens as i64)
            .bind(e.cost_micro_usd)
            .bind(e.status as i64)
            .bind(e.error_class.clone())
            .bind(e.incomplete as i64)
            .bind(e.attempts.clone())
            .bind(e.empty_attempts as i64)
            .bind(e.latency_ms as i64)
            .bind(now);
    }
    let mut tx = db.pool.begin().await?;
    q.execute(&mut *tx).await?;
    let mut charges: Vec<(&str, i64)> = Vec::new();
    for e in events
        .iter()
        .filter(|e| e.cost_micro_usd > 0 && e.lane == "platform_funded")
    {
        match charges.iter_mut().find(|(org, _)| *org == e.org_id) {
            Some((_, sum)) => *sum += e.cost_micro_usd,
            None => charges.push((&e.org_id, e.cost_micro_usd)),
        }
    }
    for (org, sum) in charges {
        // updated_at is left alone: the balance is not part of the org snapshot
        // every instance polls for.
        sqlx::query("UPDATE orgs SET balance_micro_usd = balance_micro_usd - $1 WHERE id = $2")
            .bind(sum)
            .bind(org)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}
