//! The management API under `/api` (axum). On the gateway listener the proxy
//! dispatches `/api/*` to this router in-process: the bodies are small JSON, so a
//! second loopback hop would only add latency and a socket per request.

pub(crate) mod byok;
pub(crate) mod custom;
pub(crate) mod models;
pub(crate) mod respond;
pub(crate) mod usage;

use crate::state::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::routing::{get, post};
use axum::Router;
use respond::{json, ApiResult, Failure};
use sluice_filters::ApiError;
use std::sync::Arc;

pub(crate) type Shared = Arc<AppState>;

pub(crate) use crate::accounts::Caller;

/// A route that requires a key.
pub(crate) struct Authed(pub Caller);

/// A route that works keyless; a key, if presented, must be valid.
pub(crate) struct MaybeAuthed(pub Option<Caller>);

async fn caller(parts: &Parts, state: &Shared) -> Result<Option<Caller>, Failure> {
    crate::accounts::authenticate(&state.directory, &state.db, &parts.headers, false)
        .await
        .map_err(Failure)
}

impl FromRequestParts<Shared> for Authed {
    type Rejection = Failure;
    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Self, Failure> {
        caller(parts, state)
            .await?
            .map(Authed)
            .ok_or(Failure(ApiError::invalid_key()))
    }
}

impl FromRequestParts<Shared> for MaybeAuthed {
    type Rejection = Failure;
    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Self, Failure> {
        Ok(MaybeAuthed(caller(parts, state).await?))
    }
}

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/api/models", get(models::list).post(custom::create))
        .route("/api/models/{slug}", get(models::one))
        .route(
            "/api/models/{slug}/providers",
            get(models::providers).post(custom::add_deployment),
        )
        .route("/api/keys", get(list_keys))
        .route("/api/credits-overflow", post(credits_overflow))
        .route("/api/orgs/{org_id}/provider-connections", get(byok::list))
        .route(
            "/api/orgs/{org_id}/provider-connections/{provider}",
            post(byok::create)
                .put(byok::rotate)
                .delete(byok::disconnect),
        )
        .route(
            "/api/orgs/{org_id}/provider-connections/{provider}/check",
            post(byok::check),
        )
        .route(
            "/api/orgs/{org_id}/provider-connections/{provider}/spend-refresh",
            post(byok::spend_refresh),
        )
        .route(
            "/api/orgs/{org_id}/policy",
            get(byok::get_policy).put(byok::put_policy),
        )
        .route(
            "/api/models/{slug}/waterfall",
            get(byok::get_waterfall).put(byok::put_waterfall),
        )
        .route("/api/gateway/usage/events", get(usage::events))
        .route("/api/gateway/usage/daily", get(usage::daily))
        .route("/api/gateway/catalog", get(usage::catalog))
        .route(
            "/api/gateway/keys/{api_key_id}/limits",
            get(usage::key_limits),
        )
        .merge(
            crate::telemetry::routes().route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                telemetry_caller,
            )),
        )
        .fallback(|uri: axum::http::Uri| async move { Failure(ApiError::not_found(uri.path())) })
        .with_state(state)
}

/// Authenticates a telemetry route with the key like every other route here, and
/// hands the room its caller's org.
async fn telemetry_caller(
    axum::extract::State(state): axum::extract::State<Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (mut parts, body) = req.into_parts();
    match Authed::from_request_parts(&mut parts, &state).await {
        Ok(Authed(c)) => {
            parts.extensions.insert(c);
            next.run(axum::extract::Request::from_parts(parts, body))
                .await
        }
        Err(f) => f.into_response(),
    }
}

/// `POST /api/credits-overflow`: turns credits overflow on for the key's org (it
/// never turns it off); 402 `verification_required` while the org is unverified.
async fn credits_overflow(
    Authed(c): Authed,
    axum::extract::State(state): axum::extract::State<Shared>,
) -> ApiResult {
    use crate::accounts::orgs;
    // The database's word, not the snapshot's: a verification may be seconds old.
    let org = orgs::get(&state.db, &c.org.id)
        .await?
        .ok_or_else(|| Failure(ApiError::invalid_key()))?;
    orgs::enable_overflow(&state.db, &org).await?;
    if let Some(fresh) = orgs::get(&state.db, &org.id).await? {
        state.directory.put_org(fresh);
    }
    Ok(json(
        http::StatusCode::OK,
        &serde_json::json!({"org_id": org.id, "credits_overflow": true}),
    ))
}

/// `GET /api/keys`: the org's keys, never a secret.
async fn list_keys(
    Authed(c): Authed,
    axum::extract::State(state): axum::extract::State<Shared>,
) -> ApiResult {
    let keys = crate::accounts::keys::list_for_org(&state.db, &c.org.id).await?;
    let data: Vec<_> = keys
        .iter()
        .map(|k| {
            serde_json::json!({
                "id": k.id,
                "name": k.name,
                "hint": k.hint,
                "created_at": k.created_at,
                "expires_at": k.expires_at,
                "revoked": k.revoked_at.is_some(),
                "limits": {
                    "daily_spend_cap_usd": k.daily_spend_cap_micro_usd.map(crate::money::micro_to_usd),
                    "rpm": k.rpm,
                    "tpm": k.tpm,
                },
            })
        })
        .collect();
    Ok(json(
        http::StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data}),
    ))
}
