//! The management routes of the intake (SPEC "Telemetry trace intake"): the upload
//! ticket, finalize, the pull, and the list. Mounted by the management router,
//! which authenticates the key and hands over its org as a [`Caller`]; an
//! `org_id` in the path that is not the caller's is 404.

use super::answers::{answer, body, check_kind, check_label, Answer, Refusal};
use super::ingests::{self, NewIngest};
use super::tickets::{upload_path, Signer};
use super::{pull, worker, Caller};
use crate::state::AppState;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Router};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use sluice_filters::{ApiError, ErrorCode};
use std::collections::HashMap;
use std::sync::Arc;

type Shared = Arc<AppState>;

pub(crate) fn routes() -> Router<Shared> {
    Router::new()
        .route("/api/orgs/{org_id}/telemetry/traces", get(list))
        .route("/api/orgs/{org_id}/telemetry/traces/upload", post(upload))
        .route("/api/orgs/{org_id}/telemetry/traces/pull", post(pull_route))
        .route("/api/orgs/{org_id}/telemetry/traces/{ingest_id}", get(one))
        .route(
            "/api/orgs/{org_id}/telemetry/traces/{ingest_id}/finalize",
            post(finalize),
        )
}

fn own(org_id: &str, caller: &Caller) -> Result<(), Refusal> {
    if org_id == caller.org.id {
        Ok(())
    } else {
        Err(ApiError::new(ErrorCode::NotFound, "No such organization.").into())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UploadBody {
    source_kind: String,
    source_label: String,
}

async fn upload(
    Extension(c): Extension<Caller>,
    State(state): State<Shared>,
    Path(org_id): Path<String>,
    raw: Bytes,
) -> Answer {
    own(&org_id, &c)?;
    let b: UploadBody = body(&raw)?;
    check_kind(&b.source_kind)?;
    check_label(&b.source_label)?;
    // The org's quota: tickets open at once, and stored bytes (a PUT is cut off at
    // what is left of them).
    let limits = &state.config.limits;
    if ingests::open_tickets(&state.db, &org_id).await? >= limits.org_open_tickets as i64 {
        return Err(crate::store::quota::refused(&format!(
            "the organization holds {} upload tickets not yet used ([limits] org_open_tickets)",
            limits.org_open_tickets
        ))
        .into());
    }
    crate::store::quota::room(&state.db, &org_id, limits.org_storage_bytes, 1).await?;
    let ttl = crate::config::parse_duration(&state.config.telemetry.ticket_ttl)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(7200);
    let expires = crate::store::now_ms() / 1000 + ttl;
    let ingest = ingests::create(
        &state.db,
        NewIngest {
            org_id: &org_id,
            origin: "upload",
            transport_kind: None,
            source_kind: &b.source_kind,
            source_label: &b.source_label,
            status: "awaiting_bytes",
            expires_at: expires * 1000,
        },
    )
    .await?;
    let path = upload_path(&ingest.id);
    let token = Signer::get(&state.config.storage.signing_secret_env).sign(&path, expires);
    let base = state.config.server.public_base_url.trim_end_matches('/');
    let signed_url = format!("{base}{path}?expires={expires}&token={token}");
    Ok(answer(
        StatusCode::CREATED,
        &json!({
            "ingest_id": ingest.id,
            "signed_url": signed_url,
            "token": token,
            "expires_in": ttl,
            "method": "PUT",
            "headers": {"content-type": "application/octet-stream"},
            "max_bytes": state.config.telemetry.max_upload_bytes,
            "status": ingest.status,
        }),
    ))
}

async fn finalize(
    Extension(c): Extension<Caller>,
    State(state): State<Shared>,
    Path((org_id, ingest_id)): Path<(String, String)>,
) -> Answer {
    own(&org_id, &c)?;
    let not_found = || Refusal::from(ApiError::new(ErrorCode::NotFound, "No such ingest."));
    let Some(found) = ingests::get(&state.db, &ingest_id).await? else {
        return Err(not_found());
    };
    if found.org_id != org_id {
        return Err(not_found());
    }
    if found.status == "uploading" {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "The upload to the signed URL is still in progress; finalize once it has finished.",
        )
        .with_status(409)
        .into());
    }
    let ingest = ingests::finalize(&state.db, &ingest_id)
        .await?
        .ok_or_else(not_found)?;
    if ingest.status == "accepted" {
        worker::nudge();
    }
    Ok(answer(StatusCode::ACCEPTED, &ingest.to_json()))
}

fn page(q: &HashMap<String, String>) -> Result<(i64, i64), Refusal> {
    let num = |k: &'static str, default: i64, max: i64| -> Result<i64, Refusal> {
        match q.get(k) {
            None => Ok(default),
            Some(v) => match v.parse::<i64>() {
                Ok(n) if (0..=max).contains(&n) => Ok(n),
                _ => Err(ApiError::invalid_parameter(
                    k,
                    format!("{k} must be an integer from 0 to {max}"),
                )
                .into()),
            },
        }
    };
    let limit = num("limit", 50, 200)?.max(1);
    let offset = num("offset", 0, i64::MAX / 2)?;
    Ok((limit, offset))
}

async fn list(
    Extension(c): Extension<Caller>,
    State(state): State<Shared>,
    Path(org_id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    own(&org_id, &c)?;
    let (limit, offset) = page(&q)?;
    let (rows, total_ingests, total_traces) =
        ingests::list(&state.db, &org_id, limit, offset).await?;
    let traces: Vec<Value> = rows.iter().map(|i| i.to_json()).collect();
    Ok(answer(
        StatusCode::OK,
        &json!({
            "traces": traces,
            "total_ingests": total_ingests,
            "total_traces": total_traces,
            "limit": limit,
            "offset": offset,
            "has_more": offset + (rows.len() as i64) < total_ingests,
        }),
    ))
}

/// One ingest with a page of its projected traces (spans included).
async fn one(
    Extension(c): Extension<Caller>,
    State(state): State<Shared>,
    Path((org_id, ingest_id)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Answer {
    own(&org_id, &c)?;
    let (limit, offset) = page(&q)?;
    let ingest = match ingests::get(&state.db, &ingest_id).await? {
        Some(i) if i.org_id == org_id => i,
        _ => return Err(ApiError::new(ErrorCode::NotFound, "No such ingest.").into()),
    };
    let items = ingests::traces(&state.db, &ingest.id, limit, offset).await?;
    let mut v = ingest.to_json();
    let total = ingest.trace_count.unwrap_or(0);
    v["has_more"] = json!(offset + (items.len() as i64) < total);
    v["items"] = Value::Array(items);
    Ok(answer(StatusCode::OK, &v))
}

async fn pull_route(
    Extension(c): Extension<Caller>,
    State(state): State<Shared>,
    Path(org_id): Path<String>,
    raw: Bytes,
) -> Answer {
    own(&org_id, &c)?;
    let req: pull::PullBody = body(&raw)?;
    let (ingest, truncated) = pull::run(&state, &org_id, req).await?;
    let mut v = ingest.to_json();
    v["truncated"] = json!(truncated);
    Ok(answer(StatusCode::CREATED, &v))
}
