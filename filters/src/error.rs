//! The one error type of the service: a stable `code`, its HTTP status, the offending
//! `param`, and the two envelopes clients parse.
//!
//! Chat, responses, models and management routes use the OpenAI-style envelope
//! `{error:{message, type, code, param}}`; the messages route uses the Anthropic
//! envelope `{type:"error", error:{type, message}}` at the same status. Clients branch
//! on `code`, so codes never change; messages are for people and never carry internals.

use serde_json::{json, Map, Value};
use std::borrow::Cow;
use std::fmt;

/// Every stable error code of the specification, with its default status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    ModelLocationNotSupported,
    InvalidJson,
    InvalidRequest,
    InvalidParameter,
    UnsupportedCapability,
    UnsupportedParameter,
    Refusal,
    PreviousResponseNotFound,
    InvalidKey,
    ModelNotGranted,
    IdempotencyConflict,
    IdempotencyReplayUnavailable,
    InsufficientQuota,
    OrgUnderReview,
    UnavailableRoute,
    GatewayOverloaded,
    RequestCancelled,
    ProviderInternal,
    AllRoutesFailed,
    ProviderOutputTooLarge,
    GatewayDraining,
    DeadlineExceeded,
    InternalError,
    NotFound,
    VerificationRequired,
    AccountExists,
    SignupDisabled,
    RateLimited,
    /// A web session request that changes something without the session's CSRF token.
    CsrfFailed,
    /// A web session API call without a valid `sluice_session` cookie.
    SessionRequired,
}

impl ErrorCode {
    /// Every code, for tests and documentation.
    pub const ALL: [ErrorCode; 30] = [
        Self::ModelLocationNotSupported,
        Self::InvalidJson,
        Self::InvalidRequest,
        Self::InvalidParameter,
        Self::UnsupportedCapability,
        Self::UnsupportedParameter,
        Self::Refusal,
        Self::PreviousResponseNotFound,
        Self::InvalidKey,
        Self::ModelNotGranted,
        Self::IdempotencyConflict,
        Self::IdempotencyReplayUnavailable,
        Self::InsufficientQuota,
        Self::OrgUnderReview,
        Self::UnavailableRoute,
        Self::GatewayOverloaded,
        Self::RequestCancelled,
        Self::ProviderInternal,
        Self::AllRoutesFailed,
        Self::ProviderOutputTooLarge,
        Self::GatewayDraining,
        Self::DeadlineExceeded,
        Self::InternalError,
        Self::NotFound,
        Self::VerificationRequired,
        Self::AccountExists,
        Self::SignupDisabled,
        Self::RateLimited,
        Self::CsrfFailed,
        Self::SessionRequired,
    ];

