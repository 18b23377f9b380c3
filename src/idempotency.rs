//! Idempotency-Key on the chat and responses routes.
//!
//! The first request with a key claims it in the database (one row per org and
//! key, owned by this instance) and its answer is taped as the client received it,
//! stream frames included; once it ends, the tape is stored and any exact retry
//! replays it without calling a provider or billing again. A retry with another
//! body is 409 `idempotency_conflict`. A concurrent duplicate waits for the first.
//! A claim whose owner is gone (its instance restarted before the answer was
//! stored; liveness is a heartbeat marker in the counters store, shared through
//! Redis) can never be replayed: 409 `idempotency_replay_unavailable`.
//!
//! Only answers that may have been billed are kept: a request refused before any
//! content (a gate, a validation error, every rung failing) releases its key, so a
//! retry runs anew. An answer over `limits.idempotency_max_tape_bytes` is not
//! stored: its key stays claimed as `unavailable` (a retry must not bill again)
//! and a retry gets `idempotency_replay_unavailable`. Expired rows are swept in
//! batches every minute by every instance (deletes of the same rows are harmless).
//!
//! The flow reaches it through the hook seam (`Claims`): the claim before the
//! gates (or the replay that answers the request), the tape as the answer goes
//! out, the record once it settles.

use crate::downstream::answer::Tape;
use crate::hooks::{Arrival, Before, Go, HookFor, RequestHook, Settled, Step};
use crate::state::AppState;
use crate::store::instances::Liveness;
use crate::store::now_ms;
use pingora::http::ResponseHeader;
use sha2::{Digest, Sha256};
use sluice_filters::{ApiError, ErrorCode, Route};
use sqlx::Row;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The feature as registered: a request on the chat or responses route with an
/// Idempotency-Key header claims it.
pub(crate) struct Claims {
    state: Arc<AppState>,
}

impl Claims {
    pub(crate) fn new(state: Arc<AppState>) -> Claims {
        Claims { state }
    }
}

impl HookFor for Claims {
    fn on_arrival(&self, a: &Arrival<'_>) -> Option<Box<dyn RequestHook>> {
        if !matches!(a.route, Route::Chat | Route::Responses) {
            return None;
        }
        let header = a.headers.get(&HEADER)?;
        Some(Box::new(Claiming {
            state: self.state.clone(),
            key: key_of(header),
            ticket: None,
            tape: None,
        }))
    }
}

/// One request's key: claimed before the gates, its answer taped.
struct Claiming {
    state: Arc<AppState>,
    key: Result<String, ApiError>,
    ticket: Option<Ticket>,
    /// What went to the client; dropped (`None`) once it outgrows
    /// `limits.idempotency_max_tape_bytes`.
    tape: Option<Box<Tape>>,
}

impl RequestHook for Claiming {
    fn before<'a>(&'a mut self, b: &'a mut Before<'_>) -> Step<'a, Result<Go, ApiError>> {
        Box::pin(async move {
            let key = std::mem::replace(&mut self.key, Ok(String::new()))?;
            let state = &*self.state;
            let claimed = claim(state, &b.org.id, &key, b.route.label(), b.body, b.deadline).await;
            let result = match &claimed {
                Ok(Claim::Fresh(_)) => "fresh",
                Ok(Claim::Replay(_)) => "replay",
                Err(_) => "refused",
            };
            state.metrics.idempotency.with_label_values(&[result]).inc();
            match claimed? {
                Claim::Replay(tape) => Ok(Go::Replay(tape)),
                Claim::Fresh(t) => {
                    self.ticket = Some(t);
                    self.tape = Some(Box::default());
                    Ok(Go::On)
                }
            }
        })
    }

    fn header(&mut self, h: &mut ResponseHeader) {
        if let Some(t) = self.tape.as_deref_mut() {
            t.status = h.status.as_u16();
            t.headers = h
                .headers
                .iter()
                .filter(|(n, _)| *n != http::header::CONTENT_LENGTH)
                .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
                .collect();
        }
    }

    fn wrote(&mut self, bytes: &[u8]) {
        let cap = self.state.config.limits.idempotency_max_tape_bytes;
        if let Some(t) = self.tape.as_deref_mut() {
            if t.body.len().saturating_add(bytes.len()) > cap {
                // Too large to keep for a replay: free it now, not at the end.
                self.tape = None;
            } else {
                t.body.extend_from_slice(bytes);
            }
        }
    }

    fn after<'a>(self: Box<Self>, s: &'a Settled<'a>) -> Step<'a, ()> {
        Box::pin(async move {
            if let Some(t) = self.ticket {
                finish(&self.state, t, self.tape.as_deref(), s.billed).await;
            }
        })
    }
}

