//! The batch runner, one in every instance. It claims lines of open batches
//! ([`Claims`]: a lease in the database where several instances share a batch, in
//! memory where the instance runs alone), so a line runs on one at a time.
//!
//! Each line goes to this instance's own gateway over an in-memory connection
//! (`wire`), as a client's request would, with the internal credential naming the batch's key
//! and the line (`state::BATCH_HEADER`): the same validation, waterfall, gates,
//! limits and prices apply, and the usage event is marked batch and names the
//! line. A line is billed once however often it runs: the usage store keeps one
//! event per line (a unique key), so a line whose instance stopped before its
//! answer was recorded simply runs again on the next claimant, and its second
//! event is neither stored nor charged. (A per-line Idempotency-Key would keep
//! the same promise with two more database writes per line, on the line's path.)
//!
//! Throttling: at most `[batches] concurrency` lines in flight per instance; a key
//! with an rpm limit gets at most `key_share` of it from this instance; a 429 of
//! the gates puts the line back and rests the key (tpm and spend limits are met
//! this way). Work past the completion window is expired; a cancelled batch takes
//! no new line and is finalized once its lines in flight end.

use super::batch::counts;
use super::claims::{Claimed, Claims};
use super::files::{self, FileRow};
use super::recorder::{output_line, record, Answered};
use super::wire::{Answer, Lines, Wire};
use crate::state::{AppState, BATCH_HEADER};
use crate::store::db::Engine;
use crate::store::now_ms;
use crate::store::Db;
use serde_json::{json, Value};
use sqlx::Row;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// How long a 429 or an unreachable gateway rests a line (and its key).
const BACKOFF: Duration = Duration::from_secs(1);
/// Rows a finalization reads at a time.
const PAGE: i64 = 1_000;
/// How long a finished batch's lines are kept after its finalization (for an
/// operator's look; the output and error files are what clients read).
const KEEP_LINES: Duration = Duration::from_secs(3600);
/// Line numbers one purge statement covers.
const PURGE_STEP: i64 = 5_000;

struct Runner {
    state: Arc<AppState>,
    /// The runner's own connections on SQLite (at its priority); the main pool on
    /// PostgreSQL.
    db: Db,
    wire: Wire,
    claims: Arc<Claims>,
    permits: Arc<Semaphore>,
    /// When each key (by hash) may start its next line here.
    pace: Mutex<HashMap<String, Instant>>,
    /// Answers on their way to the database (written a few to a transaction).
    answers: tokio::sync::mpsc::Sender<Answered>,
    /// Lines claimed ahead, with their batch: the claimer fills it, the starter
    /// takes from it.
    queue: Mutex<VecDeque<(Arc<Open>, Claimed)>>,
    /// A claim added lines (claimer to starter).
    queued: tokio::sync::Notify,
    /// The queue ran low (starter to claimer).
    low: tokio::sync::Notify,
    /// A batch's last line was recorded (recorder to finalizer).
    finished: Arc<tokio::sync::Notify>,
}

/// How long the runner trusts its list of open batches.
const OPEN_FRESH: Duration = Duration::from_millis(20);
/// How often the open batches are looked at while claimed lines wait to start.
const QUEUED_LOOK: Duration = Duration::from_millis(50);
/// Whether a look found work; a failed look counts as work (logged as `what`), so
/// the next comes at the poll.
fn looked<E: std::fmt::Display>(result: Result<usize, E>, what: &str) -> bool {
    match result {
        Ok(n) => n > 0,
        Err(e) => {
            tracing::warn!(error = %e, "{what}");
            true
        }
    }
}

/// An idle runner's looks: every `batches.poll_ms`, twice as far apart after each
/// look that found nothing, up to this many polls apart (4 s by default). A
/// batch opened in this process wakes its runner at once (`wake`); another
/// instance's batch is found within that. Every look is a database round trip
/// on the instance's cores, so an instance with no batches does not keep the
/// database and its own core busy at the poll's rate.
const IDLE_POLLS: u32 = 8;

/// How long an idle loop waits before its next look.
struct Looks {
    poll: Duration,
    wait: Duration,
}

impl Looks {
    fn new(poll: Duration) -> Looks {
        Looks { poll, wait: poll }
    }

    /// The wait after a look: the poll when it found work, else twice the last
    /// wait (at most `IDLE_POLLS` polls).
    fn after(&mut self, found: bool) -> Duration {
        self.wait = if found {
            self.poll
        } else {
            (self.wait * 2).min(self.poll * IDLE_POLLS)
        };
        self.wait
    }