    /// The wire spelling of the code.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ModelLocationNotSupported => "model_location_not_supported",
            Self::InvalidJson => "invalid_json",
            Self::InvalidRequest => "invalid_request",
            Self::InvalidParameter => "invalid_parameter",
            Self::UnsupportedCapability => "unsupported_capability",
            Self::UnsupportedParameter => "unsupported_parameter",
            Self::Refusal => "refusal",
            Self::PreviousResponseNotFound => "previous_response_not_found",
            Self::InvalidKey => "invalid_key",
            Self::ModelNotGranted => "model_not_granted",
            Self::IdempotencyConflict => "idempotency_conflict",
            Self::IdempotencyReplayUnavailable => "idempotency_replay_unavailable",
            Self::InsufficientQuota => "insufficient_quota",
            Self::OrgUnderReview => "org_under_review",
            Self::UnavailableRoute => "unavailable_route",
            Self::GatewayOverloaded => "gateway_overloaded",
            Self::RequestCancelled => "request_cancelled",
            Self::ProviderInternal => "provider_internal",
            Self::AllRoutesFailed => "all_routes_failed",
            Self::ProviderOutputTooLarge => "provider_output_too_large",
            Self::GatewayDraining => "gateway_draining",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::InternalError => "internal_error",
            Self::NotFound => "not_found",
            Self::VerificationRequired => "verification_required",
            Self::AccountExists => "account_exists",
            Self::SignupDisabled => "signup_disabled",
            Self::RateLimited => "rate_limited",
            Self::CsrfFailed => "csrf_failed",
            Self::SessionRequired => "session_required",
        }
    }

    /// The status the specification gives the code. Codes with two statuses
    /// (unavailable_route 429|503, idempotency_replay_unavailable 409|500) default to
    /// the first; [`ApiError::with_status`] picks the other.
    pub fn status(self) -> u16 {
        match self {
            Self::InvalidJson
            | Self::InvalidRequest
            | Self::InvalidParameter
            | Self::UnsupportedCapability
            | Self::UnsupportedParameter
            | Self::Refusal
            | Self::PreviousResponseNotFound => 400,
            Self::InvalidKey | Self::SessionRequired => 401,
            Self::VerificationRequired => 402,
            Self::ModelLocationNotSupported
            | Self::ModelNotGranted
            | Self::SignupDisabled
            | Self::CsrfFailed => 403,
            Self::NotFound => 404,
            Self::IdempotencyConflict
            | Self::IdempotencyReplayUnavailable
            | Self::AccountExists => 409,
            Self::InsufficientQuota
            | Self::OrgUnderReview
            | Self::UnavailableRoute
            | Self::GatewayOverloaded
            | Self::RateLimited => 429,
            Self::RequestCancelled => 499,
            Self::InternalError => 500,
            Self::ProviderInternal | Self::AllRoutesFailed | Self::ProviderOutputTooLarge => 502,
            Self::GatewayDraining => 503,
            Self::DeadlineExceeded => 504,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which envelope an error is rendered in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `{error:{message, type, code, param}}`: chat, responses, embeddings, models, management.
    OpenAi,
    /// `{type:"error", error:{type, message}}`: the messages route.
    Anthropic,
}

/// An error as a client sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub status: u16,
    pub message: Cow<'static, str>,
    pub param: Option<Cow<'static, str>>,
    /// Extra members of the error object (`refusal_reason`, `reason`).
    pub extra: Vec<(&'static str, Value)>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<Cow<'static, str>>) -> Self {
        ApiError {
            code,
            status: code.status(),
            message: message.into(),
            param: None,
            extra: Vec::new(),
        }
    }

    /// Names the request field at fault.
    pub fn param(mut self, param: impl Into<Cow<'static, str>>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    pub fn with_extra(mut self, key: &'static str, value: impl Into<Value>) -> Self {
        self.extra.push((key, value.into()));
        self
    }

    /// 401 `invalid_key`. The same body for a missing, malformed, unknown, revoked or
    /// expired key, so the answer never says which.
    pub fn invalid_key() -> Self {
        Self::new(ErrorCode::InvalidKey, "Invalid API key.")
    }

    pub fn invalid_json(detail: impl fmt::Display) -> Self {
        Self::new(
            ErrorCode::InvalidJson,
            format!("The request body is not valid JSON: {detail}."),
        )
    }

    pub fn not_found(path: &str) -> Self {
        // The path is echoed back truncated: it is the client's own input.
        let shown: String = path.chars().take(200).collect();
        Self::new(ErrorCode::NotFound, format!("Unknown path {shown}."))
    }

    /// 405: `method` is not served here; `allowed` names what is.
    pub fn method_not_allowed(method: impl fmt::Display, allowed: &str) -> Self {
        Self::new(
            ErrorCode::InvalidRequest,
            format!("Method {method} is not allowed here; use {allowed}."),
        )
        .with_status(405)
    }

    pub fn internal() -> Self {
        Self::new(
            ErrorCode::InternalError,
            "The gateway hit an unexpected failure; retry with backoff.",
        )
    }

    pub fn invalid_parameter(param: &'static str, message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(ErrorCode::InvalidParameter, message).param(param)
    }

    /// The OpenAI-convention `type` for this error's status.
    pub fn openai_type(&self) -> &'static str {
        match self.status {
            401 => "authentication_error",
            402 | 403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            400..=499 if self.status != 499 => "invalid_request_error",
            _ => "api_error",
        }
    }

    /// The Anthropic-convention `type` for this error's status.
    pub fn anthropic_type(&self) -> &'static str {
        match self.status {
            400 | 409 | 422 => "invalid_request_error",
            401 => "authentication_error",
            402 => "billing_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            504 => "timeout_error",
            _ => "api_error",
        }
    }

    /// The error object in the given envelope.
    pub fn to_value(&self, format: Format) -> Value {
        match format {
            Format::OpenAi => {
                let mut inner = Map::with_capacity(4 + self.extra.len());
                inner.insert("message".into(), Value::from(self.message.as_ref()));
                inner.insert("type".into(), Value::from(self.openai_type()));
                inner.insert("code".into(), Value::from(self.code.as_str()));
                inner.insert(
                    "param".into(),
                    self.param
                        .as_deref()
                        .map(Value::from)
                        .unwrap_or(Value::Null),
                );
                for (k, v) in &self.extra {
                    inner.insert((*k).into(), v.clone());
                }
                json!({ "error": inner })
            }
            Format::Anthropic => {
                let mut inner = Map::with_capacity(2 + self.extra.len());
                inner.insert("type".into(), Value::from(self.anthropic_type()));
                inner.insert("message".into(), Value::from(self.message.as_ref()));
                for (k, v) in &self.extra {
                    inner.insert((*k).into(), v.clone());
                }
                json!({ "type": "error", "error": inner })
            }
        }
    }

    /// The serialized envelope.
    pub fn to_body(&self, format: Format) -> Vec<u8> {
        // Serializing a Value of strings cannot fail.
        serde_json::to_vec(&self.to_value(format)).unwrap_or_default()
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_distinct_spelling_and_a_spec_status() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "duplicate {code}");
            assert!(matches!(
                code.status(),
                400 | 401 | 402 | 403 | 404 | 409 | 429 | 499 | 500 | 502 | 503 | 504
            ));
        }
        assert_eq!(ErrorCode::InvalidKey.status(), 401);
        assert_eq!(ErrorCode::ModelNotGranted.status(), 403);
        assert_eq!(ErrorCode::AllRoutesFailed.status(), 502);
        assert_eq!(ErrorCode::DeadlineExceeded.status(), 504);
        assert_eq!(ErrorCode::VerificationRequired.status(), 402);
    }

    #[test]
    fn openai_envelope_has_message_type_code_param() {
        let e = ApiError::invalid_parameter("temperature", "bad").to_value(Format::OpenAi);
        assert_eq!(e["error"]["code"], "invalid_parameter");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert_eq!(e["error"]["param"], "temperature");
        assert_eq!(e["error"]["message"], "bad");
        let e = ApiError::invalid_key().to_value(Format::OpenAi);
        assert_eq!(e["error"]["type"], "authentication_error");
        assert!(e["error"]["param"].is_null());
    }

    #[test]
    fn anthropic_envelope_uses_its_own_type_names() {
        let e = ApiError::invalid_key().to_value(Format::Anthropic);
        assert_eq!(e["type"], "error");
        assert_eq!(e["error"]["type"], "authentication_error");
        let e = ApiError::new(ErrorCode::DeadlineExceeded, "late").to_value(Format::Anthropic);
        assert_eq!(e["error"]["type"], "timeout_error");
        let e = ApiError::new(ErrorCode::GatewayDraining, "bye").to_value(Format::Anthropic);
        assert_eq!(e["error"]["type"], "overloaded_error");
        assert!(e["error"].get("code").is_none());
    }

    #[test]
    fn types_follow_status() {
        let t = |c: ErrorCode| ApiError::new(c, "").openai_type();
        assert_eq!(t(ErrorCode::ModelNotGranted), "permission_error");
        assert_eq!(t(ErrorCode::NotFound), "not_found_error");
        assert_eq!(t(ErrorCode::InsufficientQuota), "rate_limit_error");
        assert_eq!(t(ErrorCode::AllRoutesFailed), "api_error");
        assert_eq!(t(ErrorCode::RequestCancelled), "api_error");
        assert_eq!(
            ApiError::new(ErrorCode::UnavailableRoute, "")
                .with_status(503)
                .openai_type(),
            "api_error"
        );
    }

    #[test]
    fn extras_ride_inside_the_error_object() {
        let e = ApiError::new(ErrorCode::Refusal, "provider refused the request: policy")
            .with_extra("refusal_reason", "cyber_policy");
        assert_eq!(
            e.to_value(Format::OpenAi)["error"]["refusal_reason"],
            "cyber_policy"
        );
        assert_eq!(
            e.to_value(Format::Anthropic)["error"]["refusal_reason"],
            "cyber_policy"
        );
    }
}
