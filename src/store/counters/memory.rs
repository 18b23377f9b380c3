//! In-process counters for a single instance: one map behind a mutex. Entries carry
//! their own expiry and are swept lazily.

use super::{
    credited_mark, now_secs, window_counter, BalanceReq, Counters, WindowOutcome, WindowReq,
};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
pub struct MemoryCounters {
    map: Mutex<Map>,
}

impl MemoryCounters {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Map> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
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

/// Brings the live balance up to date with the credited total; returns it.
fn sync_balance(map: &mut Map, b: &BalanceReq, now: Instant) -> i64 {
    let mark = credited_mark(&b.key);
    match int_of(map, &mark, now) {
        None => {
            set_int(map, &b.key, b.balance, None);
            set_int(map, &mark, b.credited, None);
            b.balance
        }
        Some(seen) => {
            let mut live = int_of(map, &b.key, now).unwrap_or(0);
            if b.credited > seen {
                live += b.credited - seen;
                set_int(map, &b.key, live, None);
                set_int(map, &mark, b.credited, None);
            }
            live
        }
    }
}

#[async_trait]
impl Counters for MemoryCounters {
    async fn take(
        &self,
        windows: &[WindowReq],
        balance: Option<&BalanceReq>,
    ) -> anyhow::Result<WindowOutcome> {
        let now = Instant::now();
        let secs = now_secs();
        let mut map = self.lock();
        if map.len() > 100_000 {
            map.retain(|_, e| live(e, now));
        }
        let live_balance = balance.map(|b| sync_balance(&mut map, b, now));
        let keys: Vec<String> = windows
            .iter()
            .map(|w| window_counter(&w.key, w.window_secs, secs))
            .collect();
        for (i, (w, k)) in windows.iter().zip(&keys).enumerate() {
            let current = int_of(&map, k, now).unwrap_or(0);
            if current + w.amount > w.limit {
                return Ok(WindowOutcome::Refused { index: i, current });
            }
        }
        if let (Some(b), Some(live)) = (balance, live_balance) {
            if live - b.amount < b.floor {
                return Ok(WindowOutcome::Refused {
                    index: windows.len(),
                    current: live,
                });
            }
            set_int(&mut map, &b.key, live - b.amount, None);
        }
        for (w, k) in windows.iter().zip(keys) {
            let current = int_of(&map, &k, now).unwrap_or(0);
            let expires = (w.window_secs > 0).then(|| now + Duration::from_secs(w.window_secs + 1));
            set_int(&mut map, &k, current + w.amount, expires);
        }
        Ok(WindowOutcome::Added)
    }

    async fn window_total(&self, key: &str, window_secs: u64) -> anyhow::Result<i64> {
        let k = window_counter(key, window_secs, now_secs());
        Ok(int_of(&self.lock(), &k, Instant::now()).unwrap_or(0))
    }

    async fn add(&self, key: &str, amount: i64) -> anyhow::Result<i64> {
        let now = Instant::now();
        let mut map = self.lock();
        let v = int_of(&map, key, now).unwrap_or(0) + amount;
        map.insert(
            key.to_string(),
            Entry {
                value: Value::Int(v),
                expires: None,
            },
        );
        Ok(v)
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
        let mut map = self.lock();
        if only_if_absent && map.get(key).is_some_and(|e| live(e, now)) {
            return Ok(false);
        }
        map.insert(
            key.to_string(),
            Entry {
                value: Value::Str(value.to_string()),
                expires: Some(now + ttl),
            },
        );
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
    #[tokio::test]
    async fn memory_counters_keep_the_contract() {
        super::super::contract::run(&super::MemoryCounters::new(), "t").await;
    }
}
