//! `/v1/batches`: OpenAI's Batch API. Creating a batch checks its input file line
//! by line as it streams from the object store (`jsonl`), and writes the lines to
//! `batch_lines` for the runner; a file that fails the check leaves the batch
//! `failed` with `errors.data[]`, as OpenAI's do. Reads are per org.

use super::files::{self, FileRow};
use super::jsonl::{Checker, Line, LineError, ENDPOINTS};
use super::{db_err, limit_param, not_found, page, query_param, store_err, Caller};
use crate::state::AppState;
use crate::store::now_ms;
use futures_util::StreamExt;
use serde_json::{json, Value};
use sluice_filters::{ApiError, ErrorCode};
use sqlx::Row;

/// `24h`, the one completion window.
pub(crate) const WINDOW_MS: i64 = 24 * 3600 * 1000;
/// Lines written by one statement.
const INSERT_CHUNK: usize = 200;

/// A batch's row with its line counts.
#[derive(Clone, Debug)]
pub(crate) struct BatchRow {
    pub(crate) id: String,
    pub(crate) endpoint: String,
    pub(crate) input_file_id: String,
    pub(crate) completion_window: String,
    pub(crate) status: String,
    pub(crate) metadata: Option<String>,
    pub(crate) errors: Option<String>,
    pub(crate) total: i64,
    pub(crate) output_file_id: Option<String>,
    pub(crate) error_file_id: Option<String>,
    pub(crate) created_at: i64,
    pub(crate) in_progress_at: Option<i64>,
    pub(crate) expires_at: i64,
    pub(crate) finalizing_at: Option<i64>,
    pub(crate) completed_at: Option<i64>,
    pub(crate) failed_at: Option<i64>,
    pub(crate) expired_at: Option<i64>,
    pub(crate) cancelling_at: Option<i64>,
    pub(crate) cancelled_at: Option<i64>,
    /// Lines served (2xx) and failed so far, kept as the lines are recorded.
    pub(crate) completed_count: i64,
    pub(crate) failed_count: i64,
}

const COLUMNS: &str = "id, endpoint, input_file_id, completion_window, status, metadata, errors, \
    total, output_file_id, error_file_id, created_at, in_progress_at, expires_at, finalizing_at, \
    completed_at, failed_at, expired_at, cancelling_at, cancelled_at, completed_count, failed_count";

fn row(r: &sqlx::any::AnyRow) -> BatchRow {
    BatchRow {
        id: r.get("id"),
        endpoint: r.get("endpoint"),
        input_file_id: r.get("input_file_id"),
        completion_window: r.get("completion_window"),
        status: r.get("status"),
        metadata: r.get("metadata"),
        errors: r.get("errors"),
        total: r.get("total"),
        output_file_id: r.get("output_file_id"),
        error_file_id: r.get("error_file_id"),
        created_at: r.get("created_at"),
        in_progress_at: r.get("in_progress_at"),
        expires_at: r.get("expires_at"),
        finalizing_at: r.get("finalizing_at"),
        completed_at: r.get("completed_at"),
        failed_at: r.get("failed_at"),
        expired_at: r.get("expired_at"),
        cancelling_at: r.get("cancelling_at"),
        cancelled_at: r.get("cancelled_at"),
        completed_count: r.get("completed_count"),
        failed_count: r.get("failed_count"),
    }
}

fn secs(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |m| json!(m / 1000))
}

impl BatchRow {
    fn to_json(&self) -> Value {
        let (completed, failed) = (self.completed_count, self.failed_count);
        let parse = |s: &Option<String>| {
            s.as_deref()
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
                .unwrap_or(Value::Null)
        };
        json!({
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": parse(&self.errors),
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at / 1000,
            "in_progress_at": secs(self.in_progress_at),
            "expires_at": self.expires_at / 1000,
            "finalizing_at": secs(self.finalizing_at),
            "completed_at": secs(self.completed_at),
            "failed_at": secs(self.failed_at),
            "expired_at": secs(self.expired_at),
            "cancelling_at": secs(self.cancelling_at),
            "cancelled_at": secs(self.cancelled_at),
            "request_counts": {
                "total": self.total,
                "completed": completed,
                "failed": failed,
            },
            "metadata": parse(&self.metadata),
        })
    }
}

/// Lines served (2xx) and failed so far (kept on the batch as its lines are
/// recorded).
pub(crate) async fn counts(state: &AppState, batch_id: &str) -> Result<(i64, i64), ApiError> {
    let q = sqlx::query("SELECT completed_count, failed_count FROM batches WHERE id = $1")
        .bind(batch_id)
        .fetch_optional(&state.db.pool);
    let r = state.db.bounded(q).await.map_err(db_err("batch counts"))?;
    Ok(r.map_or((0, 0), |r| {
        (r.get("completed_count"), r.get("failed_count"))
    }))
}

