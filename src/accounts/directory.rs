//! The in-process directory of keys and orgs that the hot path authenticates
//! against: no SQL per request. Snapshots sit behind `ArcSwap` (lock-free reads) and
//! are kept fresh by a versioned poll of `updated_at`, so a key revoked through any
//! instance stops working on every instance sharing the database within a second
//! (on PostgreSQL, woken by the change feed, within milliseconds).
//! A well-formed key the snapshot does not know yet (minted a moment ago by the
//! CLI or another instance) is looked up in the database once; unknown ones are
//! remembered briefly, so garbage keys cannot turn into a query per request.

use super::{keys, orgs, KeyRecord, OrgRecord};
use crate::store::changes::{Feed, Topic};
use crate::store::{now_ms, Db};
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How far back each poll re-reads, to catch writes whose transaction committed
/// after a later-stamped one was already seen. Stamps come from the database's
/// clock (migration 0006), so writers' clocks may disagree.
const OVERLAP_MS: i64 = 2_000;

/// How often the directory polls for changes.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(250);

/// How long a key hash the database did not know is answered without asking again.
const MISS_TTL: Duration = Duration::from_secs(10);
/// Remembered misses at most; past it the expired ones go, then all of them.
const MISS_CAP: usize = 10_000;
/// Database look-ups of unknown keys in flight at most; more are answered as misses.
const MAX_LOOKUPS: usize = 4;
/// This often the whole directory is re-read, whatever the stamps say.
const FULL_RELOAD_EVERY: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct Directory {
    keys: ArcSwap<HashMap<String, Arc<KeyRecord>>>,
    orgs: ArcSwap<HashMap<String, Arc<OrgRecord>>>,
    watermark: AtomicI64,
    /// Hashes of well-formed keys the database did not know, and when it said so.
    misses: Mutex<HashMap<String, Instant>>,
    lookups: AtomicUsize,
    /// Counts local writes (`put_key`, `put_org`): a poll that read while one
    /// landed drops what it read, so a stale row never overwrites a newer write.
    local_writes: AtomicU64,
}

/// Releases a look-up slot when the look-up ends, however it ends.
struct LookupSlot<'a>(&'a AtomicUsize);

