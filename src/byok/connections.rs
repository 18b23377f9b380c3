//! An org's own provider accounts: create (never overwriting an alias), rotate,
//! list, status and spend, delete. Secrets are sealed before they touch the
//! database and never appear in a read.

use super::secrets::Sealer;
use crate::config::PROVIDERS;
use crate::error::Error;
use crate::money::micro_to_usd;
use crate::store::db::opt_i64;
use crate::store::{new_id, now_ms, Db};
use serde_json::{json, Value};
use sluice_filters::{ApiError, ErrorCode};
use sqlx::Row;

/// Providers an org may connect its own account to (not `local`, not the
/// platform-hosted collection).
pub(crate) fn accepts_connections(provider: &str) -> bool {
    PROVIDERS.contains(&provider) && !matches!(provider, "local" | "hosted")
}

/// A connection as stored, without its secret.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Connection {
    pub(crate) id: String,
    pub(crate) org_id: String,
    pub(crate) provider: String,
    pub(crate) setup_alias: String,
    pub(crate) config: Value,
    /// `unchecked`, `ok` or `failed`.
    pub(crate) status: String,
    pub(crate) status_detail: Option<String>,
    pub(crate) spend_micro_usd: Option<i64>,
    pub(crate) spend_checked_at: Option<i64>,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
}

impl Connection {
    /// The list entry: never any secret material.
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "provider": self.provider,
            "setup_alias": self.setup_alias,
            "config": self.config,
            "created_at": self.created_at / 1000,
            "status": self.status,
            "status_detail": self.status_detail,
            "spend_usd": self.spend_micro_usd.map(micro_to_usd),
            "spend_checked_at": self.spend_checked_at.map(|t| t / 1000),
        })
    }

    /// `config.base_url`, if the account lives somewhere other than the provider's
    /// default endpoint (an Azure resource, a regional host).
    pub(crate) fn base_url(&self) -> &str {
        self.config
            .get("base_url")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// The provider's model id for a catalog slug: `config.models[slug]` when the
    /// account maps it (an Azure deployment name), else `None`.
    pub(crate) fn model_for(&self, slug: &str) -> Option<&str> {
        self.config.get("models")?.get(slug)?.as_str()
    }
}

/// Checks the parts of a write a client controls.
pub(crate) fn validate(
    provider: &str,
    alias: &str,
    secret: &str,
    config: &Value,
) -> Result<(), ApiError> {
    if !accepts_connections(provider) {
        return Err(ApiError::invalid_parameter(
            "provider",
            format!("{provider:?} does not take connections; every provider except local and hosted does"),
        ));
    }
    let alias_ok = (1..=64).contains(&alias.len())
        && alias
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !alias_ok {
        return Err(ApiError::invalid_parameter(
            "setup_alias",
            "setup_alias must be 1 to 64 letters, digits, '-', '_' or '.'",
        ));
    }
    if secret.trim().is_empty() || secret.len() > 16_384 {
        return Err(ApiError::invalid_parameter(
            "secret",
            "secret must be a non-empty string of at most 16,384 characters",
        ));
    }
    let Some(obj) = config.as_object() else {
        return Err(ApiError::invalid_parameter(
            "config",
            "config must be an object",
        ));
    };
    if serde_json::to_vec(config).map_or(0, |v| v.len()) > 16_384 {
        return Err(ApiError::invalid_parameter(
            "config",
            "config must be at most 16 KB",
        ));
    }
    if let Some(b) = obj.get("base_url") {
        let ok = b
            .as_str()
            .is_some_and(|s| s.starts_with("https://") || s.starts_with("http://"));
        if !ok {
            return Err(ApiError::invalid_parameter(
                "config.base_url",
                "config.base_url must be an http(s) URL",
            ));
        }
    }
    match provider {
        "bedrock"
            if obj
                .get("access_key_id")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty) =>
        {
            return Err(ApiError::invalid_parameter(
                "config.access_key_id",
                "a bedrock account needs config.access_key_id (the secret is its secret access key)",
            ));
        }
        // Only key JSON: a path would read the gateway's own files. Its fields are
        // read by the provider client (`api::byok` checks them).
        "vertex" if !secret.trim_start().starts_with('{') => {
            return Err(ApiError::invalid_parameter(
                "secret",
                "a vertex account's secret is its service-account key JSON",
            ));
        }
        _ => {}
    }
    if let Some(m) = obj.get("models") {
        let ok = m.as_object().is_some_and(|m| {
            m.values()
                .all(|v| v.as_str().is_some_and(|s| !s.is_empty()))
        });
        if !ok {
            return Err(ApiError::invalid_parameter(
                "config.models",
                "config.models must map model slugs to provider model ids",
            ));
        }
    }
    Ok(())
}

