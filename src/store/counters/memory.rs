//! In-process counters for a single instance: one map behind a mutex. Entries carry
//! their own expiry: reads ignore expired entries, and a timer task sweeps them out
//! every [`SWEEP_EVERY`], off the request path (a request never scans the map).
//!
//! Cache-affinity markers (`aff:{org}:…`) are the one family a client can make
//! without bound (one per distinct `prompt_cache_key`), so each org keeps at most
//! [`AFFINITY_PER_ORG`] of them: a new one past the cap evicts that org's oldest.
//! Losing a marker only costs its conversation a cold prompt cache.

use super::{
    credited_mark, now_secs, window_counter, BalanceReq, Counters, Observed, WindowOutcome,
    WindowReq,
};
use async_trait::async_trait;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{AFFINITY, AFFINITY_PER_ORG};

/// How often expired entries are swept out.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

enum Value {
    Int(i64),
    Str(String),
}

struct Entry {
    value: Value,
    expires: Option<Instant>,
}

/// Keys are hashed several times per request: foldhash (seeded per process)
/// instead of SipHash.
type Map = HashMap<String, Entry, foldhash::fast::RandomState>;

#[derive(Default)]
struct Inner {
    map: Map,
    /// Each org's affinity markers, oldest first (a key may linger here after its
    /// entry expired; the sweep drops those).
    affinity: HashMap<String, VecDeque<String>, foldhash::fast::RandomState>,
}

impl std::ops::Deref for Inner {
    type Target = Map;
    fn deref(&self) -> &Map {
        &self.map
    }
}

impl std::ops::DerefMut for Inner {
    fn deref_mut(&mut self) -> &mut Map {
        &mut self.map
    }
}

#[derive(Default)]
pub struct MemoryCounters {
    inner: Mutex<Inner>,
}

impl MemoryCounters {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sweeps expired entries every [`SWEEP_EVERY`] for as long as the counters
    /// live. Must run inside the runtime.
    pub fn spawn_sweeper(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(c) => c.sweep(),
                    None => return,
                }
            }
        });
    }

    /// Drops every expired entry, and affinity bookkeeping for markers gone.
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut inner = self.lock();
        let Inner { map, affinity } = &mut *inner;
        map.retain(|_, e| live(e, now));
        affinity.retain(|_, keys| {
            keys.retain(|k| map.contains_key(k));
            !keys.is_empty()
        });
    }

    /// How many entries the map holds, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Records a new affinity marker under its org and evicts the org's oldest past
/// the cap.
fn note_affinity(inner: &mut Inner, key: &str) {
    let Some(org) = key
        .strip_prefix(AFFINITY)
        .and_then(|rest| rest.split(':').next())
    else {
        return;
    };
    let keys = inner.affinity.entry(org.to_string()).or_default();
    keys.push_back(key.to_string());
    while keys.len() > AFFINITY_PER_ORG {
        if let Some(old) = keys.pop_front() {
            inner.map.remove(&old);
        }
    }
}

fn live(e: &Entry, now: Instant) -> bool {
    e.expires.is_none_or(|t| t > now)
}

fn int_of(map: &Map, key: &str, now: Instant) -> Option<i64> {
    match map.get(key) {
        Some(e) if live(e, now) => match e.value {
            Value::Int(v) => Some(v),
            Value::Str(_) => None,
        },
        _ => None,
    }
}

fn set_int(map: &mut Map, key: &str, v: i64, expires: Option<Instant>) {
    let value = Value::Int(v);
    // A counter that exists is updated in place: no new key on every request.
    if let Some(e) = map.get_mut(key) {
        *e = Entry { value, expires };
    } else {
        map.insert(key.to_string(), Entry { value, expires });
    }
}

/// Brings the live balance up to date with the credited total; returns it, or
/// `None` when the counter was never seeded.
fn sync_balance(map: &mut Map, b: &BalanceReq, now: Instant) -> Option<i64> {
    let mark = credited_mark(&b.key);
    let seen = int_of(map, &mark, now)?;
    let mut live = int_of(map, &b.key, now).unwrap_or(0);
    if b.credited > seen {
        live = live.saturating_add(b.credited - seen);
        set_int(map, &b.key, live, None);
        set_int(map, &mark, b.credited, None);
    }
    Some(live)
}

