//! The ingest rows and their moves (SPEC "States and transitions"):
//! `awaiting_bytes` → (PUT) `uploading` → `uploaded` → (finalize) `accepted` →
//! (worker) `done` | `error`; a pull is created `accepted` and finished in its
//! request. Every move is one conditional UPDATE, so two requests or two instances
//! racing for the same move find one winner.

use crate::error::Error;
use crate::store::db::{opt_i64, Engine};
use crate::store::{new_id, now_ms, Db};
use crate::telemetry::model::Trace;
use serde_json::{json, Value};
use sqlx::any::AnyRow;
use sqlx::Row;

/// An upload whose PUT started this long ago and never ended (its instance died)
/// may be started again.
pub const UPLOAD_STALE_MS: i64 = 15 * 60 * 1000;

#[derive(Clone, Debug)]
pub struct Ingest {
    pub id: String,
    pub org_id: String,
    pub origin: String,
    pub transport_kind: Option<String>,
    pub source_kind: String,
    pub source_label: String,
    pub status: String,
    pub object_key: String,
    pub byte_size: Option<i64>,
    pub sha256: Option<String>,
    pub trace_count: Option<i64>,
    pub span_count: Option<i64>,
    pub error: Option<String>,
    pub expires_at: i64,
    pub attempts: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
}

const COLS: &str = "id, org_id, origin, transport_kind, source_kind, source_label, status, \
    object_key, byte_size, sha256, trace_count, span_count, error, expires_at, attempts, \
    created_at, updated_at, finished_at";

fn from_row(r: &AnyRow) -> Ingest {
    let s = |c: &str| r.try_get::<String, _>(c).unwrap_or_default();
    let o = |c: &str| r.try_get::<Option<String>, _>(c).ok().flatten();
    Ingest {
        id: s("id"),
        org_id: s("org_id"),
        origin: s("origin"),
        transport_kind: o("transport_kind"),
        source_kind: s("source_kind"),
        source_label: s("source_label"),
        status: s("status"),
        object_key: s("object_key"),
        byte_size: opt_i64(r, "byte_size"),
        sha256: o("sha256"),
        trace_count: opt_i64(r, "trace_count"),
        span_count: opt_i64(r, "span_count"),
        error: o("error"),
        expires_at: opt_i64(r, "expires_at").unwrap_or(0),
        attempts: opt_i64(r, "attempts").unwrap_or(0),
        created_at: opt_i64(r, "created_at").unwrap_or(0),
        updated_at: opt_i64(r, "updated_at").unwrap_or(0),
        finished_at: opt_i64(r, "finished_at"),
    }
}

impl Ingest {
    /// The ingest as the list and the answers show it.
    pub fn to_json(&self) -> Value {
        json!({
            "ingest_id": self.id,
            "origin": self.origin,
            "transport_kind": self.transport_kind,
            "source_kind": self.source_kind,
            "source_label": self.source_label,
            "status": self.status,
            "byte_size": self.byte_size,
            "sha256": self.sha256,
            "trace_count": self.trace_count,
            "span_count": self.span_count,
            "error": self.error,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        })
    }
}

pub struct NewIngest<'a> {
    pub org_id: &'a str,
    pub origin: &'a str,
    pub transport_kind: Option<&'a str>,
    pub source_kind: &'a str,
    pub source_label: &'a str,
    pub status: &'a str,
    pub expires_at: i64,
}

/// The org's upload tickets issued and not yet used (nor expired).
pub(crate) async fn open_tickets(db: &Db, org_id: &str) -> Result<i64, Error> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS n FROM telemetry_ingests WHERE org_id = $1 \
         AND status IN ('awaiting_bytes', 'uploading') AND expires_at > $2",
    )
    .bind(org_id)
    .bind(now_ms())
    .fetch_one(&db.pool)
    .await
    .map_err(Error::db("telemetry tickets"))?;
    Ok(row.get("n"))
}