static HEADER: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// A concurrent duplicate's first wait; each next one doubles, up to `POLL_MAX`.
const POLL: Duration = Duration::from_millis(25);
const POLL_MAX: Duration = Duration::from_secs(1);
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Rows one sweep statement deletes: short statements, short locks.
const SWEEP_BATCH: i64 = 1_000;

/// The wait after `d` while a duplicate waits for the first request.
fn next_poll(d: Duration) -> Duration {
    (d * 2).min(POLL_MAX)
}

/// Deletes expired rows, `batch` at a time; returns how many went.
pub(crate) async fn sweep_expired(
    db: &crate::store::Db,
    now: i64,
    batch: i64,
) -> anyhow::Result<u64> {
    let mut total = 0;
    loop {
        let gone = sqlx::query(
            "DELETE FROM idempotency_keys WHERE (org_id, idem_key) IN \
             (SELECT org_id, idem_key FROM idempotency_keys WHERE expires_at <= $1 LIMIT $2)",
        )
        .bind(now)
        .bind(batch)
        .execute(&db.pool)
        .await?
        .rows_affected();
        total += gone;
        if gone < u64::try_from(batch).unwrap_or(0) {
            return Ok(total);
        }
        // Let other writers in between batches.
        tokio::task::yield_now().await;
    }
}

/// Sweeps expired rows every minute while the process runs.
pub(crate) fn spawn_sweep(db: crate::store::Db) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = sweep_expired(&db, now_ms(), SWEEP_BATCH).await {
                tracing::warn!(error = %e, "idempotency sweep failed");
            }
        }
    });
}

/// The request's Idempotency-Key: 1 to 255 visible ASCII characters.
fn key_of(v: &http::HeaderValue) -> Result<String, ApiError> {
    match v.to_str() {
        Ok(k) if (1..=255).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()) => {
            Ok(k.to_string())
        }
        _ => Err(ApiError::invalid_parameter(
            "Idempotency-Key",
            "the Idempotency-Key header must be 1 to 255 visible ASCII characters",
        )),
    }
}

/// A claimed key: this request runs, and its answer is stored under the key.
struct Ticket {
    org_id: String,
    key: String,
}

enum Claim {
    Fresh(Ticket),
    Replay(Tape),
}

fn body_hash(route: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(route.as_bytes());
    h.update([0]);
    h.update(body);
    hex::encode(h.finalize())
}

/// The answer when the store behind Idempotency-Key cannot be reached (or did not
/// answer within `storage.database_timeout_ms`): the guarantee cannot be kept, so
/// the request is not sent, and the client is told to retry (a 503 of SPEC's).
fn store_away(e: sqlx::Error) -> ApiError {
    tracing::error!(error = %e, "idempotency store unavailable");
    ApiError::new(
        ErrorCode::UnavailableRoute,
        "The store that keeps Idempotency-Key results is unavailable, so the request was not sent; retry with backoff.",
    )
    .with_status(503)
}