async fn find(state: &AppState, org_id: &str, id: &str) -> Result<Option<BatchRow>, ApiError> {
    let sql = format!("SELECT {COLUMNS} FROM batches WHERE id = $1 AND org_id = $2");
    let q = sqlx::query(&sql)
        .bind(id)
        .bind(org_id)
        .fetch_optional(&state.db.pool);
    let r = state.db.bounded(q).await.map_err(db_err("batch read"))?;
    Ok(r.as_ref().map(row))
}

pub(super) async fn get(state: &AppState, caller: &Caller, id: &str) -> Result<Value, ApiError> {
    let b = find(state, &caller.org.id, id)
        .await?
        .ok_or_else(|| not_found("batch", "batch_id"))?;
    Ok(b.to_json())
}

pub(super) async fn list(
    state: &AppState,
    caller: &Caller,
    query: &str,
) -> Result<Value, ApiError> {
    let limit = limit_param(query, 20, 100)?;
    let after = match query_param(query, "after") {
        Some(a) => Some(
            find(state, &caller.org.id, &a)
                .await?
                .ok_or_else(|| not_found("batch", "after"))?,
        ),
        None => None,
    };
    let mut sql = format!("SELECT {COLUMNS} FROM batches WHERE org_id = $1");
    if after.is_some() {
        sql.push_str(" AND (created_at < $2 OR (created_at = $2 AND id < $3)) LIMIT $4");
    } else {
        sql.push_str(" LIMIT $2");
    }
    // ORDER BY goes before LIMIT.
    let sql = sql.replacen(" LIMIT", " ORDER BY created_at DESC, id DESC LIMIT", 1);
    let mut q = sqlx::query(&sql).bind(&caller.org.id);
    if let Some(a) = &after {
        q = q.bind(a.created_at).bind(&a.id);
    }
    let q = q.bind(limit + 1).fetch_all(&state.db.pool);
    let rows = state.db.bounded(q).await.map_err(db_err("batch list"))?;
    let has_more = rows.len() as i64 > limit;
    let mut data = Vec::new();
    for r in rows.iter().take(limit as usize) {
        data.push(row(r).to_json());
    }
    Ok(page(data, has_more))
}

pub(super) async fn cancel(state: &AppState, caller: &Caller, id: &str) -> Result<Value, ApiError> {
    let now = now_ms();
    let q = sqlx::query(
        "UPDATE batches SET status = 'cancelling', cancelling_at = $1 \
         WHERE id = $2 AND org_id = $3 AND status IN ('validating', 'in_progress')",
    )
    .bind(now)
    .bind(id)
    .bind(&caller.org.id)
    .execute(&state.db.pool);
    state.db.bounded(q).await.map_err(db_err("batch cancel"))?;
    // This process's runner drops the batch's queued lines now.
    super::wake::batches_changed();
    let b = find(state, &caller.org.id, id)
        .await?
        .ok_or_else(|| not_found("batch", "batch_id"))?;
    if !matches!(b.status.as_str(), "cancelling" | "cancelled") {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("A batch with status {} cannot be cancelled.", b.status),
        )
        .with_status(409));
    }
    Ok(b.to_json())
}

fn required(param: &'static str) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, format!("{param} is required.")).param(param)
}

/// `metadata`: up to 16 string pairs, keys to 64 characters, values to 512.
fn metadata(v: Option<&Value>) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m))
            if m.len() <= 16
                && m.iter().all(|(k, v)| {
                    k.chars().count() <= 64 && v.as_str().is_some_and(|s| s.chars().count() <= 512)
                }) =>
        {
            Ok(Some(Value::Object(m.clone()).to_string()))
        }
        Some(_) => Err(ApiError::invalid_parameter(
            "metadata",
            "metadata is up to 16 pairs of strings (keys to 64 characters, values to 512)",
        )),
    }
}

