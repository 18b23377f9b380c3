//! How the runner claims a batch's lines, so that a line runs on one instance at
//! a time.
//!
//! - **Leased** (PostgreSQL, where several instances share a batch): a claim is a
//!   lease in the database, taken by one conditional UPDATE whose candidate rows are
//!   locked `FOR UPDATE SKIP LOCKED`. A line whose claimant stopped beating
//!   (`instances`) or whose lease ran out is claimed again.
//! - **Local** (SQLite, where the instance runs alone, as its counters are
//!   in-process): the claims are held in memory, and a claim reads lines without
//!   writing them. A claim used to rewrite each line's row (and its index entry)
//!   once more before its answer did; on SQLite every row written goes to the log
//!   and its checkpoint, so a line cost the database three writes where two do. A
//!   restart forgets the claims, and every line not done is free again (a line that
//!   ran before the restart runs again, billed once: `batch_line` on its usage
//!   event).

use crate::store::db::Engine;
use crate::store::instances::HEARTBEAT_TTL;
use crate::store::{now_ms, Db};
use sqlx::any::AnyRow;
use sqlx::Row;
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A claimed line.
pub(super) struct Claimed {
    pub(crate) line_no: i64,
    pub(crate) custom_id: String,
    pub(crate) body: String,
}

impl Claimed {
    fn of(r: &AnyRow) -> Self {
        Claimed {
            line_no: r.get("line_no"),
            custom_id: r.get("custom_id"),
            body: r.get("body"),
        }
    }
}

pub(super) enum Claims {
    Leased { instance: String, lease_ms: i64 },
    Local(Local),
}

/// The claims of an instance that runs alone: each batch's circle, by batch id.
#[derive(Default)]
pub(super) struct Local(Mutex<HashMap<String, Circle>>);

/// A batch's lines as this instance alone holds them.
#[derive(Default)]
struct Circle {
    /// The claims go round the batch's open lines (by rowid) from past this one.
    after: i64,
    /// Lines claimed, and neither recorded nor given back yet.
    held: HashSet<i64>,
    /// Lines given back to wait: not claimed again before then.
    rested: HashMap<i64, Instant>,
}

/// The batch is open: in progress and inside its window (`$1` is the batch, `$2`
/// now).
const OPEN: &str = "EXISTS (SELECT 1 FROM batches WHERE id = $1 AND status = 'in_progress' \
                    AND expires_at > $2)";

impl Claims {
    pub(crate) fn new(engine: Engine, instance: &str, lease_ms: u64) -> Self {
        match engine {
            Engine::Sqlite => Claims::Local(Local::default()),
            Engine::Postgres => Claims::Leased {
                instance: instance.to_string(),
                lease_ms: lease_ms as i64,
            },
        }
    }

    /// The instance a recorded line names as its claimant: none where the claims
    /// are held in memory, so the line's row keeps its size when it is marked done
    /// (a row that grows can split its page, and each page written goes to the log).
    pub(crate) fn claimant(&self) -> Option<&str> {
        match self {
            Claims::Leased { instance, .. } => Some(instance),
            Claims::Local(_) => None,
        }
    }

    /// Claims up to `n` free lines of an open batch, in line order. Only the
    /// runner's claimer calls it (one claim at a time per instance).
    pub(crate) async fn claim(
        &self,
        db: &Db,
        batch_id: &str,
        n: usize,
    ) -> anyhow::Result<Vec<Claimed>> {
        let mut lines = match self {
            Claims::Leased { instance, lease_ms } => {
                leased(db, instance, *lease_ms, batch_id, n).await?
            }
            Claims::Local(local) => local.claim(db, batch_id, n).await?,
        };
        lines.sort_by_key(|l| l.line_no);
        Ok(lines)
    }

    /// Gives a claimed line back, not to be claimed again for `wait`.
    pub(crate) async fn put_back(&self, db: &Db, batch_id: &str, line_no: i64, wait: Duration) {
        let instance = match self {
            Claims::Local(local) => return local.put_back(batch_id, line_no, wait),
            Claims::Leased { instance, .. } => instance,
        };
        let q = sqlx::query(
            "UPDATE batch_lines SET claimed_by = NULL, lease_until = $1 \
             WHERE batch_id = $2 AND line_no = $3 AND claimed_by = $4 AND done = 0",
        )
        .bind(now_ms() + wait.as_millis() as i64)
        .bind(batch_id)
        .bind(line_no)
        .bind(instance)
        .execute(&db.pool);
        if let Err(e) = db.bounded(q).await {
            tracing::warn!(error = %e, "a batch line was not given back; its lease will lapse");
        }
    }

