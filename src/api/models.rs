//! Catalog reads: `GET /api/models` (keyless, filters), `GET /api/models/{slug}`,
//! `GET /api/models/{slug}/providers`. A key adds the org's own rows.

use super::respond::{json, ApiResult, Failure};
use super::{MaybeAuthed, Shared};
use crate::catalog::query::ListQuery;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde_json::json;
use sluice_filters::{ApiError, ErrorCode};
use std::collections::HashMap;

pub async fn list(
    MaybeAuthed(caller): MaybeAuthed,
    State(state): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let query = ListQuery::parse(&q)?;
    let catalog = state.catalog.snapshot();
    let org = caller.as_ref().map(|c| c.org.id.as_str());
    let (page, total) = query.apply(catalog.visible(org));
    let data: Vec<_> = page.iter().map(|m| m.row_json()).collect();
    Ok(json(
        StatusCode::OK,
        &json!({
            "object": "list",
            "data": data,
            "total": total,
            "limit": query.limit,
            "offset": query.offset,
        }),
    ))
}

fn unknown_model(slug: &str) -> Failure {
    let shown: String = slug.chars().take(128).collect();
    Failure(ApiError::new(
        ErrorCode::NotFound,
        format!("No model with slug {shown:?}."),
    ))
}

pub async fn one(
    MaybeAuthed(caller): MaybeAuthed,
    State(state): State<Shared>,
    Path(slug): Path<String>,
) -> ApiResult {
    let catalog = state.catalog.snapshot();
    let org = caller.as_ref().map(|c| c.org.id.as_str());
    let model = catalog
        .lookup(org, &slug)
        .ok_or_else(|| unknown_model(&slug))?;
    let mut row = model.row_json();
    row["default_waterfall"] = json!(model.default_chain());
    Ok(json(StatusCode::OK, &row))
}

pub async fn providers(
    MaybeAuthed(caller): MaybeAuthed,
    State(state): State<Shared>,
    Path(slug): Path<String>,
) -> ApiResult {
    let catalog = state.catalog.snapshot();
    let org = caller.as_ref().map(|c| c.org.id.as_str());
    let model = catalog
        .lookup(org, &slug)
        .ok_or_else(|| unknown_model(&slug))?;
    let data: Vec<_> = model
        .spec
        .rungs
        .iter()
        .map(|r| model.deployment_json(r))
        .collect();
    Ok(json(
        StatusCode::OK,
        &json!({"object": "list", "slug": model.spec.slug, "data": data}),
    ))
}
