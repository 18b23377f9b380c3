//! The org's own routing: provider connections (BYOK), waterfall overrides, the
//! require-ZDR provider policy. An `org_id` in the path that is not the key's org is
//! 404, whatever exists.

use super::respond::{json, parse_body, ApiResult, Failure};
use super::{Authed, Shared};
use crate::accounts::OrgRecord;
use crate::byok::{active_route, connections, waterfalls, Live};
use crate::upstream::account_check::{self, Checked};
use crate::upstream::auth::google::ServiceAccount;
use crate::upstream::egress;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json as j, Value};
use sluice_filters::{ApiError, ErrorCode};
use std::collections::HashMap;
use std::sync::Arc;

fn own(org_id: &str, caller: &str) -> Result<(), Failure> {
    if org_id == caller {
        Ok(())
    } else {
        Err(Failure(ApiError::new(
            ErrorCode::NotFound,
            "No such organization.",
        )))
    }
}

/// A create or rotate body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Account {
    pub(crate) setup_alias: String,
    pub(crate) secret: String,
    pub(crate) config: Option<Value>,
}

/// A create or rotate body, checked; `config` defaults to `{}`.
fn account_body(provider: &str, body: &[u8]) -> Result<(Account, Value), Failure> {
    checked(provider, parse_body(body)?)
}

/// An account, checked; `config` defaults to `{}`.
fn checked(provider: &str, a: Account) -> Result<(Account, Value), Failure> {
    let config = a.config.clone().unwrap_or_else(|| j!({}));
    connections::validate(provider, &a.setup_alias, &a.secret, &config)?;
    if provider == "vertex" {
        if let Err(why) = ServiceAccount::from_json(&a.secret) {
            return Err(ApiError::invalid_parameter("secret", why).into());
        }
    }
    Ok((a, config))
}

/// The org URLs of a create or rotate body (`config.base_url`, a Vertex key's
/// `token_uri`), checked against the network rule before anything is stored.
async fn check_urls(
    state: &Shared,
    provider: &str,
    a: &Account,
    config: &Value,
) -> Result<(), Failure> {
    let allow = state.config.network.allow_private_upstreams;
    let refused = |param: &'static str, why: String| {
        Failure(ApiError::new(ErrorCode::InvalidParameter, format!("{param} {why}")).param(param))
    };
    if let Some(url) = config.get("base_url").and_then(Value::as_str) {
        egress::check_org_url(url, allow)
            .await
            .map_err(|why| refused("config.base_url", why))?;
    }
    if provider == "vertex" {
        if let Ok(account) = ServiceAccount::from_json(&a.secret) {
            egress::check_org_url(&account.token_uri, allow)
                .await
                .map_err(|why| refused("secret.token_uri", why))?;
        }
    }
    Ok(())
}

fn alias_of(q: &HashMap<String, String>) -> Result<&str, Failure> {
    q.get("setup_alias").map(String::as_str).ok_or_else(|| {
        Failure(
            ApiError::new(ErrorCode::InvalidRequest, "setup_alias is required.")
                .param("setup_alias"),
        )
    })
}

pub(crate) async fn list(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path(org_id): Path<String>,
) -> ApiResult {
    own(&org_id, &c.org.id)?;
    let data: Vec<Value> = connections::list(&state.db, &org_id)
        .await?
        .iter()
        .map(connections::Connection::to_json)
        .collect();
    Ok(json(StatusCode::OK, &j!({"object": "list", "data": data})))
}

