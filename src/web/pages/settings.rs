//! The settings page: the org's members and inviting one by email, and the org
//! settings (prompt capture, the require-ZDR provider policy, credits overflow)
//! through the same rules as `PUT /api/session/settings`.

use super::{org, shell, status_of, with_status};
use crate::accounts::{links, orgs, signin, users};
use crate::api::respond::Failure;
use crate::web::api::{apply_settings, user_of};
use crate::web::session::{checked_form, PageMember};
use crate::web::WebShared;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::json as j;
use std::collections::HashMap;

async fn render(
    web: &WebShared,
    m: &PageMember,
    notice: Option<&str>,
    error: Option<String>,
    status: StatusCode,
) -> Response {
    let org = match org(web, m).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let members = match users::members(&web.app.db, &org.id).await {
        Ok(v) => v,
        Err(e) => return Failure(e).into_response(),
    };
    let pending = match links::pending_invitations(&web.app.db, &org.id).await {
        Ok(v) => v,
        Err(e) => return Failure(e).into_response(),
    };
    let default = web.app.config.responses.prompt_capture_default;
    let mut ctx = shell(web, m, &org, "settings", "Settings", notice);
    ctx["members"] = j!(members);
    ctx["pending"] = j!(pending
        .iter()
        .map(|(email, at)| j!({"email": email, "invited_at": at}))
        .collect::<Vec<_>>());
    ctx["settings"] = org.settings_json(default);
    ctx["capture_default"] = j!(default);
    ctx["error"] = j!(error);
    with_status(status, web.templates.page("settings.html", &ctx))
}

pub(crate) async fn page(
    State(web): State<WebShared>,
    m: PageMember,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    render(
        &web,
        &m,
        q.get("notice").map(String::as_str),
        None,
        StatusCode::OK,
    )
    .await
}

/// `POST /settings`: each checkbox sets its setting (absent is off).
pub(crate) async fn save(State(web): State<WebShared>, m: PageMember, body: Bytes) -> Response {
    let form = match checked_form(&m, &body) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    let on = |f: &str| form.get(f) == "on";
    let change = orgs::SettingsChange {
        prompt_capture: Some(on("prompt_capture")),
        require_zdr: Some(on("require_zdr")),
        credits_overflow: Some(on("credits_overflow")),
    };
    match apply_settings(&web, &m.session.org_id, change).await {
        Ok(_) => Redirect::to("/settings?notice=settings_saved").into_response(),
        Err(f) => {
            let status = status_of(&f);
            render(&web, &m, None, Some(f.0.message.to_string()), status).await
        }
    }
}

/// `POST /settings/members` (`email`): invites the address into the org.
pub(crate) async fn invite(State(web): State<WebShared>, m: PageMember, body: Bytes) -> Response {
    let form = match checked_form(&m, &body) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    let inviter = match user_of(&web, &m.session.user_id).await {
        Ok(u) => u,
        Err(f) => return f.into_response(),
    };
    let app = &web.app;
    let done = signin::invite(
        &app.db,
        &web.mailer,
        &app.config,
        &m.session.org_id,
        &inviter,
        form.get("email"),
    )
    .await;
    match done {
        Ok(_) => Redirect::to("/settings?notice=invited").into_response(),
        Err(e) => {
            let f = Failure(e);
            let status = status_of(&f);
            render(&web, &m, None, Some(f.0.message.to_string()), status).await
        }
    }
}
