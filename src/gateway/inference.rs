//! The front half of every inference route: authenticate, read the body under the
//! cap, check it is JSON naming a model slug the org may call from where it is, then
//! hand over to the engine.

use super::body::{read_capped, BodyError};
use super::models::{authenticate, granted, Handled};
use crate::catalog::ModelKind;
use crate::state::AppState;
use pingora::proxy::Session;
use serde::Deserialize;
use sluice_filters::slug::split_suffixes;
use sluice_filters::{ApiError, ErrorCode, Route};

/// The one field every inference body must carry; the rest is parsed by the format
/// layer. Deserializing still validates the whole document's syntax.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    model: Option<serde_json::Value>,
}

pub async fn handle(state: &AppState, session: &mut Session, route: Route) -> Handled {
    let org = authenticate(state, session, route == Route::Messages)?;
    let body = match read_capped(session, state.config.limits.max_request_bytes).await {
        Ok(b) => b,
        Err(BodyError::TooLarge(e)) => return Err(e),
        Err(BodyError::Io(_)) => {
            return Err(ApiError::new(
                ErrorCode::RequestCancelled,
                "The client went away.",
            ))
        }
    };
    let not_object = || {
        ApiError::new(
            ErrorCode::InvalidRequest,
            "The request body must be a JSON object.",
        )
    };
    let head: Head = match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => serde_json::from_slice(&body).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => not_object(),
            _ => ApiError::invalid_json(e),
        })?,
        // Valid JSON of another shape is a malformed request; anything else is not JSON.
        _ => {
            return Err(
                match serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
                    Ok(_) => not_object(),
                    Err(e) => ApiError::invalid_json(e),
                },
            )
        }
    };
    let model_name = match head.model {
        Some(serde_json::Value::String(s)) => s,
        Some(_) => {
            return Err(ApiError::invalid_parameter(
                "model",
                "model must be a string slug",
            ))
        }
        None => {
            return Err(
                ApiError::new(ErrorCode::InvalidRequest, "model is required.").param("model"),
            )
        }
    };
    let wanted = split_suffixes(&model_name);
    let catalog = state.catalog.snapshot();
    let not_granted = || {
        ApiError::new(
            ErrorCode::ModelNotGranted,
            format!(
                "This key cannot call {:?}: use a slug from GET /v1/models.",
                model_name.chars().take(128).collect::<String>()
            ),
        )
        .param("model")
    };
    let model = catalog
        .lookup(Some(&org.id), wanted.slug)
        .filter(|m| granted(&org, m))
        .ok_or_else(not_granted)?;
    let country = client_country(state, session);
    if !model.spec.serves_country(country.as_deref()) {
        return Err(ApiError::new(
            ErrorCode::ModelLocationNotSupported,
            "This model is not offered where the request comes from, or the location could not be verified.",
        ));
    }
    let wants_embedding = route == Route::Embeddings;
    if wants_embedding != (model.spec.kind == ModelKind::Embedding) {
        return Err(ApiError::new(
            ErrorCode::UnsupportedCapability,
            if wants_embedding {
                "This model does not serve embeddings."
            } else {
                "This model serves embeddings only."
            },
        )
        .param("model"));
    }
    Err(ApiError::new(
        ErrorCode::UnavailableRoute,
        "No healthy route serves this model right now.",
    )
    .with_status(503))
}

/// The client's ISO country from the trusted edge header, if configured and present.
fn client_country(state: &AppState, session: &Session) -> Option<String> {
    let name = &state.config.server.client_country_header;
    if name.is_empty() {
        return None;
    }
    let v = session
        .req_header()
        .headers
        .get(name.as_str())?
        .to_str()
        .ok()?
        .trim();
    (v.len() == 2 && v.bytes().all(|b| b.is_ascii_alphabetic())).then(|| v.to_ascii_uppercase())
}