const COLUMNS: &str =
    "id, org_id, provider, setup_alias, sealed_secret, config, status, status_detail, \
                       spend_micro_usd, spend_checked_at, created_at, updated_at";

pub(crate) fn from_row(row: &sqlx::any::AnyRow) -> (Connection, String) {
    let config: String = row.get("config");
    (
        Connection {
            id: row.get("id"),
            org_id: row.get("org_id"),
            provider: row.get("provider"),
            setup_alias: row.get("setup_alias"),
            config: serde_json::from_str(&config).unwrap_or_else(|_| json!({})),
            status: row.get("status"),
            status_detail: row
                .try_get::<Option<String>, _>("status_detail")
                .ok()
                .flatten(),
            spend_micro_usd: opt_i64(row, "spend_micro_usd"),
            spend_checked_at: opt_i64(row, "spend_checked_at"),
            created_at: row.get("created_at"),
            updated_at: row.get("updated_at"),
        },
        row.get("sealed_secret"),
    )
}

fn account_exists(alias: &str) -> ApiError {
    ApiError::new(
        ErrorCode::AccountExists,
        format!("An account with setup_alias {alias:?} already exists for this provider; choose another alias, or rotate it with PUT."),
    )
    .param("setup_alias")
}

fn no_account(alias: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("No account with setup_alias {alias:?} for this provider."),
    )
}

/// Accounts one org may hold: each is opened into every instance's routing
/// snapshot, so their number is bounded.
pub(crate) const MAX_PER_ORG: i64 = 50;

/// Creates a new account; an alias already taken is 409 `account_exists`, an org
/// at [`MAX_PER_ORG`] gets 400 `invalid_request`.
pub(crate) async fn create(
    db: &Db,
    sealer: &Sealer,
    org_id: &str,
    provider: &str,
    alias: &str,
    secret: &str,
    config: &Value,
) -> Result<Connection, ApiError> {
    if find(db, org_id, provider, alias).await?.is_some() {
        return Err(account_exists(alias));
    }
    let held: i64 = sqlx::query("SELECT COUNT(*) AS n FROM provider_connections WHERE org_id = $1")
        .bind(org_id)
        .fetch_one(&db.pool)
        .await
        .map_err(Error::db("provider connections"))?
        .get("n");
    if held >= MAX_PER_ORG {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("This organization already has {held} provider connections, the most it may hold ({MAX_PER_ORG}); delete one it no longer uses first."),
        ));
    }
    let id = new_id("conn");
    let now = now_ms();
    let done = sqlx::query(
        "INSERT INTO provider_connections (id, org_id, provider, setup_alias, sealed_secret, config, \
         status, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, 'unchecked', $7, $7)",
    )
    .bind(&id)
    .bind(org_id)
    .bind(provider)
    .bind(alias)
    .bind(sealer.seal(secret, &id))
    .bind(config.to_string())
    .bind(now)
    .execute(&db.pool)
    .await;
    match done {
        Ok(_) => {}
        // Two creates raced for the alias: the unique index keeps the first.
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            return Err(account_exists(alias))
        }
        Err(e) => return Err(Error::db("provider connections")(e).into()),
    }
    find(db, org_id, provider, alias)
        .await?
        .ok_or_else(ApiError::internal)
}

/// Replaces the secret (and the config, when given) of one existing account.
pub(crate) async fn rotate(
    db: &Db,
    sealer: &Sealer,
    org_id: &str,
    provider: &str,
    alias: &str,
    secret: &str,
    config: Option<&Value>,
) -> Result<Connection, ApiError> {
    let (current, _) = require(db, org_id, provider, alias).await?;
    let config = config.unwrap_or(&current.config);
    sqlx::query(
        "UPDATE provider_connections SET sealed_secret = $1, config = $2, status = 'unchecked', \
         status_detail = NULL, updated_at = $3 WHERE id = $4",
    )
    .bind(sealer.seal(secret, &current.id))
    .bind(config.to_string())
    .bind(now_ms())
    .bind(&current.id)
    .execute(&db.pool)
    .await
    .map_err(Error::db("provider connections"))?;
    find(db, org_id, provider, alias)
        .await?
        .ok_or_else(ApiError::internal)
}

