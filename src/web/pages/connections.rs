//! The connections page: the org's own provider accounts (BYOK). Add one, rotate
//! its secret, check it with the provider, delete it; the same logic as the
//! management API's provider-connections routes. A secret goes in and is never
//! shown back.

use super::{org, shell, status_of, with_status};
use crate::api::byok::{check_account, create_account, delete_account, rotate_account, Account};
use crate::api::respond::Failure;
use crate::byok::connections;
use crate::config::PROVIDERS;
use crate::web::session::{checked_form, Form, PageMember};
use crate::web::WebShared;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::{json as j, Map, Value};
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
    let list = match connections::list(&web.app.db, &org.id).await {
        Ok(l) => l,
        Err(e) => return Failure(e).into_response(),
    };
    let mut ctx = shell(web, m, &org, "connections", "Provider connections", notice);
    ctx["connections"] = j!(list
        .iter()
        .map(|c| {
            let mut v = c.to_json();
            v["models"] = j!(c
                .config
                .get("models")
                .and_then(Value::as_object)
                .map(|o| o.len())
                .unwrap_or(0));
            v
        })
        .collect::<Vec<_>>());
    ctx["providers"] = j!(PROVIDERS
        .iter()
        .filter(|p| connections::accepts_connections(p))
        .collect::<Vec<_>>());
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            ctx[k] = v;
        }
    }
    with_status(status, web.templates.page("connections.html", &ctx))
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
        j!({}),
        StatusCode::OK,
    )
    .await
}

/// The account's config from the form's fields: `base_url`, `access_key_id`
/// (Bedrock), and `models` lines of `slug = provider model id`.
fn config_of(form: &Form) -> Result<Value, Failure> {
    let mut config = Map::new();
    let base = form.get("base_url").trim();
    if !base.is_empty() {
        config.insert("base_url".into(), j!(base));
    }
    let key_id = form.get("access_key_id").trim();
    if !key_id.is_empty() {
        config.insert("access_key_id".into(), j!(key_id));
    }
    let mut models = Map::new();
    for line in form.get("models").lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some((slug, id)) = line.split_once('=') else {
            return Err(Failure(ApiError::invalid_parameter(
                "config.models",
                "each model line reads: model slug = provider model id",
            )));
        };
        models.insert(slug.trim().to_string(), j!(id.trim()));
    }
    if !models.is_empty() {
        config.insert("models".into(), Value::Object(models));
    }
    Ok(Value::Object(config))
}

/// `POST /connections`: adds an account.
pub(crate) async fn create(State(web): State<WebShared>, m: PageMember, body: Bytes) -> Response {
    let form = match checked_form(&m, &body) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    let provider = form.get("provider").to_string();
    let made = match config_of(&form) {
        Ok(config) => {
            let account = Account {
                setup_alias: form.get("setup_alias").trim().to_string(),
                secret: form.get("secret").to_string(),
                config: Some(config),
            };
            create_account(&web.app, &m.session.org_id, &provider, account).await
        }
        Err(f) => Err(f),
    };
    match made {
        Ok(_) => Redirect::to("/connections?notice=connection_added").into_response(),
        Err(f) => {
            // The form comes back filled in, but for the secret.
            let extra = j!({"error": f.0.message, "form": {
                "provider": provider, "setup_alias": form.get("setup_alias"),
                "base_url": form.get("base_url"), "access_key_id": form.get("access_key_id"),
                "models": form.get("models"),
            }});
            render(&web, &m, None, extra, status_of(&f)).await
        }
    }
}

/// `POST /connections/{provider}/{alias}/{check|rotate|delete}`.
pub(crate) async fn act(
    State(web): State<WebShared>,
    m: PageMember,
    Path((provider, alias, action)): Path<(String, String, String)>,
    body: Bytes,
) -> Response {
    let form = match checked_form(&m, &body) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    let org_id = &m.session.org_id;
    let done: Result<Option<Value>, Failure> = match action.as_str() {
        "check" => check_account(&web.app, org_id, &provider, &alias)
            .await
            .map(Some),
        "rotate" => {
            let account = Account {
                setup_alias: alias.clone(),
                secret: form.get("secret").to_string(),
                // The saved config stays.
                config: None,
            };
            rotate_account(&web.app, org_id, &provider, account)
                .await
                .map(|_| None)
        }
        "delete" => delete_account(&web.app, org_id, &provider, &alias)
            .await
            .map(|()| None),
        _ => return super::not_found(&web),
    };
    match done {
        Ok(Some(checked)) => {
            let extra = j!({"checked": checked});
            render(&web, &m, None, extra, StatusCode::OK).await
        }
        Ok(None) => {
            let notice = if action == "rotate" {
                "connection_rotated"
            } else {
                "connection_deleted"
            };
            Redirect::to(&format!("/connections?notice={notice}")).into_response()
        }
        Err(f) if f.0.status == 404 => super::not_found(&web),
        Err(f) => {
            let extra = j!({"error": f.0.message});
            render(&web, &m, None, extra, status_of(&f)).await
        }
    }
}