    /// The recorder is through with these lines (recorded, or not: then they run
    /// again). A lease needs nothing: a line done is not claimed, and one whose
    /// answer was not recorded is claimed again when its lease lapses.
    pub(crate) fn recorded(&self, batch_id: &str, lines: impl Iterator<Item = i64>) {
        if let Claims::Local(local) = self {
            if let Some(c) = local.lock().get_mut(batch_id) {
                for l in lines {
                    c.held.remove(&l);
                }
            }
        }
    }

    /// A finalized batch's claims are dropped.
    pub(crate) fn forget(&self, batch_id: &str) {
        if let Claims::Local(local) = self {
            local.lock().remove(batch_id);
        }
    }

    /// Lines of the batch held by a live claimant (the lines done are counted on
    /// the batch). Leases held by an instance that stopped beating are freed.
    pub(crate) async fn in_flight(&self, db: &Db, batch_id: &str) -> anyhow::Result<i64> {
        match self {
            Claims::Local(local) => Ok(local
                .lock()
                .get(batch_id)
                .map_or(0, |c| c.held.len() as i64)),
            Claims::Leased { .. } => leases_in_flight(db, batch_id).await,
        }
    }
}

impl Local {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Circle>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Goes round the open lines from where the last claim stopped, taking those
    /// not held and not resting, until `n` are taken or the circle is closed.
    async fn claim(&self, db: &Db, batch_id: &str, n: usize) -> anyhow::Result<Vec<Claimed>> {
        if !self.lock().contains_key(batch_id) {
            // Leases a build with leased claims left here are not this instance's.
            let q = sqlx::query(
                "UPDATE batch_lines SET claimed_by = NULL, lease_until = 0 \
                 WHERE batch_id = $1 AND done = 0 AND lease_until <> 0",
            )
            .bind(batch_id)
            .execute(&db.pool);
            db.bounded(q).await?;
            self.lock().entry(batch_id.to_string()).or_default();
        }
        // Open lines only, on the index (batch_id, done, lease_until, rowid).
        let sql = format!(
            "SELECT rowid AS at, line_no, custom_id, body FROM batch_lines \
             WHERE batch_id = $1 AND done = 0 AND lease_until = 0 AND rowid > $3 AND {OPEN} \
             ORDER BY rowid LIMIT $4"
        );
        let page = n.max(16);
        let mut out = Vec::new();
        let mut wrapped = false;
        while out.len() < n {
            let Some(after) = self.lock().get(batch_id).map(|c| c.after) else {
                break; // forgotten meanwhile (finalized)
            };
            let q = sqlx::query(&sql)
                .bind(batch_id)
                .bind(now_ms())
                .bind(after)
                .bind(page as i64)
                .fetch_all(&db.pool);
            let rows = db.bounded(q).await?;
            let now = Instant::now();
            let mut circles = self.lock();
            let Some(c) = circles.get_mut(batch_id) else {
                break;
            };
            let mut full = false;
            for r in &rows {
                if out.len() >= n {
                    full = true;
                    break;
                }
                c.after = r.get("at");
                let line = Claimed::of(r);
                let resting = c
                    .rested
                    .get(&line.line_no)
                    .is_some_and(|until| *until > now);
                if c.held.contains(&line.line_no) || resting {
                    continue;
                }
                c.rested.remove(&line.line_no);
                c.held.insert(line.line_no);
                out.push(line);
            }
            if !full && rows.len() < page {
                // The end: the next look starts from the first open line again.
                c.after = 0;
                if wrapped {
                    break;
                }
                wrapped = true;
            }
        }
        Ok(out)
    }

    fn put_back(&self, batch_id: &str, line_no: i64, wait: Duration) {
        if let Some(c) = self.lock().get_mut(batch_id) {
            c.held.remove(&line_no);
            if !wait.is_zero() {
                c.rested.insert(line_no, Instant::now() + wait);
            }
        }
    }
}

