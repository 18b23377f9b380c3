//! The usage record: one event per inference request, written after the answer
//! completed, off the client's path. Events are appended to an in-process buffer
//! (no wake-up, no syscall per request) that a writer task drains in batches every
//! few tens of milliseconds.
//!
//! Nothing is lost and nothing is charged twice: each event gets its id before the
//! first write, a write inserts only ids not yet stored and charges the balance for
//! exactly the rows it inserted (one transaction), and a batch the database refuses
//! goes to a local spool file that is replayed once the database answers again.
//!
//! What is charged but not yet in the database (buffered, being written, spooled,
//! a spool left by the last run) is tallied per org in [`Unwritten`], so a balance
//! counter seeded from the database can take it off (`counters::seeded`).

use super::db::Engine;
use super::journal::{Journal, Sealed, Segment};
use super::{new_ordered_id, now_ms, Db};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the writer drains the buffer.
const FLUSH_EVERY: Duration = Duration::from_millis(50);

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageEvent {
    /// Assigned by the writer before the first attempt to store the event.
    #[serde(default)]
    pub id: String,
    pub org_id: String,
    pub key_id: String,
    pub route: Cow<'static, str>,
    pub model: String,
    /// The rung that served, if one did.
    pub rung: Option<String>,
    /// `platform_funded` or `pass_through`.
    pub lane: Cow<'static, str>,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    /// Input written to the provider's prompt cache (part of `input_tokens`).
    #[serde(default)]
    pub cache_write_tokens: u64,
    pub output_tokens: u64,
    pub reasoning_tokens: u64,
    /// Web searches run for the request (the gateway's, or the provider's).
    #[serde(default)]
    pub web_search_requests: u64,
    pub cost_micro_usd: i64,
    pub status: u16,
    pub error_class: Option<String>,
    /// A stream cut after output: settled as the provider's cut.
    pub incomplete: bool,
    /// The provider reported no usage for the answer: its tokens are the
    /// gateway's estimate.
    #[serde(default)]
    pub estimated: bool,
    /// `x-gateway-attempts`: each rung tried with its outcome.
    pub attempts: String,
    /// Attempts that ended their turn empty (recorded at zero cost).
    pub empty_attempts: u32,
    pub latency_ms: u64,
    /// Served on the model's free allowance (billed nothing).
    #[serde(default)]
    pub free: bool,
    /// Tokens as the limits count them (cached input at its price weight).
    #[serde(default)]
    pub weighted_tokens: i64,
    /// The usage at the model's list price (what free allowances count).
    #[serde(default)]
    pub list_micro_usd: i64,
    /// When the request ended (Unix ms): the row's `created_at`, so a spooled
    /// event replayed later still lands in the windows it was used in.
    #[serde(default)]
    pub at_ms: i64,
    /// Served as a line of a batch (`/v1/batches`), at the same prices.
    #[serde(default)]
    pub batch: bool,
    /// The batch line served (`<batch id>:<line>`): unique among stored events, so a
    /// line run again after its instance stopped is billed once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_line: Option<String>,
}

impl UsageEvent {
    /// What the event draws from the org's balance.
    fn charge(&self) -> i64 {
        if self.lane == "platform_funded" {
            self.cost_micro_usd.max(0)
        } else {
            0
        }
    }
}

/// Each org's charges not yet written to the database, and the lock that makes a
/// write's commit and its removal from here one step for readers.
#[derive(Default)]
pub struct Unwritten {
    commit: tokio::sync::Mutex<()>,
    by_org: Mutex<HashMap<String, i64>>,
}

impl Unwritten {
    fn adjust(&self, events: &[UsageEvent], sign: i64) {
        let mut map = self.by_org.lock().unwrap_or_else(|e| e.into_inner());
        for e in events {
            let c = e.charge();
            if c == 0 {
                continue;
            }
            let v = map.entry(e.org_id.clone()).or_insert(0);
            *v = v.saturating_add(sign * c);
            if *v == 0 {
                map.remove(&e.org_id);
            }
        }
    }

