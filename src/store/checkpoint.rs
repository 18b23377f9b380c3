//! SQLite's log (WAL) is copied into the database file by one task per file every
//! [`EVERY`], not by whichever commit finds the log past 1,000 frames.
//!
//! SQLite's own rule counts the frames in the log, and the log only starts over
//! when a writer finds it wholly copied and no reader in it. Under steady load
//! some reader always is (a usage batch, a poll, a batch claim), so the log grew
//! (53 MB in a 10,000-line batch) and from then on *every* commit ran a
//! checkpoint: a sort of the log's current segment, a copy and an `fsync` of the
//! database file, on the committing connection's thread. That was a quarter of
//! the database's CPU in the batch bench. Here a commit only appends; a
//! checkpoint every [`EVERY`] copies each page changed since once, whatever
//! number of commits changed it.
//!
//! Bound: the log starts over only when a writer finds it wholly copied with no
//! reader in it, which steady load rarely allows; so past [`RESTART_FRAMES`] the
//! task makes it start over (`TRUNCATE`): it holds off new writers and waits for
//! the readers in the log to finish, each at most [`RESTART_WAIT`], then empties
//! the log. So the log stays near 16 MiB, and writers (the usage writer, the
//! batch recorder, never a request) wait at most twice [`RESTART_WAIT`] for it.
//! A restart that did not get its turn is tried again the next tick.

use super::db::Db;
use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

/// How often the log is copied into the database file.
pub const EVERY: Duration = Duration::from_millis(500);
/// Frames (4 KiB pages) past which the log is made to start over: 16 MiB.
const RESTART_FRAMES: i64 = 4096;
/// How long a restart waits for the writer, then for the readers, in the log.
const RESTART_WAIT: &str = "PRAGMA busy_timeout=25";

/// Files that have their checkpoint task in this process.
static RUNNING: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Starts the checkpoint task for `path` unless this process runs it already.
/// Connections of a pool with this task set `wal_autocheckpoint=0`.
pub(super) fn keep(path: &str, db: Db) {
    {
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        if !running
            .get_or_insert_with(HashSet::new)
            .insert(path.to_string())
        {
            return;
        }
    }
    let path = path.to_string();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if db.pool.is_closed() {
                break;
            }
            if let Err(e) = once(&db).await {
                tracing::debug!(error = %e, "SQLite checkpoint skipped; again next tick");
            }
        }
        let mut running = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        running.get_or_insert_with(HashSet::new).remove(&path);
    });
}

/// One pass: copies what no reader still needs (PASSIVE never waits); a long
/// log is then made to start over, waiting at most [`RESTART_WAIT`] (on this
/// connection, for that one statement).
async fn once(db: &Db) -> Result<(), sqlx::Error> {
    use sqlx::Row;
    let pass = async {
        let mut conn = db.pool.acquire().await?;
        let r = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_one(&mut *conn)
            .await?;
        let log: i64 = r.try_get(1)?;
        if log >= RESTART_FRAMES {
            sqlx::query(RESTART_WAIT).execute(&mut *conn).await?;
            let restarted = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .fetch_one(&mut *conn)
                .await;
            sqlx::query(super::db::BUSY_TIMEOUT)
                .execute(&mut *conn)
                .await?;
            restarted?;
        }
        Ok(())
    };
    db.bounded(pass).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_bytes(dir: &std::path::Path) -> u64 {
        std::fs::metadata(dir.join("c.db-wal")).map_or(0, |m| m.len())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_log_is_copied_and_started_over_by_the_task_not_by_commits() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("c.db").display()))
            .await
            .unwrap();
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
        assert!(grown > RESTART_FRAMES as u64 * 4096, "{grown}");
        drop(reader);
        // Within two ticks the task has copied the log and started it over.
        tokio::time::sleep(EVERY * 3).await;
        let after = log_bytes(dir.path());
        assert!(after < 1 << 20, "the log is still {after} bytes");
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(n, 2500);
    }
}
