//! The in-process directory of keys and orgs that the hot path authenticates
//! against: no SQL per request. Snapshots sit behind `ArcSwap` (lock-free reads) and
//! are kept fresh by a versioned poll of `updated_at`, so a key revoked through any
//! instance stops working on every instance sharing the database within a second.

use super::{keys, orgs, KeyRecord, OrgRecord};
use crate::store::{now_ms, Db};
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How far back each poll re-reads, to catch writes whose transaction committed
/// after a later-stamped one was already seen.
const OVERLAP_MS: i64 = 2_000;

/// How often the directory polls for changes.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Default)]
pub struct Directory {
    keys: ArcSwap<HashMap<String, Arc<KeyRecord>>>,
    orgs: ArcSwap<HashMap<String, Arc<OrgRecord>>>,
    watermark: AtomicI64,
}

impl Directory {
    /// Loads every key and org.
    pub async fn load(db: &Db) -> anyhow::Result<Directory> {
        let dir = Directory::default();
        dir.sync_from(db, i64::MIN).await?;
        Ok(dir)
    }

    /// The live key and its org for a presented credential, or `None` for a
    /// missing, malformed, unknown, revoked or expired key (the caller answers all of
    /// them alike).
    pub fn authenticate(&self, presented: &str) -> Option<(Arc<KeyRecord>, Arc<OrgRecord>)> {
        if !keys::well_formed(presented) {
            return None;
        }
        let mut hex = [0u8; 64];
        let key = self
            .keys
            .load()
            .get(keys::hash_into(presented, &mut hex))?
            .clone();
        if !key.is_live(now_ms()) {
            return None;
        }
        let org = self.orgs.load().get(&key.org_id)?.clone();
        Some((key, org))
    }

    /// Applies a local write at once (the poll would see it within a tick).
    pub fn put_key(&self, rec: KeyRecord) {
        let rec = Arc::new(rec);
        self.keys.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.insert(rec.hash.clone(), rec.clone());
            m
        });
    }

    pub fn put_org(&self, rec: OrgRecord) {
        let rec = Arc::new(rec);
        self.orgs.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.insert(rec.id.clone(), rec.clone());
            m
        });
    }

    /// Reads what changed since the last poll and swaps it in.
    pub async fn sync(&self, db: &Db) -> anyhow::Result<()> {
        let since = self
            .watermark
            .load(Ordering::Relaxed)
            .saturating_sub(OVERLAP_MS);
        self.sync_from(db, since).await
    }

    async fn sync_from(&self, db: &Db, since: i64) -> anyhow::Result<()> {
        let changed_keys = keys::changed_since(db, since).await?;
        let changed_orgs = orgs::changed_since(db, since).await?;
        let mut max = self.watermark.load(Ordering::Relaxed);
        for (_, t) in &changed_keys {
            max = max.max(*t);
        }
        for (_, t) in &changed_orgs {
            max = max.max(*t);
        }
        // Merged into the newest map (rcu), never swapped over it: a key or org a
        // local write put in while this poll was reading stays in.
        if !changed_keys.is_empty() {
            let changed: Vec<Arc<KeyRecord>> =
                changed_keys.into_iter().map(|(k, _)| Arc::new(k)).collect();
            self.keys
                .rcu(|current| merged(current, &changed, |k| k.hash.clone()));
        }
        if !changed_orgs.is_empty() {
            let changed: Vec<Arc<OrgRecord>> =
                changed_orgs.into_iter().map(|(o, _)| Arc::new(o)).collect();
            self.orgs
                .rcu(|current| merged(current, &changed, |o| o.id.clone()));
        }
        self.watermark.store(max.max(0), Ordering::Relaxed);
        Ok(())
    }

    /// Polls forever on the current runtime.
    pub fn spawn_sync(self: &Arc<Self>, db: Db) {
        let dir = Arc::clone(self);
        crate::store::spawn_poll(SYNC_INTERVAL, "directory", move || {
            let (dir, db) = (dir.clone(), db.clone());
            async move { dir.sync(&db).await }
        });
    }
}

/// `current` with the changed records in (a copy only when one differs).
fn merged<T: PartialEq>(
    current: &Arc<HashMap<String, Arc<T>>>,
    changed: &[Arc<T>],
    key: impl Fn(&T) -> String,
) -> Arc<HashMap<String, Arc<T>>> {
    let differs = changed
        .iter()
        .any(|c| current.get(&key(c)).map(|x| x.as_ref()) != Some(c.as_ref()));
    if !differs {
        return Arc::clone(current);
    }
    let mut next = HashMap::clone(current);
    for c in changed {
        next.insert(key(c), Arc::clone(c));
    }
    Arc::new(next)
}
