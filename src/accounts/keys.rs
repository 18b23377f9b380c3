//! API keys: `xpl_` followed by 40 lowercase hex characters from the OS CSPRNG,
//! stored only as a SHA-256 hash (the key has 160 random bits, so a fast hash is
//! enough: no slow KDF needed against guessing), shown once at creation.

use super::orgs::org_exists;
use crate::error::Error;
use crate::store::db::opt_i64;
use crate::store::{new_id, now_ms, Db};
use rand::RngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sluice_filters::{ApiError, ErrorCode};
use sqlx::Row;

pub const KEY_PREFIX: &str = "xpl_";

/// What the hot path knows of a key.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct KeyRecord {
    pub id: String,
    pub org_id: String,
    pub name: Option<String>,
    /// The key's first characters, for people to tell keys apart.
    pub hint: String,
    #[serde(skip)]
    pub hash: String,
    pub daily_spend_cap_micro_usd: Option<i64>,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    pub created_at: i64,
    /// The member who minted it in the web app; `None` for an operator's key.
    pub user_id: Option<String>,
}

impl KeyRecord {
    /// Usable now: neither revoked nor expired.
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|t| t > now_ms)
    }
}

/// A fresh key's plaintext.
pub fn generate() -> String {
    let mut bytes = [0u8; 20];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("{KEY_PREFIX}{}", hex::encode(bytes))
}

/// Whether a presented credential has the key shape at all.
pub fn well_formed(key: &str) -> bool {
    key.len() == 44
        && key.starts_with(KEY_PREFIX)
        && key[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub fn hash(key: &str) -> String {
    hash_into(key, &mut [0u8; 64]).to_string()
}

/// [`hash`] into a caller's buffer: every request hashes its key, and the lookup
/// needs no owned string.
pub fn hash_into<'a>(key: &str, out: &'a mut [u8; 64]) -> &'a str {
    hex::encode_to_slice(Sha256::digest(key.as_bytes()), out).expect("32 bytes fill 64");
    // Hex digits are ASCII.
    std::str::from_utf8(out).unwrap_or_default()
}

/// Limits and expiry of a new key.
#[derive(Clone, Debug, Default)]
pub struct NewKey {
    pub name: Option<String>,
    pub daily_spend_cap_micro_usd: Option<i64>,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub expires_at: Option<i64>,
    /// The member minting it (web sessions); `None` for an operator's key.
    pub user_id: Option<String>,
}

/// Creates a key for an org; returns the record and the plaintext (shown once).
pub async fn create(db: &Db, org_id: &str, new: NewKey) -> Result<(KeyRecord, String), ApiError> {
    if !org_exists(db, org_id).await? {
        return Err(ApiError::new(ErrorCode::NotFound, "No such organization."));
    }
    let mut tx = db.pool.begin().await.map_err(Error::db("keys"))?;
    let out = create_in_tx(&mut tx, org_id, new).await?;
    tx.commit().await.map_err(Error::db("keys"))?;
    Ok(out)
}

/// [`create`] inside a caller's transaction (a signup makes its org, its first
/// member and its first key at once); the org must exist in it.
pub async fn create_in_tx(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    org_id: &str,
    new: NewKey,
) -> Result<(KeyRecord, String), ApiError> {
    for (param, v) in [
        ("daily_spend_cap_usd", new.daily_spend_cap_micro_usd),
        ("rpm", new.rpm),
        ("tpm", new.tpm),
    ] {
        if v.is_some_and(|v| v < 0) {
            return Err(ApiError::invalid_parameter(
                param,
                format!("{param} must not be negative"),
            ));
        }
    }
    let plaintext = generate();
    let now = now_ms();
    let rec = KeyRecord {
        id: new_id("key"),
        org_id: org_id.to_string(),
        name: new.name,
        hint: format!("{}…", &plaintext[..8]),
        hash: hash(&plaintext),
        daily_spend_cap_micro_usd: new.daily_spend_cap_micro_usd,
        rpm: new.rpm,
        tpm: new.tpm,
        expires_at: new.expires_at,
        revoked_at: None,
        created_at: now,
        user_id: new.user_id,
    };
    sqlx::query(
        "INSERT INTO api_keys (id, org_id, name, key_hash, hint, daily_spend_cap_micro_usd, rpm, tpm, \
         expires_at, revoked_at, created_at, updated_at, user_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, NULL, $10, $10, $11)",
    )
    .bind(&rec.id)
    .bind(&rec.org_id)
    .bind(&rec.name)
    .bind(&rec.hash)
    .bind(&rec.hint)
    .bind(rec.daily_spend_cap_micro_usd)
    .bind(rec.rpm)
    .bind(rec.tpm)
    .bind(rec.expires_at)
    .bind(now)
    .bind(&rec.user_id)
    .execute(&mut **tx)
    .await
    .map_err(Error::db("keys"))?;
    Ok((rec, plaintext))
}