/// Claims `key` for this request, or answers what an earlier request with it left.
async fn claim(
    state: &AppState,
    org_id: &str,
    key: &str,
    route: &str,
    body: &[u8],
    deadline: Instant,
) -> Result<Claim, ApiError> {
    let hash = body_hash(route, body);
    let db = &state.db;
    let pool = &db.pool;
    let ttl_ms = i64::try_from(
        state
            .config
            .limits
            .idempotency_ttl_seconds
            .saturating_mul(1000),
    )
    .unwrap_or(i64::MAX);
    // A claim older than this can no longer be in flight anywhere.
    let stale_ms =
        i64::try_from(state.config.limits.request_deadline_ms).unwrap_or(i64::MAX) + 30_000;
    let mut poll = POLL;
    loop {
        let now = now_ms();
        let inserted = sqlx::query(
            "INSERT INTO idempotency_keys (org_id, idem_key, route, body_hash, owner, state, \
             created_at, expires_at) VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7) \
             ON CONFLICT DO NOTHING",
        )
        .bind(org_id)
        .bind(key)
        .bind(route)
        .bind(&hash)
        .bind(&state.instance_id)
        .bind(now)
        .bind(now.saturating_add(ttl_ms))
        .execute(pool);
        let inserted = db
            .bounded(inserted)
            .await
            .map_err(store_away)?
            .rows_affected();
        if inserted == 1 {
            return Ok(Claim::Fresh(Ticket {
                org_id: org_id.to_string(),
                key: key.to_string(),
            }));
        }
        let row = sqlx::query(
            "SELECT body_hash, owner, state, status, headers, body, created_at, expires_at \
             FROM idempotency_keys WHERE org_id = $1 AND idem_key = $2",
        )
        .bind(org_id)
        .bind(key)
        .fetch_optional(pool);
        let row = db.bounded(row).await.map_err(store_away)?;
        let Some(row) = row else { continue };
        if row.get::<i64, _>("expires_at") <= now {
            let gone = sqlx::query(
                "DELETE FROM idempotency_keys WHERE org_id = $1 AND idem_key = $2 AND expires_at <= $3",
            )
            .bind(org_id)
            .bind(key)
            .bind(now)
            .execute(pool);
            db.bounded(gone).await.map_err(store_away)?;
            continue;
        }
        if row.get::<String, _>("body_hash") != hash {
            return Err(ApiError::new(
                ErrorCode::IdempotencyConflict,
                "This Idempotency-Key was used with a different request body; use a fresh key for a new request.",
            ));
        }
        match row.get::<String, _>("state").as_str() {
            "done" => return Ok(Claim::Replay(tape_of(&row))),
            "unavailable" => {
                return Err(ApiError::new(
                    ErrorCode::IdempotencyReplayUnavailable,
                    "The original result of this Idempotency-Key was too large to keep for a replay; retry with a new Idempotency-Key.",
                ))
            }
            _ => {}
        }
        let owner: String = row.get("owner");
        let in_flight = now - row.get::<i64, _>("created_at") < stale_ms;
        if !in_flight || !alive(state, &owner).await {
            return Err(ApiError::new(
                ErrorCode::IdempotencyReplayUnavailable,
                "The original result of this Idempotency-Key is gone (the instance serving it stopped before it was stored); retry with a new Idempotency-Key.",
            ));
        }
        if Instant::now() >= deadline {
            return Err(ApiError::new(
                ErrorCode::DeadlineExceeded,
                "The request with this Idempotency-Key is still running; retry later to receive its result.",
            ));
        }
        tokio::time::sleep(poll.min(deadline.saturating_duration_since(Instant::now()))).await;
        poll = next_poll(poll);
    }
}

fn tape_of(row: &sqlx::any::AnyRow) -> Tape {
    let headers = row
        .try_get::<Option<String>, _>("headers")
        .ok()
        .flatten()
        .and_then(|h| serde_json::from_str(&h).ok())
        .unwrap_or_default();
    let body = row
        .try_get::<Option<String>, _>("body")
        .ok()
        .flatten()
        .unwrap_or_default();
    Tape {
        status: row
            .try_get::<Option<i64>, _>("status")
            .ok()
            .flatten()
            .and_then(|s| u16::try_from(s).ok())
            .unwrap_or(200),
        headers,
        body: body.into_bytes(),
    }
}

