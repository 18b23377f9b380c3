//! `/v1/files`: OpenAI's Files API. A file's bytes go to the object store as they
//! arrive (the multipart body is parsed incrementally, never held whole) under
//! `files/<org>/<id>`, capped at `[batches] max_file_bytes`; its row in `files`
//! holds the metadata. Every read is by org: another org's id is 404.

use super::{db_err, limit_param, not_found, page, query_param, store_err, Caller};
use crate::state::AppState;
use crate::store::objects::PutError;
use crate::store::{now_ms, quota};
use bytes::Bytes;
use futures_util::StreamExt;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use serde_json::{json, Value};
use sluice_filters::{ApiError, ErrorCode};
use sqlx::Row;
use std::time::{Duration, Instant};

/// An upload must arrive whole within this long.
const UPLOAD_DEADLINE: Duration = Duration::from_secs(30 * 60);
/// Silence between body pieces past this ends the upload.
const PIECE_TIMEOUT: Duration = Duration::from_secs(60);
/// The purposes a client may upload with (OpenAI's); `batch_output` is the
/// gateway's own.
const PURPOSES: [&str; 6] = [
    "batch",
    "assistants",
    "fine-tune",
    "vision",
    "user_data",
    "evals",
];
/// The room multipart framing takes beyond the file itself.
const FRAMING: u64 = 64 * 1024;

/// A file's row.
#[derive(Clone, Debug)]
pub(crate) struct FileRow {
    pub(crate) id: String,
    pub(crate) purpose: String,
    pub(crate) filename: String,
    pub(crate) bytes: i64,
    pub(crate) object_key: String,
    pub(crate) created_at: i64,
}

impl FileRow {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at / 1000,
            "expires_at": null,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": null,
        })
    }
}

const COLUMNS: &str = "id, purpose, filename, bytes, object_key, created_at";

fn row(r: &sqlx::any::AnyRow) -> FileRow {
    FileRow {
        id: r.get("id"),
        purpose: r.get("purpose"),
        filename: r.get("filename"),
        bytes: r.get("bytes"),
        object_key: r.get("object_key"),
        created_at: r.get("created_at"),
    }
}

/// A new file id (`file-` and 24 hex digits, as OpenAI's look).
pub(crate) fn new_file_id() -> String {
    let bytes: [u8; 12] = rand::random();
    format!("file-{}", hex::encode(bytes))
}

pub(crate) fn object_key(org_id: &str, file_id: &str) -> String {
    format!("files/{org_id}/{file_id}")
}

/// Records a stored file (`ON CONFLICT DO NOTHING`: a finalization run again
/// records its output files once).
pub(crate) async fn insert(state: &AppState, org_id: &str, f: &FileRow) -> Result<(), ApiError> {
    let q = sqlx::query(
        "INSERT INTO files (id, org_id, purpose, filename, bytes, object_key, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&f.id)
    .bind(org_id)
    .bind(&f.purpose)
    .bind(&f.filename)
    .bind(f.bytes)
    .bind(&f.object_key)
    .bind(f.created_at)
    .execute(&state.db.pool);
    state.db.bounded(q).await.map_err(db_err("file insert"))?;
    Ok(())
}

/// The org's file `id`, or `None`.
pub(crate) async fn find(
    state: &AppState,
    org_id: &str,
    id: &str,
) -> Result<Option<FileRow>, ApiError> {
    let sql = format!("SELECT {COLUMNS} FROM files WHERE id = $1 AND org_id = $2");
    let q = sqlx::query(&sql)
        .bind(id)
        .bind(org_id)
        .fetch_optional(&state.db.pool);
    let r = state.db.bounded(q).await.map_err(db_err("file read"))?;
    Ok(r.as_ref().map(row))
}

async fn found(state: &AppState, caller: &Caller, id: &str) -> Result<FileRow, ApiError> {
    find(state, &caller.org.id, id)
        .await?
        .ok_or_else(|| not_found("file", "file_id"))
}

pub(super) async fn get(state: &AppState, caller: &Caller, id: &str) -> Result<Value, ApiError> {
    Ok(found(state, caller, id).await?.to_json())
}

pub(super) async fn list(
    state: &AppState,
    caller: &Caller,
    query: &str,
) -> Result<Value, ApiError> {
    let limit = limit_param(query, 10_000, 10_000)?;
    let purpose = query_param(query, "purpose");
    let ascending = match query_param(query, "order").as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(_) => return Err(ApiError::invalid_parameter("order", "order is asc or desc")),
    };
    let after = match query_param(query, "after") {
        Some(a) => Some(
            find(state, &caller.org.id, &a)
                .await?
                .ok_or_else(|| not_found("file", "after"))?,
        ),
        None => None,
    };
    let mut sql = format!("SELECT {COLUMNS} FROM files WHERE org_id = $1");
    let mut n = 1;
    if purpose.is_some() {
        n += 1;
        sql.push_str(&format!(" AND purpose = ${n}"));
    }
    let (cmp, dir) = if ascending {
        (">", "ASC")
    } else {
        ("<", "DESC")
    };
    if after.is_some() {
        sql.push_str(&format!(
            " AND (created_at {cmp} ${} OR (created_at = ${} AND id {cmp} ${}))",
            n + 1,
            n + 1,
            n + 2
        ));
        n += 2;
    }
    sql.push_str(&format!(
        " ORDER BY created_at {dir}, id {dir} LIMIT ${}",
        n + 1
    ));
    let mut q = sqlx::query(&sql).bind(&caller.org.id);
    if let Some(p) = &purpose {
        q = q.bind(p);
    }
    if let Some(a) = &after {
        q = q.bind(a.created_at).bind(&a.id);
    }
    let q = q.bind(limit + 1).fetch_all(&state.db.pool);
    let rows = state.db.bounded(q).await.map_err(db_err("file list"))?;
    let has_more = rows.len() as i64 > limit;
    let data = rows
        .iter()
        .take(limit as usize)
        .map(|r| row(r).to_json())
        .collect();
    Ok(page(data, has_more))
}