/// A lease on up to `n` free lines: those never claimed, given back, or whose
/// lease is past (a line of an instance that stopped is freed by `in_flight`).
/// The claim walks the index (batch_id, done, lease_until) from the never-claimed
/// lines up; the candidates are picked once (a CTE), locked and skipped by other
/// claimers (an IN (subquery ... LIMIT) may be evaluated again per row).
async fn leased(
    db: &Db,
    instance: &str,
    lease_ms: i64,
    batch_id: &str,
    n: usize,
) -> anyhow::Result<Vec<Claimed>> {
    let now = now_ms();
    let sql = format!(
        "WITH picked AS (SELECT line_no FROM batch_lines \
         WHERE batch_id = $1 AND done = 0 AND lease_until < $2 AND {OPEN} \
         LIMIT $5 FOR UPDATE SKIP LOCKED) \
         UPDATE batch_lines SET claimed_by = $3, lease_until = $4 FROM picked \
         WHERE batch_lines.batch_id = $1 AND batch_lines.line_no = picked.line_no \
         RETURNING batch_lines.line_no, batch_lines.custom_id, batch_lines.body"
    );
    let q = sqlx::query(&sql)
        .bind(batch_id)
        .bind(now)
        .bind(instance)
        .bind(now + lease_ms)
        .bind(n as i64)
        .fetch_all(&db.pool);
    Ok(db.bounded(q).await?.iter().map(Claimed::of).collect())
}

