//! The web session API (CONTRACT.md, "Web session API"): a signed-in member's JSON
//! calls on {web_url}, authenticated by the `sluice_session` cookie; every call
//! that changes something carries `x-csrf-token`. Keys are minted and revoked only
//! here (an API key cannot); the usage reads of the management API are served for
//! the session too, where `scope=self` works.

use super::session::{ApiMember, ApiWriter};
use super::WebShared;
use crate::accounts::{admin, keys, orgs, signin, users};
use crate::api::respond::{json, parse_body, ApiResult, Failure};
use crate::api::usage::{self, Scope};
use crate::billing::payments::Checkout;
use crate::money::micro_to_usd;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{json as j, Value};
use sluice_filters::{ApiError, ErrorCode};

fn not_found(what: &str) -> Failure {
    Failure(ApiError::new(
        ErrorCode::NotFound,
        format!("No such {what}."),
    ))
}

/// The session's org as the database has it now.
pub(crate) async fn org_of(web: &WebShared, org_id: &str) -> Result<orgs::OrgRecord, Failure> {
    orgs::get(&web.app.db, org_id)
        .await?
        .ok_or_else(|| not_found("organization"))
}

/// The session's member.
pub(crate) async fn user_of(web: &WebShared, user_id: &str) -> Result<users::User, Failure> {
    users::get(&web.app.db, user_id)
        .await?
        .ok_or_else(|| not_found("user"))
}

/// `GET /api/session`.
pub(crate) async fn session(State(web): State<WebShared>, m: ApiMember) -> ApiResult {
    let s = &m.session;
    let org = org_of(&web, &s.org_id).await?;
    Ok(json(
        StatusCode::OK,
        &j!({
            "user_id": s.user_id,
            "email": s.email,
            "org_id": s.org_id,
            "email_verified": org.email_verified,
            "csrf_token": s.csrf_token,
        }),
    ))
}

/// `POST /api/session/logout`: 204; the cookie no longer works on any instance.
pub(crate) async fn logout(State(web): State<WebShared>, ApiWriter(m): ApiWriter) -> ApiResult {
    web.sessions.revoke(&web.app.db, &m.token).await?;
    Ok((
        StatusCode::NO_CONTENT,
        [(
            header::SET_COOKIE,
            super::session::cleared_cookie(web.app.config.web_cookies_secure()),
        )],
    )
        .into_response())
}

/// A key as the session lists it: never a secret.
pub(crate) fn key_json(k: &keys::KeyRecord) -> Value {
    j!({
        "api_key_id": k.id,
        "name": k.name,
        "hint": k.hint,
        "created_at": k.created_at / 1000,
        "expires_at": k.expires_at.map(|t| t / 1000),
        "revoked": k.revoked_at.is_some(),
        "daily_spend_cap_usd": k.daily_spend_cap_micro_usd.map(micro_to_usd),
        "rpm": k.rpm,
        "tpm": k.tpm,
        "user_id": k.user_id,
    })
}