pub(super) async fn delete(state: &AppState, caller: &Caller, id: &str) -> Result<Value, ApiError> {
    let f = found(state, caller, id).await?;
    let q = sqlx::query("DELETE FROM files WHERE id = $1 AND org_id = $2")
        .bind(&f.id)
        .bind(&caller.org.id)
        .execute(&state.db.pool);
    state.db.bounded(q).await.map_err(db_err("file delete"))?;
    if let Err(e) = state.objects.delete(&f.object_key).await {
        // The row is gone, so the file is; the bytes are an orphan to log.
        tracing::warn!(error = %e, key = %f.object_key, "a deleted file's object remains");
    }
    Ok(json!({"id": f.id, "object": "file", "deleted": true}))
}

/// Writes the file's bytes as they are read from the store.
pub(super) async fn content(
    state: &AppState,
    session: &mut Session,
    caller: &Caller,
    id: &str,
) -> Result<(), ApiError> {
    let f = found(state, caller, id).await?;
    let (size, mut body) = state
        .objects
        .get(&f.object_key)
        .await
        .map_err(store_err)?
        .ok_or_else(|| not_found("file", "file_id"))?;
    let head = (|| -> pingora::Result<ResponseHeader> {
        let mut h = ResponseHeader::build_no_case(200, Some(3))?;
        h.insert_header(http::header::CONTENT_TYPE, "application/octet-stream")?;
        h.insert_header(http::header::CONTENT_LENGTH, size)?;
        h.insert_header(
            http::header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"{}\"", f.filename.replace('"', "")),
        )?;
        Ok(h)
    })()
    .map_err(|_| ApiError::internal())?;
    let written = async {
        session
            .write_response_header(Box::new(head), size == 0)
            .await?;
        if size == 0 {
            return Ok(());
        }
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|e| {
                pingora::Error::because(pingora::ErrorType::InternalError, "object store read", e)
            })?;
            session.write_response_body(Some(piece), false).await?;
        }
        session.write_response_body(Some(Bytes::new()), true).await
    }
    .await;
    if let Err(e) = written {
        // The header went out: the connection ends short of Content-Length.
        tracing::warn!(error = %e, "a file's content was cut off");
        session.set_keepalive(None);
    }
    Ok(())
}

fn refuse(status: u16, msg: impl Into<std::borrow::Cow<'static, str>>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, msg).with_status(status)
}

fn too_large(cap: u64) -> ApiError {
    refuse(413, format!("The file exceeds the limit of {cap} bytes.")).param("file")
}

/// `POST /v1/files`: multipart `file` and `purpose`.
pub(super) async fn upload(
    state: &AppState,
    session: &mut Session,
    caller: &Caller,
) -> Result<Value, ApiError> {
    let id = new_file_id();
    let key = object_key(&caller.org.id, &id);
    // The org's quota: at most so many files, and what its bytes leave (the
    // body is cut off there as it arrives).
    let cap = match quota_room(state, &caller.org.id).await {
        Ok(cap) => cap,
        Err(e) => {
            session.set_keepalive(None);
            return Err(e);
        }
    };
    let got = receive(state, session, &key, cap).await;
    let got = match got {
        Ok(g) => g,
        Err(e) => {
            // The rest of a refused body is never read: the connection closes.
            session.set_keepalive(None);
            let _ = state.objects.delete(&key).await;
            return Err(e);
        }
    };
    let f = FileRow {
        id,
        purpose: got.purpose,
        filename: got.filename,
        bytes: got.size as i64,
        object_key: key.clone(),
        created_at: now_ms(),
    };
    if let Err(e) = insert(state, &caller.org.id, &f).await {
        let _ = state.objects.delete(&key).await;
        return Err(e);
    }
    Ok(f.to_json())
}