    /// Runs `read` (a database read) with no write committing meanwhile, and
    /// returns its answer with the org's unwritten charges at that moment.
    pub async fn read_with<T, F, Fut>(&self, org_id: &str, read: F) -> anyhow::Result<(T, T, i64)>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<(T, T)>>,
    {
        let _held = self.commit.lock().await;
        let (a, b) = read().await?;
        let pending = self
            .by_org
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(org_id)
            .copied()
            .unwrap_or(0);
        Ok((a, b, pending))
    }

    /// Commits a write's transaction and takes its events off the tally, as one
    /// step for [`Unwritten::read_with`].
    async fn commit<DB: sqlx::Database>(
        &self,
        tx: sqlx::Transaction<'_, DB>,
        events: &[UsageEvent],
    ) -> anyhow::Result<()> {
        let _held = self.commit.lock().await;
        tx.commit().await?;
        self.adjust(events, -1);
        Ok(())
    }
}

/// Events recorded and not yet taken by the writer, and the journal segment
/// they were appended to.
#[derive(Default)]
struct Pending {
    events: Vec<UsageEvent>,
    journal: Option<Journal>,
}

/// Where requests leave their events; cheap to clone.
#[derive(Clone, Default)]
pub struct UsageSink {
    pending: Arc<Mutex<Pending>>,
    pub unwritten: Arc<Unwritten>,
}

impl UsageSink {
    /// Records one event: its id is given here, its line appended to the journal
    /// (one `write`, no wait: a killed process loses nothing recorded), and the
    /// writer takes it on its next tick.
    pub fn record(&self, mut ev: UsageEvent) {
        if ev.id.is_empty() {
            ev.id = new_ordered_id("ue");
        }
        self.unwritten.adjust(std::slice::from_ref(&ev), 1);
        let line = serde_json::to_vec(&ev).map(|mut l| {
            l.push(b'\n');
            l
        });
        crate::metrics::global().usage_queue.inc();
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(j), Ok(line)) = (p.journal.as_mut(), line) {
            if let Err(e) = j.append(&line) {
                tracing::error!(error = %e, "usage journal not written: this event is kept in memory only");
            }
        }
        p.events.push(ev);
    }

    /// The events recorded since the last take, and the journal segment that
    /// holds them (sealed: new events go to the other one).
    fn take(&self) -> (Vec<UsageEvent>, Option<Sealed>) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let events = std::mem::take(&mut p.events);
        let sealed = p.journal.as_mut().and_then(Journal::seal);
        (events, sealed)
    }

    /// Gives an emptied segment back to the journal.
    fn reuse(&self, seg: Segment) {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(j) = p.journal.as_mut() {
            j.reuse(seg);
        }
    }
}

