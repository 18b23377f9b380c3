//! The signed PUT on the gateway listener: `PUT /api/telemetry/uploads/{ingest_id}
//! ?expires=..&token=..`. The body is read piece by piece from the Pingora session
//! and streamed to the object store as it arrives (never held whole), counted and
//! hashed on the way, and refused past `[telemetry] max_upload_bytes`. The URL is
//! good for one PUT: a second one, a tampered or expired URL, a multipart body or
//! an oversize one are refused, and a refused or broken PUT leaves nothing stored
//! (the ticket stays usable until one PUT succeeds).

use super::ingests;
use super::tickets::{upload_path, Signer, UPLOAD_PREFIX};
use crate::downstream::answer::{send_error, send_json};
use crate::state::AppState;
use crate::store::now_ms;
use crate::store::objects::PutError;
use pingora::proxy::Session;
use serde_json::json;
use sluice_filters::{ApiError, ErrorCode, Format};
use std::time::{Duration, Instant};

/// A PUT must arrive whole within this long.
const UPLOAD_DEADLINE: Duration = Duration::from_secs(10 * 60);
/// Silence between body pieces past this ends the upload.
const PIECE_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether this request is a signed upload (checked by the gateway's dispatch
/// before `/api` goes to the management router, which reads bodies whole).
pub fn is_upload(method: &http::Method, path: &str) -> bool {
    method == http::Method::PUT && path.starts_with(UPLOAD_PREFIX)
}

fn refuse(status: u16, msg: impl Into<std::borrow::Cow<'static, str>>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, msg).with_status(status)
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Serves one signed PUT; returns the status written.
pub(crate) async fn serve(state: &AppState, session: &mut Session) -> pingora::Result<u16> {
    match receive(state, session).await {
        Ok(body) => {
            send_json(session, 200, body.to_string().into_bytes()).await?;
            Ok(200)
        }
        Err(e) => {
            // The rest of a refused body is never read: the connection closes.
            session.set_keepalive(None);
            send_error(session, &e, Format::OpenAi).await?;
            Ok(e.status)
        }
    }
}

async fn receive(state: &AppState, session: &mut Session) -> Result<serde_json::Value, ApiError> {
    let head = session.req_header();
    let path = head.uri.path().to_string();
    let query = head.uri.query().unwrap_or("").to_string();
    let ingest_id = path.strip_prefix(UPLOAD_PREFIX).unwrap_or("").to_string();
    let bad_url = || {
        refuse(
            403,
            "The upload URL's signature does not match; use the signed_url exactly as issued.",
        )
    };
    if ingest_id.is_empty() || ingest_id.contains('/') || path != upload_path(&ingest_id) {
        return Err(ApiError::not_found(&path));
    }
    let expires: i64 = query_param(&query, "expires")
        .and_then(|v| v.parse().ok())
        .ok_or_else(bad_url)?;
    let token = query_param(&query, "token").ok_or_else(bad_url)?;
    let signer = Signer::get(&state.config.storage.signing_secret_env);
    if !signer.verify(&path, expires, token) {
        return Err(bad_url());
    }
    if now_ms() / 1000 > expires {
        return Err(refuse(
            403,
            "The upload URL has expired; ask for a new one with POST .../telemetry/traces/upload.",
        ));
    }
    let content_type = head
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if content_type.starts_with("multipart/")
        || content_type.starts_with("application/x-www-form-urlencoded")
    {
        return Err(refuse(
            415,
            "Send the file's raw bytes with Content-Type application/octet-stream, not a multipart or form body.",
        ));
    }
    let ingest_org = ingests::get(&state.db, &ingest_id)
        .await
        .map_err(ApiError::from)?
        .map(|i| i.org_id);
    let cap = match ingest_org {
        Some(org) => {
            let limits = &state.config.limits;
            crate::store::quota::room(
                &state.db,
                &org,
                limits.org_storage_bytes,
                state.config.telemetry.max_upload_bytes,
            )
            .await?
        }
        None => state.config.telemetry.max_upload_bytes,
    };
    let declared = head
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap) {
        return Err(refuse(
            413,
            format!("The file exceeds the limit of {cap} bytes."),
        ));
    }
    let expect_continue = head
        .headers
        .get(http::header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    let ingest = ingests::get(&state.db, &ingest_id)
        .await
        .map_err(ApiError::from)?
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "No such ingest."))?;
    if ingest.expires_at < now_ms() {
        return Err(refuse(
            403,
            "The upload URL has expired; ask for a new one with POST .../telemetry/traces/upload.",
        ));
    }
    if !ingests::begin_upload(&state.db, &ingest.id)
        .await
        .map_err(ApiError::from)?
    {
        return Err(refuse(
            409,
            "This upload URL was already used (or an upload to it is in progress); signed URLs are single-use.",
        ));
    }
    if expect_continue {
        let _ = session.write_continue_response().await;
    }
    match stream_body(state, session, &ingest.object_key, cap).await {
        Ok(stored) => {
            let size = stored.size as i64;
            let ok = match ingests::end_upload(&state.db, &ingest.id, size, &stored.sha256).await {
                Ok(ok) => ok,
                Err(e) => {
                    // Not recorded, so not kept: the ticket stays usable.
                    let _ = state.objects.delete(&ingest.object_key).await;
                    let _ = ingests::reset_upload(&state.db, &ingest.id).await;
                    return Err(ApiError::from(e));
                }
            };
            if !ok {
                // Another PUT took the ticket over as stale while this one ran.
                return Err(refuse(409, "This upload URL was used by another upload."));
            }
            Ok(json!({
                "ingest_id": ingest.id,
                "status": "uploaded",
                "byte_size": size,
                "sha256": stored.sha256,
            }))
        }
        Err(e) => {
            let _ = state.objects.delete(&ingest.object_key).await;
            if let Err(db) = ingests::reset_upload(&state.db, &ingest.id).await {
                tracing::warn!(error = %db, "could not reopen a failed upload");
            }
            Err(e)
        }
    }
}

