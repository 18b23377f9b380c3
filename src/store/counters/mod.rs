//! Fast shared counters: rate windows, credit reservations, short-lived markers
//! (cache affinity, idempotency locks). One trait, two stores: Redis when several
//! instances share the work (Lua scripts make each step atomic and one round trip),
//! in-process maps when one instance runs alone; and three wrappers over a store:
//! `leased` (local leases of shared windows and balances), `seeded` (windows
//! restored from the ledger) and `metered` (each call timed).

pub mod leased;
mod memory;
mod metered;
mod redis;
pub mod seeded;

pub use self::leased::LeasedCounters;
pub use self::memory::MemoryCounters;
pub use self::metered::MeteredCounters;
pub use self::redis::{RedisCounters, EPOCH};
pub use self::seeded::SeededCounters;

use async_trait::async_trait;
use std::time::Duration;

/// The key family of cache-affinity markers, `aff:{org}:{model}:{digest}` (written
/// by the waterfall). A client can make these without bound (one per distinct
/// `prompt_cache_key`), so both stores keep at most [`AFFINITY_PER_ORG`] per org:
/// a new one past the cap evicts the org's oldest, which only costs that
/// conversation a cold prompt cache.
pub const AFFINITY: &str = "aff:";

/// Cache-affinity markers one org may hold at once (each lives 600 s).
pub const AFFINITY_PER_ORG: usize = 10_000;

/// One fixed rate window to check and add to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowReq {
    /// The counter's name without the window suffix, e.g. `rpm:key_…`.
    pub key: String,
    /// Window length in seconds; windows align to the Unix epoch (so daily windows
    /// reset at 00:00 UTC). Zero: `key` is the counter itself and never expires (a
    /// lifetime total, or a calendar period named in the key).
    pub window_secs: u64,
    pub amount: i64,
    /// The window refuses an add that would take it past this.
    pub limit: i64,
    /// For a counter with no window (`window_secs` 0): Redis gives it this expiry
    /// when it has none (0: never expires). It bounds how long slots held by an
    /// instance that died stay counted; the in-process store dies with its slots.
    pub ttl_secs: u64,
    /// What an instance may grant itself of this window while the shared store
    /// does not answer (`leased`).
    pub down: Down,
}

/// A window's allowance while the shared store is away, per instance (the rule
/// and its bound are in docs/decisions.md, "Shared state").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Down {
    /// Nothing: the take fails.
    #[default]
    Refuse,
    /// Rates and concurrency: its share of the limit (the limit over the live
    /// instances), as if the window had just begun.
    Share,
    /// Money (a spend cap, a free allowance): its share of what the window had
    /// left when the shared store last answered this instance; nothing when it
    /// never did.
    Remaining,
}

/// What a take that was added saw in the shared store: each window's total
/// after it, and the live balance after the draw. Only a shared store says it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    pub totals: Vec<i64>,
    pub balance: Option<i64>,
}

/// A draw on a shared balance, taken in the same atomic step as the windows.
///
/// The live balance is a counter (`key`) that reservations draw down and grants top
/// up. Grants reach it without any instance having to be told: `credited` is the
/// org's running total of credits ever added (from the same database row as
/// `balance`), and the counter remembers the total it has already taken in; a larger
/// figure adds the difference, once, whichever instance brings it.
///
/// A counter without its credited mark (first use, an in-process restart, a Redis
/// that lost data) is not guessed from any snapshot: the take answers
/// [`WindowOutcome::Unseeded`], and the balance is seeded from the database minus
/// the usage not written there yet (see [`seeded`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BalanceReq {
    pub key: String,
    /// The org whose balance it is.
    pub org_id: String,
    pub credited: i64,
    pub amount: i64,
    /// The draw is refused when it would take the live balance below this.
    pub floor: i64,
}

/// The answer of [`Counters::take`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowOutcome {
    /// Every window took its amount.
    Added,
    /// The window at this index would pass its limit; nothing was added anywhere.
    /// The balance, when asked for, has the index after the last window, and
    /// `current` is then the live balance.
    Refused { index: usize, current: i64 },
    /// The balance counter has no credited mark: nothing was taken; seed it with
    /// [`Counters::seed_balance`] and take again.
    Unseeded,
}

#[async_trait]
pub trait Counters: Send + Sync {
    /// All-or-nothing: adds each request's amount to its current window and draws
    /// the balance, unless one of them would pass its limit.
    async fn take(
        &self,
        windows: &[WindowReq],
        balance: Option<&BalanceReq>,
    ) -> anyhow::Result<WindowOutcome>;

    /// [`Counters::take`], with what the store saw when it added (a store that
    /// does not say gives nothing).
    async fn take_observed(
        &self,
        windows: &[WindowReq],
        balance: Option<&BalanceReq>,
    ) -> anyhow::Result<(WindowOutcome, Observed)> {
        Ok((self.take(windows, balance).await?, Observed::default()))
    }

    /// Starts a balance counter at `balance` with its credited mark at `credited`,
    /// unless the mark exists (another request seeded it first).
    async fn seed_balance(&self, key: &str, balance: i64, credited: i64) -> anyhow::Result<()>;

