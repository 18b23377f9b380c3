//! People: users (one per email address, no passwords: they sign in by emailed
//! link) and their memberships of organizations. An org's members sign in to the
//! web app, mint keys and read the org's usage; `scope=self` reads count the
//! requests of the keys a member minted.

use crate::error::Error;
use crate::store::db::opt_i64;
use crate::store::{new_id, now_ms, Db};
use sluice_filters::{ApiError, ErrorCode};
use sqlx::Row;

/// A person, known by their address.
#[derive(Clone, Debug, PartialEq)]
pub struct User {
    pub id: String,
    pub email: String,
    /// They followed a link mailed to the address.
    pub email_verified: bool,
    pub created_at: i64,
}

/// What a member may do. Today every member may do everything in the org; the
/// owner is the one who signed it up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Owner,
    Member,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Member => "member",
        }
    }
}

/// A member of an org as the settings page lists them.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Member {
    pub user_id: String,
    pub email: String,
    pub role: String,
    pub email_verified: bool,
    pub joined_at: i64,
}

/// Domains of throwaway mailboxes: an account there verifies nothing about anyone.
const DISPOSABLE: &[&str] = &[
    "mailinator.com",
    "guerrillamail.com",
    "10minutemail.com",
    "tempmail.com",
    "temp-mail.org",
    "yopmail.com",
    "trashmail.com",
    "sharklasers.com",
    "getnada.com",
    "dispostable.com",
    "maildrop.cc",
    "throwawaymail.com",
];

fn rejected(why: &str) -> ApiError {
    ApiError::new(ErrorCode::InvalidRequest, format!("email rejected: {why}.")).param("email")
}

