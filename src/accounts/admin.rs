//! The admin operations of the operating contract, as plain functions over typed
//! requests. The HTTP admin API (ops listener) and the `sluice admin` CLI both call
//! these, so their effects are the same.

use super::{keys, orgs, Directory};
use crate::money::usd_to_micro;
use crate::store::Db;
use crate::time::parse_rfc3339_ms;
use serde::Deserialize;
use serde_json::{json, Value};
use sluice_filters::{ApiError, ErrorCode};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateOrg {
    pub name: String,
    pub email: Option<String>,
    /// Absent: verified unless an `email` is given (an address then awaits its
    /// verification). The operator vouches for the orgs it makes, so a quickstart
    /// org can draw its credits at once.
    pub email_verified: Option<bool>,
    #[serde(default)]
    pub card_verified: bool,
    #[serde(default)]
    pub credits_usd: f64,
    #[serde(default)]
    pub tier: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKey {
    pub name: Option<String>,
    pub daily_spend_cap_usd: Option<f64>,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    /// RFC 3339 text or Unix seconds.
    pub expires_at: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credits {
    pub amount_usd: f64,
    pub kind: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verification {
    pub email: Option<bool>,
    pub card_on_file: Option<bool>,
    pub settled: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grants {
    pub slugs: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Review {
    pub under_review: bool,
    pub reason: Option<String>,
    /// A review for a payment reason, lifted by a settled payment (default: the
    /// reason speaks of payment, a card or a charge).
    pub for_payment: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    pub tier: i64,
}

/// Keeps the local directory in step with a write (other instances poll).
async fn refresh_org(db: &Db, dir: Option<&Directory>, org_id: &str) -> Result<Value, ApiError> {
    let org = orgs::get(db, org_id)
        .await?
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "No such organization."))?;
    let out = org.to_admin_json();
    if let Some(dir) = dir {
        dir.put_org(org);
    }
    Ok(out)
}

pub async fn create_org(
    db: &Db,
    dir: Option<&Directory>,
    req: CreateOrg,
) -> Result<Value, ApiError> {
    let credits = usd_to_micro(req.credits_usd).map_err(|e| e.param("credits_usd"))?;
    let id = orgs::create(
        db,
        orgs::NewOrg {
            name: req.name,
            email_verified: req.email_verified.unwrap_or(req.email.is_none()),
            email: req.email,
            card_verified: req.card_verified,
            credits_micro_usd: credits,
            tier: req.tier,
        },
    )
    .await?;
    refresh_org(db, dir, &id).await?;
    Ok(json!({ "org_id": id }))
}

pub async fn show_org(db: &Db, org_id: &str) -> Result<Value, ApiError> {
    refresh_org(db, None, org_id).await
}

pub async fn create_key(
    db: &Db,
    dir: Option<&Directory>,
    org_id: &str,
    req: CreateKey,
) -> Result<Value, ApiError> {
    create_key_as(db, dir, org_id, req, None).await
}

/// [`create_key`] for a member of the org (web sessions): the key is theirs, and
/// `scope=self` usage reads count its requests.
pub async fn create_key_as(
    db: &Db,
    dir: Option<&Directory>,
    org_id: &str,
    req: CreateKey,
    user_id: Option<&str>,
) -> Result<Value, ApiError> {
    let expires_at = match &req.expires_at {
        None | Some(Value::Null) => None,
        // Checked: seconds past i64::MAX / 1000 would wrap to a time in the past.
        Some(Value::Number(n)) => Some(
            n.as_i64()
                .filter(|s| *s > 0)
                .and_then(|s| s.checked_mul(1000))
                .ok_or_else(|| {
                    ApiError::invalid_parameter(
                        "expires_at",
                        "expires_at must be a positive Unix time in seconds",
                    )
                })?,
        ),
        Some(Value::String(s)) => Some(parse_rfc3339_ms(s).ok_or_else(|| {
            ApiError::invalid_parameter(
                "expires_at",
                "expires_at must be RFC 3339, e.g. 2027-01-01T00:00:00Z",
            )
        })?),
        Some(_) => {
            return Err(ApiError::invalid_parameter(
                "expires_at",
                "expires_at must be RFC 3339 text or Unix seconds",
            ))
        }
    };
    let cap = req
        .daily_spend_cap_usd
        .map(|v| usd_to_micro(v).map_err(|e| e.param("daily_spend_cap_usd")))
        .transpose()?;
    let (rec, plaintext) = keys::create(
        db,
        org_id,
        keys::NewKey {
            name: req.name,
            daily_spend_cap_micro_usd: cap,
            rpm: req.rpm,
            tpm: req.tpm,
            expires_at,
            user_id: user_id.map(str::to_string),
        },
    )
    .await?;
    let id = rec.id.clone();
    if let Some(dir) = dir {
        dir.put_key(rec);
    }
    Ok(json!({ "api_key_id": id, "api_key": plaintext }))
}

pub async fn revoke_key(db: &Db, dir: Option<&Directory>, key_id: &str) -> Result<(), ApiError> {
    if !keys::revoke(db, key_id).await? {
        return Err(ApiError::new(ErrorCode::NotFound, "No such key."));
    }
    if let (Some(dir), Some(rec)) = (dir, keys::get(db, key_id).await?) {
        dir.put_key(rec);
    }
    Ok(())
}

pub async fn credits(
    db: &Db,
    dir: Option<&Directory>,
    org_id: &str,
    req: Credits,
    tier_up_purchase_usd: f64,
) -> Result<Value, ApiError> {
    let kind = req.kind.as_deref().unwrap_or("grant");
    let tier_up = usd_to_micro(tier_up_purchase_usd).unwrap_or(i64::MAX);
    orgs::add_credits(db, org_id, req.amount_usd, kind, tier_up).await?;
    let org = refresh_org(db, dir, org_id).await?;
    Ok(json!({ "balance_usd": org["balance_usd"] }))
}

pub async fn verification(
    db: &Db,
    dir: Option<&Directory>,
    org_id: &str,
    req: Verification,
) -> Result<Value, ApiError> {
    orgs::verify(db, org_id, req.email, req.card_on_file, req.settled).await?;
    refresh_org(db, dir, org_id).await
}

pub async fn grants(
    db: &Db,
    dir: Option<&Directory>,
    org_id: &str,
    req: Grants,
) -> Result<Value, ApiError> {
    orgs::set_grants(db, org_id, &req.slugs).await?;
    refresh_org(db, dir, org_id).await
}

pub async fn review(
    db: &Db,
    dir: Option<&Directory>,
    org_id: &str,
    req: Review,
) -> Result<Value, ApiError> {
    orgs::set_review(db, org_id, req.under_review, req.reason, req.for_payment).await?;
    refresh_org(db, dir, org_id).await
}

pub async fn tier(
    db: &Db,
    dir: Option<&Directory>,
    org_id: &str,
    req: Tier,
) -> Result<Value, ApiError> {
    orgs::set_tier(db, org_id, req.tier).await?;
    refresh_org(db, dir, org_id).await
}

/// `PUT /admin/orgs/{org_id}/settings`: prompt capture, the require-ZDR policy,
/// credits overflow; answers the settings as they apply now.
pub async fn settings(
    db: &Db,
    dir: Option<&Directory>,
    org_id: &str,
    change: orgs::SettingsChange,
    capture_default: bool,
) -> Result<Value, ApiError> {
    orgs::set_settings(db, org_id, &change).await?;
    refresh_org(db, dir, org_id).await?;
    let org = orgs::get(db, org_id)
        .await?
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, "No such organization."))?;
    Ok(org.settings_json(capture_default))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddMember {
    pub email: String,
}

/// `POST /admin/orgs/{org_id}/members`: the address becomes a member who can sign
/// in to the web app (`POST {web_url}/login`); a member already is one (201 again).
pub async fn add_member(db: &Db, org_id: &str, req: AddMember) -> Result<Value, ApiError> {
    let email = super::users::normalize_email(&req.email)?;
    if !orgs::org_exists(db, org_id).await? {
        return Err(ApiError::new(ErrorCode::NotFound, "No such organization."));
    }
    let user = super::users::ensure(db, &email).await?;
    super::users::add_member(db, org_id, &user.id, super::users::Role::Member, None).await?;
    Ok(json!({ "user_id": user.id, "org_id": org_id, "email": user.email }))
}
