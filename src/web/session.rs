//! Who is asking: the `sluice_session` cookie and the member it signs in, the CSRF
//! check of every request that changes something, and the client's origin (its IP
//! address) that signups are counted by.

use super::WebShared;
use crate::accounts::sessions::Session;
use crate::api::respond::Failure;
use crate::downstream::client::Client;
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use sluice_filters::{ApiError, ErrorCode};
use std::net::SocketAddr;
use std::sync::Arc;

pub(crate) const COOKIE: &str = "sluice_session";

/// The `sluice_session` cookie's value, if the request carries one.
pub(crate) fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE).then_some(value.trim())
        })
}

/// The cookie that holds a new session.
pub(crate) fn session_cookie(token: &str, max_age_secs: u64, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age_secs}{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("sluice_session=; Path=/; Max-Age=0"))
}

/// The cookie that clears the session.
pub(crate) fn cleared_cookie(secure: bool) -> HeaderValue {
    HeaderValue::from_static(if secure {
        "sluice_session=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0; Secure"
    } else {
        "sluice_session=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0"
    })
}

/// The client's origin, which the per-origin limits count: the address the
/// trusted edge header carries (`server.client_ip_header`), else the peer
/// address, an IPv6 one by its /64 ([`Client::origin`]). Behind an edge every
/// peer address is the edge's, so without the header all clients would share
/// one limit.
pub(crate) fn origin(parts: &Parts, ip_header: &str) -> String {
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    Client::of(&parts.headers, ip_header, peer)
        .map_or_else(|| "unknown".to_string(), |c| c.origin())
}

/// The client's origin, as an extractor.
pub(crate) struct Origin(pub String);

impl FromRequestParts<WebShared> for Origin {
    type Rejection = std::convert::Infallible;
    async fn from_request_parts(
        parts: &mut Parts,
        web: &WebShared,
    ) -> Result<Self, Self::Rejection> {
        Ok(Origin(origin(
            parts,
            &web.app.config.server.client_ip_header,
        )))
    }
}

/// The live session of the request's cookie.
async fn current(
    parts: &Parts,
    web: &WebShared,
) -> Result<Option<(Arc<Session>, String)>, ApiError> {
    let Some(token) = cookie_token(&parts.headers) else {
        return Ok(None);
    };
    let found = web.sessions.lookup(&web.app.db, token).await?;
    Ok(found.map(|s| (s, token.to_string())))
}

/// Constant-time equality of a presented CSRF token and the session's.
pub(crate) fn csrf_matches(presented: &str, session: &Session) -> bool {
    let (a, b) = (presented.as_bytes(), session.csrf_token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn session_required() -> Failure {
    Failure(ApiError::new(
        ErrorCode::SessionRequired,
        "Sign in to the web app: this call needs a valid sluice_session cookie.",
    ))
}

pub(crate) fn csrf_failed() -> Failure {
    Failure(ApiError::new(
        ErrorCode::CsrfFailed,
        "This request changes something and needs the session's CSRF token (header x-csrf-token).",
    ))
}

/// A signed-in member on the JSON session API; 401 `session_required` without a
/// valid session.
pub(crate) struct ApiMember {
    pub(crate) session: Arc<Session>,
    pub(crate) token: String,
}

impl FromRequestParts<WebShared> for ApiMember {
    type Rejection = Failure;
    async fn from_request_parts(parts: &mut Parts, web: &WebShared) -> Result<Self, Failure> {
        match current(parts, web).await? {
            Some((session, token)) => Ok(ApiMember { session, token }),
            None => Err(session_required()),
        }
    }
}

/// [`ApiMember`] on a call that changes something: also the header
/// `x-csrf-token` with the session's token, else 403 `csrf_failed`.
pub(crate) struct ApiWriter(pub ApiMember);

impl FromRequestParts<WebShared> for ApiWriter {
    type Rejection = Failure;
    async fn from_request_parts(parts: &mut Parts, web: &WebShared) -> Result<Self, Failure> {
        let member = ApiMember::from_request_parts(parts, web).await?;
        let presented = parts
            .headers
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !csrf_matches(presented, &member.session) {
            return Err(csrf_failed());
        }
        Ok(ApiWriter(member))
    }
}

/// A signed-in member on a page; without a session the page sends them to sign in.
pub(crate) struct PageMember {
    pub(crate) session: Arc<Session>,
    pub(crate) token: String,
}

/// The answer to a page request without a session.
pub(crate) struct SignInFirst;

impl IntoResponse for SignInFirst {
    fn into_response(self) -> Response {
        Redirect::to("/login").into_response()
    }
}

impl FromRequestParts<WebShared> for PageMember {
    type Rejection = Response;
    async fn from_request_parts(parts: &mut Parts, web: &WebShared) -> Result<Self, Response> {
        match current(parts, web).await {
            Ok(Some((session, token))) => Ok(PageMember { session, token }),
            Ok(None) => Err(SignInFirst.into_response()),
            Err(e) => Err(Failure(e).into_response()),
        }
    }
}

/// A page open to visitors that shows a signed-in member more (the catalog).
pub(crate) struct PageVisitor(pub Option<PageMember>);

impl FromRequestParts<WebShared> for PageVisitor {
    type Rejection = Response;
    async fn from_request_parts(parts: &mut Parts, web: &WebShared) -> Result<Self, Response> {
        match current(parts, web).await {
            Ok(s) => Ok(PageVisitor(
                s.map(|(session, token)| PageMember { session, token }),
            )),
            Err(e) => Err(Failure(e).into_response()),
        }
    }
}

/// The session of a page request, if any (public pages that change with it).
pub(crate) struct MaybeMember(pub Option<Arc<Session>>);

impl FromRequestParts<WebShared> for MaybeMember {
    type Rejection = Response;
    async fn from_request_parts(parts: &mut Parts, web: &WebShared) -> Result<Self, Response> {
        match current(parts, web).await {
            Ok(s) => Ok(MaybeMember(s.map(|(s, _)| s))),
            Err(e) => Err(Failure(e).into_response()),
        }
    }
}

/// A form post's fields (`application/x-www-form-urlencoded`), in order.
pub(crate) struct Form(pub Vec<(String, String)>);

impl Form {
    pub(crate) fn parse(body: &[u8]) -> Form {
        Form(
            form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The first value of a field ("" when absent).
    pub(crate) fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }

    /// Every value of a field, in order.
    pub(crate) fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| k == name)
    }
}

/// A form post without the session's CSRF token: 403, and nothing changes.
pub(crate) struct FormRefused;

impl IntoResponse for FormRefused {
    fn into_response(self) -> Response {
        (
            StatusCode::FORBIDDEN,
            axum::response::Html(
                "<!doctype html><title>Forbidden</title><p>This form is out of date or did not come \
                 from this site. <a href=\"/overview\">Go back</a> and try again.</p>",
            ),
        )
            .into_response()
    }
}

/// A form post of a signed-in member, its CSRF field checked.
pub(crate) fn checked_form(member: &PageMember, body: &[u8]) -> Result<Form, FormRefused> {
    let form = Form::parse(body);
    if csrf_matches(form.get("csrf"), &member.session) {
        Ok(form)
    } else {
        Err(FormRefused)
    }
}