/// The journal's folder: the spool's.
fn journal_dir(spool: &Path) -> PathBuf {
    match spool.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Moves what journal segments of processes gone from this machine hold into the
/// spool (replayed like any spooled batch, exactly once: ids make a stored event
/// a no-op). Runs at start, before the spool is replayed.
pub fn adopt_orphans(spool: &Path) {
    for (segment, text) in super::journal::orphans(&journal_dir(spool)) {
        let events: Vec<UsageEvent> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if events.is_empty() {
            segment.done();
            continue;
        }
        match append_spool(spool, &events) {
            Ok(()) => {
                tracing::info!(
                    events = events.len(),
                    "usage journal of a stopped process taken over"
                );
                segment.done();
            }
            Err(e) => {
                tracing::error!(error = %e, "usage journal of a stopped process left in place: the spool is not writable")
            }
        }
    }
}

/// Starts the writer on a thread of its own, below the gateway's priority (nice
/// 5): a request waking while a batch insert runs takes the core at once. That cut
/// the p99 at concurrency 1 from about 190 to 100 us on the bench machine. Nice 10
/// gave 70 us, but a quarter of a saturated core (nice 5) is what keeps the writer
/// level with 40,000 requests a second; at 10 its backlog grew RSS to 126 MB over a
/// 10-second burst at concurrency 64. Its own small pool keeps the database work
/// (SQLite's worker threads, PostgreSQL's sockets) at that priority too; `db` is
/// used when that pool cannot open, and for in-memory SQLite. A writer that cannot
/// start fails the start of the service: events would otherwise only pile up.
pub fn spawn_writer(
    db: Db,
    url: &str,
    spool: PathBuf,
    instance: &str,
) -> anyhow::Result<UsageSink> {
    let sink = UsageSink::default();
    match Journal::open(&journal_dir(&spool), instance) {
        Ok(j) => {
            sink.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .journal = Some(j)
        }
        Err(e) => {
            tracing::error!(error = %e, "usage journal not opened: events are kept in memory until written")
        }
    }
    // A spool the last run left is charged but not written yet.
    let left = read_spool(&spool);
    sink.unwritten.adjust(&left, 1);
    spool_gauges(&spool, Some(left.len()));
    let drained = sink.clone();
    let url = url.to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("sluice-usage".into())
        .spawn(move || {
            crate::priority::background(5);
            rt.block_on(async move {
                let db = if url.contains(":memory:") {
                    db
                } else {
                    match Db::open(&url, Some(2), db.timeout).await {
                        Ok(own) => own,
                        Err(e) => {
                            tracing::warn!(error = %e, "usage writer: sharing the main pool");
                            db
                        }
                    }
                };
                write_loop(Store::open(db, &url).await, spool, drained).await
            })
        })?;
    Ok(sink)
}

/// Where the writer writes: the database, and on PostgreSQL a pool of typed
/// connections of its own, for `COPY` (sqlx's `Any` driver has none).
struct Store {
    db: Db,
    copy: Option<sqlx::PgPool>,
}

impl std::ops::Deref for Store {
    type Target = Db;
    fn deref(&self) -> &Db {
        &self.db
    }
}

impl Store {
    /// `url` is `db`'s. Without the `COPY` pool a fresh batch is inserted as
    /// any other.
    async fn open(db: Db, url: &str) -> Store {
        let copy = match db.engine {
            Engine::Sqlite => None,
            Engine::Postgres => super::db::ping_when_idle(sqlx::postgres::PgPoolOptions::new())
                .max_connections(2)
                .acquire_timeout(db.timeout)
                .connect(url)
                .await
                .inspect_err(
                    |e| tracing::warn!(error = %e, "usage writer: no COPY pool, inserting instead"),
                )
                .ok(),
        };
        Store { db, copy }
    }
}

async fn write_loop(db: Store, spool: PathBuf, drained: UsageSink) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let tally = &drained.unwritten;
    loop {
        tick.tick().await;
        replay(&db, &spool, tally).await;
        let (batch, sealed) = drained.take();
        let m = crate::metrics::global();
        if let Some(oldest) = batch.iter().map(|e| e.at_ms).filter(|&t| t > 0).min() {
            m.usage_lag.set((now_ms() - oldest).max(0) as f64 / 1000.0);
        }
        let started = std::time::Instant::now();
        let kept = write_or_spool(&db, &spool, &batch, tally).await;
        if !batch.is_empty() {
            m.usage_write.observe(started.elapsed().as_secs_f64());
            m.usage_queue.sub(batch.len() as i64);
        }
        // Stored or spooled: the journal's copy has done its work. Else it is
        // the only one, and goes to the disk.
        match (kept, sealed) {
            (true, Some(s)) => {
                if let Some(emptied) = s.done() {
                    drained.reuse(emptied);
                }
            }
            (false, Some(s)) => s.keep(),
            (_, None) => {}
        }
    }
}

/// The spool's size on the gauges (`events`: its count, when known).
fn spool_gauges(spool: &Path, events: Option<usize>) {
    let m = crate::metrics::global();
    let bytes = std::fs::metadata(spool).map_or(0, |md| md.len());
    m.usage_spool_bytes.set(bytes as i64);
    match events {
        Some(n) => m.usage_spool_events.set(n as i64),
        None if bytes == 0 => m.usage_spool_events.set(0),
        None => {}
    }
}

