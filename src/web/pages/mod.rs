//! The signed-in member's pages. Each shows the session's org only; each form
//! carries the session's CSRF token and is checked before anything changes; a
//! form that succeeds redirects (so a reload never repeats it), one that fails
//! shows the page again with the reason.

mod billing;
mod connections;
mod keys;
mod models;
mod overview;
mod playground;
mod settings;
mod usage;

use super::session::PageMember;
use super::WebShared;
use crate::accounts::orgs::OrgRecord;
use crate::api::respond::Failure;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json as j, Value};

pub(crate) fn routes() -> Router<WebShared> {
    Router::new()
        .route("/overview", get(overview::page))
        .route("/verify/resend", post(overview::resend))
        .route("/keys", get(keys::page).post(keys::create))
        .route("/keys/{api_key_id}/revoke", post(keys::revoke))
        .route("/models", get(models::list))
        .route("/models/{slug}", get(models::one))
        .route("/models/{slug}/waterfall", post(models::waterfall))
        .route(
            "/connections",
            get(connections::page).post(connections::create),
        )
        .route(
            "/connections/{provider}/{alias}/{action}",
            post(connections::act),
        )
        .route("/usage", get(usage::page))
        .route("/usage/events.csv", get(usage::csv))
        .route("/billing", get(billing::page))
        .route("/billing/checkout", post(billing::checkout))
        .route("/settings", get(settings::page).post(settings::save))
        .route("/settings/members", post(settings::invite))
        .route("/playground", get(playground::page).post(playground::send))
}

/// The fixed notices a redirect may name (`?notice=`); no text of the query is
/// ever shown.
fn notice_text(code: &str) -> Option<&'static str> {
    Some(match code {
        "verified" => "Your email address is verified: calls paid from credits work now.",
        "signed_in" => "You are signed in.",
        "verified_keys_revoked" => {
            "Your email address is verified. The keys made before you proved it were revoked: \
             whoever signed up with your address had them. Make a new key on the Keys page."
        }
        "joined" => "Welcome: you joined the organization.",
        "key_revoked" => "The key is revoked: it stops working on every instance within a second.",
        "waterfall_saved" => {
            "The waterfall is saved: requests follow the new order within a second."
        }
        "waterfall_reset" => "The waterfall is back to the default order.",
        "connection_added" => {
            "The connection is saved. Check it to see the provider accept the key."
        }
        "connection_rotated" => "The new secret is saved.",
        "connection_deleted" => "The connection is deleted.",
        "settings_saved" => "The settings are saved.",
        "invited" => "The invitation is on its way.",
        "verification_sent" => "A new verification link is on its way.",
        "checkout_success" => {
            "Payment received: credits appear as soon as the payment provider confirms it."
        }
        "checkout_cancelled" => "The checkout was cancelled; nothing was charged.",
        _ => return None,
    })
}

/// What every signed-in page shows: the org, the member, the CSRF token, the
/// navigation, a notice.
pub(crate) fn shell(
    web: &WebShared,
    m: &PageMember,
    org: &OrgRecord,
    nav: &str,
    title: &str,
    notice: Option<&str>,
) -> Value {
    j!({
        "title": title,
        "nav": nav,
        "signed_in": true,
        "csrf": m.session.csrf_token,
        "me": {"email": m.session.email, "user_id": m.session.user_id},
        "org": {
            "id": org.id,
            "name": org.name,
            "email_verified": org.email_verified,
            "card_verified": org.card_on_file && org.settled,
            "balance_usd": crate::money::micro_to_usd(org.balance_micro_usd),
            "tier": org.tier,
            "under_review": org.under_review,
        },
        "base_url": web.app.config.server.public_base_url.trim_end_matches('/'),
        "web_url": web.app.config.server.public_web_url.trim_end_matches('/'),
        "payments": web.payments.is_some(),
        "notice": notice.and_then(notice_text),
    })
}

/// The frame of a page a visitor sees (no session): the public header, no side
/// navigation.
pub(crate) fn visitor_shell(web: &WebShared, nav: &str, title: &str) -> Value {
    let config = &web.app.config;
    j!({
        "title": title,
        "nav": nav,
        "signed_in": false,
        "signup_enabled": config.signup.enabled,
        "base_url": config.server.public_base_url.trim_end_matches('/'),
    })
}

/// The session's org, or the answer that it is gone.
pub(crate) async fn org(web: &WebShared, m: &PageMember) -> Result<OrgRecord, Response> {
    super::api::org_of(web, &m.session.org_id)
        .await
        .map_err(IntoResponse::into_response)
}

/// A page answer with a status (a form that failed shows the page again).
pub(crate) fn with_status(status: StatusCode, html: axum::response::Html<String>) -> Response {
    (status, html).into_response()
}

/// The status a failed action's page answers with.
pub(crate) fn status_of(f: &Failure) -> StatusCode {
    StatusCode::from_u16(f.0.status).unwrap_or(StatusCode::BAD_REQUEST)
}

/// A "404" page for an id that is not the org's.
pub(crate) fn not_found(web: &WebShared) -> Response {
    with_status(
        StatusCode::NOT_FOUND,
        web.templates.page(
            "message.html",
            &j!({
                "title": "Not found",
                "heading": "Not found",
                "text": "There is no such thing in your organization.",
            }),
        ),
    )
}