/// Leased lines of the batch held by a live claimant; those of an instance that
/// stopped beating are freed to be claimed again (a line that ran there runs
/// again, billed once).
async fn leases_in_flight(db: &Db, batch_id: &str) -> anyhow::Result<i64> {
    let now = now_ms();
    let stale = now - HEARTBEAT_TTL.as_millis() as i64;
    // Counted on the index (batch_id, done, lease_until), leased lines only:
    // those leased, and those leased by an instance that stopped beating.
    let q = sqlx::query(
        "SELECT (SELECT COUNT(*) FROM batch_lines WHERE batch_id = $1 AND done = 0 \
          AND lease_until >= $2 AND claimed_by IS NOT NULL) AS held, \
         (SELECT COUNT(*) FROM batch_lines WHERE batch_id = $1 AND done = 0 \
          AND lease_until >= $2 AND claimed_by IN \
          (SELECT id FROM instances WHERE seen_at < $3)) AS dead",
    )
    .bind(batch_id)
    .bind(now)
    .bind(stale)
    .fetch_one(&db.pool);
    let r = db.bounded(q).await?;
    let (held, dead): (i64, i64) = (r.get("held"), r.get("dead"));
    if dead > 0 {
        let q = sqlx::query(
            "UPDATE batch_lines SET claimed_by = NULL, lease_until = 0 \
             WHERE batch_id = $1 AND done = 0 AND lease_until >= $2 AND claimed_by IN \
             (SELECT id FROM instances WHERE seen_at < $3)",
        )
        .bind(batch_id)
        .bind(now)
        .bind(stale)
        .execute(&db.pool);
        db.bounded(q).await?;
    }
    Ok(held - dead)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database with the two tables a claim reads (as the migrations make them)
    /// and one open batch of `n` lines.
    async fn batch_of(n: i64) -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("c.db").display()))
            .await
            .unwrap();
        for sql in [
            "CREATE TABLE batches (id TEXT PRIMARY KEY, status TEXT NOT NULL, expires_at BIGINT NOT NULL)",
            "CREATE TABLE batch_lines (batch_id TEXT NOT NULL, line_no BIGINT NOT NULL, \
             custom_id TEXT NOT NULL, body TEXT NOT NULL, done BIGINT NOT NULL DEFAULT 0, \
             ok BIGINT NOT NULL DEFAULT 0, claimed_by TEXT, lease_until BIGINT NOT NULL DEFAULT 0, \
             PRIMARY KEY (batch_id, line_no))",
            "CREATE INDEX batch_lines_open ON batch_lines (batch_id, done, lease_until)",
        ] {
            sqlx::query(sql).execute(&db.pool).await.unwrap();
        }
        sqlx::query("INSERT INTO batches VALUES ('b', 'in_progress', $1)")
            .bind(now_ms() + 60_000)
            .execute(&db.pool)
            .await
            .unwrap();
        for i in 0..n {
            sqlx::query("INSERT INTO batch_lines (batch_id, line_no, custom_id, body) VALUES ('b', $1, $2, '{}')")
                .bind(i)
                .bind(format!("c-{i}"))
                .execute(&db.pool)
                .await
                .unwrap();
        }
        (dir, db)
    }

    fn nos(lines: &[Claimed]) -> Vec<i64> {
        lines.iter().map(|l| l.line_no).collect()
    }

    async fn mark_done(db: &Db, lines: &[i64]) {
        for l in lines {
            sqlx::query("UPDATE batch_lines SET done = 1 WHERE batch_id = 'b' AND line_no = $1")
                .bind(l)
                .execute(&db.pool)
                .await
                .unwrap();
        }
    }

    #[tokio::test]
    async fn local_claims_go_round_the_open_lines_each_held_once() {
        let (_dir, db) = batch_of(40).await;
        let claims = Claims::new(Engine::Sqlite, "i", 1000);
        let a = claims.claim(&db, "b", 16).await.unwrap();
        assert_eq!(nos(&a), (0..16).collect::<Vec<_>>());
        assert_eq!(a[3].custom_id, "c-3");
        let b = claims.claim(&db, "b", 16).await.unwrap();
        assert_eq!(nos(&b), (16..32).collect::<Vec<_>>());
        assert_eq!(claims.in_flight(&db, "b").await.unwrap(), 32);
        // Lines 0..8 are recorded; 8 is given back at once, 9 to wait a minute,
        // 10 was recorded without being marked done (its write failed).
        mark_done(&db, &(0..8).collect::<Vec<_>>()).await;
        claims.recorded("b", 0..8);
        claims.recorded("b", [10].into_iter());
        claims.put_back(&db, "b", 8, Duration::ZERO).await;
        claims.put_back(&db, "b", 9, Duration::from_secs(60)).await;
        assert_eq!(claims.in_flight(&db, "b").await.unwrap(), 21);
        // The rest of the circle, then round again from the first open line:
        // neither a line held nor one resting comes back, a line let go does.
        let c = claims.claim(&db, "b", 16).await.unwrap();
        assert_eq!(nos(&c), [8, 10, 32, 33, 34, 35, 36, 37, 38, 39]);
        assert!(claims.claim(&db, "b", 16).await.unwrap().is_empty());
        // A batch no longer open gives nothing, and a forgotten one nothing held.
        claims.recorded("b", 11..40);
        sqlx::query("UPDATE batches SET status = 'cancelling'")
            .execute(&db.pool)
            .await
            .unwrap();
        assert!(claims.claim(&db, "b", 16).await.unwrap().is_empty());
        claims.forget("b");
        assert_eq!(claims.in_flight(&db, "b").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_new_instance_on_the_same_file_claims_what_another_left_undone() {
        let (_dir, db) = batch_of(10).await;
        // A lease left by a build whose claims were leases, and lines an instance
        // held when it stopped.
        sqlx::query(
            "UPDATE batch_lines SET claimed_by = 'old', lease_until = $1 WHERE line_no < 3",
        )
        .bind(now_ms() + 600_000)
        .execute(&db.pool)
        .await
        .unwrap();
        let before = Claims::new(Engine::Sqlite, "i", 1000);
        assert_eq!(before.claim(&db, "b", 5).await.unwrap().len(), 5);
        mark_done(&db, &[3, 4]).await;
        let after = Claims::new(Engine::Sqlite, "j", 1000);
        let all = after.claim(&db, "b", 100).await.unwrap();
        assert_eq!(nos(&all), [0, 1, 2, 5, 6, 7, 8, 9]);
        // The claimant a recorded line names: none here (its row keeps its
        // size), the lease's instance on PostgreSQL.
        assert_eq!(after.claimant(), None);
        assert_eq!(
            Claims::new(Engine::Postgres, "i", 1000).claimant(),
            Some("i")
        );
    }
}