/// The address as stored (trimmed, lower case), or 400 `invalid_request` naming
/// why it is refused: its syntax, its length, or a throwaway-mail domain. Quoted
/// local parts and address literals are not accepted: a link is mailed to it, and
/// an ordinary mailbox has neither.
pub fn normalize_email(raw: &str) -> Result<String, ApiError> {
    let email = raw.trim().to_ascii_lowercase();
    if email.is_empty() {
        return Err(rejected("the address is empty"));
    }
    if email.len() > 254 {
        return Err(rejected("the address is longer than 254 characters"));
    }
    let Some((local, domain)) = email.split_once('@') else {
        return Err(rejected("the address has no @"));
    };
    let local_ok = (1..=64).contains(&local.len())
        && !local.starts_with('.')
        && !local.ends_with('.')
        && !local.contains("..")
        && local
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-/=?^_`{|}~.".contains(&b));
    if !local_ok {
        return Err(rejected("the part before the @ is not a mailbox name"));
    }
    let labels: Vec<&str> = domain.split('.').collect();
    let domain_ok = labels.len() >= 2
        && domain.len() <= 253
        && labels.iter().all(|l| {
            (1..=63).contains(&l.len())
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        && labels
            .last()
            .is_some_and(|tld| tld.len() >= 2 && tld.bytes().all(|b| b.is_ascii_alphabetic()));
    if !domain_ok {
        return Err(rejected("the part after the @ is not a mail domain"));
    }
    if DISPOSABLE
        .iter()
        .any(|d| domain == *d || domain.ends_with(&format!(".{d}")))
    {
        return Err(rejected("throwaway mail domains cannot hold an account"));
    }
    Ok(email)
}

fn from_row(row: &sqlx::any::AnyRow) -> User {
    User {
        id: row.get("id"),
        email: row.get("email"),
        email_verified: opt_i64(row, "email_verified_at").is_some(),
        created_at: row.get("created_at"),
    }
}

pub async fn by_email(db: &Db, email: &str) -> Result<Option<User>, ApiError> {
    let row =
        sqlx::query("SELECT id, email, email_verified_at, created_at FROM users WHERE email = $1")
            .bind(email)
            .fetch_optional(&db.pool)
            .await
            .map_err(Error::db("users"))?;
    Ok(row.as_ref().map(from_row))
}

pub async fn get(db: &Db, user_id: &str) -> Result<Option<User>, ApiError> {
    let row =
        sqlx::query("SELECT id, email, email_verified_at, created_at FROM users WHERE id = $1")
            .bind(user_id)
            .fetch_optional(&db.pool)
            .await
            .map_err(Error::db("users"))?;
    Ok(row.as_ref().map(from_row))
}

/// Inserts a user inside a caller's transaction; `None` when the address already
/// has one (the unique index decides, so two signups of one address cannot both
/// win).
pub async fn insert_in_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    email: &str,
) -> Result<Option<String>, ApiError> {
    let id = new_id("user");
    let done = sqlx::query("INSERT INTO users (id, email, created_at) VALUES ($1, $2, $3)")
        .bind(&id)
        .bind(email)
        .bind(now_ms())
        .execute(&mut **tx)
        .await;
    match done {
        Ok(_) => Ok(Some(id)),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(None),
        Err(e) => Err(Error::db("users")(e).into()),
    }
}

/// The user of an address, made when there is none (an invitation, an operator
/// adding a member).
pub async fn ensure(db: &Db, email: &str) -> Result<User, ApiError> {
    if let Some(u) = by_email(db, email).await? {
        return Ok(u);
    }
    let mut tx = db.pool.begin().await.map_err(Error::db("users"))?;
    insert_in_tx(&mut tx, email).await?;
    tx.commit().await.map_err(Error::db("users"))?;
    // Made now, or by a racing request a moment ago: either way it is there.
    by_email(db, email).await?.ok_or_else(ApiError::internal)
}

/// Makes the user a member of the org inside a caller's transaction (a member
/// already stays as they are).
pub async fn add_member_in_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    org_id: &str,
    user_id: &str,
    role: Role,
    invited_by: Option<&str>,
) -> Result<(), ApiError> {
    sqlx::query(
        "INSERT INTO org_members (org_id, user_id, role, invited_by, created_at) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (org_id, user_id) DO NOTHING",
    )
    .bind(org_id)
    .bind(user_id)
    .bind(role.as_str())
    .bind(invited_by)
    .bind(now_ms())
    .execute(&mut **tx)
    .await
    .map_err(Error::db("members"))?;
    Ok(())
}

pub async fn add_member(
    db: &Db,
    org_id: &str,
    user_id: &str,
    role: Role,
    invited_by: Option<&str>,
) -> Result<(), ApiError> {
    let mut tx = db.pool.begin().await.map_err(Error::db("members"))?;
    add_member_in_tx(&mut tx, org_id, user_id, role, invited_by).await?;
    tx.commit().await.map_err(Error::db("members"))?;
    Ok(())
}

/// Removes a member from an org: the membership, the member's sessions in the
/// org and the keys they minted in it all end. An org keeps at least one owner.
/// The revoked keys, for the directory.
pub async fn remove_member(db: &Db, org_id: &str, user_id: &str) -> Result<Vec<String>, ApiError> {
    let mut tx = db.pool.begin().await.map_err(Error::db("members"))?;
    let role: Option<String> =
        sqlx::query("SELECT role FROM org_members WHERE org_id = $1 AND user_id = $2")
            .bind(org_id)
            .bind(user_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(Error::db("members"))?
            .map(|r| r.get("role"));
    let Some(role) = role else {
        return Err(ApiError::new(ErrorCode::NotFound, "No such member."));
    };
    if role == Role::Owner.as_str() {
        let owners: i64 =
            sqlx::query("SELECT COUNT(*) AS n FROM org_members WHERE org_id = $1 AND role = $2")
                .bind(org_id)
                .bind(Role::Owner.as_str())
                .fetch_one(&mut *tx)
                .await
                .map_err(Error::db("members"))?
                .get("n");
        if owners <= 1 {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "The organization's last owner cannot be removed.",
            ));
        }
    }
    let now = now_ms();
    sqlx::query("DELETE FROM org_members WHERE org_id = $1 AND user_id = $2")
        .bind(org_id)
        .bind(user_id)
        .execute(&mut *tx)
        .await
        .map_err(Error::db("members"))?;
    sqlx::query(
        "UPDATE web_sessions SET revoked_at = $1 WHERE org_id = $2 AND user_id = $3 AND revoked_at IS NULL",
    )
    .bind(now)
    .bind(org_id)
    .bind(user_id)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("members"))?;
    let keys: Vec<String> = sqlx::query(
        "SELECT key_hash FROM api_keys WHERE org_id = $1 AND user_id = $2 AND revoked_at IS NULL",
    )
    .bind(org_id)
    .bind(user_id)
    .fetch_all(&mut *tx)
    .await
    .map_err(Error::db("members"))?
    .iter()
    .map(|r| r.get("key_hash"))
    .collect();
    sqlx::query(
        "UPDATE api_keys SET revoked_at = $1, updated_at = $1 WHERE org_id = $2 AND user_id = $3 AND revoked_at IS NULL",
    )
    .bind(now)
    .bind(org_id)
    .bind(user_id)
    .execute(&mut *tx)
    .await
    .map_err(Error::db("members"))?;
    tx.commit().await.map_err(Error::db("members"))?;
    Ok(keys)
}

pub async fn is_member(db: &Db, org_id: &str, user_id: &str) -> Result<bool, ApiError> {
    Ok(
        sqlx::query("SELECT 1 FROM org_members WHERE org_id = $1 AND user_id = $2")
            .bind(org_id)
            .bind(user_id)
            .fetch_optional(&db.pool)
            .await
            .map_err(Error::db("members"))?
            .is_some(),
    )
}

/// The org a sign-in opens: the first the user joined.
pub async fn first_org(db: &Db, user_id: &str) -> Result<Option<String>, ApiError> {
    let row = sqlx::query(
        "SELECT org_id FROM org_members WHERE user_id = $1 ORDER BY created_at, org_id LIMIT 1",
    )
    .bind(user_id)
    .fetch_optional(&db.pool)
    .await
    .map_err(Error::db("members"))?;
    Ok(row.map(|r| r.get("org_id")))
}

/// The org's members, oldest first.
pub async fn members(db: &Db, org_id: &str) -> Result<Vec<Member>, ApiError> {
    let rows = sqlx::query(
        "SELECT m.user_id, u.email, m.role, m.created_at, u.email_verified_at \
         FROM org_members m JOIN users u ON u.id = m.user_id WHERE m.org_id = $1 \
         ORDER BY m.created_at, u.email",
    )
    .bind(org_id)
    .fetch_all(&db.pool)
    .await
    .map_err(Error::db("members"))?;
    Ok(rows
        .iter()
        .map(|r| Member {
            user_id: r.get("user_id"),
            email: r.get("email"),
            role: r.get("role"),
            email_verified: opt_i64(r, "email_verified_at").is_some(),
            joined_at: r.get("created_at"),
        })
        .collect())
}

/// Records that the user followed a link mailed to their address (the first time
/// counts) and signed in.
pub async fn mark_signed_in(db: &Db, user_id: &str) -> Result<(), ApiError> {
    let now = now_ms();
    sqlx::query(
        "UPDATE users SET email_verified_at = COALESCE(email_verified_at, $1), \
         last_sign_in_at = $1 WHERE id = $2",
    )
    .bind(now)
    .bind(user_id)
    .execute(&db.pool)
    .await
    .map_err(Error::db("users"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_normalized_or_refused_with_the_reason() {
        assert_eq!(
            normalize_email("  Alice.B+tag@Example.COM ").unwrap(),
            "alice.b+tag@example.com"
        );
        for bad in [
            "",
            "alice",
            "@example.com",
            "alice@",
            "alice@localhost",
            "alice@exa_mple.com",
            "al ice@example.com",
            ".alice@example.com",
            "a..b@example.com",
            "alice@example.c0m",
            "alice@-x.com",
            "\"q\"@example.com",
            "alice@[127.0.0.1]",
            "bob@mailinator.com",
            "bob@eu.mailinator.com",
        ] {
            let e = normalize_email(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidRequest, "{bad}");
            assert_eq!(e.param.as_deref(), Some("email"));
        }
        let long = format!("{}@example.com", "a".repeat(65));
        assert!(normalize_email(&long).is_err());
        let very_long = format!("a@{}.com", "b.".repeat(130));
        assert!(normalize_email(&very_long).is_err());
    }
}