struct Received {
    purpose: String,
    filename: String,
    size: u64,
}

/// What the org may still upload in one file: `[batches] max_file_bytes`, less
/// than that when its storage quota has less left; refused at its file count.
async fn quota_room(state: &AppState, org_id: &str) -> Result<u64, ApiError> {
    let limits = &state.config.limits;
    let stored = quota::stored(&state.db, org_id).await?;
    if stored.files as u64 >= limits.org_files {
        return Err(quota::refused(&format!(
            "the organization holds {} files, its quota ([limits] org_files)",
            limits.org_files
        )));
    }
    quota::room(
        &state.db,
        org_id,
        limits.org_storage_bytes,
        state.config.batches.max_file_bytes,
    )
    .await
}

async fn receive(
    state: &AppState,
    session: &mut Session,
    key: &str,
    cap: u64,
) -> Result<Received, ApiError> {
    let head = session.req_header();
    let content_type = head
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let boundary = multer::parse_boundary(content_type).map_err(|_| {
        refuse(
            400,
            "Upload the file as multipart/form-data with the fields file and purpose.",
        )
    })?;
    let declared = head
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap.saturating_add(FRAMING)) {
        return Err(too_large(cap));
    }
    let expect_continue = head
        .headers
        .get(http::header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    if expect_continue {
        let _ = session.write_continue_response().await;
    }
    let until = Instant::now() + UPLOAD_DEADLINE;
    let pieces = futures_util::stream::unfold(Some(&mut *session), move |s| async move {
        let s = s?;
        let left = until
            .saturating_duration_since(Instant::now())
            .min(PIECE_TIMEOUT);
        match tokio::time::timeout(left, s.read_request_body()).await {
            Ok(Ok(Some(b))) => Some((Ok(b), Some(s))),
            Ok(Ok(None)) => None,
            Ok(Err(e)) => Some((Err(std::io::Error::other(e.to_string())), None)),
            Err(_) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the upload did not arrive in time",
                )),
                None,
            )),
        }
    });
    let mut form = multer::Multipart::new(pieces, boundary);
    let bad_form = |e: multer::Error| {
        tracing::debug!(error = %e, "a file upload's form did not parse");
        refuse(400, "The multipart body is malformed or was cut off.")
    };
    let mut purpose: Option<String> = None;
    let mut stored: Option<(String, u64)> = None;
    while let Some(mut field) = form.next_field().await.map_err(bad_form)? {
        match field.name() {
            Some("purpose") => {
                let mut text = Vec::new();
                while let Some(c) = field.chunk().await.map_err(bad_form)? {
                    text.extend_from_slice(&c);
                    if text.len() > 256 {
                        return Err(ApiError::invalid_parameter(
                            "purpose",
                            "purpose is too long",
                        ));
                    }
                }
                purpose = Some(String::from_utf8_lossy(&text).trim().to_string());
            }
            Some("file") => {
                if stored.is_some() {
                    return Err(ApiError::invalid_parameter("file", "send one file"));
                }
                let filename = field
                    .file_name()
                    .filter(|n| !n.is_empty())
                    .unwrap_or("file")
                    .chars()
                    .take(255)
                    .collect::<String>();
                let mut w = state.objects.writer(key, cap);
                loop {
                    let c = match field.chunk().await {
                        Ok(Some(c)) => c,
                        Ok(None) => break,
                        Err(e) => {
                            w.abort().await;
                            return Err(bad_form(e));
                        }
                    };
                    match w.write(c).await {
                        Ok(()) => {}
                        Err(PutError::TooLarge { cap }) => return Err(too_large(cap)),
                        Err(PutError::Store(e)) => return Err(store_err(e)),
                    }
                }
                let s = w.finish().await.map_err(store_err)?;
                stored = Some((filename, s.size));
            }
            // Other fields (OpenAI's `expires_after`) are read past.
            _ => while field.chunk().await.map_err(bad_form)?.is_some() {},
        }
    }
    let purpose = purpose.ok_or_else(|| {
        ApiError::new(ErrorCode::InvalidRequest, "purpose is required.").param("purpose")
    })?;
    if !PURPOSES.contains(&purpose.as_str()) {
        return Err(ApiError::invalid_parameter(
            "purpose",
            format!("purpose must be one of {}", PURPOSES.join(", ")),
        ));
    }
    let (filename, size) = stored.ok_or_else(|| {
        ApiError::new(ErrorCode::InvalidRequest, "file is required.").param("file")
    })?;
    Ok(Received {
        purpose,
        filename,
        size,
    })
}
