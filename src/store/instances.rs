//! Instance liveness: each process beats every `HEARTBEAT` in the counters store
//! (a marker that expires) and in the database (a row with the time), and is
//! alive while either beat is fresh. A Redis that restarted has lost every marker;
//! the database row keeps such a restart from being read as every instance dead.

use super::counters::Counters;
use super::{now_ms, Db};
use sqlx::Row;
use std::sync::Arc;
use std::time::Duration;

pub const HEARTBEAT: Duration = Duration::from_secs(2);
pub const HEARTBEAT_TTL: Duration = Duration::from_secs(6);

/// Instances whose beat the database has fresh, as of this instance's last beat
/// (at least 1: this one). While the shared counters are away each instance
/// grants itself a share of a window: this many share it. With the database away
/// too, the last count stands.
static LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

pub fn live() -> usize {
    LIVE.load(std::sync::atomic::Ordering::Relaxed).max(1)
}

fn marker(instance: &str) -> String {
    format!("inst:{instance}")
}

/// Keeps this instance's liveness fresh while the process runs, each write bounded
/// by its store's timeout.
pub fn spawn_heartbeat(counters: Arc<dyn Counters>, db: Db, instance: String) {
    tokio::spawn(async move {
        let key = marker(&instance);
        loop {
            if let Err(e) = counters.put_marker(&key, "1", HEARTBEAT_TTL, false).await {
                tracing::warn!(error = %e, "instance heartbeat not stored in the counters");
            }
            let beat = sqlx::query(
                "INSERT INTO instances (id, seen_at) VALUES ($1, $2) \
                 ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at",
            )
            .bind(&instance)
            .bind(now_ms())
            .execute(&db.pool);
            if let Err(e) = db.bounded(beat).await {
                tracing::warn!(error = %e, "instance heartbeat not stored in the database");
            }
            let ttl_ms = i64::try_from(HEARTBEAT_TTL.as_millis()).unwrap_or(i64::MAX);
            let count = sqlx::query("SELECT COUNT(*) AS n FROM instances WHERE seen_at >= $1")
                .bind(now_ms() - ttl_ms)
                .fetch_one(&db.pool);
            if let Ok(row) = db.bounded(count).await {
                let n: i64 = row.get("n");
                LIVE.store(
                    usize::try_from(n).unwrap_or(1).max(1),
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
            tokio::time::sleep(HEARTBEAT).await;
        }
    });
}

/// What is known of an instance's liveness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    /// Neither beat is fresh.
    Gone,
    /// Neither store answered.
    Unknown,
}

/// Whether `instance` beats in either store.
pub async fn liveness(counters: &dyn Counters, db: &Db, instance: &str) -> Liveness {
    let marked = counters.get_marker(&marker(instance)).await;
    if let Ok(Some(_)) = marked {
        return Liveness::Alive;
    }
    let ttl_ms = i64::try_from(HEARTBEAT_TTL.as_millis()).unwrap_or(i64::MAX);
    let seen = sqlx::query("SELECT seen_at FROM instances WHERE id = $1")
        .bind(instance)
        .fetch_optional(&db.pool);
    match db.bounded(seen).await {
        Ok(Some(row)) if row.get::<i64, _>("seen_at") >= now_ms() - ttl_ms => Liveness::Alive,
        Ok(_) => Liveness::Gone,
        Err(_) if marked.is_ok() => Liveness::Gone,
        Err(_) => Liveness::Unknown,
    }
}