/// Whether the instance that owns a claim still runs (a store that does not
/// answer leaves it alive: the wait is bounded by the request's deadline).
async fn alive(state: &AppState, owner: &str) -> bool {
    owner == state.instance_id
        || crate::store::instances::liveness(state.counters.as_ref(), &state.db, owner).await
            != Liveness::Gone
}

/// Stores the answer under the key, or releases the key when the request was
/// refused before anything could be billed (`billed` false).
async fn finish(state: &AppState, ticket: Ticket, tape: Option<&Tape>, billed: bool) {
    let pool = &state.db.pool;
    let done =
        match (billed, tape) {
            // Billed, but too large to keep: a retry must neither replay nor run.
            (true, None) => {
                sqlx::query(
                    "UPDATE idempotency_keys SET state = 'unavailable' \
                     WHERE org_id = $1 AND idem_key = $2 AND owner = $3",
                )
                .bind(&ticket.org_id)
                .bind(&ticket.key)
                .bind(&state.instance_id)
                .execute(pool)
                .await
            }
            (true, Some(tape)) => {
                let headers = serde_json::to_string(&tape.headers).unwrap_or_default();
                sqlx::query(
                "UPDATE idempotency_keys SET state = 'done', status = $1, headers = $2, body = $3 \
                 WHERE org_id = $4 AND idem_key = $5 AND owner = $6",
            )
            .bind(i64::from(tape.status))
            .bind(headers)
            .bind(String::from_utf8_lossy(&tape.body).into_owned())
            .bind(&ticket.org_id)
            .bind(&ticket.key)
            .bind(&state.instance_id)
            .execute(pool)
            .await
            }
            _ => sqlx::query(
                "DELETE FROM idempotency_keys WHERE org_id = $1 AND idem_key = $2 AND owner = $3",
            )
            .bind(&ticket.org_id)
            .bind(&ticket.key)
            .bind(&state.instance_id)
            .execute(pool)
            .await,
        };
    if let Err(e) = done {
        tracing::error!(error = %e, "storing an Idempotency-Key result failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_duplicate_backs_off_to_a_second() {
        let mut d = POLL;
        let mut waits = vec![d];
        for _ in 0..8 {
            d = next_poll(d);
            waits.push(d);
        }
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [25, 50, 100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[tokio::test]
    async fn the_sweep_deletes_expired_rows_in_batches_and_keeps_live_ones() {
        let dir = tempfile::tempdir().unwrap();
        let db =
            crate::store::Db::connect(&format!("sqlite://{}", dir.path().join("t.db").display()))
                .await
                .unwrap();
        db.migrate().await.unwrap();
        for (i, expires_at) in [10, 20, 30, 40, 50, 1_000, 2_000].into_iter().enumerate() {
            sqlx::query(
                "INSERT INTO idempotency_keys (org_id, idem_key, route, body_hash, owner, state, \
                 created_at, expires_at) VALUES ('org_1', $1, 'chat', 'h', 'inst', 'done', 0, $2)",
            )
            .bind(format!("k{i}"))
            .bind(expires_at)
            .execute(&db.pool)
            .await
            .unwrap();
        }
        assert_eq!(sweep_expired(&db, 100, 2).await.unwrap(), 5);
        let left: Vec<String> =
            sqlx::query("SELECT idem_key FROM idempotency_keys ORDER BY idem_key")
                .fetch_all(&db.pool)
                .await
                .unwrap()
                .iter()
                .map(|r| r.get("idem_key"))
                .collect();
        assert_eq!(left, ["k5", "k6"]);
    }
}