impl Drop for LookupSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
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

    /// The live key whose hash is `hash` and its org (a batch line names its key so:
    /// the key itself is never stored).
    pub fn authenticate_hash(&self, hash: &str) -> Option<(Arc<KeyRecord>, Arc<OrgRecord>)> {
        let key = self.keys.load().get(hash)?.clone();
        if !key.is_live(now_ms()) {
            return None;
        }
        let org = self.orgs.load().get(&key.org_id)?.clone();
        Some((key, org))
    }

    /// [`Directory::authenticate`], and on a miss for a well-formed key the snapshot
    /// does not hold, one bounded database look-up: a key works the moment the
    /// command that made it returns, on every instance. Cached keys never reach SQL.
    pub async fn authenticate_or_fetch(
        &self,
        db: &Db,
        presented: &str,
    ) -> Option<(Arc<KeyRecord>, Arc<OrgRecord>)> {
        if let Some(found) = self.authenticate(presented) {
            return Some(found);
        }
        if !keys::well_formed(presented) {
            return None;
        }
        let hash = keys::hash(presented);
        if let Some(k) = self.keys.load().get(&hash) {
            if self.orgs.load().contains_key(&k.org_id) {
                // Known, and revoked or expired.
                return None;
            }
        }
        if self.missed_recently(&hash) {
            return None;
        }
        if self.lookups.fetch_add(1, Ordering::Relaxed) >= MAX_LOOKUPS {
            self.lookups.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let _slot = LookupSlot(&self.lookups);
        match crate::metrics::global()
            .db("directory", self.fetch(db, &hash))
            .await
        {
            Ok(true) => self.authenticate(presented),
            Ok(false) => {
                self.remember_miss(hash);
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "key look-up failed");
                None
            }
        }
    }

    /// Reads one key and its org into the snapshot; false when there is no such key.
    async fn fetch(&self, db: &Db, hash: &str) -> anyhow::Result<bool> {
        let Some(key) = keys::by_hash(db, hash).await? else {
            return Ok(false);
        };
        let Some(org) = orgs::get(db, &key.org_id).await? else {
            return Ok(false);
        };
        self.put_org(org);
        self.put_key(key);
        Ok(true)
    }

    fn missed_recently(&self, hash: &str) -> bool {
        let misses = self.misses.lock().unwrap_or_else(|p| p.into_inner());
        misses.get(hash).is_some_and(|t| t.elapsed() < MISS_TTL)
    }

    fn remember_miss(&self, hash: String) {
        let mut misses = self.misses.lock().unwrap_or_else(|p| p.into_inner());
        if misses.len() >= MISS_CAP {
            misses.retain(|_, t| t.elapsed() < MISS_TTL);
            if misses.len() >= MISS_CAP {
                misses.clear();
            }
        }
        misses.insert(hash, Instant::now());
    }

    /// Applies a local write at once (the poll would see it within a tick).
    pub fn put_key(&self, rec: KeyRecord) {
        self.local_writes.fetch_add(1, Ordering::SeqCst);
        let rec = Arc::new(rec);
        self.keys.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.insert(rec.hash.clone(), rec.clone());
            m
        });
    }

    pub fn put_org(&self, rec: OrgRecord) {
        self.local_writes.fetch_add(1, Ordering::SeqCst);
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
        let epoch = self.local_writes.load(Ordering::SeqCst);
        let changed_keys = keys::changed_since(db, since).await?;
        let changed_orgs = orgs::changed_since(db, since).await?;
        let mut max = self.watermark.load(Ordering::Relaxed);
        for (_, t) in &changed_keys {
            max = max.max(*t);
        }
        for (_, t) in &changed_orgs {
            max = max.max(*t);
        }
        // Merged into the newest map (rcu), never swapped over it; and not at all
        // when a local write landed while this poll read (its rows may be older
        // than that write): the next poll reads again from the same watermark.
        let stale = || self.local_writes.load(Ordering::SeqCst) != epoch;
        if !changed_keys.is_empty() {
            let changed: Vec<Arc<KeyRecord>> =
                changed_keys.into_iter().map(|(k, _)| Arc::new(k)).collect();
            self.keys.rcu(|current| {
                if stale() {
                    Arc::clone(current)
                } else {
                    merged(current, &changed, |k| k.hash.clone())
                }
            });
        }
        if !changed_orgs.is_empty() {
            let changed: Vec<Arc<OrgRecord>> =
                changed_orgs.into_iter().map(|(o, _)| Arc::new(o)).collect();
            self.orgs.rcu(|current| {
                if stale() {
                    Arc::clone(current)
                } else {
                    merged(current, &changed, |o| o.id.clone())
                }
            });
        }
        if !stale() {
            self.watermark.store(max.max(0), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Polls forever on the current runtime (woken by the change feed on
    /// PostgreSQL); every minute re-reads everything, a backstop for any write
    /// whose stamp fell behind the watermark.
    pub fn spawn_sync(self: &Arc<Self>, db: Db, feed: &Arc<Feed>) {
        let dir = Arc::clone(self);
        let mut full_at = Instant::now() + FULL_RELOAD_EVERY;
        crate::store::spawn_poll(
            SYNC_INTERVAL,
            (feed, Topic::Directory),
            "directory",
            move || {
                let full = Instant::now() >= full_at;
                if full {
                    full_at = Instant::now() + FULL_RELOAD_EVERY;
                }
                let (dir, db) = (dir.clone(), db.clone());
                async move {
                    if full {
                        dir.sync_from(&db, i64::MIN).await
                    } else {
                        dir.sync(&db).await
                    }
                }
            },
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_minted_elsewhere_works_at_once_and_unknown_keys_are_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("t.db").display()))
            .await
            .unwrap();
        db.migrate().await.unwrap();
        let directory = Directory::load(&db).await.unwrap();
        // Written as another process would: the snapshot has not seen either row.
        let org = orgs::create(
            &db,
            orgs::NewOrg {
                name: "acme".into(),
                email: None,
                email_verified: true,
                card_verified: false,
                credits_micro_usd: 0,
                tier: 0,
            },
        )
        .await
        .unwrap();
        let (_, key) = keys::create(&db, &org, keys::NewKey::default())
            .await
            .unwrap();
        assert!(directory.authenticate(&key).is_none());
        let (k, o) = directory.authenticate_or_fetch(&db, &key).await.unwrap();
        assert_eq!(
            (k.org_id.as_str(), o.id.as_str()),
            (org.as_str(), org.as_str())
        );
        // Now cached: the plain snapshot read answers.
        assert!(directory.authenticate(&key).is_some());

        let unknown = keys::generate();
        assert!(directory
            .authenticate_or_fetch(&db, &unknown)
            .await
            .is_none());
        assert!(directory.missed_recently(&keys::hash(&unknown)));
        // Malformed credentials never reach the database or the miss list.
        assert!(directory
            .authenticate_or_fetch(&db, "xpl_nothex")
            .await
            .is_none());
        assert_eq!(directory.misses.lock().unwrap().len(), 1);
    }
}
