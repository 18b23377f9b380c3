//! Catalog reads: `GET /api/models` (keyless, filters), `GET /api/models/{slug}`,
//! `GET /api/models/{slug}/providers`. A key adds the org's own rows.

use super::respond::{json, ApiResult, Failure};
use super::{MaybeAuthed, Shared};
use crate::byok::active_route;
use crate::catalog::query::ListQuery;
use crate::catalog::{retention, Retention};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde_json::json;
use sluice_filters::{ApiError, ErrorCode};
use std::collections::HashMap;

pub(crate) async fn list(
    MaybeAuthed(caller): MaybeAuthed,
    State(state): State<Shared>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let query = ListQuery::parse(&q)?;
    let catalog = state.catalog.snapshot();
    let org = caller.as_ref().map(|c| c.org.id.as_str());
    // With a key, the verdict is the org's: its own order and its ZDR policy.
    let routing = state.byok.snapshot();
    let verdict = |m: &crate::catalog::Model| match &caller {
        Some(c) => org_verdict(m, &c.org, &routing),
        None => m.retention,
    };
    let (page, total) = query.apply(catalog.visible(org), &verdict);
    let data: Vec<_> = page
        .iter()
        .map(|m| {
            let mut row = m.row_json();
            row["retention"] = json!(verdict(m).map(Retention::as_str));
            row
        })
        .collect();
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

/// The retention verdict over the platform rungs of the org's active route
/// (`None` for the org's own models, which have none).
pub(crate) fn org_verdict(
    m: &crate::catalog::Model,
    org: &crate::accounts::OrgRecord,
    routing: &crate::byok::Routing,
) -> Option<Retention> {
    if m.owner.is_some() {
        return None;
    }
    let active = active_route::effective(m, org, routing);
    retention::verdict(
        active
            .iter()
            .filter(|r| r.is_platform())
            .map(|r| r.spec.as_ref()),
    )
}

fn unknown_model(slug: &str) -> Failure {
    let shown: String = slug.chars().take(128).collect();
    Failure(ApiError::new(
        ErrorCode::NotFound,
        format!("No model with slug {shown:?}."),
    ))
}

pub(crate) async fn one(
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
    if let Some(c) = &caller {
        // The verdict of the org's active route: its order and its ZDR policy.
        let routing = state.byok.snapshot();
        let active = active_route::effective(model, &c.org, &routing);
        row["retention"] = json!(org_verdict(model, &c.org, &routing).map(Retention::as_str));
        row["waterfall"] = json!(active.iter().map(|r| r.id.as_ref()).collect::<Vec<&str>>());
    }
    Ok(json(StatusCode::OK, &row))
}

pub(crate) async fn providers(
    MaybeAuthed(caller): MaybeAuthed,
    State(state): State<Shared>,
    Path(slug): Path<String>,
) -> ApiResult {
    let catalog = state.catalog.snapshot();
    let org = caller.as_ref().map(|c| c.org.id.as_str());
    let model = catalog
        .lookup(org, &slug)
        .ok_or_else(|| unknown_model(&slug))?;
    let data: Vec<_> = match &caller {
        // In an authorized org context: the org's route, each rung with its lane and
        // the handle that selects it per request (x-gateway-route).
        Some(c) => {
            let routing = state.byok.snapshot();
            active_route::chain(model, &c.org, &routing)
                .iter()
                .map(|r| {
                    let mut v = model.deployment_json(&r.spec);
                    v["rung_id"] = json!(r.id.as_ref());
                    v["lane"] = json!(r.lane.as_str());
                    v["route_id"] =
                        json!(active_route::route_id(&c.org.id, &model.spec.slug, &r.id));
                    v
                })
                .collect()
        }
        None => model
            .spec
            .rungs
            .iter()
            .map(|r| model.deployment_json(r))
            .collect(),
    };
    Ok(json(
        StatusCode::OK,
        &json!({"object": "list", "slug": model.spec.slug, "data": data}),
    ))
}
