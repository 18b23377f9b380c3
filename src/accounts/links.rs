//! The links mails carry: address verification, sign-in and invitations. Each is a
//! random token (256 bits; only its SHA-256 is stored), usable once, within 24
//! hours. Following one proves the address, and opens a web session in the org the
//! link names.

use crate::error::Error;
use crate::store::{now_ms, Db};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sluice_filters::ApiError;
use sqlx::Row;

/// How long a mailed link works.
pub const LINK_TTL_MS: i64 = 24 * 3600 * 1000;

/// What a link was mailed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// The address a signup gave.
    Verify,
    /// `POST /login`.
    SignIn,
    /// A member's invitation of another address.
    Invite,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Verify => "verify",
            Purpose::SignIn => "sign_in",
            Purpose::Invite => "invite",
        }
    }

    fn parse(s: &str) -> Option<Purpose> {
        Some(match s {
            "verify" => Purpose::Verify,
            "sign_in" => Purpose::SignIn,
            "invite" => Purpose::Invite,
            _ => return None,
        })
    }
}

/// A link that was just used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Followed {
    pub purpose: Purpose,
    pub user_id: String,
    pub org_id: String,
}

/// A fresh random token: 64 lowercase hex characters.
pub fn token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

pub fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Issues a link token for the user in the org; the caller mails it.
pub async fn issue(
    db: &Db,
    purpose: Purpose,
    user_id: &str,
    org_id: &str,
) -> Result<String, ApiError> {
    let t = token();
    let now = now_ms();
    sqlx::query(
        "INSERT INTO email_links (token_hash, purpose, user_id, org_id, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(hash(&t))
    .bind(purpose.as_str())
    .bind(user_id)
    .bind(org_id)
    .bind(now)
    .bind(now + LINK_TTL_MS)
    .execute(&db.pool)
    .await
    .map_err(Error::db("email links"))?;
    Ok(t)
}

/// Uses a link: `None` when it is unknown, used already or expired. One statement
/// marks it used, so of two racing requests only one gets it.
pub async fn follow(db: &Db, token: &str) -> Result<Option<Followed>, ApiError> {
    if token.len() != 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(None);
    }
    let h = hash(token);
    let now = now_ms();
    let used = sqlx::query(
        "UPDATE email_links SET used_at = $1 \
         WHERE token_hash = $2 AND used_at IS NULL AND expires_at > $1",
    )
    .bind(now)
    .bind(&h)
    .execute(&db.pool)
    .await
    .map_err(Error::db("email links"))?;
    if used.rows_affected() != 1 {
        return Ok(None);
    }
    let row = sqlx::query("SELECT purpose, user_id, org_id FROM email_links WHERE token_hash = $1")
        .bind(&h)
        .fetch_one(&db.pool)
        .await
        .map_err(Error::db("email links"))?;
    let purpose: String = row.get("purpose");
    Ok(Purpose::parse(&purpose).map(|purpose| Followed {
        purpose,
        user_id: row.get("user_id"),
        org_id: row.get("org_id"),
    }))
}

/// Links of a purpose mailed to the user since `since_ms`: how often an address
/// may be mailed is bounded by it.
/// Links of a purpose mailed on an org's behalf since `since_ms` (invitations).
pub async fn issued_for_org_since(
    db: &Db,
    org_id: &str,
    purpose: Purpose,
    since_ms: i64,
) -> Result<i64, ApiError> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS n FROM email_links WHERE org_id = $1 AND purpose = $2 AND created_at > $3",
    )
    .bind(org_id)
    .bind(purpose.as_str())
    .bind(since_ms)
    .fetch_one(&db.pool)
    .await
    .map_err(Error::db("email links"))?;
    Ok(row.get("n"))
}

/// The addresses an org invited whose links are still unused and unexpired,
/// with when the newest was mailed; newest first.
pub async fn pending_invitations(db: &Db, org_id: &str) -> Result<Vec<(String, i64)>, ApiError> {
    let rows = sqlx::query(
        "SELECT u.email AS email, MAX(l.created_at) AS at FROM email_links l JOIN users u ON u.id = l.user_id \
         WHERE l.org_id = $1 AND l.purpose = $2 AND l.used_at IS NULL AND l.expires_at > $3 \
         AND NOT EXISTS (SELECT 1 FROM org_members m WHERE m.org_id = l.org_id AND m.user_id = l.user_id) \
         GROUP BY u.email ORDER BY MAX(l.created_at) DESC LIMIT 100",
    )
    .bind(org_id)
    .bind(Purpose::Invite.as_str())
    .bind(now_ms())
    .fetch_all(&db.pool)
    .await
    .map_err(Error::db("email links"))?;
    Ok(rows
        .iter()
        .map(|r| (r.get("email"), r.get::<i64, _>("at")))
        .collect())
}

pub async fn issued_since(
    db: &Db,
    user_id: &str,
    purpose: Purpose,
    since_ms: i64,
) -> Result<i64, ApiError> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS n FROM email_links WHERE user_id = $1 AND purpose = $2 AND created_at > $3",
    )
    .bind(user_id)
    .bind(purpose.as_str())
    .bind(since_ms)
    .fetch_one(&db.pool)
    .await
    .map_err(Error::db("email links"))?;
    Ok(row.get("n"))
}
