//! Rules shared by the inbound formats.

use crate::error::{ApiError, ErrorCode};

/// Fields refused on every route (SPEC "How request fields are handled").
pub const REFUSED_EVERYWHERE: [&str; 10] = [
    "audio",
    "modalities",
    "logit_bias",
    "seed",
    "functions",
    "function_call",
    "prediction",
    "prompt_cache_retention",
    "provider",
    "route",
];

/// The longest tool or structured-format description accepted, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 65_536;

/// The 400 for a field refused on every route, if `field` is one.
pub fn refused_everywhere(field: &str) -> Option<ApiError> {
    REFUSED_EVERYWHERE.contains(&field).then(|| {
        ApiError::new(
            ErrorCode::UnsupportedParameter,
            format!("The parameter `{field}` is not supported on any route."),
        )
        .param(field.to_string())
    })
}

/// Checks a tool or structured-format description against the cap.
pub fn check_description(param: String, text: &str) -> Result<(), ApiError> {
    let len = text.chars().count();
    if len > MAX_DESCRIPTION_CHARS {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            format!(
                "The description is {len} characters long; the limit is {MAX_DESCRIPTION_CHARS} characters."
            ),
        )
        .param(param));
    }
    Ok(())
}

/// A 400 `invalid_parameter` naming `param`.
pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidParameter, message.into()).param(param.into())
}

/// A 400 `unsupported_parameter` naming `param`.
pub fn unsupported(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::UnsupportedParameter, message.into()).param(param.into())
}

/// A 400 `invalid_request` (a malformed body that is still JSON).
pub fn malformed(message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, message.into())
}
