//! Getting in and out: the landing page, signup (the form and
//! `POST /api/signup/instant`), sign-in by mailed link (`POST /login`), following a
//! link (which always opens a new session: a cookie the browser held is never
//! adopted), and signing out.
//!
//! The signup form has no session yet; its CSRF token is a double-submit one: a
//! random value in an HttpOnly, SameSite=Strict cookie and in the form, which a
//! page of another site can neither read nor set.

use super::session::{self, cookie_token, MaybeMember, Origin, PageMember};
use super::WebShared;
use crate::accounts::signin::{self, LoginRequest};
use crate::accounts::{links, signup};
use crate::api::respond::{json, parse_body, ApiResult, Failure};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::{json as j, Value};
use sluice_filters::{ApiError, ErrorCode};

const FORM_COOKIE: &str = "sluice_form";

/// The signed-out pages' form token: the browser's, or a new one it is given
/// (`Secure` where the session cookie is).
fn form_token(headers: &HeaderMap, secure: bool) -> (String, Option<HeaderValue>) {
    let held = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|p| {
            let (k, v) = p.trim().split_once('=')?;
            (k == FORM_COOKIE && v.len() == 64).then(|| v.to_string())
        });
    match held {
        Some(t) => (t, None),
        None => {
            let t = links::token();
            let cookie = HeaderValue::from_str(&format!(
                "{FORM_COOKIE}={t}; Path=/; HttpOnly; SameSite=Strict; Max-Age=86400{}",
                if secure { "; Secure" } else { "" }
            ))
            .ok();
            (t, cookie)
        }
    }
}

/// Whether a signed-out form post carries the browser's form token.
fn form_token_matches(headers: &HeaderMap, presented: &str) -> bool {
    let (held, fresh) = form_token(headers, false);
    fresh.is_none() && !presented.is_empty() && held.as_bytes() == presented.as_bytes()
}

fn with_cookie(mut res: Response, cookie: Option<HeaderValue>) -> Response {
    if let Some(c) = cookie {
        res.headers_mut().append(header::SET_COOKIE, c);
    }
    res
}

/// Whether the web app's public URL names this machine (a developer's service).
fn loopback_web(url: &str) -> bool {
    let Some(host) = reqwest::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
    else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn base_ctx(web: &WebShared) -> Value {
    let config = &web.app.config;
    j!({
        "base_url": config.server.public_base_url.trim_end_matches('/'),
        "signup_enabled": config.signup.enabled,
        // No SMTP server: the page says where the mail went, to a developer on
        // their own machine only (the folder holds live sign-in links).
        "outbox": (config.email.smtp_url.is_empty() && loopback_web(&config.server.public_web_url))
            .then_some(crate::accounts::mail::OUTBOX),
    })
}

/// `/`: the landing page with the public catalog; a signed-in member goes to the
/// overview.
pub(crate) async fn landing(
    State(web): State<WebShared>,
    MaybeMember(member): MaybeMember,
    headers: HeaderMap,
) -> Response {
    if member.is_some() {
        return Redirect::to("/overview").into_response();
    }
    let catalog = web.app.catalog.snapshot();
    let models: Vec<Value> = catalog
        .visible(None)
        .into_iter()
        .map(|m| {
            let s = &m.spec;
            j!({
                "slug": s.slug, "name": s.display_name, "maker": s.owned_by,
                "context": s.context_window, "input": s.price.input, "output": s.price.output,
                "retention": m.retention.map(|r| r.as_str()),
            })
        })
        .collect();
    let (token, cookie) = form_token(&headers, web.app.config.web_cookies_secure());
    let mut ctx = base_ctx(&web);
    ctx["title"] = j!("One base URL for many models");
    ctx["models"] = j!(models);
    ctx["form_token"] = j!(token);
    with_cookie(
        web.templates.page("landing.html", &ctx).into_response(),
        cookie,
    )
}

pub(crate) async fn signup_page(State(web): State<WebShared>, headers: HeaderMap) -> Response {
    let (token, cookie) = form_token(&headers, web.app.config.web_cookies_secure());
    let mut ctx = base_ctx(&web);
    ctx["title"] = j!("Sign up");
    ctx["form_token"] = j!(token);
    with_cookie(
        web.templates.page("signup.html", &ctx).into_response(),
        cookie,
    )
}

/// The signup form: the same signup as the API; the page shows the first key once.
pub(crate) async fn signup_form(
    State(web): State<WebShared>,
    Origin(origin): Origin,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let form = session::Form::parse(&body);
    let (token, cookie) = form_token(&headers, web.app.config.web_cookies_secure());
    let mut ctx = base_ctx(&web);
    ctx["title"] = j!("Sign up");
    ctx["form_token"] = j!(token);
    ctx["email"] = j!(form.get("email"));
    if !form_token_matches(&headers, form.get("csrf")) {
        ctx["error"] = j!("This form expired; please send it again.");
        let page = web.templates.page("signup.html", &ctx);
        return with_cookie((StatusCode::FORBIDDEN, page).into_response(), cookie);
    }
    let app = &web.app;
    match signup::instant(
        &app.db,
        &app.directory,
        &web.mailer,
        &app.config,
        &origin,
        form.get("email"),
    )
    .await
    {
        Ok(done) => {
            ctx["title"] = j!("Check your inbox");
            ctx["signed_up"] = j!({
                "email": done.email,
                "api_key": done.api_key,
                "credits": done.credits_granted,
            });
            let page = web.templates.page("signup.html", &ctx);
            let mut res = page.into_response();
            // The key is on this page once: no cache may keep it.
            res.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            res
        }
        Err(e) => {
            ctx["error"] = j!(e.message);
            ctx["exists"] = j!(e.code == sluice_filters::ErrorCode::AccountExists);
            let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
            (status, web.templates.page("signup.html", &ctx)).into_response()
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignupBody {
    /// Missing or not a string is an email rejected (SPEC: `invalid_request`,
    /// `param: email`), not a malformed parameter.
    #[serde(default, deserialize_with = "email_string")]
    email: Option<String>,
}

fn email_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => Some(s),
        _ => None,
    })
}

/// `POST {web_url}/api/signup/instant` `{email}`: 200 with the signup result.
pub(crate) async fn signup_api(
    State(web): State<WebShared>,
    Origin(origin): Origin,
    body: Bytes,
) -> ApiResult {
    let app = &web.app;
    // Disabled and rate-limited answers come before the body is judged.
    let parsed: Result<SignupBody, _> = parse_body(&body);
    let email = match (parsed, app.config.signup.enabled) {
        (Ok(SignupBody { email: Some(e) }), _) => e,
        (_, false) => String::new(),
        (Ok(SignupBody { email: None }), true) => {
            return Err(Failure(
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    "email rejected: the body has no email string.",
                )
                .param("email"),
            ))
        }
        (Err(e), true) => return Err(Failure(e)),
    };
    let done = signup::instant(
        &app.db,
        &app.directory,
        &web.mailer,
        &app.config,
        &origin,
        &email,
    )
    .await?;
    Ok(json(StatusCode::OK, &done))
}