    /// Work is known to be coming (a batch opened, a last line recorded).
    fn reset(&mut self) {
        self.wait = self.poll;
    }
}

/// An open batch the runner serves.
struct Open {
    id: String,
    key_hash: String,
    endpoint: String,
}

/// Runs the runner; `lines` serves a connection to the gateway for batch lines.
/// It runs on the batch lines' own thread (`server::BatchLines`), at their lower
/// priority, as do the connections it opens: a line's request and its answer
/// pass between the runner and the gateway within one event loop, not between
/// two threads taking turns on the core. On SQLite it opens its own connections there, so their
/// threads run at that priority too.
pub(crate) async fn run(state: Arc<AppState>, lines: Lines) {
    let deadline = Duration::from_millis(state.config.limits.request_deadline_ms);
    let wire = Wire::new(lines, deadline + Duration::from_secs(30));
    let db = match state.db.engine {
        Engine::Sqlite if !state.config.storage.database_url.contains(":memory:") => Db::open(
            &state.config.storage.database_url,
            Some(2),
            state.db.timeout,
        )
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "batch runner: sharing the main pool");
            state.db.clone()
        }),
        _ => state.db.clone(),
    };
    let permits = Arc::new(Semaphore::new(state.config.batches.concurrency));
    let (answers, rx) = tokio::sync::mpsc::channel(1024);
    let finished = Arc::new(tokio::sync::Notify::new());
    let claims = Arc::new(Claims::new(
        db.engine,
        &state.instance_id,
        state.config.batches.lease_ms,
    ));
    tokio::spawn(record(db.clone(), rx, claims.clone(), finished.clone()));
    let runner = Arc::new(Runner {
        state,
        db,
        wire,
        claims,
        permits,
        pace: Mutex::new(HashMap::new()),
        answers,
        queue: Mutex::new(VecDeque::new()),
        queued: tokio::sync::Notify::new(),
        low: tokio::sync::Notify::new(),
        finished,
    });
    runner.run().await
}

impl Runner {
    /// Three loops: the finalizer (every poll, and when a batch's last line is
    /// recorded), the claimer (keeps the queue of
    /// claimed lines topped up) and the starter (a line per free slot). Claims and
    /// finalization passes take database round trips; apart, neither holds a
    /// free slot idle while it waits.
    async fn run(self: Arc<Self>) {
        let poll = Duration::from_millis(self.state.config.batches.poll_ms.max(10));
        let me = self.clone();
        tokio::spawn(async move {
            let mut looks = Looks::new(poll);
            loop {
                let found = if me.serving() {
                    let finalized =
                        looked(me.finalize_ready().await, "batch finalization pass failed");
                    let purged = looked(
                        me.purge_finished().await,
                        "purging finished batches' lines failed",
                    );
                    finalized || purged
                } else {
                    true
                };
                tokio::select! {
                    () = tokio::time::sleep(looks.after(found)) => {}
                    () = me.finished.notified() => looks.reset(),
                }
            }
        });
        let me = self.clone();
        tokio::spawn(async move { me.claim_loop(poll).await });
        loop {
            let Ok(permit) = self.permits.clone().acquire_owned().await else {
                return;
            };
            let mut asked = false;
            let next = loop {
                let notified = self.queued.notified();
                if self.serving() {
                    let popped = self.lock_queue().pop_front();
                    if let Some(next) = popped {
                        break next;
                    }
                }
                // The claimer hears once that the queue is empty (not at every
                // poll: it paces its own looks while there is nothing to claim).
                if !asked {
                    self.low.notify_one();
                    asked = true;
                }
                // Woken by a claim, or looks again after a poll (draining ends).
                let _ = tokio::time::timeout(poll, notified).await;
            };
            if self.lock_queue().len() < self.ahead().1 {
                self.low.notify_one();
            }
            let me = self.clone();
            tokio::spawn(async move {
                let (b, line) = next;
                me.serve_line(&b, line).await;
                drop(permit);
            });
        }
    }

    /// How many lines the queue holds at most, and below how many it is refilled:
    /// sixteen rounds of the slots (at least 16, at most 256), refilled at half.
    /// One claim serves many lines: each claim is a commit, and a commit writes
    /// the pages it touched to the log whole, so fewer, fuller ones cost the
    /// database less per line. What a stopped instance held ahead is claimed again
    /// once its heartbeat lapses; a cancel here drops the batch's queued lines at
    /// once (`wake`), another instance within `QUEUED_LOOK`.
    fn ahead(&self) -> (usize, usize) {
        let ahead = (16 * self.state.config.batches.concurrency).clamp(16, 256);
        (ahead, ahead / 2)
    }