/// Counts what became of `n` usage events.
fn count(result: &'static str, n: usize) {
    let m = crate::metrics::global();
    m.usage_events.with_label_values(&[result]).inc_by(n as u64);
}

/// Counts a failed database write of the usage writer.
fn db_error(op: &'static str) {
    crate::metrics::global()
        .db_errors
        .with_label_values(&[op])
        .inc();
}

/// Splits a batch into the chunks one statement writes: on SQLite a few fixed
/// sizes (one cached statement each); on PostgreSQL, whose statement takes the
/// rows as one parameter, any count up to [`PG_ROWS`].
fn chunks(engine: Engine, events: &[UsageEvent]) -> Vec<&[UsageEvent]> {
    match engine {
        Engine::Sqlite => super::db::fixed_chunks(events, &[128, 64, 32, 16, 8, 4, 2, 1]),
        Engine::Postgres => events.chunks(PG_ROWS).collect(),
    }
}

/// The most rows one PostgreSQL statement carries (about 400 bytes each).
const PG_ROWS: usize = 1024;

/// Writes events in chunks; a chunk that fails twice goes to the spool. Returns
/// whether every event is stored or spooled (kept on the disk either way).
async fn write_or_spool(
    db: &Store,
    spool: &Path,
    events: &[UsageEvent],
    tally: &Unwritten,
) -> bool {
    if events.is_empty() {
        return true;
    }
    let m = crate::metrics::global();
    if m.db("usage_write", insert_fresh(db, events, tally))
        .await
        .is_ok()
    {
        count("written", events.len());
        return true;
    }
    let mut kept = true;
    for part in chunks(db.engine, events) {
        if insert(db, part, tally).await.is_ok() {
            count("written", part.len());
            continue;
        }
        db_error("usage_write");
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Err(e) = insert(db, part, tally).await {
            db_error("usage_write");
            tracing::error!(error = %e, events = part.len(), "usage events spooled until the database answers");
            if let Err(e) = append_spool(spool, part) {
                kept = false;
                // Not lost: the journal keeps them until a write or a spool works.
                count("unspooled", part.len());
                tracing::error!(error = %e, events = part.len(), path = %spool.display(), "usage events not spooled: the spool is not writable (the journal keeps them)");
            } else {
                count("spooled", part.len());
                m.usage_spool_events.add(part.len() as i64);
                spool_gauges(spool, None);
            }
        } else {
            count("written", part.len());
        }
    }
    kept
}

fn append_spool(spool: &Path, events: &[UsageEvent]) -> std::io::Result<()> {
    if let Some(dir) = spool.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(spool)?;
    let mut buf = Vec::new();
    for e in events {
        serde_json::to_writer(&mut buf, e)?;
        buf.push(b'\n');
    }
    f.write_all(&buf)?;
    f.sync_data()
}

