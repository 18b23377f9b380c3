//! The routing snapshot every instance serves from: each org's connections (secrets
//! opened) and waterfall overrides. A versioned poll keeps it fresh (a change made
//! on any instance routes everywhere within a second); the instance that made a
//! change refreshes at once. Refreshes are incremental: only connections whose
//! `updated_at` moved are read and opened, and a row count catches deletions.

use super::connections::{self, Connection};
use super::secrets::Sealer;
use crate::store::changes::{Feed, Topic};
use crate::store::Db;
use arc_swap::ArcSwap;
use sqlx::Row;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tokio::sync::Mutex;

/// How far back each poll re-reads, to catch writes whose transaction committed
/// after a later-stamped one was already seen (as the key directory does).
const OVERLAP_MS: i64 = 2_000;

/// A connection with its secret, for calling the provider.
pub(crate) struct Live {
    pub(crate) conn: Connection,
    pub(crate) secret: Arc<str>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("conn", &self.conn)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Default, Debug)]
pub(crate) struct Routing {
    connections: HashMap<String, Arc<Live>>,
    /// (org, provider) -> the org's accounts of that provider, by alias.
    by_provider: HashMap<(String, String), Vec<Arc<Live>>>,
    /// org -> slug -> the org's chain of rung ids.
    pub(crate) waterfalls: HashMap<String, HashMap<String, Arc<Vec<String>>>>,
}

impl Routing {
    /// The org's own connection with this id.
    pub(crate) fn connection(&self, org_id: &str, id: &str) -> Option<&Arc<Live>> {
        self.connections.get(id).filter(|l| l.conn.org_id == org_id)
    }

    /// The org's first account of a provider (by alias).
    pub(crate) fn first_for(&self, org_id: &str, provider: &str) -> Option<&Arc<Live>> {
        self.by_provider
            .get(&(org_id.to_string(), provider.to_string()))?
            .first()
    }

    pub(crate) fn waterfall(&self, org_id: &str, slug: &str) -> Option<&Arc<Vec<String>>> {
        self.waterfalls.get(org_id)?.get(slug)
    }

    /// This snapshot with `changed` put in and the connections `gone` taken out;
    /// the (org, provider) index moves only for the accounts they touch.
    fn with(&self, changed: Vec<Arc<Live>>, gone: &[String]) -> Routing {
        let mut next = self.clone();
        for live in changed {
            if let Some(old) = next.connections.insert(live.conn.id.clone(), live.clone()) {
                next.unindex(&old);
            }
            let c = &live.conn;
            let accounts = next
                .by_provider
                .entry((c.org_id.clone(), c.provider.clone()))
                .or_default();
            accounts.push(live.clone());
            accounts.sort_by(|a, b| a.conn.setup_alias.cmp(&b.conn.setup_alias));
        }
        // After the puts: a row read and then deleted within one refresh goes.
        for id in gone {
            if let Some(old) = next.connections.remove(id) {
                next.unindex(&old);
            }
        }
        next
    }

    fn unindex(&mut self, old: &Live) {
        let pair = (old.conn.org_id.clone(), old.conn.provider.clone());
        if let Some(accounts) = self.by_provider.get_mut(&pair) {
            accounts.retain(|l| l.conn.id != old.conn.id);
            if accounts.is_empty() {
                self.by_provider.remove(&pair);
            }
        }
    }
}

/// How often the snapshot checks the database for changes.
const REFRESH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

pub(crate) struct ByokStore {
    current: ArcSwap<Routing>,
    pub(crate) sealer: Sealer,
    /// The newest connection `updated_at` seen.
    watermark: AtomicI64,
    /// Every connection row seen (id -> `updated_at`), those whose secret does not
    /// open included: a row count that differs means rows were deleted. One
    /// refresh at a time.
    seen: Mutex<HashMap<String, i64>>,
    /// The waterfalls' row count and newest stamp when last read.
    waterfall_stamp: AtomicI64,
    waterfall_rows: AtomicI64,
}

impl ByokStore {
    pub(crate) async fn load(db: &Db, sealer: Sealer) -> anyhow::Result<ByokStore> {
        let s = ByokStore {
            current: ArcSwap::from_pointee(Routing::default()),
            sealer,
            watermark: AtomicI64::new(i64::MIN + OVERLAP_MS),
            seen: Mutex::new(HashMap::new()),
            waterfall_stamp: AtomicI64::new(-1),
            waterfall_rows: AtomicI64::new(-1),
        };
        s.refresh(db).await?;
        Ok(s)
    }

    pub(crate) fn snapshot(&self) -> arc_swap::Guard<Arc<Routing>> {
        self.current.load()
    }

    /// Brings the snapshot up to date: connections changed since the last look
    /// (read and opened one by one, never all of them), deleted ones dropped, and
    /// the waterfalls re-read when they changed.
    pub(crate) async fn refresh(&self, db: &Db) -> anyhow::Result<()> {
        let mut seen = self.seen.lock().await;
        let since = self.watermark.load(Ordering::Relaxed) - OVERLAP_MS;
        let mut newest = self.watermark.load(Ordering::Relaxed);
        let (mut changed, mut gone) = (Vec::new(), Vec::new());
        let rows = connections::changed_since(db, since).await?;
        self.open_new(rows, &mut seen, &mut newest, &mut changed, &mut gone);
        if connections::count(db).await? != seen.len() as i64 {
            let ids: HashSet<String> = connections::ids(db).await?.into_iter().collect();
            let deleted: Vec<String> = seen
                .keys()
                .filter(|id| !ids.contains(*id))
                .cloned()
                .collect();
            for id in deleted {
                seen.remove(&id);
                gone.push(id);
            }
            // A row stamped before the watermark (a writer's clock behind ours):
            // read everything once, still opening only the rows not seen yet.
            if ids.len() > seen.len() {
                let rows = connections::changed_since(db, i64::MIN).await?;
                self.open_new(rows, &mut seen, &mut newest, &mut changed, &mut gone);
            }
        }
        let waterfalls = self.changed_waterfalls(db).await?;
        if !changed.is_empty() || !gone.is_empty() || waterfalls.is_some() {
            let mut next = self.current.load().with(changed, &gone);
            if let Some(w) = waterfalls {
                next.waterfalls = w;
            }
            self.current.store(Arc::new(next));
        }
        self.watermark.store(newest, Ordering::Relaxed);
        Ok(())
    }

