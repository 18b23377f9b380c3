//! The `/_mock/*` control API, so a mock running as a separate process (the
//! `sluice-mock` binary) can be scripted and inspected over HTTP. Control
//! requests are never recorded.

use std::sync::atomic::Ordering;

use axum::{
    extract::State,
    response::{IntoResponse, Response},
    Json,
};
use bytes::Bytes;
use serde::{de::DeserializeOwned, Deserialize};
use serde_json::{json, Value};

use crate::{
    handlers::{error_response, Shared},
    openai, Step,
};

#[derive(Deserialize)]
pub(crate) struct ScriptBody {
    model: String,
    steps: Vec<Step>,
}

#[derive(Deserialize)]
pub(crate) struct DefaultBody {
    model: String,
    step: Step,
}

#[derive(Deserialize)]
pub(crate) struct RecordingBody {
    enabled: bool,
}

#[derive(Deserialize)]
pub(crate) struct ChunksBody {
    chunks: usize,
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| format!("bad control body: {e}"))
}

fn bad_request(msg: &str) -> Response {
    error_response(openai::error_body(400, msg), 400)
}

fn ok() -> Response {
    Json(json!({"ok": true})).into_response()
}

/// `POST /_mock/script {"model": "...", "steps": [{"kind": "status", "status": 500}, ...]}`
pub(crate) async fn script(State(m): Shared, body: Bytes) -> Response {
    match parse::<ScriptBody>(&body) {
        Ok(b) => {
            m.script(b.model, b.steps);
            ok()
        }
        Err(msg) => bad_request(&msg),
    }
}

/// `POST /_mock/default {"model": "...", "step": {"kind": "ok"}}`
pub(crate) async fn set_default(State(m): Shared, body: Bytes) -> Response {
    match parse::<DefaultBody>(&body) {
        Ok(b) => {
            m.set_default(b.model, b.step);
            ok()
        }
        Err(msg) => bad_request(&msg),
    }
}

/// `GET /_mock/requests`: `[{method, path, headers: [[name, value]...], body, model}]`,
/// the body as (lossy) text.
pub(crate) async fn requests(State(m): Shared) -> Response {
    let list: Vec<Value> = m
        .lock()
        .requests
        .iter()
        .map(|r| {
            json!({
                "method": r.method,
                "path": r.path,
                "headers": r.headers,
                "body": String::from_utf8_lossy(&r.body),
                "model": r.model,
            })
        })
        .collect();
    Json(list).into_response()
}

/// `POST /_mock/clear`: forget recorded requests and counts.
pub(crate) async fn clear(State(m): Shared) -> Response {
    m.clear();
    ok()
}

/// `POST /_mock/reset`: forget recordings, counts, scripts and defaults.
pub(crate) async fn reset(State(m): Shared) -> Response {
    m.reset();
    ok()
}

/// `POST /_mock/recording {"enabled": false}`
pub(crate) async fn recording(State(m): Shared, body: Bytes) -> Response {
    match parse::<RecordingBody>(&body) {
        Ok(b) => {
            m.recording.store(b.enabled, Ordering::Relaxed);
            ok()
        }
        Err(msg) => bad_request(&msg),
    }
}

/// `POST /_mock/chunks {"chunks": 50}`: default stream content chunks.
pub(crate) async fn chunks(State(m): Shared, body: Bytes) -> Response {
    match parse::<ChunksBody>(&body) {
        Ok(b) => {
            m.chunks.store(b.chunks, Ordering::Relaxed);
            ok()
        }
        Err(msg) => bad_request(&msg),
    }
}