pub(crate) async fn login_page(State(web): State<WebShared>) -> Response {
    let mut ctx = base_ctx(&web);
    ctx["title"] = j!("Sign in");
    web.templates.page("login.html", &ctx).into_response()
}

/// `POST /login` (form field `email`): mails a sign-in link; the page reads the
/// same whether or not the address has an account. It needs no CSRF token: all it
/// can do is mail the address.
pub(crate) async fn login_form(
    State(web): State<WebShared>,
    Origin(origin): Origin,
    body: Bytes,
) -> Response {
    let form = session::Form::parse(&body);
    let email = form.get("email");
    let mut ctx = base_ctx(&web);
    ctx["title"] = j!("Sign in");
    ctx["email"] = j!(email);
    let app = &web.app;
    match signin::request_link(&app.db, &web.mailer, &app.config, &origin, email).await {
        Ok(LoginRequest::Answered) => {
            ctx["sent"] = j!(true);
            web.templates.page("login.html", &ctx).into_response()
        }
        Ok(LoginRequest::RateLimited) => {
            ctx["error"] = j!(
                "Too many sign-in requests from your network in the last hour; try again later."
            );
            (
                StatusCode::TOO_MANY_REQUESTS,
                web.templates.page("login.html", &ctx),
            )
                .into_response()
        }
        Err(e) if e.status == 400 => {
            ctx["error"] = j!(e.message);
            (
                StatusCode::BAD_REQUEST,
                web.templates.page("login.html", &ctx),
            )
                .into_response()
        }
        Err(e) => Failure(e).into_response(),
    }
}

/// `GET /link/{token}`: a mailed link. It proves the address, and opens a new
/// session (the cookie the browser held, if any, is ended and replaced).
pub(crate) async fn follow_link(
    State(web): State<WebShared>,
    Path(token): Path<String>,
    headers: HeaderMap,
) -> Response {
    let app = &web.app;
    let followed = match signin::follow(&app.db, &app.directory, &token).await {
        Ok(f) => f,
        Err(e) => return Failure(e).into_response(),
    };
    let Some(f) = followed else {
        let mut ctx = base_ctx(&web);
        ctx["title"] = j!("Link expired");
        ctx["expired"] = j!(true);
        return (StatusCode::GONE, web.templates.page("login.html", &ctx)).into_response();
    };
    if let Some(old) = cookie_token(&headers) {
        if let Err(e) = web.sessions.revoke(&app.db, old).await {
            return Failure(e).into_response();
        }
    }
    let (token, _) = match web
        .sessions
        .open(&app.db, &f.user_id, &f.org_id, web.session_ttl)
        .await
    {
        Ok(s) => s,
        Err(e) => return Failure(e).into_response(),
    };
    let notice = match f.purpose {
        _ if f.revoked_keys > 0 => "verified_keys_revoked",
        links::Purpose::Verify => "verified",
        links::Purpose::SignIn => "signed_in",
        links::Purpose::Invite => "joined",
    };
    let mut res = Redirect::to(&format!("/overview?notice={notice}")).into_response();
    res.headers_mut().append(
        header::SET_COOKIE,
        session::session_cookie(
            &token,
            web.session_ttl.as_secs(),
            app.config.web_cookies_secure(),
        ),
    );
    res
}

/// `POST /logout` (form): ends the session everywhere and clears the cookie.
pub(crate) async fn logout_form(
    State(web): State<WebShared>,
    member: PageMember,
    body: Bytes,
) -> Response {
    if let Err(r) = session::checked_form(&member, &body) {
        return r.into_response();
    }
    if let Err(e) = web.sessions.revoke(&web.app.db, &member.token).await {
        return Failure(e).into_response();
    }
    let mut res = Redirect::to("/").into_response();
    res.headers_mut().append(
        header::SET_COOKIE,
        session::cleared_cookie(web.app.config.web_cookies_secure()),
    );
    res
}
