//! The durable database: one sqlx `AnyPool` over SQLite (the embedded default) or
//! PostgreSQL (several instances), with the migrations of both embedded in the binary.
//!
//! The SQL is portable: `$N` placeholders (SQLite accepts them), BIGINT times and
//! money, TEXT ids. Nothing on the request hot path waits on it.

use super::checkpoint::{self, BUSY_TIMEOUT};
use anyhow::Context;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::AnyPool;
use std::borrow::Cow;
use std::path::Path;

/// A pooled connection idle this long is pinged before it is handed out.
const PING_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Each SQLite connection's page cache: 256 KiB (64 pages), not SQLite's 2 MiB.
/// A connection's cache is emptied whenever another connection has written (WAL
/// readers see the change and start over), so under load each of the process's
/// connections filled and emptied its cache over and over: the process's SQLite
/// memory swung between 2.2 and 4 MB from one soak round to the next. What they read
/// is small (the pollers' tables, the rightmost pages of the usage table's
/// indexes for an append); a miss is a read from the OS's cache.
const SQLITE_CACHE: &str = "PRAGMA cache_size=-256";

/// sqlx pings every connection it hands out by default: a round trip (on SQLite,
/// a hop to the connection's thread and back) before each query, doubling what
/// the pollers cost the database. Here only a connection idle long enough to have
/// been dropped by the server or a proxy between ([`PING_IDLE`]) is tried first;
/// a broken one that slips through fails its query once and is not put back
/// (sqlx pings each connection given back).
pub fn ping_when_idle<DB: sqlx::Database>(
    options: sqlx::pool::PoolOptions<DB>,
) -> sqlx::pool::PoolOptions<DB> {
    options
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// Puts a SQLite file in WAL mode (it stays so) on a connection of its own, before
/// a pool opens all its connections at once: two connections switching a fresh
/// file together each wait for the other's lock, and SQLite fails one at once
/// ("database is locked", busy timeout or not), which sqlx logged as an error
/// (then opened another) on about 1 in 5 first starts. Two processes doing this
/// together can still collide: it is tried again, as the migrations are.
async fn to_wal(url: &str) -> anyhow::Result<()> {
    use sqlx::Connection;
    let switch = || async {
        let mut conn = sqlx::AnyConnection::connect(url).await?;
        sqlx::query(BUSY_TIMEOUT).execute(&mut conn).await?;
        sqlx::query("PRAGMA journal_mode=WAL")
            .execute(&mut conn)
            .await?;
        conn.close().await
    };
    let bounded = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        again_if_raced("switching the file to WAL", switch),
    );
    match bounded.await {
        Ok(done) => done.context("switching the SQLite file to WAL"),
        Err(_) => anyhow::bail!("switching the SQLite file to WAL timed out"),
    }
}

/// Runs `step` again while it fails, at most five more times, 50 ms longer apart
/// each time: processes starting on one fresh SQLite file (`serve` and an admin
/// command, as the quickstart runs them) race for it, and a rerun finds the
/// other's work done.
async fn again_if_raced<T, F, Fut>(what: &str, mut step: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut attempt = 0;
    loop {
        match step().await {
            Err(e) if attempt < 5 => {
                attempt += 1;
                tracing::debug!(error = %e, attempt, "{what} raced another process; again");
                tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
            }
            done => return done,
        }
    }
}

/// Which engine is behind the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

impl Engine {
    /// `rows` groups of `cols` parameters, `(…), (…)`, numbered from 1, for a
    /// multi-row statement whose text starts its parameters there. SQLite gets
    /// anonymous `?` (bound in order at no cost: its lookup of numbered names is
    /// linear per parameter, quadratic per statement); PostgreSQL `$n`.
    pub fn value_rows(self, rows: usize, cols: usize) -> String {
        let mut sql = String::with_capacity(rows * cols * 5);
        for r in 0..rows {
            if r > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for c in 0..cols {
                if c > 0 {
                    sql.push_str(", ");
                }
                match self {
                    Engine::Sqlite => sql.push('?'),
                    Engine::Postgres => {
                        sql.push('$');
                        sql.push_str(&(r * cols + c + 1).to_string());
                    }
                }
            }
            sql.push(')');
        }
        sql
    }

    /// The parameter numbered `n` (from 1), placed after every earlier one.
    pub fn param(self, n: usize) -> String {
        match self {
            Engine::Sqlite => "?".into(),
            Engine::Postgres => format!("${n}"),
        }
    }
}