    /// Whether this instance runs lines now (not draining, its gateway up).
    fn serving(&self) -> bool {
        self.state.gateway_up() && !self.state.draining()
    }

    fn lock_queue(&self) -> std::sync::MutexGuard<'_, VecDeque<(Arc<Open>, Claimed)>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps lines claimed ahead (`ahead`); gives the queue back
    /// while the instance drains.
    async fn claim_loop(self: Arc<Self>, poll: Duration) {
        let mut open = (Instant::now() - OPEN_FRESH, Vec::new());
        let mut looks = Looks::new(poll);
        loop {
            let low = self.low.notified();
            if !self.serving() {
                let queued: Vec<_> = self.lock_queue().drain(..).collect();
                for (b, line) in &queued {
                    self.put_back(b, line, Duration::ZERO).await;
                }
                // Not up yet, or draining: a batch opened here says it is up.
                tokio::select! {
                    () = tokio::time::sleep(poll) => {}
                    () = super::wake::changed() => open.0 = Instant::now() - OPEN_FRESH,
                }
                continue;
            }
            let (claimed, failed) = match self.claim_ahead(&mut open).await {
                Ok(n) => (n, false),
                Err(e) => {
                    tracing::warn!(error = %e, "batch claim pass failed");
                    (0, true)
                }
            };
            if claimed > 0 {
                self.queued.notify_one();
            }
            let queued = self.lock_queue().len();
            if claimed == 0 || queued >= self.ahead().1 {
                // Nothing to claim, or enough ahead: until the starter runs low,
                // or a batch opens or is cancelled here. While lines wait in the
                // queue the open batches are looked at every QUEUED_LOOK, so a
                // cancel on another instance stops them soon after; with no
                // batch open anywhere, further apart (`Looks`).
                let busy = failed || claimed > 0 || !open.1.is_empty();
                let wait = if queued > 0 {
                    poll.min(QUEUED_LOOK)
                } else {
                    looks.after(busy)
                };
                tokio::select! {
                    _ = tokio::time::timeout(wait, low) => {}
                    () = super::wake::changed() => {
                        open.0 = Instant::now() - OPEN_FRESH;
                        looks.reset();
                    }
                }
            }
        }
    }

    /// Lines a key may start now (`want` at most).
    fn paced(&self, key_hash: &str, want: usize) -> usize {
        let now = Instant::now();
        let mut pace = self.pace.lock().unwrap_or_else(|p| p.into_inner());
        let next = pace.get(key_hash).copied().unwrap_or(now);
        if next > now {
            return 0;
        }
        let rpm = self
            .state
            .directory
            .authenticate_hash(key_hash)
            .and_then(|(k, _)| k.rpm)
            .filter(|r| *r > 0);
        let Some(rpm) = rpm else {
            return want;
        };
        let share = self.state.config.batches.key_share;
        let per_min = ((rpm as f64) * share).floor().max(1.0);
        let interval = Duration::from_secs_f64(60.0 / per_min);
        // A slot missed while idle is not saved up beyond one.
        let from = next.max(now.checked_sub(interval).unwrap_or(now));
        let k = want
            .min(1 + (now.duration_since(from).as_secs_f64() / interval.as_secs_f64()) as usize);
        pace.insert(key_hash.to_string(), from + interval * k as u32);
        k
    }

    fn rest(&self, key_hash: &str, d: Duration) {
        let mut pace = self.pace.lock().unwrap_or_else(|p| p.into_inner());
        let until = Instant::now() + d;
        let e = pace.entry(key_hash.to_string()).or_insert(until);
        *e = (*e).max(until);
    }

