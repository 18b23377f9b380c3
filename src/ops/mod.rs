//! The ops listener: `/healthz`, `/readyz`, `/metrics` and the admin API under
//! `/admin` (behind the admin token).

pub(crate) mod admin;

use crate::api::respond::{json, Failure};
use crate::api::Shared;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use sluice_filters::ApiError;

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { json(StatusCode::OK, &serde_json::json!({"status": "ok"})) }),
        )
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .merge(admin::router(state.clone()))
        .fallback(|uri: axum::http::Uri| async move { Failure(ApiError::not_found(uri.path())) })
        .with_state(state)
}

/// 200 while the instance can serve: its gateway listener is up and it is not
/// draining. A store that does not answer does not make it unready: it serves on
/// its snapshots, leases and outage shares (Redis away), or spools usage
/// (PostgreSQL away), and every instance would be in the same case, so a load
/// balancer taking them out would only turn an outage of a store into one of the
/// service. The body says which stores answer (what the background probe last saw,
/// `AppState::spawn_readiness`), so it answers at once whatever they are doing.
async fn readyz(State(state): State<Shared>) -> impl IntoResponse {
    let (ready, body) = readiness(&state).await;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(status, &body)
}

/// Whether the instance is ready, and why (the body of `/readyz`); also what
/// `sluice_ready` reports at each scrape.
async fn readiness(state: &Shared) -> (bool, serde_json::Value) {
    let draining = state.draining();
    let db = state.database_up();
    let counters = state.counters_up();
    let gateway = state.gateway_up();
    // The catalog snapshot exists by construction: the state is built only after it loaded.
    let ready = !draining && gateway;
    state.metrics.ready.set(i64::from(ready));
    (
        ready,
        serde_json::json!({
            "ready": ready,
            "draining": draining,
            "database": db,
            "counters": counters,
            "catalog": true,
            "gateway": gateway,
        }),
    )
}

async fn metrics_text(State(state): State<Shared>) -> impl IntoResponse {
    // A store that hangs must not hang the scrape: past two seconds it is not ready.
    let checked = tokio::time::timeout(std::time::Duration::from_secs(2), readiness(&state));
    if checked.await.is_err() {
        state.metrics.ready.set(0);
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
