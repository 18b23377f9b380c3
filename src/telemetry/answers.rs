//! The intake's answers and its checks of what clients send: the error answer
//! (with a source's Retry-After), JSON bodies, `source_kind` and `source_label`.

use super::model::SourceKind;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sluice_filters::{ApiError, ErrorCode, Format};

/// An error answer; `retry_after` adds the header (a source's rate limit).
pub struct Refusal {
    pub error: ApiError,
    pub retry_after: Option<u64>,
}

impl From<ApiError> for Refusal {
    fn from(error: ApiError) -> Refusal {
        Refusal {
            error,
            retry_after: None,
        }
    }
}

impl From<crate::error::Error> for Refusal {
    fn from(e: crate::error::Error) -> Refusal {
        Refusal::from(ApiError::from(e))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            self.error.to_body(Format::OpenAi),
        )
            .into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

pub type Answer = Result<Response, Refusal>;

pub fn answer(status: StatusCode, v: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

/// A JSON body into `T`: bad JSON is `invalid_json`, a wrong shape names the field.
pub fn body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Refusal> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid_json("the body is empty").into());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Data => {
                let msg = e.to_string();
                let field = msg.split('`').nth(1).map(str::to_string);
                let text = msg.split(" at line").next().unwrap_or(&msg).to_string();
                let err = ApiError::new(ErrorCode::InvalidParameter, text);
                Refusal::from(match field {
                    Some(f) if f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => {
                        err.param(f)
                    }
                    _ => ApiError {
                        code: ErrorCode::InvalidRequest,
                        ..err
                    },
                })
            }
            _ => ApiError::invalid_json(e).into(),
        }
    })
}

/// The longest `source_label`.
pub const LABEL_MAX: usize = 200;

/// A label is 1 to 200 printable characters (no control characters), not blank.
pub fn check_label(label: &str) -> Result<(), Refusal> {
    let n = label.chars().count();
    let why = if label.trim().is_empty() {
        Some("source_label must not be empty".to_string())
    } else if n > LABEL_MAX {
        Some(format!(
            "source_label is {n} characters; at most {LABEL_MAX}"
        ))
    } else if label
        .chars()
        .any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}'))
    {
        Some("source_label must be printable text (no control characters)".into())
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(w) => Err(ApiError::invalid_parameter("source_label", w)
            .with_status(422)
            .into()),
    }
}

pub fn check_kind(kind: &str) -> Result<SourceKind, Refusal> {
    SourceKind::parse(kind).ok_or_else(|| {
        let known: Vec<&str> = SourceKind::ALL.iter().map(|k| k.as_str()).collect();
        ApiError::invalid_parameter(
            "source_kind",
            format!("source_kind must be one of {}", known.join(", ")),
        )
        .into()
    })
}