/// Splits `items` into chunks of the given sizes (largest first, ending in 1), the
/// largest that fits each time: each size is one statement the database prepares
/// once and caches, instead of a new one for every odd count.
pub fn fixed_chunks<'a, T>(items: &'a [T], sizes: &[usize]) -> Vec<&'a [T]> {
    let mut out = Vec::new();
    let mut rest = items;
    while !rest.is_empty() {
        let n = sizes
            .iter()
            .copied()
            .find(|&n| n <= rest.len())
            .unwrap_or(1);
        let (head, tail) = rest.split_at(n);
        out.push(head);
        rest = tail;
    }
    out
}

#[derive(Clone)]
pub struct Db {
    pub pool: AnyPool,
    pub engine: Engine,
    /// The longest a call may wait for a connection, and a request-path query may
    /// take (`storage.database_timeout_ms`).
    pub timeout: std::time::Duration,
}

/// The default bound of database calls when the configuration gives none.
const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// (version, description, sqlite sql, postgres sql)
const MIGRATIONS: &[(i64, &str, &str, &str)] = &[
    (
        1,
        "foundation",
        include_str!("../../migrations/sqlite/0001_foundation.sql"),
        include_str!("../../migrations/postgres/0001_foundation.sql"),
    ),
    (
        2,
        "usage events",
        include_str!("../../migrations/sqlite/0002_usage_events.sql"),
        include_str!("../../migrations/postgres/0002_usage_events.sql"),
    ),
    (
        3,
        "rung probes",
        include_str!("../../migrations/sqlite/0003_rung_probes.sql"),
        include_str!("../../migrations/postgres/0003_rung_probes.sql"),
    ),
    (
        4,
        "money gates and idempotency",
        include_str!("../../migrations/sqlite/0004_money_gates.sql"),
        include_str!("../../migrations/postgres/0004_money_gates.sql"),
    ),
    (
        5,
        "byok connections, org waterfalls, provider policy",
        include_str!("../../migrations/sqlite/0005_byok.sql"),
        include_str!("../../migrations/postgres/0005_byok.sql"),
    ),
    (
        6,
        "key and org changes stamped with the database clock",
        include_str!("../../migrations/sqlite/0006_db_clock_stamps.sql"),
        include_str!("../../migrations/postgres/0006_db_clock_stamps.sql"),
    ),
    (
        7,
        "usage windows: free, weighted tokens, list cost",
        include_str!("../../migrations/sqlite/0007_usage_windows.sql"),
        include_str!("../../migrations/postgres/0007_usage_windows.sql"),
    ),
    (
        8,
        "prompt-cache writes in usage events",
        include_str!("../../migrations/sqlite/0008_cache_writes.sql"),
        include_str!("../../migrations/postgres/0008_cache_writes.sql"),
    ),
    (
        9,
        "org settings: prompt capture",
        include_str!("../../migrations/sqlite/0009_org_settings.sql"),
        include_str!("../../migrations/postgres/0009_org_settings.sql"),
    ),
    (
        10,
        "the responses store",
        include_str!("../../migrations/sqlite/0010_stored_responses.sql"),
        include_str!("../../migrations/postgres/0010_stored_responses.sql"),
    ),
    (
        11,
        "the responses store's items by id",
        include_str!("../../migrations/sqlite/0011_stored_items.sql"),
        include_str!("../../migrations/postgres/0011_stored_items.sql"),
    ),
    (
        12,
        "instance heartbeats",
        include_str!("../../migrations/sqlite/0012_instances.sql"),
        include_str!("../../migrations/postgres/0012_instances.sql"),
    ),
    (
        20,
        "telemetry ingests and traces",
        include_str!("../../migrations/sqlite/0020_telemetry.sql"),
        include_str!("../../migrations/postgres/0020_telemetry.sql"),
    ),
    (
        30,
        "accounts: users, members, web sessions, email links, origin attempts",
        include_str!("../../migrations/sqlite/0030_accounts.sql"),
        include_str!("../../migrations/postgres/0030_accounts.sql"),
    ),
    (
        31,
        "payments and payment events",
        include_str!("../../migrations/sqlite/0031_payments.sql"),
        include_str!("../../migrations/postgres/0031_payments.sql"),
    ),
    (
        40,
        "web searches in usage events",
        include_str!("../../migrations/sqlite/0040_web_search_requests.sql"),
        include_str!("../../migrations/postgres/0040_web_search_requests.sql"),
    ),
    (
        50,
        "files, batches and their lines; batch usage",
        include_str!("../../migrations/sqlite/0050_batches.sql"),
        include_str!("../../migrations/postgres/0050_batches.sql"),
    ),
    (
        51,
        "a batch line billed once; request counts kept on the batch",
        include_str!("../../migrations/sqlite/0051_batch_lines_once.sql"),
        include_str!("../../migrations/postgres/0051_batch_lines_once.sql"),
    ),
    (
        52,
        "batch answers in a table of their own",
        include_str!("../../migrations/sqlite/0052_batch_answers.sql"),
        include_str!("../../migrations/postgres/0052_batch_answers.sql"),
    ),
    (
        60,
        "change feed",
        include_str!("../../migrations/sqlite/0060_change_feed.sql"),
        include_str!("../../migrations/postgres/0060_change_feed.sql"),
    ),
    (
        70,
        "payment unlocks",
        include_str!("../../migrations/sqlite/0070_payment_unlocks.sql"),
        include_str!("../../migrations/postgres/0070_payment_unlocks.sql"),
    ),
    (
        80,
        "usage estimated",
        include_str!("../../migrations/sqlite/0080_usage_estimated.sql"),
        include_str!("../../migrations/postgres/0080_usage_estimated.sql"),
    ),
];

