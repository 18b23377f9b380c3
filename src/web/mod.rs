//! The web app on the web listener: signup, sign-in by mailed link, and for a
//! signed-in member the pages of their org (overview, keys, models and their
//! waterfalls, provider connections, usage, billing, settings, a playground),
//! server-rendered from templates with a few KB of plain JavaScript; the small JSON
//! session API the pages' scripts and outside suites use; the signup API; and the
//! payment provider's webhook.
//!
//! Every page and call acts for the session's member in the session's org: another
//! org's ids are 404. Every request that changes something carries the session's
//! CSRF token. Answers carry a strict content security policy, refuse framing and
//! sniffing, and never hold a secret but the one a member just minted.

mod api;
mod auth;
mod chart;
mod pages;
mod render;
mod session;
mod webhooks;

use crate::accounts::mail::Mailer;
use crate::accounts::sessions::Sessions;
use crate::api::Shared;
use crate::billing::payments::Stripe;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// What the web app's handlers share.
pub(crate) struct Web {
    pub(crate) app: Shared,
    pub(crate) templates: render::Templates,
    pub(crate) sessions: Sessions,
    pub(crate) mailer: Mailer,
    pub(crate) payments: Option<Stripe>,
    /// The playground's client, and where it reaches the gateway.
    pub(crate) http: reqwest::Client,
    pub(crate) gateway: SocketAddr,
    /// The Content-Security-Policy of every answer.
    csp: HeaderValue,
    /// The session lifetime (`[web] session_ttl`).
    pub(crate) session_ttl: Duration,
}

pub(crate) type WebShared = Arc<Web>;

/// The web app's router. `gateway` is where the gateway listener accepts
/// connections (the playground calls it as a client would).
pub(crate) fn router(state: Shared, gateway: SocketAddr) -> anyhow::Result<Router> {
    let session_ttl = crate::config::parse_duration(&state.config.web.session_ttl)
        .map_err(|e| anyhow::anyhow!("web.session_ttl: {e}"))?;
    let mailer = Mailer::from_config(&state.config.email)?;
    let payments = Stripe::from_config(&state.config.payments)?;
    let mut form_targets = vec!["'self'".to_string()];
    if let Some(p) = &payments {
        form_targets.extend(p.checkout_origins());
    }
    // No inline script or style anywhere: the pages load /static/app.js and
    // /static/app.css, and the charts are SVG with presentation attributes.
    let csp = format!(
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; \
         frame-ancestors 'none'; form-action {}",
        form_targets.join(" ")
    );
    let web = Arc::new(Web {
        templates: render::Templates::new()?,
        sessions: Sessions::default(),
        mailer,
        payments,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()?,
        gateway: reachable(gateway),
        csp: HeaderValue::from_str(&csp)?,
        session_ttl,
        app: state,
    });
    Ok(Router::new()
        .route("/", get(auth::landing))
        .route("/healthz", get(|| async { "ok" }))
        .route("/static/app.css", get(render::stylesheet))
        .route("/static/app.js", get(render::script))
        .route("/static/icon.svg", get(render::icon))
        .route("/favicon.ico", get(render::icon))
        .route("/signup", get(auth::signup_page).post(auth::signup_form))
        .route("/login", get(auth::login_page).post(auth::login_form))
        .route("/link/{token}", get(auth::follow_link))
        .route("/logout", post(auth::logout_form))
        .route("/api/signup/instant", post(auth::signup_api))
        .route("/webhooks/stripe", post(webhooks::stripe))
        .merge(pages::routes())
        .route("/api/session", get(api::session))
        .route("/api/session/logout", post(api::logout))
        .route("/api/session/keys", get(api::keys).post(api::mint_key))
        .route("/api/session/keys/{api_key_id}", delete(api::revoke_key))
        .route("/api/session/members", post(api::invite))
        .route("/api/session/members/{user_id}", delete(api::remove_member))
        .route(
            "/api/session/settings",
            get(api::settings).put(api::change_settings),
        )
        .route("/api/session/checkout", post(api::checkout))
        .route("/api/gateway/usage/daily", get(api::usage_daily))
        .route("/api/gateway/usage/events", get(api::usage_events))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(web.clone(), secure_headers))
        .with_state(web))
}

/// A wildcard bind address is reached on loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    let mut a = addr;
    if a.ip().is_unspecified() {
        a.set_ip(if a.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    a
}

/// The headers every answer carries: the content security policy (no framing, no
/// inline script), no MIME sniffing, no referrer beyond this origin (a link's
/// token never leaks through one), and no caching of anything signed-in.
async fn secure_headers(State(web): State<WebShared>, req: Request, next: Next) -> Response {
    let is_static = req.uri().path().starts_with("/static/");
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, web.csp.clone());
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    if !is_static && !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    // Behind TLS the browser is told to come back only over it (a year).
    if web.app.config.web_cookies_secure() {
        h.insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    res
}

/// Unknown paths: the JSON envelope under /api, a page elsewhere.
async fn not_found(State(web): State<WebShared>, uri: axum::http::Uri) -> Response {
    if uri.path().starts_with("/api/") {
        return crate::api::respond::Failure(sluice_filters::ApiError::not_found(uri.path()))
            .into_response();
    }
    let html = web.templates.page(
        "message.html",
        &serde_json::json!({
            "title": "Not found",
            "heading": "This page does not exist",
            "text": "The address may be mistyped, or the page may belong to another organization.",
        }),
    );
    (StatusCode::NOT_FOUND, html).into_response()
}