    /// The current total of a window (0 when absent).
    async fn window_total(&self, key: &str, window_secs: u64) -> anyhow::Result<i64>;

    /// Adds to a plain counter and returns the new value.
    async fn add(&self, key: &str, amount: i64) -> anyhow::Result<i64>;

    /// Adds to several plain counters (one round trip where the store allows).
    async fn add_many(&self, adds: &[(String, i64)]) -> anyhow::Result<()> {
        for (k, v) in adds {
            self.add(k, *v).await?;
        }
        Ok(())
    }

    /// Corrects held amounts (settling): adds to each counter that still exists,
    /// keeping its expiry, and leaves a counter that is gone (its window over, a
    /// slot counter expired, a store that lost it) gone. Creating it would leave
    /// a counter without an expiry behind, never swept, and start it off by the
    /// correction.
    async fn correct_many(&self, adds: &[(String, i64)]) -> anyhow::Result<()>;

    /// The value of a plain counter (`None` when absent).
    async fn get(&self, key: &str) -> anyhow::Result<Option<i64>>;

    /// The values of several counters (one round trip where the store allows).
    async fn get_many(&self, keys: &[String]) -> anyhow::Result<Vec<Option<i64>>> {
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            out.push(self.get(k).await?);
        }
        Ok(out)
    }

    /// Sets a plain counter.
    async fn set(&self, key: &str, value: i64) -> anyhow::Result<()>;

    /// Stores a short-lived string; with `only_if_absent`, returns false when the key
    /// already exists (and leaves it).
    async fn put_marker(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
        only_if_absent: bool,
    ) -> anyhow::Result<bool>;

    async fn get_marker(&self, key: &str) -> anyhow::Result<Option<String>>;

    async fn delete(&self, key: &str) -> anyhow::Result<()>;

    /// Whether the backing store answers (readiness).
    async fn ping(&self) -> bool;
}

/// The window index of `now` for a window length (epoch-aligned).
pub fn window_index(now_secs: u64, window_secs: u64) -> u64 {
    now_secs / window_secs.max(1)
}

/// The stored counter name of a window at `now`.
pub fn window_counter(key: &str, window_secs: u64, now_secs: u64) -> String {
    if window_secs == 0 {
        return key.to_string();
    }
    // `{key}:w{window_secs}:{index}`, without the formatting machinery: one per
    // window on every request.
    let mut name = String::with_capacity(key.len() + 24);
    name.push_str(key);
    name.push_str(":w");
    name.push_str(itoa::Buffer::new().format(window_secs));
    name.push(':');
    name.push_str(itoa::Buffer::new().format(window_index(now_secs, window_secs)));
    name
}