impl Db {
    pub async fn connect(url: &str) -> anyhow::Result<Db> {
        Db::open(url, None, DEFAULT_TIMEOUT).await
    }

    /// `max`: the pool's connection limit (default: 4 for SQLite, 16 for PostgreSQL).
    #[cfg(test)]
    async fn connect_with(url: &str, max: Option<u32>) -> anyhow::Result<Db> {
        Db::open(url, max, DEFAULT_TIMEOUT).await
    }

    /// Runs a request-path query within the database's bound: a database that
    /// hangs fails the query (`PoolTimedOut`) instead of the request.
    pub async fn bounded<T>(
        &self,
        query: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, sqlx::Error> {
        tokio::time::timeout(self.timeout, query)
            .await
            .unwrap_or(Err(sqlx::Error::PoolTimedOut))
    }

    /// Opens the pool; `timeout` bounds waiting for a connection.
    pub async fn open(
        url: &str,
        max: Option<u32>,
        timeout: std::time::Duration,
    ) -> anyhow::Result<Db> {
        sqlx::any::install_default_drivers();
        let engine = if url.starts_with("sqlite:") {
            Engine::Sqlite
        } else {
            Engine::Postgres
        };
        let mut url = url.to_string();
        // A SQLite file (not `:memory:`): its path.
        let file = (engine == Engine::Sqlite && !url.contains(":memory:")).then(|| {
            let path = url
                .trim_start_matches("sqlite://")
                .trim_start_matches("sqlite:");
            path.split('?').next().unwrap_or(path).to_string()
        });
        if let Some(path) = &file {
            if let Some(dir) = Path::new(path).parent() {
                if !dir.as_os_str().is_empty() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
            }
            if !url.contains("mode=") {
                url.push_str(if url.contains('?') {
                    "&mode=rwc"
                } else {
                    "?mode=rwc"
                });
            }
        }
        let max = max.unwrap_or(if engine == Engine::Sqlite { 4 } else { 16 });
        let on_file = file.is_some();
        let mut options = ping_when_idle(AnyPoolOptions::new())
            .max_connections(max)
            .acquire_timeout(timeout);
        if engine == Engine::Sqlite {
            // A SQLite connection is a file handle and a worker thread of this
            // process: sqlx's recycling (after 30 minutes, or 10 idle) gains
            // nothing here and starts a thread and a page cache afresh, and the
            // RSS kept a step of each (31 → 33 MB at the 30-minute mark of the
            // load bench's soak; flat at 31 without it). A server's connections
            // keep sqlx's limits.
            options = options.max_lifetime(None).idle_timeout(None);
            if on_file {
                // Every connection opens now, not the first time all those open
                // are busy at once: that came minutes into a soak, and the RSS
                // took a step of 1-3 MB with the new thread and its caches, where
                // a process's memory should be flat after warm-up.
                options = options.min_connections(max);
            }
        }
        if on_file {
            to_wal(&url).await?;
        }
        let pool = options
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if engine == Engine::Sqlite {
                        // A file is in WAL mode (`to_wal`; it stays so): a commit
                        // appends to the log instead of writing, syncing and deleting
                        // a rollback journal, so the usage writer costs little on the
                        // core that serves requests; readers never wait on it. NORMAL
                        // sync is durable across process crashes.
                        for pragma in ["PRAGMA synchronous=NORMAL", BUSY_TIMEOUT, SQLITE_CACHE] {
                            sqlx::query(pragma).execute(&mut *conn).await?;
                        }
                        // A file's log is copied by its checkpoint task
                        // (`store::checkpoint`), not at commits.
                        if on_file {
                            sqlx::query("PRAGMA wal_autocheckpoint=0")
                                .execute(&mut *conn)
                                .await?;
                        }
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await
            .with_context(|| format!("connecting to the {engine:?} database"))?;
        let db = Db {
            pool,
            engine,
            timeout,
        };
        if let Some(path) = file {
            checkpoint::keep(&path, db.pool.clone(), timeout);
        }
        Ok(db)
    }

    /// Applies pending migrations of this engine.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        let migrations: Vec<Migration> = MIGRATIONS
            .iter()
            .map(|(v, d, lite, pg)| {
                let sql = if self.engine == Engine::Sqlite {
                    lite
                } else {
                    pg
                };
                Migration::new(
                    *v,
                    Cow::Borrowed(*d),
                    MigrationType::Simple,
                    Cow::Borrowed(*sql),
                    false,
                )
            })
            .collect();
        let migrator = Migrator {
            migrations: Cow::Owned(migrations),
            ..Migrator::DEFAULT
        };
        // Two processes migrating one fresh SQLite file race: both see migration N
        // pending, one applies it, the other's CREATE fails and rolls back; a
        // rerun sees it applied. (PostgreSQL serializes migrators with an
        // advisory lock.)
        let run = || async { migrator.run(&self.pool).await.map_err(sqlx::Error::from) };
        let ran = if self.engine == Engine::Sqlite {
            again_if_raced("migrations", run).await
        } else {
            run().await
        };
        ran.context("applying migrations")
    }

    /// A cheap liveness query, for readiness.
    pub async fn ping(&self) -> bool {
        self.bounded(sqlx::query("SELECT 1").execute(&self.pool))
            .await
            .is_ok()
    }
}

/// Reads an optional BIGINT column.
pub fn opt_i64(row: &AnyRow, col: &str) -> Option<i64> {
    use sqlx::Row;
    row.try_get::<Option<i64>, _>(col).ok().flatten()
}

/// A fresh database for a unit test: on the PostgreSQL server
/// `SLUICE_TEST_DATABASE_URL` names (the test command's second pass) a database of
/// its own, else a SQLite file in `dir`.
#[cfg(test)]
pub async fn test_database_url(dir: &Path) -> String {
    match std::env::var("SLUICE_TEST_DATABASE_URL") {
        Ok(server) if !server.is_empty() => {
            use sqlx::Connection;
            let name = format!("sluice_u_{:016x}", rand::random::<u64>());
            let mut conn = sqlx::PgConnection::connect(&server).await.unwrap();
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&mut conn)
                .await
                .unwrap();
            let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
            format!("{base}/{name}")
        }
        _ => format!("sqlite://{}", dir.join("t.db").display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_rows_are_anonymous_on_sqlite_and_numbered_after_earlier_ones_on_postgres() {
        assert_eq!(Engine::Sqlite.value_rows(2, 3), "(?, ?, ?), (?, ?, ?)");
        assert_eq!(Engine::Postgres.value_rows(2, 2), "($1, $2), ($3, $4)");
        assert_eq!(Engine::Postgres.param(7), "$7");
        assert_eq!(Engine::Sqlite.param(7), "?");
    }

    /// A SQLite file's connections live as long as the process (each is a
    /// worker thread: see `Db::open`); a server's are recycled as sqlx does.
    #[tokio::test]
    async fn sqlite_connections_are_never_recycled() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("life.db").display());
        let db = Db::connect(&url).await.unwrap();
        let options = db.pool.options();
        assert_eq!(options.get_max_lifetime(), None);
        assert_eq!(options.get_idle_timeout(), None);
    }

