//! The keys page: the org's keys (never a secret), minting one (name, optional
//! expiry, daily spend cap, requests and tokens per minute; the plaintext shown
//! once, on the answer to the form), and revoking one.

use super::{org, shell, status_of, with_status};
use crate::accounts::{keys, users};
use crate::api::respond::Failure;
use crate::web::api::{key_json, mint, revoke as revoke_key, MintKey};
use crate::web::session::{checked_form, Form, PageMember};
use crate::web::WebShared;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::{json as j, Value};
use sluice_filters::ApiError;
use std::collections::HashMap;

async fn render(
    web: &WebShared,
    m: &PageMember,
    notice: Option<&str>,
    extra: Value,
    status: StatusCode,
) -> Response {
    let org = match org(web, m).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let db = &web.app.db;
    let (list, members) = match (
        keys::list_for_org(db, &org.id).await,
        users::members(db, &org.id).await,
    ) {
        (Ok(k), Ok(u)) => (k, u),
        (Err(e), _) | (_, Err(e)) => return Failure(e).into_response(),
    };
    let emails: HashMap<&str, &str> = members
        .iter()
        .map(|u| (u.user_id.as_str(), u.email.as_str()))
        .collect();
    let now = crate::store::now_ms();
    let rows: Vec<Value> = list
        .iter()
        .rev()
        .map(|k| {
            let mut v = key_json(k);
            v["owner"] = j!(k
                .user_id
                .as_deref()
                .and_then(|u| emails.get(u).copied())
                .unwrap_or("operator"));
            v["state"] = j!(if k.revoked_at.is_some() {
                "revoked"
            } else if k.is_live(now) {
                "active"
            } else {
                "expired"
            });
            v
        })
        .collect();
    let mut ctx = shell(web, m, &org, "keys", "API keys", notice);
    ctx["keys"] = j!(rows);
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            ctx[k] = v;
        }
    }
    let mut res = with_status(status, web.templates.page("keys.html", &ctx));
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

pub(crate) async fn page(
    State(web): State<WebShared>,
    m: PageMember,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let notice = q.get("notice").map(String::as_str);
    render(&web, &m, notice, j!({}), StatusCode::OK).await
}

/// The form's optional number: empty is none.
fn number<T: std::str::FromStr>(form: &Form, field: &'static str) -> Result<Option<T>, Failure> {
    let v = form.get(field).trim();
    if v.is_empty() {
        return Ok(None);
    }
    v.parse().map(Some).map_err(|_| {
        Failure(ApiError::invalid_parameter(
            field,
            format!("{field} must be a number"),
        ))
    })
}

fn mint_request(form: &Form) -> Result<MintKey, Failure> {
    let expires = form.get("expires_on").trim();
    Ok(MintKey {
        name: form.get("name").to_string(),
        // A date from the form's date field: the key works until that day begins (UTC).
        expires_at: (!expires.is_empty()).then(|| j!(format!("{expires}T00:00:00Z"))),
        daily_spend_cap_usd: number(form, "daily_spend_cap_usd")?,
        rpm: number(form, "rpm")?,
        tpm: number(form, "tpm")?,
    })
}

/// `POST /keys`: mints a key; the answer shows its plaintext once.
pub(crate) async fn create(State(web): State<WebShared>, m: PageMember, body: Bytes) -> Response {
    let form = match checked_form(&m, &body) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    let minted = match mint_request(&form) {
        Ok(req) => mint(&web, &m.session.org_id, &m.session.user_id, req).await,
        Err(f) => Err(f),
    };
    match minted {
        Ok(v) => {
            let extra = j!({"new_key": {"api_key": v["api_key"], "name": form.get("name").trim()}});
            render(&web, &m, None, extra, StatusCode::OK).await
        }
        Err(f) => {
            let status = status_of(&f);
            let extra = j!({"error": f.0.message, "form": {
                "name": form.get("name"), "expires_on": form.get("expires_on"),
                "daily_spend_cap_usd": form.get("daily_spend_cap_usd"),
                "rpm": form.get("rpm"), "tpm": form.get("tpm"),
            }});
            render(&web, &m, None, extra, status).await
        }
    }
}

/// `POST /keys/{api_key_id}/revoke`.
pub(crate) async fn revoke(
    State(web): State<WebShared>,
    m: PageMember,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(r) = checked_form(&m, &body) {
        return r.into_response();
    }
    match revoke_key(&web, &m.session.org_id, &id).await {
        Ok(()) => Redirect::to("/keys?notice=key_revoked").into_response(),
        Err(f) if f.0.status == 404 => super::not_found(&web),
        Err(f) => f.into_response(),
    }
}
