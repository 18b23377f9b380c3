//! `GET /v1/models` and `GET /v1/models/{id}`: the models the key's org can call,
//! with the pricing extension.

use crate::downstream::answer::send_json;
use crate::downstream::Handled;
use crate::inference::granted;

use crate::state::AppState;
use pingora::proxy::Session;
use serde_json::json;
use sluice_filters::{ApiError, ErrorCode};

pub(crate) async fn list(state: &AppState, session: &mut Session) -> Handled {
    let org = super::caller(state, session).await?.org;
    let catalog = state.catalog.snapshot();
    let data: Vec<_> = catalog
        .visible(Some(&org.id))
        .into_iter()
        .filter(|m| granted(&org, m))
        .map(|m| m.listing_json())
        .collect();
    let body = serde_json::to_vec(&json!({"object": "list", "data": data}))
        .map_err(|_| ApiError::internal())?;
    send_json(session, 200, body)
        .await
        .map_err(|_| ApiError::internal())?;
    Ok(200)
}

pub(crate) async fn one(state: &AppState, session: &mut Session) -> Handled {
    let org = super::caller(state, session).await?.org;
    let path = session.req_header().uri.path().trim_end_matches('/');
    let id = path
        .rsplit_once("/models/")
        .map_or("", |(_, id)| id)
        .to_string();
    let catalog = state.catalog.snapshot();
    let model = catalog
        .lookup(Some(&org.id), &id)
        .filter(|m| granted(&org, m))
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!(
                    "No model {:?} for this key.",
                    id.chars().take(128).collect::<String>()
                ),
            )
        })?;
    let body = serde_json::to_vec(&model.listing_json()).map_err(|_| ApiError::internal())?;
    send_json(session, 200, body)
        .await
        .map_err(|_| ApiError::internal())?;
    Ok(200)
}
