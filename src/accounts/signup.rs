//! Signing up: one address makes an org with `[signup] credits_usd`, its first
//! member and its first key, and gets a mail whose link verifies the address.
//! Until it is followed the org's credit-drawing calls are refused
//! (`insufficient_quota`, `email_unverified`); calls on its own provider keys work.
//! Signups are limited per origin (the client's IP address) per hour.

use super::mail::{Mail, Mailer};
use super::{keys, links, orgs, users, Directory};
use crate::config::Config;
use crate::error::Error;
use crate::store::{now_ms, Db};
use serde::Serialize;
use sluice_filters::{ApiError, ErrorCode};

/// What an origin is counted for.
#[derive(Clone, Copy, Debug)]
pub enum Attempt {
    Signup,
    Login,
}

impl Attempt {
    fn as_str(self) -> &'static str {
        match self {
            Attempt::Signup => "signup",
            Attempt::Login => "login",
        }
    }
}

const HOUR_MS: i64 = 3600 * 1000;

/// Counts one attempt of an origin unless it already made `per_hour` in the last
/// hour (a sliding hour: no window edge lets a burst through twice); false when
/// refused. Rows older than an hour are swept on the way.
pub async fn count_attempt(
    db: &Db,
    what: Attempt,
    origin: &str,
    per_hour: u32,
) -> Result<bool, ApiError> {
    let now = now_ms();
    let since = now - HOUR_MS;
    sqlx::query("DELETE FROM origin_attempts WHERE created_at <= $1")
        .bind(since)
        .execute(&db.pool)
        .await
        .map_err(Error::db("origin attempts"))?;
    let done = sqlx::query(
        "INSERT INTO origin_attempts (action, origin, created_at) SELECT $1, $2, $3 \
         WHERE (SELECT COUNT(*) FROM origin_attempts WHERE action = $1 AND origin = $2 AND created_at > $4) < $5",
    )
    .bind(what.as_str())
    .bind(origin)
    .bind(now)
    .bind(since)
    .bind(i64::from(per_hour))
    .execute(&db.pool)
    .await
    .map_err(Error::db("origin attempts"))?;
    Ok(done.rows_affected() == 1)
}

/// The signup result of SPEC.md.
#[derive(Clone, Debug, Serialize)]
pub struct SignupResult {
    pub api_key: String,
    pub org_id: String,
    pub credits_granted: f64,
    pub verification_required: bool,
    pub overview_url: String,
    #[serde(skip)]
    pub email: String,
}

/// The page a link opens, under `public_web_url`.
pub fn link_url(config: &Config, token: &str) -> String {
    format!(
        "{}/link/{token}",
        config.server.public_web_url.trim_end_matches('/')
    )
}

/// `POST {web_url}/api/signup/instant`.
pub async fn instant(
    db: &Db,
    dir: &Directory,
    mailer: &Mailer,
    config: &Config,
    origin: &str,
    raw_email: &str,
) -> Result<SignupResult, ApiError> {
    if !config.signup.enabled {
        return Err(ApiError::new(
            ErrorCode::SignupDisabled,
            "Signup is disabled on this service; ask its operator for an account.",
        ));
    }
    if !count_attempt(
        db,
        Attempt::Signup,
        origin,
        config.signup.per_origin_per_hour,
    )
    .await?
    {
        return Err(ApiError::new(
            ErrorCode::RateLimited,
            "Too many signups from this address in the last hour; try again later.",
        ));
    }
    let email = users::normalize_email(raw_email)?;
    let credits = crate::money::usd_to_micro(config.signup.credits_usd.max(0.0))?;
    let exists = || {
        ApiError::new(
            ErrorCode::AccountExists,
            "An account with this address exists; sign in with it instead.",
        )
        .param("email")
    };
    // An address known only from an invitation never accepted (or an operator's
    // record of it) has no account yet: this signup makes it.
    let known = match users::by_email(db, &email).await? {
        Some(u) if users::first_org(db, &u.id).await?.is_none() => Some(u.id),
        Some(_) => return Err(exists()),
        None => None,
    };
    let mut tx = db.pool.begin().await.map_err(Error::db("signup"))?;
    let user_id = match known {
        Some(id) => id,
        None => users::insert_in_tx(&mut tx, &email)
            .await?
            .ok_or_else(exists)?,
    };
    let org_id = orgs::create_in_tx(
        &mut tx,
        orgs::NewOrg {
            name: email.clone(),
            email: Some(email.clone()),
            email_verified: false,
            card_verified: false,
            credits_micro_usd: credits,
            tier: 0,
        },
    )
    .await?;
    users::add_member_in_tx(&mut tx, &org_id, &user_id, users::Role::Owner, None).await?;
    let (key, plaintext) = keys::create_in_tx(
        &mut tx,
        &org_id,
        keys::NewKey {
            name: Some("default".into()),
            user_id: Some(user_id.clone()),
            ..keys::NewKey::default()
        },
    )
    .await?;
    tx.commit().await.map_err(Error::db("signup"))?;
    if let Some(org) = orgs::get(db, &org_id).await? {
        dir.put_org(org);
    }
    dir.put_key(key);

    let token = links::issue(db, links::Purpose::Verify, &user_id, &org_id).await?;
    let mail = Mail {
        to: email.clone(),
        subject: "Verify your email for sluice".into(),
        text: format!(
            "Welcome to sluice.\n\n\
             Follow this link to verify your address and sign in:\n\n{}\n\n\
             The link works once, for 24 hours. Until the address is verified, calls\n\
             paid from credits are refused; calls on your own provider keys work.\n\n\
             If you did not sign up, ignore this mail.\n",
            link_url(config, &token)
        ),
    };
    if let Err(e) = mailer.send(mail).await {
        // The account stands: a sign-in link (POST /login) verifies the address too.
        tracing::error!(error = %format!("{e:#}"), "the verification mail was not sent");
    }
    Ok(SignupResult {
        api_key: plaintext,
        org_id,
        credits_granted: crate::money::micro_to_usd(credits),
        verification_required: true,
        overview_url: format!(
            "{}/overview",
            config.server.public_web_url.trim_end_matches('/')
        ),
        email,
    })
}