/// After a refusal mid-body, reads (and drops) a little more of what the client is
/// still sending, so it reads the answer instead of a reset connection; a client
/// with more than this much left gets the reset.
async fn discard_rest(session: &mut Session) {
    const MAX: usize = 4 * 1024 * 1024;
    let mut seen = 0;
    let until = Instant::now() + Duration::from_secs(5);
    while seen < MAX {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, session.read_request_body()).await {
            Ok(Ok(Some(p))) => seen += p.len(),
            _ => return,
        }
    }
}

/// Looks like a multipart/form-data body, whatever its Content-Type said.
fn looks_multipart(first: &[u8]) -> bool {
    let head = &first[..first.len().min(512)];
    head.starts_with(b"--")
        && head
            .windows(b"content-disposition: form-data".len())
            .any(|w| w.eq_ignore_ascii_case(b"content-disposition: form-data"))
}

async fn stream_body(
    state: &AppState,
    session: &mut Session,
    key: &str,
    cap: u64,
) -> Result<crate::store::objects::Stored, ApiError> {
    let until = Instant::now() + UPLOAD_DEADLINE;
    let mut w = state.objects.writer(key, cap);
    let mut first = true;
    loop {
        let left = until
            .saturating_duration_since(Instant::now())
            .min(PIECE_TIMEOUT);
        let piece = match tokio::time::timeout(left, session.read_request_body()).await {
            Err(_) => {
                w.abort().await;
                return Err(refuse(408, "The upload did not arrive in time."));
            }
            Ok(Err(e)) => {
                w.abort().await;
                tracing::debug!(error = %e, "upload body read failed");
                return Err(refuse(400, "The upload was cut off before its end."));
            }
            Ok(Ok(None)) => break,
            Ok(Ok(Some(p))) => p,
        };
        if first && !piece.is_empty() {
            first = false;
            if looks_multipart(&piece) {
                w.abort().await;
                discard_rest(session).await;
                return Err(refuse(
                    415,
                    "The body is multipart form data; send the file's raw bytes instead.",
                ));
            }
        }
        match w.write(piece).await {
            Ok(()) => {}
            Err(PutError::TooLarge { cap }) => {
                discard_rest(session).await;
                return Err(refuse(
                    413,
                    format!("The file exceeds the limit of {cap} bytes."),
                ));
            }
            Err(PutError::Store(e)) => {
                tracing::error!(error = %e, "object store refused an upload");
                return Err(ApiError::internal());
            }
        }
    }
    w.finish().await.map_err(|e| {
        tracing::error!(error = %e, "object store could not finish an upload");
        ApiError::internal()
    })
}