#[async_trait]
impl Counters for MemoryCounters {
    async fn take(
        &self,
        windows: &[WindowReq],
        balance: Option<&BalanceReq>,
    ) -> anyhow::Result<WindowOutcome> {
        Ok(self.take_observed(windows, balance).await?.0)
    }

    async fn take_observed(
        &self,
        windows: &[WindowReq],
        balance: Option<&BalanceReq>,
    ) -> anyhow::Result<(WindowOutcome, Observed)> {
        let now = Instant::now();
        let secs = now_secs();
        let mut map = self.lock();
        let nothing = Observed::default;
        let live_balance = match balance {
            Some(b) => match sync_balance(&mut map, b, now) {
                Some(live) => Some(live),
                None => return Ok((WindowOutcome::Unseeded, nothing())),
            },
            None => None,
        };
        let keys: Vec<String> = windows
            .iter()
            .map(|w| window_counter(&w.key, w.window_secs, secs))
            .collect();
        for (i, (w, k)) in windows.iter().zip(&keys).enumerate() {
            let current = int_of(&map, k, now).unwrap_or(0);
            if current.saturating_add(w.amount) > w.limit {
                return Ok((WindowOutcome::Refused { index: i, current }, nothing()));
            }
        }
        let mut seen = Observed::default();
        if let (Some(b), Some(live)) = (balance, live_balance) {
            if live.saturating_sub(b.amount) < b.floor {
                return Ok((
                    WindowOutcome::Refused {
                        index: windows.len(),
                        current: live,
                    },
                    nothing(),
                ));
            }
            set_int(&mut map, &b.key, live.saturating_sub(b.amount), None);
            seen.balance = Some(live.saturating_sub(b.amount));
        }
        for (w, k) in windows.iter().zip(keys) {
            let current = int_of(&map, &k, now).unwrap_or(0);
            let expires = (w.window_secs > 0).then(|| now + Duration::from_secs(w.window_secs + 1));
            set_int(&mut map, &k, current.saturating_add(w.amount), expires);
            seen.totals.push(current.saturating_add(w.amount));
        }
        Ok((WindowOutcome::Added, seen))
    }

    async fn seed_balance(&self, key: &str, balance: i64, credited: i64) -> anyhow::Result<()> {
        let now = Instant::now();
        let mut map = self.lock();
        let mark = credited_mark(key);
        if int_of(&map, &mark, now).is_none() {
            set_int(&mut map, key, balance, None);
            set_int(&mut map, &mark, credited, None);
        }
        Ok(())
    }

    async fn window_total(&self, key: &str, window_secs: u64) -> anyhow::Result<i64> {
        let k = window_counter(key, window_secs, now_secs());
        Ok(int_of(&self.lock(), &k, Instant::now()).unwrap_or(0))
    }

    async fn add(&self, key: &str, amount: i64) -> anyhow::Result<i64> {
        let now = Instant::now();
        let mut map = self.lock();
        let v = int_of(&map, key, now).unwrap_or(0).saturating_add(amount);
        // A live window keeps its expiry: settling must not make it permanent.
        let expires = map
            .get(key)
            .filter(|e| live(e, now))
            .and_then(|e| e.expires);
        set_int(&mut map, key, v, expires);
        Ok(v)
    }

    async fn correct_many(&self, adds: &[(String, i64)]) -> anyhow::Result<()> {
        let now = Instant::now();
        let mut map = self.lock();
        for (k, v) in adds {
            if let Some(e) = map.get_mut(k.as_str()).filter(|e| live(e, now)) {
                if let Value::Int(n) = &mut e.value {
                    *n = n.saturating_add(*v);
                }
            }
        }
        Ok(())
    }

    async fn get(&self, key: &str) -> anyhow::Result<Option<i64>> {
        Ok(int_of(&self.lock(), key, Instant::now()))
    }