/// Revokes a key; false when there is no such key.
pub async fn revoke(db: &Db, key_id: &str) -> Result<bool, ApiError> {
    let now = now_ms();
    let done = sqlx::query(
        "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $1), updated_at = $1 WHERE id = $2",
    )
    .bind(now)
    .bind(key_id)
    .execute(&db.pool)
    .await
    .map_err(Error::db("keys"))?;
    Ok(done.rows_affected() > 0)
}

/// Revokes every live key of the org; the revoked records (for the local
/// snapshot, which the poll would otherwise bring within a second).
pub async fn revoke_all_of_org(db: &Db, org_id: &str) -> Result<Vec<KeyRecord>, ApiError> {
    let now = now_ms();
    let live = list_for_org(db, org_id).await?;
    sqlx::query(
        "UPDATE api_keys SET revoked_at = $1, updated_at = $1 WHERE org_id = $2 AND revoked_at IS NULL",
    )
    .bind(now)
    .bind(org_id)
    .execute(&db.pool)
    .await
    .map_err(Error::db("keys"))?;
    Ok(live
        .into_iter()
        .filter(|k| k.revoked_at.is_none())
        .map(|mut k| {
            k.revoked_at = Some(now);
            k
        })
        .collect())
}

const COLUMNS: &str = "id, org_id, name, key_hash, hint, daily_spend_cap_micro_usd, rpm, tpm, \
                       expires_at, revoked_at, created_at, updated_at, user_id";

fn from_row(row: &sqlx::any::AnyRow) -> KeyRecord {
    KeyRecord {
        id: row.get("id"),
        org_id: row.get("org_id"),
        name: row.try_get::<Option<String>, _>("name").ok().flatten(),
        hint: row.get("hint"),
        hash: row.get("key_hash"),
        daily_spend_cap_micro_usd: opt_i64(row, "daily_spend_cap_micro_usd"),
        rpm: opt_i64(row, "rpm"),
        tpm: opt_i64(row, "tpm"),
        expires_at: opt_i64(row, "expires_at"),
        revoked_at: opt_i64(row, "revoked_at"),
        created_at: row.get("created_at"),
        user_id: row.try_get::<Option<String>, _>("user_id").ok().flatten(),
    }
}

/// Keys changed at or after `since_ms`, with their change time.
pub async fn changed_since(db: &Db, since_ms: i64) -> anyhow::Result<Vec<(KeyRecord, i64)>> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM api_keys WHERE updated_at >= $1"
    ))
    .bind(since_ms)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows
        .iter()
        .map(|r| (from_row(r), r.get::<i64, _>("updated_at")))
        .collect())
}

/// The key with this hash, revoked or not.
pub async fn by_hash(db: &Db, hash: &str) -> anyhow::Result<Option<KeyRecord>> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM api_keys WHERE key_hash = $1"
    ))
    .bind(hash)
    .fetch_optional(&db.pool)
    .await?;
    Ok(row.as_ref().map(from_row))
}

pub async fn get(db: &Db, key_id: &str) -> Result<Option<KeyRecord>, ApiError> {
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM api_keys WHERE id = $1"))
        .bind(key_id)
        .fetch_optional(&db.pool)
        .await
        .map_err(Error::db("keys"))?;
    Ok(row.as_ref().map(from_row))
}

/// How many keys of the org are not revoked (expired ones included).
pub async fn live_count(db: &Db, org_id: &str) -> Result<i64, ApiError> {
    let row =
        sqlx::query("SELECT COUNT(*) AS n FROM api_keys WHERE org_id = $1 AND revoked_at IS NULL")
            .bind(org_id)
            .fetch_one(&db.pool)
            .await
            .map_err(Error::db("keys"))?;
    Ok(row.get("n"))
}

pub async fn list_for_org(db: &Db, org_id: &str) -> Result<Vec<KeyRecord>, ApiError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM api_keys WHERE org_id = $1 ORDER BY created_at, id"
    ))
    .bind(org_id)
    .fetch_all(&db.pool)
    .await
    .map_err(Error::db("keys"))?;
    Ok(rows.iter().map(from_row).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_well_formed_and_distinct() {
        let a = generate();
        let b = generate();
        assert!(well_formed(&a), "{a}");
        assert_ne!(a, b);
        assert_eq!(a.len(), 44);
        assert!(!well_formed(&a.to_uppercase()));
        assert!(!well_formed("xpl_123"));
        assert!(!well_formed(&a.replace("xpl_", "sk-_")));
        assert_eq!(hash(&a).len(), 64);
    }
}