/// The counter name that remembers how much credit a balance counter took in.
pub fn credited_mark(balance_key: &str) -> String {
    [balance_key, ":credited"].concat()
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
pub(crate) mod contract {
    //! The behaviour both implementations must show; run against each.
    use super::*;

    pub async fn run(c: &dyn Counters, ns: &str) {
        let k = |s: &str| format!("{ns}:{s}");
        // Windows: all-or-nothing.
        let w = |key: &str, amount, limit| WindowReq {
            key: k(key),
            window_secs: 60,
            amount,
            limit,
            ttl_secs: 0,
            down: Down::Refuse,
        };
        assert_eq!(
            c.take(&[w("a", 3, 5), w("b", 10, 100)], None)
                .await
                .unwrap(),
            WindowOutcome::Added
        );
        assert_eq!(
            c.take(&[w("b", 10, 100), w("a", 3, 5)], None)
                .await
                .unwrap(),
            WindowOutcome::Refused {
                index: 1,
                current: 3
            }
        );
        assert_eq!(c.window_total(&k("a"), 60).await.unwrap(), 3);
        assert_eq!(
            c.window_total(&k("b"), 60).await.unwrap(),
            10,
            "refusal added nothing"
        );
        assert_eq!(c.window_total(&k("zz"), 60).await.unwrap(), 0);
        // A lifetime window (no expiry) behaves the same.
        let life = |amount, limit| WindowReq {
            key: k("life"),
            window_secs: 0,
            amount,
            limit,
            ttl_secs: 0,
            down: Down::Refuse,
        };
        assert_eq!(
            c.take(&[life(4, 5)], None).await.unwrap(),
            WindowOutcome::Added
        );
        assert!(matches!(
            c.take(&[life(2, 5)], None).await.unwrap(),
            WindowOutcome::Refused {
                index: 0,
                current: 4
            }
        ));
        assert_eq!(c.get(&k("life")).await.unwrap(), Some(4));
        // Balances: an unseeded counter takes nothing and says so; once seeded,
        // draw, refuse below the floor, and take in each new credit once whoever
        // brings it.
        let bal = |credited, _snapshot: i64, amount| BalanceReq {
            key: k("org"),
            org_id: "org".into(),
            credited,
            amount,
            floor: 0,
        };
        assert_eq!(
            c.take(&[w("c", 1, 10)], Some(&bal(100, 100, 70)))
                .await
                .unwrap(),
            WindowOutcome::Unseeded
        );
        assert_eq!(c.window_total(&k("c"), 60).await.unwrap(), 0);
        c.seed_balance(&k("org"), 100, 100).await.unwrap();
        // A second seed (another request raced to it) changes nothing.
        c.seed_balance(&k("org"), 999, 999).await.unwrap();
        assert_eq!(
            c.take(&[w("c", 1, 10)], Some(&bal(100, 100, 70)))
                .await
                .unwrap(),
            WindowOutcome::Added
        );
        assert_eq!(
            c.take(&[w("c", 1, 10)], Some(&bal(100, 100, 70)))
                .await
                .unwrap(),
            WindowOutcome::Refused {
                index: 1,
                current: 30
            },
            "a seeded balance is never reset"
        );
        assert_eq!(
            c.window_total(&k("c"), 60).await.unwrap(),
            1,
            "all or nothing"
        );
        // A grant of 50 seen by two instances is taken in once.
        assert_eq!(
            c.take(&[], Some(&bal(150, 150, 70))).await.unwrap(),
            WindowOutcome::Added
        );
        assert_eq!(c.get(&k("org")).await.unwrap(), Some(10));
        assert!(matches!(
            c.take(&[], Some(&bal(150, 80, 20))).await.unwrap(),
            WindowOutcome::Refused {
                index: 0,
                current: 10
            }
        ));
        c.add_many(&[(k("org"), 5), (k("other"), 2)]).await.unwrap();
        assert_eq!(c.get(&k("org")).await.unwrap(), Some(15));
        assert_eq!(c.get(&k("other")).await.unwrap(), Some(2));
        // Corrections reach counters that exist and create none.
        c.correct_many(&[(k("org"), -5), (k("gone"), -3)])
            .await
            .unwrap();
        assert_eq!(c.get(&k("org")).await.unwrap(), Some(10));
        assert_eq!(c.get(&k("gone")).await.unwrap(), None);
        // A window corrected after it closed is not brought back.
        let short = WindowReq {
            key: k("short"),
            window_secs: 1,
            amount: 5,
            limit: 10,
            ttl_secs: 0,
            down: Down::Refuse,
        };
        assert_eq!(
            c.take(std::slice::from_ref(&short), None).await.unwrap(),
            WindowOutcome::Added
        );
        let name = window_counter(&short.key, 1, now_secs());
        c.correct_many(&[(name.clone(), -2)]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        c.correct_many(&[(name.clone(), -3)]).await.unwrap();
        assert_eq!(c.get(&name).await.unwrap(), None, "expired and left gone");
        // Plain counters.
        assert_eq!(c.get(&k("bal")).await.unwrap(), None);
        c.set(&k("bal"), 100).await.unwrap();
        assert_eq!(c.add(&k("bal"), -120).await.unwrap(), -20);
        assert_eq!(c.add(&k("bal"), 20).await.unwrap(), 0);
        assert_eq!(c.get(&k("bal")).await.unwrap(), Some(0));
        // Markers.
        assert!(c
            .put_marker(&k("m"), "one", Duration::from_secs(30), true)
            .await
            .unwrap());
        assert!(!c
            .put_marker(&k("m"), "two", Duration::from_secs(30), true)
            .await
            .unwrap());
        assert_eq!(c.get_marker(&k("m")).await.unwrap().as_deref(), Some("one"));
        c.put_marker(&k("m"), "three", Duration::from_secs(30), false)
            .await
            .unwrap();
        assert_eq!(
            c.get_marker(&k("m")).await.unwrap().as_deref(),
            Some("three")
        );
        c.delete(&k("m")).await.unwrap();
        assert_eq!(c.get_marker(&k("m")).await.unwrap(), None);
        assert!(c
            .put_marker(&k("short"), "x", Duration::from_millis(50), false)
            .await
            .unwrap());
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert_eq!(
            c.get_marker(&k("short")).await.unwrap(),
            None,
            "markers expire"
        );
        assert!(c.ping().await);
    }

    /// Affinity markers past the per-org cap evict the org's oldest, never another
    /// org's.
    pub async fn affinity_cap(c: &dyn Counters, ns: &str) {
        let ttl = Duration::from_secs(600);
        let other = format!("aff:{ns}_org_b:m:one");
        c.put_marker(&other, "r", ttl, false).await.unwrap();
        let key = |i: usize| format!("aff:{ns}_org_a:m:{i}");
        for i in 0..AFFINITY_PER_ORG + 500 {
            c.put_marker(&key(i), "r", ttl, false).await.unwrap();
        }
        assert_eq!(c.get_marker(&key(0)).await.unwrap(), None);
        assert_eq!(c.get_marker(&key(499)).await.unwrap(), None);
        assert!(c.get_marker(&key(500)).await.unwrap().is_some());
        let newest = key(AFFINITY_PER_ORG + 499);
        assert!(c.get_marker(&newest).await.unwrap().is_some());
        assert!(c.get_marker(&other).await.unwrap().is_some());
        // Re-marking a conversation keeps its place and evicts nothing.
        c.put_marker(&newest, "r2", ttl, false).await.unwrap();
        assert!(c.get_marker(&key(500)).await.unwrap().is_some());
    }
}