    /// Every SQLite connection, not only the first, gets the small page cache.
    #[tokio::test]
    async fn every_sqlite_connection_has_the_small_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("cache.db").display());
        let db = Db::connect(&url).await.unwrap();
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut conn = db.pool.acquire().await.unwrap();
            let size: i64 = sqlx::query_scalar("PRAGMA cache_size")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert_eq!(size, -256);
            held.push(conn);
        }
    }

    /// A fresh SQLite file is in WAL mode before its pool opens (`to_wal`),
    /// and every connection of the pool sees it so.
    #[tokio::test]
    async fn a_fresh_sqlite_file_is_in_wal_mode_on_every_connection() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("wal.db").display());
        let db = Db::connect_with(&url, Some(3)).await.unwrap();
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut conn = db.pool.acquire().await.unwrap();
            let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            assert_eq!(mode, "wal");
            held.push(conn);
        }
    }

    /// A SQLite file's pool opens every connection (each a thread of this
    /// process) at once: none starts later, under load.
    #[tokio::test]
    async fn a_sqlite_file_pool_opens_all_its_connections_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("all.db").display());
        let db = Db::connect_with(&url, Some(3)).await.unwrap();
        assert_eq!(db.pool.size(), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn processes_migrating_one_fresh_sqlite_file_at_once_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("race.db").display());
        let runs: Vec<_> = (0..6)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move {
                    // Each its own pool, as separate processes would have.
                    let db = Db::connect(&url).await?;
                    db.migrate().await
                })
            })
            .collect();
        for r in runs {
            r.await.unwrap().unwrap();
        }
    }
}
