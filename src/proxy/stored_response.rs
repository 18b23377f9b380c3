//! `DELETE /v1/responses/{id}`: removes one response the store kept for the
//! key's org (OpenAI's shape: `{id, object: "response", deleted: true}`), so an
//! org can erase a conversation before its retention ends. Another org's id, or
//! one never stored, is 404 `not_found`.

use crate::downstream::answer::send_json;
use crate::downstream::Handled;
use crate::state::AppState;
use pingora::proxy::Session;
use serde_json::json;
use sluice_filters::{ApiError, ErrorCode};

pub(crate) async fn delete(state: &AppState, session: &mut Session) -> Handled {
    let org = super::caller(state, session).await?.org;
    let path = session.req_header().uri.path().trim_end_matches('/');
    let id = path
        .rsplit_once("/responses/")
        .map_or("", |(_, id)| id)
        .to_string();
    if !state.responses.delete(&org.id, &id).await? {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "No stored response {:?} for this key's organization.",
                id.chars().take(128).collect::<String>()
            ),
        ));
    }
    let body = serde_json::to_vec(&json!({"id": id, "object": "response", "deleted": true}))
        .map_err(|_| ApiError::internal())?;
    send_json(session, 200, body)
        .await
        .map_err(|_| ApiError::internal())?;
    Ok(200)
}