/// The events a spool file holds (none when there is no file).
pub fn read_spool(spool: &Path) -> Vec<UsageEvent> {
    let Ok(text) = std::fs::read_to_string(spool) else {
        return Vec::new();
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Stores what the spool holds; the file goes once every event is stored. Ids make
/// a replay after a partial success harmless. Returns whether the spool is gone.
pub async fn replay(db: &Db, spool: &Path, tally: &Unwritten) -> bool {
    if !spool.exists() {
        return true;
    }
    let events = read_spool(spool);
    spool_gauges(spool, Some(events.len()));
    for part in chunks(db.engine, &events) {
        if crate::metrics::global()
            .db("usage_replay", insert(db, part, tally))
            .await
            .is_err()
        {
            return false;
        }
    }
    match std::fs::remove_file(spool) {
        Ok(()) => {
            tracing::info!(events = events.len(), "usage spool replayed");
            count("replayed", events.len());
            spool_gauges(spool, Some(0));
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "usage spool replayed but not removed");
            false
        }
    }
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// The columns an insert writes, in the order [`bind_events`] binds them.
const COLUMNS: &str = "id, org_id, key_id, route, model, rung, lane, input_tokens, \
     cached_tokens, output_tokens, reasoning_tokens, cost_micro_usd, status, error_class, \
     incomplete, attempts, empty_attempts, latency_ms, free, weighted_tokens, \
     list_micro_usd, created_at, cache_write_tokens, web_search_requests, batch, batch_line, \
     estimated";

/// The insert of `n` events; only ids (and batch lines) not stored yet go in.
/// `returning`: the rows that did go in say what to charge.
///
/// SQLite takes the rows as parameters, 27 to a row. PostgreSQL takes them as
/// one JSON parameter (see [`pg_rows`]): a multi-row `VALUES` costs it an
/// expression per value to set up, and the usage writer shares the host with
/// the requests it records. (A fresh batch goes to PostgreSQL by `COPY`, see
/// [`copy_fresh`], unless the writer has no `COPY` pool.)
fn insert_sql(engine: Engine, n: usize, returning: bool) -> String {
    let rows = match engine {
        Engine::Sqlite => format!("VALUES {}", engine.value_rows(n, 27)),
        Engine::Postgres => {
            format!("SELECT {COLUMNS} FROM json_populate_recordset(NULL::usage_events, $1::json)")
        }
    };
    // Any unique key: the id (a retried write) or the batch line (a line run again).
    let mut sql = format!("INSERT INTO usage_events ({COLUMNS}) {rows} ON CONFLICT DO NOTHING");
    if returning {
        sql.push_str(" RETURNING org_id, lane, cost_micro_usd");
    }
    sql
}

/// `events` bound to `sql` (from [`insert_sql`] for as many events).
fn bind<'q>(engine: Engine, sql: &'q str, events: &[UsageEvent], now: i64) -> AnyQuery<'q> {
    match engine {
        Engine::Sqlite => bind_events(sqlx::query(sql), events, now),
        Engine::Postgres => sqlx::query(sql).bind(pg_rows(events, now)),
    }
}

/// One event as a `usage_events` row: named and typed as the columns are, so
/// `json_populate_recordset` reads it with no conversion of ours in the SQL.
#[derive(Serialize)]
struct EventRow<'a> {
    id: Cow<'a, str>,
    org_id: &'a str,
    key_id: &'a str,
    route: &'a str,
    model: &'a str,
    rung: Option<&'a str>,
    lane: &'a str,
    input_tokens: i64,
    cached_tokens: i64,
    output_tokens: i64,
    reasoning_tokens: i64,
    cost_micro_usd: i64,
    status: i64,
    error_class: Option<&'a str>,
    incomplete: i64,
    attempts: &'a str,
    empty_attempts: i64,
    latency_ms: i64,
    free: i64,
    weighted_tokens: i64,
    list_micro_usd: i64,
    created_at: i64,
    cache_write_tokens: i64,
    web_search_requests: i64,
    batch: i64,
    batch_line: Option<&'a str>,
    estimated: i64,
}