/// `POST /v1/batches`.
pub(super) async fn create(
    state: &AppState,
    caller: &Caller,
    body: Value,
) -> Result<Value, ApiError> {
    let text = |k: &str| body.get(k).and_then(Value::as_str).map(str::to_string);
    let input_file_id = text("input_file_id").ok_or_else(|| required("input_file_id"))?;
    let endpoint = text("endpoint").ok_or_else(|| required("endpoint"))?;
    if !ENDPOINTS.contains(&endpoint.as_str()) {
        return Err(ApiError::invalid_parameter(
            "endpoint",
            format!("endpoint must be one of {}", ENDPOINTS.join(", ")),
        ));
    }
    let window = text("completion_window").ok_or_else(|| required("completion_window"))?;
    if window != "24h" {
        return Err(ApiError::invalid_parameter(
            "completion_window",
            "completion_window must be 24h",
        ));
    }
    let metadata = metadata(body.get("metadata"))?;
    let file = files::find(state, &caller.org.id, &input_file_id)
        .await?
        .ok_or_else(|| not_found("file", "input_file_id"))?;
    if file.purpose != "batch" {
        return Err(ApiError::invalid_parameter(
            "input_file_id",
            "the input file must be uploaded with purpose batch",
        ));
    }
    let id = crate::store::new_id("batch");
    let now = now_ms();
    let q = sqlx::query(
        "INSERT INTO batches (id, org_id, key_id, key_hash, endpoint, input_file_id, \
         completion_window, status, metadata, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'validating', $8, $9, $10)",
    )
    .bind(&id)
    .bind(&caller.org.id)
    .bind(&caller.key.id)
    .bind(&caller.key.hash)
    .bind(&endpoint)
    .bind(&input_file_id)
    .bind(&window)
    .bind(metadata)
    .bind(now)
    .bind(now + WINDOW_MS)
    .execute(&state.db.pool);
    state.db.bounded(q).await.map_err(db_err("batch insert"))?;
    match load_lines(state, &id, &endpoint, &file).await? {
        Ok(total) => {
            let q = sqlx::query(
                "UPDATE batches SET status = 'in_progress', in_progress_at = $1, total = $2 \
                 WHERE id = $3 AND status = 'validating'",
            )
            .bind(now_ms())
            .bind(total as i64)
            .bind(&id)
            .execute(&state.db.pool);
            state.db.bounded(q).await.map_err(db_err("batch start"))?;
            super::wake::batches_changed();
        }
        Err(e) => {
            let del = sqlx::query("DELETE FROM batch_lines WHERE batch_id = $1")
                .bind(&id)
                .execute(&state.db.pool);
            state.db.bounded(del).await.map_err(db_err("batch lines"))?;
            let errors = json!({"object": "list", "data": [e.to_json()]}).to_string();
            let q = sqlx::query(
                "UPDATE batches SET status = 'failed', failed_at = $1, errors = $2 WHERE id = $3",
            )
            .bind(now_ms())
            .bind(errors)
            .bind(&id)
            .execute(&state.db.pool);
            state.db.bounded(q).await.map_err(db_err("batch fail"))?;
        }
    }
    let b = find(state, &caller.org.id, &id)
        .await?
        .ok_or_else(ApiError::internal)?;
    Ok(b.to_json())
}

/// Reads the input file as it streams from the store, checks each line and writes
/// the accepted ones; the inner error is the file's first problem.
async fn load_lines(
    state: &AppState,
    batch_id: &str,
    endpoint: &str,
    file: &FileRow,
) -> Result<Result<usize, LineError>, ApiError> {
    let (_, mut body) = state
        .objects
        .get(&file.object_key)
        .await
        .map_err(store_err)?
        .ok_or_else(|| not_found("file", "input_file_id"))?;
    let cap = state.config.limits.max_request_bytes;
    let mut checker = Checker::new(endpoint);
    let mut splitter = super::jsonl::Splitter::default();
    let mut pending: Vec<Line> = Vec::new();
    let mut written = 0usize;
    let too_long = || LineError {
        code: "line_too_long",
        message: format!("A line is longer than {cap} bytes."),
        param: None,
        line: None,
    };
    while let Some(piece) = body.next().await {
        let piece = piece.map_err(store_err)?;
        let fed = splitter.feed(
            &piece,
            cap,
            |l| {
                if let Some(line) = checker.line(l)? {
                    pending.push(line);
                }
                Ok(())
            },
            too_long,
        );
        if let Err(e) = fed {
            return Ok(Err(e));
        }
        if pending.len() >= INSERT_CHUNK {
            insert_lines(state, batch_id, written, &pending).await?;
            written += pending.len();
            pending.clear();
        }
    }
    let last = splitter.finish();
    match checker.line(&last) {
        Ok(Some(line)) => pending.push(line),
        Ok(None) => {}
        Err(e) => return Ok(Err(e)),
    }
    if let Err(e) = checker.end() {
        return Ok(Err(e));
    }
    for chunk in pending.chunks(INSERT_CHUNK) {
        insert_lines(state, batch_id, written, chunk).await?;
        written += chunk.len();
    }
    Ok(Ok(written))
}

async fn insert_lines(
    state: &AppState,
    batch_id: &str,
    first: usize,
    lines: &[Line],
) -> Result<(), ApiError> {
    if lines.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "INSERT INTO batch_lines (batch_id, line_no, custom_id, body) VALUES {}",
        state.db.engine.value_rows(lines.len(), 4)
    );
    let mut q = sqlx::query(&sql);
    for (i, l) in lines.iter().enumerate() {
        q = q
            .bind(batch_id)
            .bind((first + i) as i64)
            .bind(&l.custom_id)
            .bind(&l.body);
    }
    let q = q.execute(&state.db.pool);
    state.db.bounded(q).await.map_err(db_err("batch lines"))?;
    Ok(())
}