/// `GET /api/session/keys`: the org's keys.
pub(crate) async fn keys(State(web): State<WebShared>, m: ApiMember) -> ApiResult {
    let list = keys::list_for_org(&web.app.db, &m.session.org_id).await?;
    let data: Vec<Value> = list.iter().map(key_json).collect();
    Ok(json(StatusCode::OK, &j!({"object": "list", "data": data})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MintKey {
    pub(crate) name: String,
    pub(crate) expires_at: Option<Value>,
    pub(crate) daily_spend_cap_usd: Option<f64>,
    pub(crate) rpm: Option<i64>,
    pub(crate) tpm: Option<i64>,
}

/// Mints a key of the member in the session's org (the API and the keys page).
pub(crate) async fn mint(
    web: &WebShared,
    org_id: &str,
    user_id: &str,
    k: MintKey,
) -> Result<Value, Failure> {
    let name = k.name.trim();
    if name.is_empty() || name.len() > 100 {
        return Err(Failure(ApiError::invalid_parameter(
            "name",
            "name must be 1 to 100 characters",
        )));
    }
    let req = admin::CreateKey {
        name: Some(name.to_string()),
        daily_spend_cap_usd: k.daily_spend_cap_usd,
        rpm: k.rpm,
        tpm: k.tpm,
        expires_at: k.expires_at,
    };
    let app = &web.app;
    let cap = app.config.limits.keys_per_org;
    if keys::live_count(&app.db, org_id).await? >= cap as i64 {
        return Err(Failure(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("This organization holds {cap} keys, the most it may ([limits] keys_per_org); revoke one first."),
        )));
    }
    Ok(admin::create_key_as(&app.db, Some(&app.directory), org_id, req, Some(user_id)).await?)
}

/// `POST /api/session/keys`: 201 `{api_key_id, api_key}`, the plaintext once.
pub(crate) async fn mint_key(
    State(web): State<WebShared>,
    ApiWriter(m): ApiWriter,
    body: Bytes,
) -> ApiResult {
    let k: MintKey = parse_body(&body)?;
    let out = mint(&web, &m.session.org_id, &m.session.user_id, k).await?;
    Ok(json(StatusCode::CREATED, &out))
}

/// Revokes a key of the session's org; another org's key is 404 (the API and the
/// keys page).
pub(crate) async fn revoke(web: &WebShared, org_id: &str, key_id: &str) -> Result<(), Failure> {
    let app = &web.app;
    match keys::get(&app.db, key_id).await? {
        Some(k) if k.org_id == org_id => {
            admin::revoke_key(&app.db, Some(&app.directory), key_id).await?;
            Ok(())
        }
        _ => Err(not_found("API key")),
    }
}

/// `DELETE /api/session/keys/{api_key_id}`: 204; the key fails with
/// `invalid_key` from then on, on every instance.
pub(crate) async fn revoke_key(
    State(web): State<WebShared>,
    ApiWriter(m): ApiWriter,
    Path(id): Path<String>,
) -> ApiResult {
    revoke(&web, &m.session.org_id, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Invite {
    email: String,
}

/// `POST /api/session/members` `{email}`: 201 `{user_id}`; the invitee gets a mail
/// whose link opens a session in this org.
pub(crate) async fn invite(
    State(web): State<WebShared>,
    ApiWriter(m): ApiWriter,
    body: Bytes,
) -> ApiResult {
    let i: Invite = parse_body(&body)?;
    let inviter = user_of(&web, &m.session.user_id).await?;
    let app = &web.app;
    let user = signin::invite(
        &app.db,
        &web.mailer,
        &app.config,
        &m.session.org_id,
        &inviter,
        &i.email,
    )
    .await?;
    Ok(json(
        StatusCode::CREATED,
        &j!({"user_id": user.id, "email": user.email, "org_id": m.session.org_id}),
    ))
}

/// `DELETE /api/session/members/{user_id}`: 204. An owner removes any member, a
/// member removes themselves (leaves); the org keeps one owner at least. The
/// member's sessions in the org and the keys they minted there end at once.
pub(crate) async fn remove_member(
    State(web): State<WebShared>,
    ApiWriter(m): ApiWriter,
    Path(user_id): Path<String>,
) -> ApiResult {
    let app = &web.app;
    let org_id = &m.session.org_id;
    if user_id != m.session.user_id {
        let members = users::members(&app.db, org_id).await?;
        let me_owner = members
            .iter()
            .any(|x| x.user_id == m.session.user_id && x.role == users::Role::Owner.as_str());
        if !me_owner {
            return Err(Failure(
                ApiError::new(
                    ErrorCode::InvalidRequest,
                    "Only an owner of the organization removes other members.",
                )
                .with_status(403),
            ));
        }
    }
    let revoked = users::remove_member(&app.db, org_id, &user_id).await?;
    if !revoked.is_empty() {
        for k in keys::list_for_org(&app.db, org_id).await? {
            if revoked.contains(&k.hash) {
                app.directory.put_key(k);
            }
        }
    }
    web.sessions.forget_all();
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /api/session/settings`.
pub(crate) async fn settings(State(web): State<WebShared>, m: ApiMember) -> ApiResult {
    let org = org_of(&web, &m.session.org_id).await?;
    let default = web.app.config.responses.prompt_capture_default;
    Ok(json(StatusCode::OK, &org.settings_json(default)))
}

/// Changes the org's settings for a member (the API and the settings page):
/// turning credits overflow on needs the verified org (402
/// `verification_required`), as `POST /api/credits-overflow` does.
pub(crate) async fn apply_settings(
    web: &WebShared,
    org_id: &str,
    change: orgs::SettingsChange,
) -> Result<Value, Failure> {
    let app = &web.app;
    let org = org_of(web, org_id).await?;
    if change.credits_overflow == Some(true)
        && !org.credits_overflow
        && !(org.card_on_file && org.settled)
    {
        return Err(Failure(ApiError::new(
            ErrorCode::VerificationRequired,
            "Credits overflow needs a verified organization: add a card and complete the 1 USD verification.",
        )));
    }
    let default = app.config.responses.prompt_capture_default;
    Ok(admin::settings(&app.db, Some(&app.directory), org_id, change, default).await?)
}

/// `PUT /api/session/settings` `{prompt_capture?, require_zdr?, credits_overflow?}`.
pub(crate) async fn change_settings(
    State(web): State<WebShared>,
    ApiWriter(m): ApiWriter,
    body: Bytes,
) -> ApiResult {
    let change: orgs::SettingsChange = parse_body(&body)?;
    let out = apply_settings(&web, &m.session.org_id, change).await?;
    Ok(json(StatusCode::OK, &out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckoutBody {
    kind: String,
    amount_usd: Option<f64>,
}

/// Starts a checkout for the member's org (the API and the billing page).
pub(crate) async fn start_checkout(
    web: &WebShared,
    org_id: &str,
    user_id: &str,
    kind: &str,
    amount_usd: Option<f64>,
) -> Result<crate::billing::payments::Created, Failure> {
    let Some(stripe) = &web.payments else {
        return Err(Failure(ApiError::new(
            ErrorCode::InvalidRequest,
            "Payments are not configured on this service ([payments] provider is none); an operator adds credits.",
        )));
    };
    let what = match kind {
        "verification" => Checkout::Verification,
        "purchase" => Checkout::purchase(amount_usd.ok_or_else(|| {
            Failure(ApiError::invalid_parameter(
                "amount_usd",
                "a purchase needs amount_usd",
            ))
        })?)?,
        _ => {
            return Err(Failure(ApiError::invalid_parameter(
                "kind",
                "kind must be verification or purchase",
            )))
        }
    };
    let return_url = format!(
        "{}/billing",
        web.app.config.server.public_web_url.trim_end_matches('/')
    );
    Ok(stripe
        .create_checkout(&web.app.db, org_id, user_id, what, &return_url)
        .await?)
}

/// `POST /api/session/checkout` `{kind: "verification"}` or
/// `{kind: "purchase", amount_usd}`: 200 `{checkout_url, checkout_session_id}`.
pub(crate) async fn checkout(
    State(web): State<WebShared>,
    ApiWriter(m): ApiWriter,
    body: Bytes,
) -> ApiResult {
    let c: CheckoutBody = parse_body(&body)?;
    let s = &m.session;
    let created = start_checkout(&web, &s.org_id, &s.user_id, &c.kind, c.amount_usd).await?;
    Ok(json(
        StatusCode::OK,
        &j!({
            "checkout_url": created.checkout_url,
            "checkout_session_id": created.checkout_session_id,
        }),
    ))
}

/// `GET /api/gateway/usage/daily` for a session (`scope=self` or `org`).
pub(crate) async fn usage_daily(
    State(web): State<WebShared>,
    m: ApiMember,
    Query(q): Query<Scope>,
) -> ApiResult {
    let s = &m.session;
    let reader = usage::session_reader(&q, &s.org_id, &s.user_id)?;
    Ok(json(
        StatusCode::OK,
        &usage::daily_rollup(&web.app, reader, &q).await?,
    ))
}

/// `GET /api/gateway/usage/events` for a session (`scope=self` or `org`).
pub(crate) async fn usage_events(
    State(web): State<WebShared>,
    m: ApiMember,
    Query(q): Query<Scope>,
) -> ApiResult {
    let s = &m.session;
    let reader = usage::session_reader(&q, &s.org_id, &s.user_id)?;
    Ok(json(
        StatusCode::OK,
        &usage::events_page(&web.app, reader, &q).await?,
    ))
}