/// `POST`: a new account under a new alias; never overwrites.
pub(crate) async fn create(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path((org_id, provider)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    own(&org_id, &c.org.id)?;
    let conn = create_account(&state, &org_id, &provider, parse_body(&body)?).await?;
    Ok(json(StatusCode::CREATED, &conn.to_json()))
}

/// Creates an account of the org (the API's POST and the web app's form).
pub(crate) async fn create_account(
    state: &Shared,
    org_id: &str,
    provider: &str,
    account: Account,
) -> Result<connections::Connection, Failure> {
    let (a, config) = checked(provider, account)?;
    check_urls(state, provider, &a, &config).await?;
    let conn = connections::create(
        &state.db,
        &state.byok.sealer,
        org_id,
        provider,
        &a.setup_alias,
        &a.secret,
        &config,
    )
    .await?;
    reload(state).await;
    Ok(conn)
}

/// `PUT`: rotates one saved account (exact alias), then reads its spend where the
/// provider reports it; a failed read leaves the key saved and says why in
/// `spend_error`.
pub(crate) async fn rotate(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path((org_id, provider)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult {
    own(&org_id, &c.org.id)?;
    let (a, _) = account_body(&provider, &body)?;
    let out = rotate_account(&state, &org_id, &provider, a).await?;
    Ok(json(StatusCode::OK, &out))
}

/// Rotates one account of the org (the API's PUT and the web app's form).
pub(crate) async fn rotate_account(
    state: &Shared,
    org_id: &str,
    provider: &str,
    account: Account,
) -> Result<Value, Failure> {
    let (a, config) = checked(provider, account)?;
    check_urls(state, provider, &a, &config).await?;
    let conn = connections::rotate(
        &state.db,
        &state.byok.sealer,
        org_id,
        provider,
        &a.setup_alias,
        &a.secret,
        a.config.as_ref(),
    )
    .await?;
    let mut out = conn.to_json();
    let live = Live {
        conn,
        secret: Arc::from(a.secret.as_str()),
    };
    match account_check::spend(&state.config, &live).await {
        Ok(micro) => {
            connections::set_spend(&state.db, &live.conn.id, micro).await?;
            out["spend_usd"] = j!(crate::money::micro_to_usd(micro));
        }
        Err(why) if live.conn.provider == "openrouter" => {
            out["spend_error"] = j!(why);
        }
        Err(_) => {}
    }
    reload(state).await;
    Ok(out)
}

/// An account with its secret opened for one call, read from the database (the
/// routing snapshot may not have a connection another instance made a moment ago).
fn opened(state: &Shared, conn: connections::Connection, sealed: &str) -> Result<Live, Failure> {
    match state.byok.sealer.open(sealed, &conn.id) {
        Ok(secret) => Ok(Live {
            conn,
            secret: Arc::from(secret),
        }),
        Err(e) => {
            tracing::error!(connection = %conn.id, error = %e, "a connection's secret does not open");
            Err(Failure(ApiError::internal()))
        }
    }
}

/// The named account of the caller's org (`?setup_alias=`), secret opened.
async fn account(
    state: &Shared,
    caller_org: &str,
    org_id: &str,
    provider: &str,
    q: &HashMap<String, String>,
) -> Result<Live, Failure> {
    own(org_id, caller_org)?;
    let alias = alias_of(q)?;
    let (conn, sealed) = connections::require(&state.db, org_id, provider, alias).await?;
    opened(state, conn, &sealed)
}

/// Brings this instance's routing up to date after a write (only what changed is
/// read).
async fn reload(state: &Shared) {
    if let Err(e) = state.byok.refresh(&state.db).await {
        tracing::warn!(error = %e, "routing refresh after a write failed; the poll will catch up");
    }
}

pub(crate) async fn check(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path((org_id, provider)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    own(&org_id, &c.org.id)?;
    let out = check_account(&state, &org_id, &provider, alias_of(&q)?).await?;
    Ok(json(StatusCode::OK, &out))
}

/// Checks one account of the org with its provider (the API and the web app).
pub(crate) async fn check_account(
    state: &Shared,
    org_id: &str,
    provider: &str,
    alias: &str,
) -> Result<Value, Failure> {
    let (conn, sealed) = connections::require(&state.db, org_id, provider, alias).await?;
    let live = opened(state, conn, &sealed)?;
    let conn = &live.conn;
    let (status, detail) = match account_check::check(&state.config, &live).await {
        Checked::Ok(d) => {
            connections::set_status(&state.db, &conn.id, true, &d).await?;
            ("ok", d)
        }
        Checked::Failed(d) => {
            connections::set_status(&state.db, &conn.id, false, &d).await?;
            ("failed", d)
        }
        Checked::Unsupported(d) => ("unchecked", d),
    };
    Ok(
        j!({"id": conn.id, "provider": conn.provider, "setup_alias": conn.setup_alias,
           "status": status, "detail": detail}),
    )
}

pub(crate) async fn spend_refresh(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path((org_id, provider)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    let live = account(&state, &c.org.id, &org_id, &provider, &q).await?;
    let conn = &live.conn;
    let mut out = match account_check::spend(&state.config, &live).await {
        Ok(micro) => {
            connections::set_spend(&state.db, &conn.id, micro).await?;
            connections::find(&state.db, &org_id, &provider, &conn.setup_alias)
                .await?
                .map(|c| c.to_json())
                .unwrap_or_default()
        }
        Err(why) => {
            let mut v = conn.to_json();
            v["spend_error"] = j!(why);
            v
        }
    };
    out["object"] = j!("provider_connection");
    Ok(json(StatusCode::OK, &out))
}

pub(crate) async fn disconnect(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path((org_id, provider)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult {
    own(&org_id, &c.org.id)?;
    delete_account(&state, &org_id, &provider, alias_of(&q)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Deletes only the named account of the org (the API and the web app).
pub(crate) async fn delete_account(
    state: &Shared,
    org_id: &str,
    provider: &str,
    alias: &str,
) -> Result<(), Failure> {
    connections::delete(&state.db, org_id, provider, alias).await?;
    reload(state).await;
    Ok(())
}

fn unknown_model(slug: &str) -> Failure {
    let shown: String = slug.chars().take(128).collect();
    Failure(ApiError::new(
        ErrorCode::NotFound,
        format!("No model with slug {shown:?}."),
    ))
}

/// The waterfall read: `{slug, default, override, effective}`.
pub(crate) fn waterfall_json(
    state: &Shared,
    org: &OrgRecord,
    slug: &str,
) -> Result<Value, Failure> {
    let catalog = state.catalog.snapshot();
    let model = catalog
        .lookup(Some(&org.id), slug)
        .ok_or_else(|| unknown_model(slug))?;
    let routing = state.byok.snapshot();
    let ids = |r: Vec<active_route::RouteRung>| {
        r.into_iter().map(|r| r.id.to_string()).collect::<Vec<_>>()
    };
    Ok(j!({
        "slug": model.spec.slug,
        "default": ids(active_route::default_rungs(model, &org.id, &routing)),
        "override": routing.waterfall(&org.id, &model.spec.slug).map(|w| w.as_ref().clone()),
        "effective": ids(active_route::effective(model, org, &routing)),
    }))
}

pub(crate) async fn get_waterfall(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path(slug): Path<String>,
) -> ApiResult {
    Ok(json(
        StatusCode::OK,
        &waterfall_json(&state, &c.org, &slug)?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Chain {
    model_provider_ids: Vec<String>,
}

pub(crate) async fn put_waterfall(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path(slug): Path<String>,
    body: Bytes,
) -> ApiResult {
    let chain: Chain = parse_body(&body)?;
    let out = set_waterfall(&state, &c.org, &slug, &chain.model_provider_ids).await?;
    Ok(json(StatusCode::OK, &out))
}

/// Replaces the org's chain for a model, checked as the API checks it (the API's
/// PUT and the web app's model page); answers the waterfall read.
pub(crate) async fn set_waterfall(
    state: &Shared,
    org: &OrgRecord,
    slug: &str,
    ids: &[String],
) -> Result<Value, Failure> {
    let checked = {
        let catalog = state.catalog.snapshot();
        let model = catalog
            .lookup(Some(&org.id), slug)
            .ok_or_else(|| unknown_model(slug))?;
        let routing = state.byok.snapshot();
        let ids = active_route::check_chain(ids, model, &org.id, &routing)?;
        (model.spec.slug.clone(), ids)
    };
    waterfalls::put(&state.db, &org.id, &checked.0, &checked.1).await?;
    reload(state).await;
    waterfall_json(state, org, slug)
}

/// Drops the org's chain for a model: the default serves it again (the web app's
/// model page).
pub(crate) async fn reset_waterfall(
    state: &Shared,
    org: &OrgRecord,
    slug: &str,
) -> Result<Value, Failure> {
    let name = {
        let catalog = state.catalog.snapshot();
        let model = catalog
            .lookup(Some(&org.id), slug)
            .ok_or_else(|| unknown_model(slug))?;
        model.spec.slug.clone()
    };
    waterfalls::delete(&state.db, &org.id, &name).await?;
    reload(state).await;
    waterfall_json(state, org, slug)
}

pub(crate) async fn get_policy(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path(org_id): Path<String>,
) -> ApiResult {
    own(&org_id, &c.org.id)?;
    let org = crate::accounts::orgs::get(&state.db, &org_id)
        .await?
        .ok_or_else(|| Failure(ApiError::invalid_key()))?;
    Ok(json(
        StatusCode::OK,
        &j!({"org_id": org.id, "require_zdr": org.require_zdr}),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Policy {
    require_zdr: bool,
}

pub(crate) async fn put_policy(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path(org_id): Path<String>,
    body: Bytes,
) -> ApiResult {
    own(&org_id, &c.org.id)?;
    let p: Policy = parse_body(&body)?;
    crate::accounts::orgs::set_require_zdr(&state.db, &org_id, p.require_zdr).await?;
    if let Some(fresh) = crate::accounts::orgs::get(&state.db, &org_id).await? {
        state.directory.put_org(fresh);
    }
    Ok(json(
        StatusCode::OK,
        &j!({"org_id": org_id, "require_zdr": p.require_zdr}),
    ))
}
