//! Answers of the axum services (management API, admin, web): JSON bodies and the
//! error envelope, and JSON request bodies parsed into stable error codes.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sluice_filters::{ApiError, ErrorCode, Format};

/// An [`ApiError`] as an axum answer (OpenAI-style envelope).
pub(crate) struct Failure(pub ApiError);

impl From<crate::error::Error> for Failure {
    fn from(e: crate::error::Error) -> Failure {
        Failure(e.into())
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Failure(e)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            self.0.to_body(Format::OpenAi),
        )
            .into_response()
    }
}

pub(crate) type ApiResult = Result<Response, Failure>;

/// A JSON answer with a status.
pub(crate) fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(_) => Failure(ApiError::internal()).into_response(),
    }
}

/// Parses a JSON body: bad syntax is `invalid_json`, a wrong shape `invalid_request`
/// (or `invalid_parameter` naming the field when serde can tell which).
pub(crate) fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid_json("the body is empty"));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => ApiError::invalid_json(e),
            Category::Data => {
                let msg = e.to_string();
                // serde names the field in "unknown field `x`" and "missing field `x`".
                let field = msg
                    .split('`')
                    .nth(1)
                    .filter(|f| f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                    .map(str::to_string);
                let text = msg.split(" at line").next().unwrap_or(&msg).to_string();
                let err = ApiError::new(ErrorCode::InvalidRequest, text);
                match field {
                    Some(f) => ApiError {
                        code: ErrorCode::InvalidParameter,
                        ..err
                    }
                    .param(f),
                    None => err,
                }
            }
        }
    })
}