impl<'a> EventRow<'a> {
    /// The row `e` is stored as (`now`: the time of a write with no end time).
    fn of(e: &'a UsageEvent, now: i64) -> EventRow<'a> {
        EventRow {
            id: if e.id.is_empty() {
                Cow::Owned(new_ordered_id("ue"))
            } else {
                Cow::Borrowed(&e.id)
            },
            org_id: &e.org_id,
            key_id: &e.key_id,
            route: &e.route,
            model: &e.model,
            rung: e.rung.as_deref(),
            lane: &e.lane,
            input_tokens: sat(e.input_tokens),
            cached_tokens: sat(e.cached_tokens),
            output_tokens: sat(e.output_tokens),
            reasoning_tokens: sat(e.reasoning_tokens),
            cost_micro_usd: e.cost_micro_usd,
            status: e.status as i64,
            error_class: e.error_class.as_deref(),
            incomplete: e.incomplete as i64,
            attempts: &e.attempts,
            empty_attempts: e.empty_attempts as i64,
            latency_ms: sat(e.latency_ms),
            free: e.free as i64,
            weighted_tokens: e.weighted_tokens,
            list_micro_usd: e.list_micro_usd,
            created_at: if e.at_ms > 0 { e.at_ms } else { now },
            cache_write_tokens: sat(e.cache_write_tokens),
            web_search_requests: sat(e.web_search_requests),
            batch: e.batch as i64,
            batch_line: e.batch_line.as_deref(),
            estimated: e.estimated as i64,
        }
    }

    /// Appends the row as a line of `COPY`'s text format.
    fn copy_line(&self, out: &mut String) {
        use std::fmt::Write as _;
        enum Field<'f> {
            Text(Option<&'f str>),
            Int(i64),
        }
        use Field::{Int, Text};
        let fields = [
            Text(Some(&self.id)),
            Text(Some(self.org_id)),
            Text(Some(self.key_id)),
            Text(Some(self.route)),
            Text(Some(self.model)),
            Text(self.rung),
            Text(Some(self.lane)),
            Int(self.input_tokens),
            Int(self.cached_tokens),
            Int(self.output_tokens),
            Int(self.reasoning_tokens),
            Int(self.cost_micro_usd),
            Int(self.status),
            Text(self.error_class),
            Int(self.incomplete),
            Text(Some(self.attempts)),
            Int(self.empty_attempts),
            Int(self.latency_ms),
            Int(self.free),
            Int(self.weighted_tokens),
            Int(self.list_micro_usd),
            Int(self.created_at),
            Int(self.cache_write_tokens),
            Int(self.web_search_requests),
            Int(self.batch),
            Text(self.batch_line),
            Int(self.estimated),
        ];
        for (i, f) in fields.into_iter().enumerate() {
            if i > 0 {
                out.push('\t');
            }
            match f {
                Int(v) => {
                    let _ = write!(out, "{v}");
                }
                Text(None) => out.push_str("\\N"),
                Text(Some(t)) => {
                    for c in t.chars() {
                        match c {
                            '\\' => out.push_str("\\\\"),
                            '\t' => out.push_str("\\t"),
                            '\n' => out.push_str("\\n"),
                            '\r' => out.push_str("\\r"),
                            c => out.push(c),
                        }
                    }
                }
            }
        }
        out.push('\n');
    }
}

/// The events as a JSON array of [`EventRow`]s (what [`bind_events`] binds on SQLite).
fn pg_rows(events: &[UsageEvent], now: i64) -> String {
    let rows: Vec<EventRow> = events.iter().map(|e| EventRow::of(e, now)).collect();
    serde_json::to_string(&rows).unwrap_or_else(|_| "[]".into())
}

/// A count as the BIGINT columns store it: saturated, never wrapped negative.
fn sat(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn bind_events<'q>(mut q: AnyQuery<'q>, events: &[UsageEvent], now: i64) -> AnyQuery<'q> {
    for e in events {
        let r = EventRow::of(e, now);
        q = q
            .bind(r.id.into_owned())
            .bind(r.org_id.to_owned())
            .bind(r.key_id.to_owned())
            .bind(r.route.to_owned())
            .bind(r.model.to_owned())
            .bind(r.rung.map(str::to_owned))
            .bind(r.lane.to_owned())
            .bind(r.input_tokens)
            .bind(r.cached_tokens)
            .bind(r.output_tokens)
            .bind(r.reasoning_tokens)
            .bind(r.cost_micro_usd)
            .bind(r.status)
            .bind(r.error_class.map(str::to_owned))
            .bind(r.incomplete)
            .bind(r.attempts.to_owned())
            .bind(r.empty_attempts)
            .bind(r.latency_ms)
            .bind(r.free)
            .bind(r.weighted_tokens)
            .bind(r.list_micro_usd)
            .bind(r.created_at)
            .bind(r.cache_write_tokens)
            .bind(r.web_search_requests)
            .bind(r.batch)
            .bind(r.batch_line.map(str::to_owned))
            .bind(r.estimated);
    }
    q
}

/// Each org's platform-funded total.
#[derive(Default)]
struct Charges(Vec<(String, i64)>);

impl Charges {
    fn add(&mut self, org: &str, lane: &str, cost: i64) {
        if cost <= 0 || lane != "platform_funded" {
            return;
        }
        match self.0.iter_mut().find(|(o, _)| o == org) {
            Some((_, sum)) => *sum += cost,
            None => self.0.push((org.to_string(), cost)),
        }
    }