    /// Claims lines ahead into the queue (up to `ahead`); returns
    /// how many. Queued lines of a batch no longer open (cancelled, expired) are
    /// given back unstarted.
    async fn claim_ahead(&self, open: &mut (Instant, Vec<Arc<Open>>)) -> anyhow::Result<usize> {
        // The open batches, read again at most every OPEN_FRESH (a cancel stops this
        // instance's queued lines within it; the claim itself checks the status).
        if open.0.elapsed() >= OPEN_FRESH {
            let db = &self.db;
            let q = sqlx::query(
                "SELECT id, key_hash, endpoint FROM batches \
                 WHERE status = 'in_progress' AND expires_at > $1 ORDER BY created_at LIMIT 16",
            )
            .bind(now_ms())
            .fetch_all(&db.pool);
            open.1 = db
                .bounded(q)
                .await?
                .iter()
                .map(|r| {
                    Arc::new(Open {
                        id: r.get("id"),
                        key_hash: r.get("key_hash"),
                        endpoint: r.get("endpoint"),
                    })
                })
                .collect();
            open.0 = Instant::now();
            let closed: VecDeque<_> = {
                let mut queue = self.lock_queue();
                let (kept, closed) = queue
                    .drain(..)
                    .partition(|(b, _)| open.1.iter().any(|o| o.id == b.id));
                *queue = kept;
                closed
            };
            for (b, line) in &closed {
                self.put_back(b, line, Duration::ZERO).await;
            }
        }
        let (ahead, refill) = self.ahead();
        let mut claimed = 0;
        for b in &open.1 {
            let queued = self.lock_queue().len();
            let room = ahead.saturating_sub(queued);
            if room == 0 || queued >= refill {
                break;
            }
            let want = self.paced(&b.key_hash, room);
            if want == 0 {
                continue;
            }
            let lines = self.claims.claim(&self.db, &b.id, want).await?;
            tracing::debug!(batch = %b.id, want, claimed = lines.len(), "batch lines claimed");
            claimed += lines.len();
            self.lock_queue()
                .extend(lines.into_iter().map(|l| (b.clone(), l)));
        }
        Ok(claimed)
    }

