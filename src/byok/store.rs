//! The routing snapshot every instance serves from: each org's connections (secrets
//! opened) and waterfall overrides. A versioned poll keeps it fresh (a change made
//! on any instance routes everywhere within a second); the instance that made a
//! change reloads at once.

use super::connections::{self, Connection};
use super::secrets::Sealer;
use crate::store::Db;
use arc_swap::ArcSwap;
use sqlx::Row;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// A connection with its secret, for calling the provider.
pub struct Live {
    pub conn: Connection,
    pub secret: Arc<str>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("conn", &self.conn)
            .finish_non_exhaustive()
    }
}

#[derive(Default, Debug)]
pub struct Routing {
    pub connections: HashMap<String, Arc<Live>>,
    /// org -> slug -> the org's chain of rung ids.
    pub waterfalls: HashMap<String, HashMap<String, Arc<Vec<String>>>>,
}

impl Routing {
    /// The org's own connection with this id.
    pub fn connection(&self, org_id: &str, id: &str) -> Option<&Arc<Live>> {
        self.connections.get(id).filter(|l| l.conn.org_id == org_id)
    }

    /// The org's first account of a provider (by alias).
    pub fn first_for(&self, org_id: &str, provider: &str) -> Option<&Arc<Live>> {
        self.connections
            .values()
            .filter(|l| l.conn.org_id == org_id && l.conn.provider == provider)
            .min_by(|a, b| a.conn.setup_alias.cmp(&b.conn.setup_alias))
    }

    pub fn waterfall(&self, org_id: &str, slug: &str) -> Option<&Arc<Vec<String>>> {
        self.waterfalls.get(org_id)?.get(slug)
    }
}

/// How often the snapshot checks the database for changes.
const REFRESH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

pub struct ByokStore {
    current: ArcSwap<Routing>,
    pub sealer: Sealer,
    stamp: AtomicI64,
    rows: AtomicI64,
}

impl ByokStore {
    pub async fn load(db: &Db, sealer: Sealer) -> anyhow::Result<ByokStore> {
        let s = ByokStore {
            current: ArcSwap::from_pointee(Routing::default()),
            sealer,
            stamp: AtomicI64::new(-1),
            rows: AtomicI64::new(-1),
        };
        s.reload(db).await?;
        Ok(s)
    }

    pub fn snapshot(&self) -> arc_swap::Guard<Arc<Routing>> {
        self.current.load()
    }

    /// Reloads when a row changed or disappeared since the last look.
    pub async fn refresh(&self, db: &Db) -> anyhow::Result<()> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM provider_connections) + (SELECT COUNT(*) FROM org_waterfalls) AS n, \
             (SELECT COALESCE(MAX(updated_at), 0) FROM provider_connections) + \
             (SELECT COALESCE(MAX(updated_at), 0) FROM org_waterfalls) AS t",
        )
        .fetch_one(&db.pool)
        .await?;
        let (n, t): (i64, i64) = (row.get("n"), row.get("t"));
        if n != self.rows.load(Ordering::Relaxed) || t != self.stamp.load(Ordering::Relaxed) {
            self.reload(db).await?;
        }
        Ok(())
    }

    pub async fn reload(&self, db: &Db) -> anyhow::Result<()> {
        let mut routing = Routing::default();
        // The same figure `refresh` compares: the sum of each table's newest stamp.
        let (mut conn_stamp, mut wf_stamp) = (0, 0);
        let conns = connections::all(db).await?;
        for (conn, sealed) in &conns {
            conn_stamp = conn_stamp.max(conn.updated_at);
            match self.sealer.open(sealed, &conn.id) {
                Ok(secret) => {
                    routing.connections.insert(
                        conn.id.clone(),
                        Arc::new(Live {
                            conn: conn.clone(),
                            secret: Arc::from(secret),
                        }),
                    );
                }
                // Never the secret, only which row.
                Err(e) => {
                    tracing::error!(connection = %conn.id, error = %e, "a connection's secret does not open; it is not routed")
                }
            }
        }
        let rows = sqlx::query("SELECT org_id, slug, chain, updated_at FROM org_waterfalls")
            .fetch_all(&db.pool)
            .await?;
        for r in &rows {
            wf_stamp = wf_stamp.max(r.get::<i64, _>("updated_at"));
            let chain: Vec<String> =
                serde_json::from_str(&r.get::<String, _>("chain")).unwrap_or_default();
            routing
                .waterfalls
                .entry(r.get("org_id"))
                .or_default()
                .insert(r.get("slug"), Arc::new(chain));
        }
        self.current.store(Arc::new(routing));
        self.stamp.store(conn_stamp + wf_stamp, Ordering::Relaxed);
        self.rows
            .store((conns.len() + rows.len()) as i64, Ordering::Relaxed);
        Ok(())
    }

    pub fn spawn_refresh(self: &Arc<Self>, db: Db) {
        let store = Arc::clone(self);
        crate::store::spawn_poll(REFRESH_EVERY, "routing", move || {
            let (store, db) = (store.clone(), db.clone());
            async move { store.refresh(&db).await }
        });
    }
}