    async fn apply<DB: sqlx::Database>(
        self,
        tx: &mut sqlx::Transaction<'_, DB>,
    ) -> anyhow::Result<()>
    where
        i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        String: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    {
        for (org, sum) in self.0 {
            // updated_at is left alone: the balance is not part of the org snapshot
            // every instance polls for.
            sqlx::query("UPDATE orgs SET balance_micro_usd = balance_micro_usd - $1 WHERE id = $2")
                .bind(sum)
                .bind(org)
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }

    /// What `events` draw, by org.
    fn of(events: &[UsageEvent]) -> Charges {
        let mut charges = Charges::default();
        for e in events {
            charges.add(&e.org_id, &e.lane, e.cost_micro_usd);
        }
        charges
    }
}

/// A fresh batch (ids minted for this write), all of it in one transaction: every
/// chunk must go in whole, then the events themselves say what to charge. Any id
/// already stored fails the whole write, which is then made the careful way.
async fn insert_fresh(db: &Store, events: &[UsageEvent], tally: &Unwritten) -> anyhow::Result<()> {
    let now = now_ms();
    if let Some(pg) = &db.copy {
        return copy_fresh(pg, events, now, tally).await;
    }
    let mut tx = db.pool.begin().await?;
    for part in chunks(db.engine, events) {
        let sql = insert_sql(db.engine, part.len(), false);
        let n = bind(db.engine, &sql, part, now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if n != part.len() as u64 {
            anyhow::bail!("an event of a fresh usage batch is already stored (its id, or its batch line run again)");
        }
    }
    Charges::of(events).apply(&mut tx).await?;
    tally.commit(tx, events).await
}

/// A fresh batch on PostgreSQL, by `COPY`: the server parses each row's text
/// straight into the table, with none of an `INSERT`'s per-row executor work
/// (the batch's share of its CPU on the gateway's host is the production
/// configuration's tail). A stored id fails the `COPY`, and with it the write,
/// which is then made the careful way.
async fn copy_fresh(
    pg: &sqlx::PgPool,
    events: &[UsageEvent],
    now: i64,
    tally: &Unwritten,
) -> anyhow::Result<()> {
    let mut tx = pg.begin().await?;
    let mut copy = tx
        .copy_in_raw(&format!("COPY usage_events ({COLUMNS}) FROM STDIN"))
        .await?;
    copy.send(copy_rows(events, now)).await?;
    let n = copy.finish().await?;
    if n != events.len() as u64 {
        anyhow::bail!("COPY stored {n} of {} usage events", events.len());
    }
    Charges::of(events).apply(&mut tx).await?;
    tally.commit(tx, events).await
}

/// Inserts a chunk and draws each org's platform-funded cost of the rows the
/// database reports inserted, in one transaction: a retried or replayed chunk can
/// neither lose an event nor charge it twice.
async fn insert(db: &Db, events: &[UsageEvent], tally: &Unwritten) -> anyhow::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let sql = insert_sql(db.engine, events.len(), true);
    let q = bind(db.engine, &sql, events, now_ms());
    let mut tx = db.pool.begin().await?;
    let mut charges = Charges::default();
    for row in &q.fetch_all(&mut *tx).await? {
        let (org, lane): (String, String) = (row.get("org_id"), row.get("lane"));
        charges.add(&org, &lane, row.get("cost_micro_usd"));
    }
    charges.apply(&mut tx).await?;
    // Every event of the chunk is stored now, inserted here or before.
    tally.commit(tx, events).await
}

/// The events in `COPY`'s text format: one line each, the [`EventRow`]'s
/// values in [`COLUMNS`]' order, tab-separated, `\N` for NULL.
fn copy_rows(events: &[UsageEvent], now: i64) -> Vec<u8> {
    let mut out = String::with_capacity(events.len() * 200);
    for e in events {
        EventRow::of(e, now).copy_line(&mut out);
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests;
