//! The account endpoints a gateway calls to check a BYOK key and read its spend:
//! model lists (OpenAI-compatible and Anthropic `GET /v1/models`, Azure
//! `GET /openai/models`, Gemini `GET /v1beta/models`) and OpenRouter's key
//! endpoint (`GET /api/v1/key`, with `usage` in USD). A key that starts with `bad`
//! (or none) is refused with 401, as a provider refuses a revoked key.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// The key presented in any of the providers' header forms.
fn presented(h: &HeaderMap) -> Option<String> {
    let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
    get("authorization")
        .and_then(|v| v.strip_prefix("Bearer ").map(str::to_string))
        .or_else(|| get("x-api-key"))
        .or_else(|| get("x-goog-api-key"))
        .or_else(|| get("api-key"))
}

fn refused() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error", "code": "invalid_api_key"}})),
    )
        .into_response()
}

fn authorized(h: &HeaderMap) -> bool {
    presented(h).is_some_and(|k| !k.is_empty() && !k.starts_with("bad"))
}

pub(crate) async fn models(headers: HeaderMap) -> Response {
    if !authorized(&headers) {
        return refused();
    }
    Json(json!({"object": "list", "data": [{"id": "o1", "object": "model", "owned_by": "mock"}]}))
        .into_response()
}

pub(crate) async fn gemini_models(headers: HeaderMap) -> Response {
    if !authorized(&headers) {
        return refused();
    }
    Json(json!({"models": [{"name": "models/g1"}]})).into_response()
}

pub(crate) async fn openrouter_key(headers: HeaderMap) -> Response {
    if !authorized(&headers) {
        return refused();
    }
    Json(json!({"data": {"label": "mock", "usage": 12.5, "limit": null, "is_free_tier": false}}))
        .into_response()
}
