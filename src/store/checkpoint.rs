//! SQLite's log (WAL) is copied into the database file by one task per file, not
//! by whichever commit finds the log past 1,000 frames.
//!
//! SQLite's own rule counts the frames in the log, and the log only starts over
//! when a writer finds it wholly copied and no reader in it. Under steady load
//! some reader always is (a usage batch, a poll, a batch claim), so the log grew
//! (53 MB in a 10,000-line batch) and from then on *every* commit ran a
//! checkpoint: a sort of the log's current segment, a copy and an `fsync` of the
//! database file, on the committing connection's thread. That was a quarter of
//! the database's CPU in the batch bench. Here a commit only appends; the task
//! looks at the log's size every [`LOOK`] and copies it at most every [`EVERY`]
//! (each page changed since is copied once, whatever number of commits changed
//! it).
//!
//! Bound: past [`RESTART_BYTES`] the task makes the log start over at once
//! (`TRUNCATE`): it holds off new writers and waits for the readers in the log
//! to finish, each at most [`RESTART_WAIT`], then empties the file. The file's
//! size is then the log's, which is what the task looks at (`RESTART` kept the
//! file at its largest, so every look past 16 MiB restarted the log again and
//! held the writers off each time). So the log
//! holds at most [`RESTART_BYTES`] plus what is written in one [`LOOK`] and in
//! the restarts that did not get their turn (tried again at the next look);
//! writers (the usage writer, the batch recorder, never a request) wait at most
//! twice [`RESTART_WAIT`] for a restart.

use sqlx::AnyPool;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the task looks at the log's size.
const LOOK: Duration = Duration::from_millis(100);
/// How often a log that grew is copied into the database file.
pub const EVERY: Duration = Duration::from_millis(500);
/// Past this the log is made to start over at the next look: 16 MiB.
const RESTART_BYTES: u64 = 16 << 20;
/// How long a restart waits for the writer, then for the readers, in the log.
const RESTART_WAIT: &str = "PRAGMA busy_timeout=25";
/// How long any other SQLite statement waits for another connection's lock (set
/// on every connection; the restart puts it back after its own).
pub(super) const BUSY_TIMEOUT: &str = "PRAGMA busy_timeout=5000";

/// Files that have their checkpoint task in this process.
static RUNNING: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Starts the checkpoint task for `path` unless this process runs it already;
/// each pass is bounded by `bound`. Connections of a pool with this task set
/// `wal_autocheckpoint=0`.
pub(super) fn keep(path: &str, pool: AnyPool, bound: Duration) {
    {
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        if running.iter().any(|p| p == path) {
            return;
        }
        running.push(path.to_string());
    }
    let path = path.to_string();
    let log = format!("{path}-wal");
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(LOOK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut last, mut copied) = (Instant::now(), 0u64);
        loop {
            tick.tick().await;
            if pool.is_closed() {
                break;
            }
            let size = std::fs::metadata(&log).map_or(0, |m| m.len());
            let restart = size >= RESTART_BYTES;
            if !restart && (size == copied || last.elapsed() < EVERY) {
                continue;
            }
            match once(&pool, bound, restart).await {
                Ok(()) => {
                    last = Instant::now();
                    copied = std::fs::metadata(&log).map_or(0, |m| m.len());
                }
                Err(e) => {
                    tracing::debug!(error = %e, "SQLite checkpoint skipped; again at the next look")
                }
            }
        }
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        running.retain(|p| *p != path);
    });
}

/// One pass: copies what no reader still needs (PASSIVE never waits); with
/// `restart`, the log is then made to start over, waiting at most
/// [`RESTART_WAIT`] (on this connection, for that one statement).
async fn once(pool: &AnyPool, bound: Duration, restart: bool) -> Result<(), sqlx::Error> {
    let pass = async {
        let mut conn = pool.acquire().await?;
        sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&mut *conn)
            .await?;
        if restart {
            sqlx::query(RESTART_WAIT).execute(&mut *conn).await?;
            let restarted = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&mut *conn)
                .await;
            sqlx::query(BUSY_TIMEOUT).execute(&mut *conn).await?;
            restarted?;
        }
        Ok(())
    };
    tokio::time::timeout(bound, pass)
        .await
        .unwrap_or(Err(sqlx::Error::PoolTimedOut))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Db;
    use sqlx::Row;

    fn log_bytes(dir: &std::path::Path) -> u64 {
        std::fs::metadata(dir.join("c.db-wal")).map_or(0, |m| m.len())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_log_is_copied_and_started_over_by_the_task_not_by_commits() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("c.db").display()))
            .await
            .unwrap();
        // Commits leave the log to the task.
        let auto: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(auto, 0);
        sqlx::query("CREATE TABLE t (v TEXT)")
            .execute(&db.pool)
            .await
            .unwrap();
        // A reader stays in the log while the commits go on, as under load.
        let mut reader = db.pool.begin().await.unwrap();
        sqlx::query("SELECT COUNT(*) FROM t")
            .fetch_one(&mut *reader)
            .await
            .unwrap();
        let page = "x".repeat(4000);
        for _ in 0..2500 {
            sqlx::query("INSERT INTO t (v) VALUES ($1)")
                .bind(&page)
                .execute(&db.pool)
                .await
                .unwrap();
        }
        let grown = log_bytes(dir.path());
        assert!(grown > RESTART_BYTES, "{grown}");
        drop(reader);
        // Within a few looks the task has copied the log and emptied it: the
        // next commit writes its frames from the log's start.
        tokio::time::sleep(EVERY * 2).await;
        sqlx::query("INSERT INTO t (v) VALUES ('after')")
            .execute(&db.pool)
            .await
            .unwrap();
        let frames: i64 = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&db.pool)
            .await
            .unwrap()
            .get(1);
        assert!(frames < 16, "the log holds {frames} frames");
        // And the file, whose size the task watches, is the log's size again.
        let after = log_bytes(dir.path());
        assert!(after < 1 << 20, "the log file is still {after} bytes");
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(n, 2501);
    }
}