    /// Opens the rows not seen at this version yet into `changed`; one whose
    /// secret no longer opens goes to `gone` (it stops routing).
    fn open_new(
        &self,
        rows: Vec<(Connection, String)>,
        seen: &mut HashMap<String, i64>,
        newest: &mut i64,
        changed: &mut Vec<Arc<Live>>,
        gone: &mut Vec<String>,
    ) {
        for (conn, sealed) in rows {
            *newest = (*newest).max(conn.updated_at);
            // Rows inside the overlap window come back each poll: open only new ones.
            if seen.get(&conn.id) == Some(&conn.updated_at) {
                continue;
            }
            seen.insert(conn.id.clone(), conn.updated_at);
            match self.sealer.open(&sealed, &conn.id) {
                Ok(secret) => changed.push(Arc::new(Live {
                    conn,
                    secret: Arc::from(secret),
                })),
                // Never the secret, only which row.
                Err(e) => {
                    tracing::error!(connection = %conn.id, error = %e, "a connection's secret does not open; it is not routed");
                    gone.push(conn.id);
                }
            }
        }
    }

    /// Every org's waterfalls, when their row count or newest stamp moved.
    async fn changed_waterfalls(
        &self,
        db: &Db,
    ) -> anyhow::Result<Option<HashMap<String, HashMap<String, Arc<Vec<String>>>>>> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS n, COALESCE(MAX(updated_at), 0) AS t FROM org_waterfalls",
        )
        .fetch_one(&db.pool)
        .await?;
        let (n, t): (i64, i64) = (row.get("n"), row.get("t"));
        if n == self.waterfall_rows.load(Ordering::Relaxed)
            && t == self.waterfall_stamp.load(Ordering::Relaxed)
        {
            return Ok(None);
        }
        let rows = sqlx::query("SELECT org_id, slug, chain FROM org_waterfalls")
            .fetch_all(&db.pool)
            .await?;
        let mut all: HashMap<String, HashMap<String, Arc<Vec<String>>>> = HashMap::new();
        for r in &rows {
            let chain: Vec<String> =
                serde_json::from_str(&r.get::<String, _>("chain")).unwrap_or_default();
            all.entry(r.get("org_id"))
                .or_default()
                .insert(r.get("slug"), Arc::new(chain));
        }
        self.waterfall_rows.store(n, Ordering::Relaxed);
        self.waterfall_stamp.store(t, Ordering::Relaxed);
        Ok(Some(all))
    }

    pub(crate) fn spawn_refresh(self: &Arc<Self>, db: Db, feed: &Arc<Feed>) {
        let store = Arc::clone(self);
        crate::store::spawn_poll(
            REFRESH_EVERY,
            (feed, Topic::Routing),
            "routing",
            move || {
                let (store, db) = (store.clone(), db.clone());
                async move { store.refresh(&db).await }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(id: &str, org: &str, provider: &str, alias: &str) -> Arc<Live> {
        Arc::new(Live {
            conn: Connection {
                id: id.into(),
                org_id: org.into(),
                provider: provider.into(),
                setup_alias: alias.into(),
                config: serde_json::json!({}),
                status: "unchecked".into(),
                status_detail: None,
                spend_micro_usd: None,
                spend_checked_at: None,
                created_at: 0,
                updated_at: 0,
            },
            secret: Arc::from("s"),
        })
    }

    #[test]
    fn accounts_are_indexed_by_org_and_provider_as_they_change() {
        let r = Routing::default().with(
            vec![
                live("c1", "o1", "openai", "b"),
                live("c2", "o1", "openai", "a"),
                live("c3", "o2", "openai", "a"),
                live("c4", "o1", "mistral", "a"),
            ],
            &[],
        );
        let first =
            |r: &Routing, org: &str, p: &str| r.first_for(org, p).map(|l| l.conn.id.clone());
        assert_eq!(
            first(&r, "o1", "openai").as_deref(),
            Some("c2"),
            "lowest alias"
        );
        assert_eq!(first(&r, "o2", "openai").as_deref(), Some("c3"));
        assert_eq!(first(&r, "o2", "mistral"), None);
        // A rename, a deletion: only the touched pairs move.
        let r = r.with(vec![live("c2", "o1", "openai", "z")], &["c4".into()]);
        assert_eq!(first(&r, "o1", "openai").as_deref(), Some("c1"));
        assert_eq!(first(&r, "o1", "mistral"), None);
        assert!(r.connection("o1", "c4").is_none());
        assert!(
            r.connection("o2", "c1").is_none(),
            "another org's id never resolves"
        );
        let r = r.with(Vec::new(), &["c1".into(), "c2".into()]);
        assert_eq!(first(&r, "o1", "openai"), None);
        assert!(
            r.by_provider.keys().all(|(o, _)| o == "o2"),
            "no empty entries left"
        );
    }
}
