//! The usage record: one event per inference request, written after the answer
//! completed, off the client's path. Events go through a channel to a writer task
//! that inserts them in batches.

use super::{new_id, now_ms, Db};
use tokio::sync::mpsc;

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

/// The sending half; cheap to clone.
#[derive(Clone)]
pub struct UsageSink {
    tx: mpsc::UnboundedSender<UsageEvent>,
}

impl UsageSink {
    pub fn record(&self, ev: UsageEvent) {
        if self.tx.send(ev).is_err() {
            tracing::error!("usage writer is gone; event dropped");
        }
    }
}

/// Starts the writer on the current runtime.
pub fn spawn_writer(db: Db) -> UsageSink {
    let (tx, mut rx) = mpsc::unbounded_channel::<UsageEvent>();
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(256);
        while rx.recv_many(&mut batch, 256).await > 0 {
            if let Err(e) = insert(&db, &batch).await {
                tracing::error!(error = %e, events = batch.len(), "writing usage events failed; retrying once");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                if let Err(e) = insert(&db, &batch).await {
                    tracing::error!(error = %e, events = batch.len(), "usage events lost");
                }
            }
            batch.clear();
        }
    });
    UsageSink { tx }
}

async fn insert(db: &Db, events: &[UsageEvent]) -> anyhow::Result<()> {
    let mut tx = db.pool.begin().await?;
    let now = now_ms();
    for e in events {
        sqlx::query(
            "INSERT INTO usage_events (id, org_id, key_id, route, model, rung, lane, input_tokens, \
             cached_tokens, output_tokens, reasoning_tokens, cost_micro_usd, status, error_class, \
             incomplete, attempts, empty_attempts, latency_ms, created_at) VALUES \
             ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)",
        )
        .bind(new_id("ue"))
        .bind(&e.org_id)
        .bind(&e.key_id)
        .bind(e.route)
        .bind(&e.model)
        .bind(&e.rung)
        .bind(e.lane)
        .bind(e.input_tokens as i64)
        .bind(e.cached_tokens as i64)
        .bind(e.output_tokens as i64)
        .bind(e.reasoning_tokens as i64)
        .bind(e.cost_micro_usd)
        .bind(e.status as i64)
        .bind(&e.error_class)
        .bind(e.incomplete as i64)
        .bind(&e.attempts)
        .bind(e.empty_attempts as i64)
        .bind(e.latency_ms as i64)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