pub(crate) async fn find(
    db: &Db,
    org_id: &str,
    provider: &str,
    alias: &str,
) -> Result<Option<Connection>, ApiError> {
    Ok(find_sealed(db, org_id, provider, alias)
        .await?
        .map(|(c, _)| c))
}

/// One account with its sealed secret.
pub(crate) async fn find_sealed(
    db: &Db,
    org_id: &str,
    provider: &str,
    alias: &str,
) -> Result<Option<(Connection, String)>, ApiError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM provider_connections WHERE org_id = $1 AND provider = $2 AND setup_alias = $3"
    ))
    .bind(org_id)
    .bind(provider)
    .bind(alias)
    .fetch_optional(&db.pool)
    .await
    .map_err(Error::db("provider connections"))?;
    Ok(row.as_ref().map(from_row))
}

/// The named account, or 404.
pub(crate) async fn require(
    db: &Db,
    org_id: &str,
    provider: &str,
    alias: &str,
) -> Result<(Connection, String), ApiError> {
    find_sealed(db, org_id, provider, alias)
        .await?
        .ok_or_else(|| no_account(alias))
}

pub(crate) async fn list(db: &Db, org_id: &str) -> Result<Vec<Connection>, ApiError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM provider_connections WHERE org_id = $1 ORDER BY provider, setup_alias"
    ))
    .bind(org_id)
    .fetch_all(&db.pool)
    .await
    .map_err(Error::db("provider connections"))?;
    Ok(rows.iter().map(|r| from_row(r).0).collect())
}

/// Connections changed at or after `since` (Unix ms), with their sealed secrets:
/// what the routing snapshot reads on each poll.
pub(crate) async fn changed_since(
    db: &Db,
    since: i64,
) -> anyhow::Result<Vec<(Connection, String)>> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM provider_connections WHERE updated_at >= $1"
    ))
    .bind(since)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows.iter().map(from_row).collect())
}

/// How many connections exist (a change means rows were deleted or added).
pub(crate) async fn count(db: &Db) -> anyhow::Result<i64> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM provider_connections")
        .fetch_one(&db.pool)
        .await?;
    Ok(row.get("n"))
}

/// Every connection's id, no secrets: how deletions are found.
pub(crate) async fn ids(db: &Db) -> anyhow::Result<Vec<String>> {
    let rows = sqlx::query("SELECT id FROM provider_connections")
        .fetch_all(&db.pool)
        .await?;
    Ok(rows.iter().map(|r| r.get("id")).collect())
}

/// Removes only the named account.
pub(crate) async fn delete(
    db: &Db,
    org_id: &str,
    provider: &str,
    alias: &str,
) -> Result<(), ApiError> {
    let n = sqlx::query(
        "DELETE FROM provider_connections WHERE org_id = $1 AND provider = $2 AND setup_alias = $3",
    )
    .bind(org_id)
    .bind(provider)
    .bind(alias)
    .execute(&db.pool)
    .await
    .map_err(Error::db("provider connections"))?
    .rows_affected();
    if n == 0 {
        return Err(no_account(alias));
    }
    Ok(())
}

/// Records a check's verdict. `updated_at` stays: it versions what routing reads
/// (the secret, the config), and a status is not part of it, so a check never makes
/// any instance re-read the connection (nor drop its Vertex token cache).
pub(crate) async fn set_status(db: &Db, id: &str, ok: bool, detail: &str) -> Result<(), ApiError> {
    sqlx::query("UPDATE provider_connections SET status = $1, status_detail = $2 WHERE id = $3")
        .bind(if ok { "ok" } else { "failed" })
        .bind(detail)
        .bind(id)
        .execute(&db.pool)
        .await
        .map_err(Error::db("provider connections"))?;
    Ok(())
}

/// Records the provider's spend figure; like a status, not part of what routing
/// reads, so `updated_at` stays.
pub(crate) async fn set_spend(db: &Db, id: &str, micro_usd: i64) -> Result<(), ApiError> {
    let now = now_ms();
    sqlx::query(
        "UPDATE provider_connections SET spend_micro_usd = $1, spend_checked_at = $2 WHERE id = $3",
    )
    .bind(micro_usd)
    .bind(now)
    .bind(id)
    .execute(&db.pool)
    .await
    .map_err(Error::db("provider connections"))?;
    Ok(())
}