    async fn set(&self, key: &str, value: i64) -> anyhow::Result<()> {
        self.lock().insert(
            key.to_string(),
            Entry {
                value: Value::Int(value),
                expires: None,
            },
        );
        Ok(())
    }

    async fn put_marker(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
        only_if_absent: bool,
    ) -> anyhow::Result<bool> {
        let now = Instant::now();
        let mut inner = self.lock();
        let present = inner.get(key).is_some_and(|e| live(e, now));
        if only_if_absent && present {
            return Ok(false);
        }
        let fresh = !inner.contains_key(key);
        inner.insert(
            key.to_string(),
            Entry {
                value: Value::Str(value.to_string()),
                expires: Some(now + ttl),
            },
        );
        if fresh {
            note_affinity(&mut inner, key);
        }
        Ok(true)
    }

    async fn get_marker(&self, key: &str) -> anyhow::Result<Option<String>> {
        let now = Instant::now();
        Ok(match self.lock().get(key) {
            Some(Entry {
                value: Value::Str(s),
                expires,
            }) if expires.is_none_or(|t| t > now) => Some(s.clone()),
            _ => None,
        })
    }

    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        self.lock().remove(key);
        Ok(())
    }

    async fn ping(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_counters_keep_the_contract() {
        super::super::contract::run(&super::MemoryCounters::new(), "t").await;
    }

    #[tokio::test]
    async fn the_sweep_drops_expired_entries_and_takes_never_scan() {
        let c = MemoryCounters::new();
        let short = Duration::from_millis(1);
        for i in 0..1_000 {
            c.put_marker(&format!("m:{i}"), "x", short, false)
                .await
                .unwrap();
        }
        c.put_marker("m:keep", "x", Duration::from_secs(60), false)
            .await
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
        // A take leaves expired entries to the sweep.
        let w = WindowReq {
            key: "w".into(),
            window_secs: 60,
            amount: 1,
            limit: 10,
            ttl_secs: 0,
            down: super::super::Down::Refuse,
        };
        c.take(std::slice::from_ref(&w), None).await.unwrap();
        assert_eq!(c.len(), 1_002);
        c.sweep();
        assert_eq!(c.len(), 2, "the live marker and the window stay");
        assert_eq!(c.get_marker("m:keep").await.unwrap().as_deref(), Some("x"));
    }

    #[tokio::test]
    async fn huge_amounts_saturate_and_are_refused() {
        let c = MemoryCounters::new();
        let w = |amount| WindowReq {
            key: "w".into(),
            window_secs: 60,
            amount,
            limit: 100,
            ttl_secs: 0,
            down: super::super::Down::Refuse,
        };
        assert_eq!(c.take(&[w(5)], None).await.unwrap(), WindowOutcome::Added);
        assert_eq!(
            c.take(&[w(i64::MAX)], None).await.unwrap(),
            WindowOutcome::Refused {
                index: 0,
                current: 5
            }
        );
        c.seed_balance("b", 10, 10).await.unwrap();
        let b = BalanceReq {
            key: "b".into(),
            org_id: "o".into(),
            credited: 10,
            amount: i64::MAX,
            floor: 0,
        };
        c.set("b", -5).await.unwrap();
        assert!(matches!(
            c.take(&[], Some(&b)).await.unwrap(),
            WindowOutcome::Refused { .. }
        ));
    }

    #[tokio::test]
    async fn each_org_keeps_a_bounded_number_of_affinity_markers() {
        let c = MemoryCounters::new();
        let ttl = Duration::from_secs(600);
        c.put_marker("aff:t_org_b:m:one", "r", ttl, false)
            .await
            .unwrap();
        super::super::contract::affinity_cap(&c, "t").await;
        assert_eq!(c.len(), AFFINITY_PER_ORG + 1);
        // Sweeping keeps the bookkeeping in step with the map.
        c.sweep();
        assert_eq!(c.lock().affinity["t_org_a"].len(), AFFINITY_PER_ORG);
    }
}