pub(crate) async fn create(db: &Db, n: NewIngest<'_>) -> Result<Ingest, Error> {
    let id = new_id("ing");
    let key = format!("telemetry/{}/{id}", n.org_id);
    let now = now_ms();
    sqlx::query(
        "INSERT INTO telemetry_ingests (id, org_id, origin, transport_kind, source_kind, \
         source_label, status, object_key, expires_at, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10)",
    )
    .bind(&id)
    .bind(n.org_id)
    .bind(n.origin)
    .bind(n.transport_kind)
    .bind(n.source_kind)
    .bind(n.source_label)
    .bind(n.status)
    .bind(&key)
    .bind(n.expires_at)
    .bind(now)
    .execute(&db.pool)
    .await
    .map_err(Error::db("creating an ingest"))?;
    get(db, &id).await?.ok_or_else(|| Error::Db {
        what: "reading a new ingest",
        source: sqlx::Error::RowNotFound,
    })
}

pub(crate) async fn get(db: &Db, id: &str) -> Result<Option<Ingest>, Error> {
    let row = sqlx::query(&format!(
        "SELECT {COLS} FROM telemetry_ingests WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&db.pool)
    .await
    .map_err(Error::db("reading an ingest"))?;
    Ok(row.as_ref().map(from_row))
}

/// Claims the one PUT a ticket allows: `awaiting_bytes` (or an upload whose
/// instance died) → `uploading`. False when another PUT has it or it is done.
pub(crate) async fn begin_upload(db: &Db, id: &str) -> Result<bool, Error> {
    let now = now_ms();
    let r = sqlx::query(
        "UPDATE telemetry_ingests SET status = 'uploading', upload_started_at = $2, updated_at = $2 \
         WHERE id = $1 AND (status = 'awaiting_bytes' \
         OR (status = 'uploading' AND upload_started_at < $3))",
    )
    .bind(id)
    .bind(now)
    .bind(now - UPLOAD_STALE_MS)
    .execute(&db.pool)
    .await
    .map_err(Error::db("starting an upload"))?;
    Ok(r.rows_affected() == 1)
}

/// The PUT stored its bytes: `uploading` → `uploaded`, with their size and hash.
pub(crate) async fn end_upload(db: &Db, id: &str, size: i64, sha256: &str) -> Result<bool, Error> {
    let r = sqlx::query(
        "UPDATE telemetry_ingests SET status = 'uploaded', byte_size = $2, sha256 = $3, updated_at = $4 \
         WHERE id = $1 AND status = 'uploading'",
    )
    .bind(id)
    .bind(size)
    .bind(sha256)
    .bind(now_ms())
    .execute(&db.pool)
    .await
    .map_err(Error::db("ending an upload"))?;
    Ok(r.rows_affected() == 1)
}

/// The PUT failed and stored nothing: the ticket may be used again.
pub(crate) async fn reset_upload(db: &Db, id: &str) -> Result<(), Error> {
    sqlx::query(
        "UPDATE telemetry_ingests SET status = 'awaiting_bytes', upload_started_at = NULL, updated_at = $2 \
         WHERE id = $1 AND status = 'uploading'",
    )
    .bind(id)
    .bind(now_ms())
    .execute(&db.pool)
    .await
    .map_err(Error::db("resetting an upload"))?;
    Ok(())
}

/// Finalize: `awaiting_bytes` or `uploaded` → `accepted`; any later state is left
/// as it is (finalize is idempotent). The ingest as it stands after.
pub(crate) async fn finalize(db: &Db, id: &str) -> Result<Option<Ingest>, Error> {
    sqlx::query(
        "UPDATE telemetry_ingests SET status = 'accepted', claimed_by = NULL, claim_until = NULL, updated_at = $2 \
         WHERE id = $1 AND status IN ('awaiting_bytes', 'uploaded')",
    )
    .bind(id)
    .bind(now_ms())
    .execute(&db.pool)
    .await
    .map_err(Error::db("finalizing an ingest"))?;
    get(db, id).await
}

/// Claims the oldest accepted ingest nobody holds (or whose holder's lease ran
/// out) for `lease_ms`. On PostgreSQL the pick skips rows another instance is
/// claiming at that moment (`FOR UPDATE SKIP LOCKED`); SQLite runs one write at a
/// time, so the single statement is the claim.
pub(crate) async fn claim(db: &Db, claimer: &str, lease_ms: i64) -> Result<Option<Ingest>, Error> {
    let now = now_ms();
    let lock = if db.engine == Engine::Postgres {
        " FOR UPDATE SKIP LOCKED"
    } else {
        ""
    };
    let sql = format!(
        "UPDATE telemetry_ingests SET claimed_by = $1, claim_until = $2, attempts = attempts + 1, updated_at = $3 \
         WHERE id = (SELECT id FROM telemetry_ingests WHERE status = 'accepted' \
           AND (claim_until IS NULL OR claim_until < $3) ORDER BY updated_at LIMIT 1{lock}) \
         AND status = 'accepted' AND (claim_until IS NULL OR claim_until < $3) \
         RETURNING {COLS}"
    );
    let row = sqlx::query(&sql)
        .bind(claimer)
        .bind(now + lease_ms)
        .bind(now)
        .fetch_optional(&db.pool)
        .await
        .map_err(Error::db("claiming an ingest"))?;
    Ok(row.as_ref().map(from_row))
}

/// Uploads finalized and not yet parsed (the queue the workers drain).
pub(crate) async fn waiting(db: &Db) -> Result<i64, Error> {
    use sqlx::Row;
    let row = sqlx::query("SELECT COUNT(*) AS n FROM telemetry_ingests WHERE status = 'accepted'")
        .fetch_one(&db.pool)
        .await
        .map_err(Error::db("counting waiting ingests"))?;
    row.try_get::<i64, _>("n")
        .map_err(Error::db("counting waiting ingests"))
}

/// Ends a claimed ingest in error, if the claim is still ours.
pub(crate) async fn fail(
    db: &Db,
    id: &str,
    claimer: Option<&str>,
    reason: &str,
) -> Result<(), Error> {
    let now = now_ms();
    let reason: String = reason.chars().take(500).collect();
    sqlx::query(
        "UPDATE telemetry_ingests SET status = 'error', error = $2, claim_until = NULL, \
         updated_at = $3, finished_at = $3 \
         WHERE id = $1 AND status IN ('accepted', 'pulling') AND ($4 = '' OR claimed_by = $4)",
    )
    .bind(id)
    .bind(reason)
    .bind(now)
    .bind(claimer.unwrap_or(""))
    .execute(&db.pool)
    .await
    .map_err(Error::db("failing an ingest"))?;
    Ok(())
}

/// Stores the projected traces and marks the ingest `done`, in one transaction,
/// only while the claim is still ours: a crash before the commit leaves nothing
/// (the ingest is claimed again when the lease runs out), and a second worker
/// whose lease overlapped finds the row moved and rolls back its copy. The unique
/// (ingest, trace id) index is the last guard against counting a trace twice.
pub(crate) async fn complete(
    db: &Db,
    ingest: &Ingest,
    claimer: Option<&str>,
    byte_size: i64,
    sha256: &str,
    traces: &[Trace],
) -> Result<bool, Error> {
    let now = now_ms();
    let mut tx = db
        .pool
        .begin()
        .await
        .map_err(Error::db("opening a transaction"))?;
    const PER: usize = 64;
    for chunk in traces.chunks(PER) {
        let mut sql = String::from(
            "INSERT INTO telemetry_traces (id, org_id, ingest_id, trace_id, name, started_at, ended_at, \
             span_count, model, provider, input_tokens, output_tokens, cost_micro_usd, tags, spans, created_at) VALUES ",
        );
        sql.push_str(&db.engine.value_rows(chunk.len(), 16));
        let mut q = sqlx::query(&sql);
        for t in chunk {
            q = q
                .bind(new_id("trc"))
                .bind(&ingest.org_id)
                .bind(&ingest.id)
                .bind(t.trace_id.chars().take(200).collect::<String>())
                .bind(
                    t.display_name()
                        .map(|n| n.chars().take(300).collect::<String>()),
                )
                .bind(t.started_at())
                .bind(t.ended_at())
                .bind(t.spans.len() as i64)
                .bind(t.model().map(str::to_string))
                .bind(t.provider().map(str::to_string))
                .bind(t.input_tokens())
                .bind(t.output_tokens())
                .bind(t.cost_micro_usd())
                .bind(serde_json::to_string(&t.tags).unwrap_or_else(|_| "[]".into()))
                .bind(serde_json::to_string(&t.spans).unwrap_or_else(|_| "[]".into()))
                .bind(now);
        }
        q.execute(&mut *tx)
            .await
            .map_err(Error::db("storing traces"))?;
    }
    let spans: i64 = traces.iter().map(|t| t.spans.len() as i64).sum();
    let moved = sqlx::query(
        "UPDATE telemetry_ingests SET status = 'done', trace_count = $2, span_count = $3, byte_size = $4, \
         sha256 = $5, claim_until = NULL, error = NULL, updated_at = $6, finished_at = $6 \
         WHERE id = $1 AND status IN ('accepted', 'pulling') AND ($7 = '' OR claimed_by = $7)",
    )
    .bind(&ingest.id)
    .bind(traces.len() as i64)
    .bind(spans)
    .bind(byte_size)
    .bind(sha256)
    .bind(now)
    .bind(claimer.unwrap_or(""))
    .execute(&mut *tx)
    .await
    .map_err(Error::db("finishing an ingest"))?;
    if moved.rows_affected() != 1 {
        let _ = tx.rollback().await;
        return Ok(false);
    }
    tx.commit().await.map_err(Error::db("committing traces"))?;
    Ok(true)
}

/// One page of the org's ingests, newest first, with the org's totals.
pub(crate) async fn list(
    db: &Db,
    org_id: &str,
    limit: i64,
    offset: i64,
) -> Result<(Vec<Ingest>, i64, i64), Error> {
    let rows = sqlx::query(&format!(
        "SELECT {COLS} FROM telemetry_ingests WHERE org_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2 OFFSET $3"
    ))
    .bind(org_id)
    .bind(limit)
    .bind(offset)
    .fetch_all(&db.pool)
    .await
    .map_err(Error::db("listing ingests"))?;
    let totals = sqlx::query(
        "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(CASE WHEN status = 'done' THEN trace_count ELSE 0 END), 0) AS BIGINT) AS t \
         FROM telemetry_ingests WHERE org_id = $1",
    )
    .bind(org_id)
    .fetch_one(&db.pool)
    .await
    .map_err(Error::db("counting ingests"))?;
    let n = totals.try_get::<i64, _>("n").unwrap_or(0);
    let t = totals.try_get::<i64, _>("t").unwrap_or(0);
    Ok((rows.iter().map(from_row).collect(), n, t))
}

/// One page of an ingest's projected traces.
pub(crate) async fn traces(
    db: &Db,
    ingest_id: &str,
    limit: i64,
    offset: i64,
) -> Result<Vec<Value>, Error> {
    let rows = sqlx::query(
        "SELECT trace_id, name, started_at, ended_at, span_count, model, provider, input_tokens, \
         output_tokens, cost_micro_usd, tags, spans FROM telemetry_traces WHERE ingest_id = $1 \
         ORDER BY started_at, trace_id LIMIT $2 OFFSET $3",
    )
    .bind(ingest_id)
    .bind(limit)
    .bind(offset)
    .fetch_all(&db.pool)
    .await
    .map_err(Error::db("reading traces"))?;
    Ok(rows
        .iter()
        .map(|r| {
            let js = |c: &str| {
                r.try_get::<String, _>(c)
                    .ok()
                    .and_then(|s| serde_json::from_str::<Value>(&s).ok())
                    .unwrap_or(Value::Null)
            };
            json!({
                "trace_id": r.try_get::<String, _>("trace_id").unwrap_or_default(),
                "name": r.try_get::<Option<String>, _>("name").ok().flatten(),
                "started_at": opt_i64(r, "started_at"),
                "ended_at": opt_i64(r, "ended_at"),
                "span_count": opt_i64(r, "span_count"),
                "model": r.try_get::<Option<String>, _>("model").ok().flatten(),
                "provider": r.try_get::<Option<String>, _>("provider").ok().flatten(),
                "input_tokens": opt_i64(r, "input_tokens"),
                "output_tokens": opt_i64(r, "output_tokens"),
                "cost_usd": opt_i64(r, "cost_micro_usd").map(|c| c as f64 / 1e6),
                "tags": js("tags"),
                "spans": js("spans"),
            })
        })
        .collect())
}
