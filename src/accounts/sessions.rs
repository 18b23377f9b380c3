//! Web sessions: a signed-in member acting in one org. The cookie holds a random
//! 256-bit token; the database holds its SHA-256, the member, the org, the
//! session's CSRF token and its expiry. A forged or guessed cookie finds no row, a
//! stolen database holds no usable cookie, and a sign-out deletes the row's
//! validity for every instance. Each instance remembers a looked-up session for
//! at most [`CACHE_TTL`], so a page costs no query per asset while a sign-out on
//! another instance takes hold within that bound.

use crate::error::Error;
use crate::store::{new_id, now_ms, Db};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sluice_filters::ApiError;
use sqlx::Row;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an instance trusts a session it looked up without asking again.
pub const CACHE_TTL: Duration = Duration::from_secs(1);
/// Sessions one instance remembers at most; past it the cache starts over.
const CACHE_CAP: usize = 10_000;

/// A signed-in member in one org.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub id: String,
    pub user_id: String,
    pub email: String,
    pub org_id: String,
    /// Every request that changes something carries it (`x-csrf-token`, or the
    /// forms' `csrf` field).
    pub csrf_token: String,
    pub expires_at: i64,
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether a cookie value has the token's shape (64 lowercase hex characters).
fn well_formed(token: &str) -> bool {
    token.len() == 64
        && token
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// What an instance remembers of a token's hash: when it looked, and what it found.
type Looked = (Instant, Option<Arc<Session>>);

/// Sessions in the database, with a short per-instance cache.
#[derive(Default)]
pub struct Sessions {
    cache: Mutex<HashMap<String, Looked>>,
}

impl Sessions {
    /// Opens a new session (always a new token: a cookie the browser already held
    /// is never adopted); returns the cookie's token and the session.
    pub async fn open(
        &self,
        db: &Db,
        user_id: &str,
        org_id: &str,
        ttl: Duration,
    ) -> Result<(String, Session), ApiError> {
        let token = random_hex();
        let now = now_ms();
        let s = Session {
            id: new_id("sess"),
            user_id: user_id.to_string(),
            email: String::new(),
            org_id: org_id.to_string(),
            csrf_token: random_hex(),
            expires_at: now.saturating_add(ttl.as_millis() as i64),
        };
        sqlx::query(
            "INSERT INTO web_sessions (token_hash, id, user_id, org_id, csrf_token, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(hash(&token))
        .bind(&s.id)
        .bind(&s.user_id)
        .bind(&s.org_id)
        .bind(&s.csrf_token)
        .bind(now)
        .bind(s.expires_at)
        .execute(&db.pool)
        .await
        .map_err(Error::db("web sessions"))?;
        let s = self
            .lookup(db, &token)
            .await?
            .map(|a| a.as_ref().clone())
            .ok_or_else(ApiError::internal)?;
        Ok((token, s))
    }

    /// The live session of a cookie's token, if any.
    pub async fn lookup(&self, db: &Db, token: &str) -> Result<Option<Arc<Session>>, ApiError> {
        if !well_formed(token) {
            return Ok(None);
        }
        let h = hash(token);
        {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, s)) = cache.get(&h) {
                if at.elapsed() < CACHE_TTL {
                    let live = s.as_ref().filter(|s| s.expires_at > now_ms());
                    return Ok(live.cloned());
                }
            }
        }
        let row = sqlx::query(
            "SELECT s.id, s.user_id, s.org_id, s.csrf_token, s.expires_at, u.email \
             FROM web_sessions s JOIN users u ON u.id = s.user_id \
             JOIN org_members m ON m.org_id = s.org_id AND m.user_id = s.user_id \
             WHERE s.token_hash = $1 AND s.revoked_at IS NULL AND s.expires_at > $2",
        )
        .bind(&h)
        .bind(now_ms())
        .fetch_optional(&db.pool)
        .await
        .map_err(Error::db("web sessions"))?;
        let found = row.map(|r| {
            Arc::new(Session {
                id: r.get("id"),
                user_id: r.get("user_id"),
                email: r.get("email"),
                org_id: r.get("org_id"),
                csrf_token: r.get("csrf_token"),
                expires_at: r.get("expires_at"),
            })
        });
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_CAP {
            cache.clear();
        }
        cache.insert(h, (Instant::now(), found.clone()));
        Ok(found)
    }

    /// Forgets what this instance cached (a member was removed: their sessions
    /// end here at once, elsewhere within [`CACHE_TTL`]).
    pub fn forget_all(&self) {
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Ends the session of a token, on every instance (this one at once, the others
    /// within [`CACHE_TTL`]).
    pub async fn revoke(&self, db: &Db, token: &str) -> Result<(), ApiError> {
        if !well_formed(token) {
            return Ok(());
        }
        let h = hash(token);
        sqlx::query(
            "UPDATE web_sessions SET revoked_at = $1 WHERE token_hash = $2 AND revoked_at IS NULL",
        )
        .bind(now_ms())
        .bind(&h)
        .execute(&db.pool)
        .await
        .map_err(Error::db("web sessions"))?;
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&h);
        Ok(())
    }
}

/// Removes sessions and mailed links that can no longer be used (expired or
/// revoked, used or expired) a day past that, every ten minutes; safe on several
/// instances at once.
pub fn spawn_sweep(db: Db) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(600)).await;
            let day_ago = now_ms() - 24 * 3600 * 1000;
            let swept = async {
                sqlx::query(
                    "DELETE FROM web_sessions WHERE expires_at < $1 OR (revoked_at IS NOT NULL AND revoked_at < $1)",
                )
                .bind(day_ago)
                .execute(&db.pool)
                .await?;
                sqlx::query(
                    "DELETE FROM email_links WHERE expires_at < $1 OR (used_at IS NOT NULL AND used_at < $1)",
                )
                .bind(day_ago)
                .execute(&db.pool)
                .await
            };
            if let Err(e) = swept.await {
                tracing::warn!(error = %e, "sweeping old sessions and links failed");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_token_shaped_cookies_are_looked_up() {
        assert!(well_formed(&random_hex()));
        assert!(!well_formed("attacker-chosen"));
        assert!(!well_formed(&random_hex().to_uppercase()));
        assert_ne!(random_hex(), random_hex());
    }
}