    async fn serve_line(&self, b: &Open, mut line: Claimed) {
        let state = &self.state;
        let credential = format!(
            "{} {} {}:{}",
            state.internal_token(),
            b.key_hash,
            b.id,
            line.line_no
        );
        let headers = [(http::HeaderName::from_static(BATCH_HEADER), credential)];
        let sent = self
            .wire
            .post(&b.endpoint, &headers, std::mem::take(&mut line.body).into())
            .await;
        let Answer {
            status,
            request_id,
            retry_after,
            body: bytes,
        } = match sent {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, batch = %b.id, "a batch line did not reach the gateway or was cut off; it waits");
                self.put_back(b, &line, BACKOFF).await;
                return;
            }
        };
        tracing::debug!(batch = %b.id, line = line.line_no, status, "batch line answered");
        // Limits (429) and a draining instance (503) are waits, not answers.
        let draining = || {
            serde_json::from_slice::<Value>(&bytes)
                .is_ok_and(|v| v.pointer("/error/code") == Some(&json!("gateway_draining")))
        };
        if status == 429 || (status == 503 && draining()) {
            let wait = retry_after.unwrap_or(BACKOFF).min(Duration::from_secs(60));
            self.rest(&b.key_hash, wait);
            self.put_back(b, &line, wait).await;
            return;
        }
        let answered = Answered {
            batch_id: b.id.clone(),
            line_no: line.line_no,
            ok: (200..300).contains(&status),
            output: output_line(&line.custom_id, status, request_id.as_deref(), &bytes),
        };
        if self.answers.send(answered).await.is_err() {
            tracing::warn!(batch = %b.id, "the batch recorder stopped; the line waits");
            self.put_back(b, &line, BACKOFF).await;
        }
    }

    /// Gives a claimed line back, not to be claimed again for `wait`.
    async fn put_back(&self, b: &Open, line: &Claimed, wait: Duration) {
        self.claims
            .put_back(&self.db, &b.id, line.line_no, wait)
            .await;
    }

    /// Finalizes every batch that is ready: all lines done, cancelled with none in
    /// flight, past its window with none in flight, or a finalization whose
    /// instance stopped.
    async fn finalize_ready(&self) -> anyhow::Result<usize> {
        let db = &self.db;
        let now = now_ms();
        let q = sqlx::query(
            "SELECT id, org_id, status, total, expires_at, cancelling_at, final_until, \
             completed_count + failed_count AS done FROM batches \
             WHERE status IN ('in_progress', 'cancelling', 'finalizing') ORDER BY created_at LIMIT 64",
        )
        .fetch_all(&db.pool);
        let rows = db.bounded(q).await?;
        let unfinished = rows.len();
        // The lines the open batches still wait for: the batch queue on /metrics.
        let mut waiting = 0i64;
        for r in rows {
            let id: String = r.get("id");
            let org_id: String = r.get("org_id");
            let status: String = r.get("status");
            let total: i64 = r.get("total");
            let expires_at: i64 = r.get("expires_at");
            let cancelling: Option<i64> = r.get("cancelling_at");
            let final_until: Option<i64> = r.get("final_until");
            let done: i64 = r.get("done");
            let in_flight = self.claims.in_flight(&self.db, &id).await?;
            if status == "in_progress" {
                waiting += (total - done).max(0);
            }
            tracing::debug!(batch = %id, %status, done, in_flight, "batch progress");
            let target = match status.as_str() {
                "in_progress" if done >= total => "completed",
                "in_progress" if now >= expires_at && in_flight == 0 => "expired",
                "cancelling" if in_flight == 0 => "cancelled",
                "finalizing" if final_until.unwrap_or(0) < now => {
                    if cancelling.is_some() {
                        "cancelled"
                    } else if done >= total {
                        "completed"
                    } else {
                        "expired"
                    }
                }
                _ => continue,
            };
            let lease = now + self.state.config.batches.lease_ms as i64;
            let q = sqlx::query(
                "UPDATE batches SET status = 'finalizing', \
                 finalizing_at = COALESCE(finalizing_at, $1), final_by = $2, final_until = $3 \
                 WHERE id = $4 AND status = $5 AND (status <> 'finalizing' OR final_until < $1)",
            )
            .bind(now)
            .bind(&self.state.instance_id)
            .bind(lease)
            .bind(&id)
            .bind(&status)
            .execute(&db.pool);
            if db.bounded(q).await?.rows_affected() != 1 {
                continue;
            }
            if let Err(e) = self.finalize(&id, &org_id, target).await {
                // Its lease lapses and this (or another) instance finishes it.
                tracing::warn!(error = %e, batch = %id, "a batch finalization failed");
            }
        }
        crate::metrics::global().batch_queue.set(waiting);
        Ok(unfinished)
    }

    /// Deletes the lines of batches finalized more than [`KEEP_LINES`] ago (their
    /// files hold the answers), a few batches and [`PURGE_STEP`] line numbers to a
    /// statement at a time; several instances doing it at once delete nothing twice.
    async fn purge_finished(&self) -> anyhow::Result<usize> {
        let db = &self.db;
        let q = sqlx::query(
            "SELECT id, total FROM batches WHERE lines_purged = 0 AND finalizing_at < $1 \
             AND status IN ('completed', 'cancelled', 'expired') LIMIT 4",
        )
        .bind(now_ms() - KEEP_LINES.as_millis() as i64)
        .fetch_all(&db.pool);
        let due = db.bounded(q).await?;
        for r in &due {
            let (id, total): (String, i64) = (r.get("id"), r.get("total"));
            let mut from = 0;
            while from < total {
                for table in ["batch_answers", "batch_lines"] {
                    let sql = format!(
                        "DELETE FROM {table} WHERE batch_id = $1 AND line_no >= $2 AND line_no < $3"
                    );
                    let q = sqlx::query(&sql)
                        .bind(&id)
                        .bind(from)
                        .bind(from + PURGE_STEP)
                        .execute(&db.pool);
                    db.bounded(q).await?;
                }
                from += PURGE_STEP;
            }
            let q = sqlx::query("UPDATE batches SET lines_purged = 1 WHERE id = $1")
                .bind(&id)
                .execute(&db.pool);
            db.bounded(q).await?;
            tracing::debug!(batch = %id, "finished batch's lines deleted");
        }
        Ok(due.len())
    }

    /// Writes the output and error files and ends the batch as `target`.
    async fn finalize(&self, batch_id: &str, org_id: &str, target: &str) -> anyhow::Result<()> {
        let state = &self.state;
        let db = &self.db;
        let tail = batch_id.strip_prefix("batch_").unwrap_or(batch_id);
        let out_id = format!("file-{tail}-output");
        let err_id = format!("file-{tail}-errors");
        let out_key = files::object_key(org_id, &out_id);
        let err_key = files::object_key(org_id, &err_id);
        let mut out = state.objects.writer(&out_key, u64::MAX);
        let mut err = state.objects.writer(&err_key, u64::MAX);
        let (mut outs, mut errs) = (0u64, 0u64);
        let mut after = -1i64;
        loop {
            let q = sqlx::query(
                "SELECT l.line_no, l.custom_id, l.done, l.ok, a.output FROM batch_lines l \
                 LEFT JOIN batch_answers a ON a.batch_id = l.batch_id AND a.line_no = l.line_no \
                 WHERE l.batch_id = $1 AND l.line_no > $2 ORDER BY l.line_no LIMIT $3",
            )
            .bind(batch_id)
            .bind(after)
            .bind(PAGE)
            .fetch_all(&db.pool);
            let rows = db.bounded(q).await?;
            for r in &rows {
                after = r.get("line_no");
                let done: i64 = r.get("done");
                let ok: i64 = r.get("ok");
                let output: Option<String> = r.get("output");
                let mut text = match (done, output) {
                    (1, Some(o)) => o,
                    // Never run: past the window it is an error line; a cancelled
                    // batch leaves it out.
                    _ if target == "expired" => {
                        let custom_id: String = r.get("custom_id");
                        let id: [u8; 12] = rand::random();
                        json!({
                            "id": format!("batch_req_{}", hex::encode(id)),
                            "custom_id": custom_id,
                            "response": null,
                            "error": {
                                "code": "batch_expired",
                                "message": "This request could not be executed before the completion window expired.",
                            },
                        })
                        .to_string()
                    }
                    _ => continue,
                };
                text.push('\n');
                if done == 1 && ok == 1 {
                    outs += 1;
                    out.write(text.into()).await?;
                } else {
                    errs += 1;
                    err.write(text.into()).await?;
                }
            }
            if (rows.len() as i64) < PAGE {
                break;
            }
        }
        if target == "expired" {
            // Lines that never ran count as failed.
            let expire = async {
                let mut tx = db.pool.begin().await?;
                let n = sqlx::query(
                    "UPDATE batch_lines SET done = 1, ok = 0 WHERE batch_id = $1 AND done = 0",
                )
                .bind(batch_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                sqlx::query("UPDATE batches SET failed_count = failed_count + $1 WHERE id = $2")
                    .bind(i64::try_from(n).unwrap_or(i64::MAX))
                    .bind(batch_id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await
            };
            db.bounded(expire).await?;
        }
        let now = now_ms();
        let record = |w: crate::store::objects::ObjectWriter,
                      n: u64,
                      id: String,
                      key: String,
                      kind: &str| {
            let filename = format!("{batch_id}_{kind}.jsonl");
            async move {
                if n == 0 {
                    let mut w = w;
                    w.abort().await;
                    return anyhow::Ok(None);
                }
                let stored = w.finish().await?;
                let f = FileRow {
                    id: id.clone(),
                    purpose: "batch_output".into(),
                    filename,
                    bytes: stored.size as i64,
                    object_key: key,
                    created_at: now,
                };
                files::insert(state, org_id, &f)
                    .await
                    .map_err(|e| anyhow::anyhow!("recording an output file: {}", e.message))?;
                Ok(Some(id))
            }
        };
        let out_file = record(out, outs, out_id, out_key, "output").await?;
        let err_file = record(err, errs, err_id, err_key, "error").await?;
        let stamp = match target {
            "completed" => "completed_at",
            "cancelled" => "cancelled_at",
            _ => "expired_at",
        };
        let sql = format!(
            "UPDATE batches SET status = $1, {stamp} = $2, output_file_id = $3, \
             error_file_id = $4, final_by = NULL, final_until = NULL \
             WHERE id = $5 AND final_by = $6 AND status = 'finalizing'"
        );
        let q = sqlx::query(&sql)
            .bind(target)
            .bind(now)
            .bind(out_file)
            .bind(err_file)
            .bind(batch_id)
            .bind(&state.instance_id)
            .execute(&db.pool);
        db.bounded(q).await?;
        self.claims.forget(batch_id);
        let (ok, failed) = counts(state, batch_id).await.unwrap_or_default();
        tracing::info!(batch = %batch_id, status = target, ok, failed, "batch finalized");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_looks_double_up_to_their_bound_and_work_brings_back_the_poll() {
        let poll = Duration::from_millis(500);
        let mut looks = Looks::new(poll);
        let waits: Vec<u64> = (0..5)
            .map(|_| looks.after(false).as_millis() as u64)
            .collect();
        assert_eq!(waits, [1_000, 2_000, 4_000, 4_000, 4_000]);
        assert_eq!(looks.after(true), poll, "a look that found work");
        looks.after(false);
        looks.reset();
        assert_eq!(looks.after(false), poll * 2, "woken: from the poll again");
    }
}
