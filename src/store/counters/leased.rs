//! Leased counters: the shared store (Redis) kept off the request's path in the
//! common case. An instance takes blocks of each window it uses (and of each
//! org's balance) ahead of need, in the same atomic step as the window's own
//! check, and then admits and settles requests against those blocks in memory.
//!
//! The rules:
//! - A request whose every window (and balance draw) is covered by what this
//!   instance holds is admitted with no round trip. One that is not goes to the
//!   shared store for what is missing plus a block more; when the store cannot give
//!   the block (a window near its limit, a balance running low) it asks for the
//!   exact amount: near a limit every admission is the shared store's own check.
//!   One block of a counter is asked for at a time: requests that miss while it
//!   is on its way ask for their own amount only, so a burst on a cold lease does
//!   not lease the whole limit in blocks and leave later instances nothing.
//! - Settling gives back (or takes more) in memory; what an instance holds unused
//!   goes back to the shared store once the lease has been idle for `IDLE` (one
//!   round trip for every lease due), and when its window is over it is dropped
//!   (the shared counter expires with it).
//!
//! Bounds (stated in docs/decisions.md): leases are taken inside each window's
//! limit, so the limits hold across instances (no overspend from leasing); a key at
//! its limit can still be served from a block another instance holds for at most
//! `IDLE` after that instance last used it, and is refused by every instance once
//! the blocks are used or returned.
//!
//! While the shared store does not answer, an instance serves on what it holds,
//! then on an allowance it grants itself (`Local`), once per counter and outage:
//! - rates and concurrency (`Down::Share`): the limit over the live instances;
//! - spend caps and free allowances (`Down::Remaining`): that share of what the
//!   window had left when the shared store last answered this instance (nothing
//!   when it never did);
//! - a balance: that share of the live balance the shared store last reported.
//!
//! What it uses of an allowance is owed to the shared counter: it goes there with
//! the lease's return once the store answers again (a counter the store lost is
//! left gone, and a balance reseeded from the ledger drops it: the ledger has
//! it). A store that failed is not asked again for `RETRY_DOWN`: requests do not
//! each wait out its timeout. The bounds are in docs/decisions.md.

use super::{BalanceReq, Counters, Down, Observed, WindowOutcome, WindowReq};
use async_trait::async_trait;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A lease unused this long goes back to the shared store.
pub const IDLE: Duration = Duration::from_secs(1);
/// How often the leased counters are read again (`refresh_seen`), and how many
/// at most.
const FRESH: Duration = Duration::from_millis(250);
const FRESH_MAX: usize = 4_096;
/// After a failed call, the shared store is left alone this long (then one
/// request, or the readiness probe, tries it again).
const RETRY_DOWN: Duration = Duration::from_millis(250);
/// A window's block: this fraction of its limit.
const WINDOW_SHARE: i64 = 16;
/// A balance block: this many times the draw that asked for it.
const BALANCE_DRAWS: i64 = 8;

/// What this instance holds of one shared counter.
#[derive(Debug)]
struct Lease {
    /// Taken from the shared store and not used yet (negative: used beyond it,
    /// owed back when the lease returns).
    available: i64,
    /// A balance counts down: what is given back is added, not taken off.
    balance: bool,
    /// The window's end (Unix seconds), for windowed counters.
    ends: Option<u64>,
    last_use: Instant,
    /// What this instance granted itself while the shared store was away.
    local: Option<Local>,
    /// A balance block is being fetched in the background.
    refilling: bool,
}

/// An allowance granted with the shared store away: `granted`, of which `left`
/// is unused; the rest is owed to the shared counter.
#[derive(Debug, Clone, Copy)]
struct Local {
    granted: i64,
    left: i64,
}

impl Lease {
    /// What the lease's return does to the shared counter: the unused backed part
    /// goes back, what the local allowance used is charged.
    fn settlement(&self) -> i64 {
        let used = self.local.map_or(0, |l| l.granted - l.left);
        if self.balance {
            self.available - used
        } else {
            used - self.available
        }
    }
}

impl Lease {
    /// A lease of a window, ending with it.
    fn window(req: &WindowReq, now: u64, available: i64) -> Lease {
        Lease {
            available,
            balance: false,
            ends: (req.window_secs > 0).then(|| (now / req.window_secs + 1) * req.window_secs),
            last_use: Instant::now(),
            local: None,
            refilling: false,
        }
    }

    /// An empty lease of a balance.
    fn balance() -> Lease {
        Lease {
            available: 0,
            balance: true,
            ends: None,
            last_use: Instant::now(),
            local: None,
            refilling: false,
        }
    }
}

/// What the shared store last said of a counter: its value, and the end of its
/// window (Unix seconds) for a windowed one.
type Seen = HashMap<String, (i64, Option<u64>)>;

pub struct LeasedCounters {
    inner: Arc<dyn Counters>,
    leases: Arc<Mutex<HashMap<String, Lease>>>,
    /// What the shared store last said of each counter this instance took from:
    /// a window's total (with the window's end), a balance's live value.
    seen: Arc<Mutex<Seen>>,
    /// When the shared store last failed a call, while it has not answered since.
    down_since: Mutex<Option<Instant>>,
    /// Counters a take is fetching a block of now.
    fetching: Mutex<HashSet<String>>,
}

/// The counters one take asks a block of; they are free for the next miss when
/// the take ends, however it ends (a dropped request included).
struct Fetching<'a> {
    set: &'a Mutex<HashSet<String>>,
    names: Vec<String>,
}

impl Fetching<'_> {
    /// Claims `name` for this take's block; false when another take has it.
    fn claim(&mut self, name: &str) -> bool {
        let mut set = self.set.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = set.insert(name.to_string());
        if fresh {
            self.names.push(name.to_string());
        }
        fresh
    }
}

impl Drop for Fetching<'_> {
    fn drop(&mut self) {
        if self.names.is_empty() {
            return;
        }
        let mut set = self.set.lock().unwrap_or_else(|e| e.into_inner());
        for n in &self.names {
            set.remove(n);
        }
    }
}

/// One window of a take, with its stored counter name, the part this instance's
/// lease covered, the part the shared store must give, and whether this take
/// asks a block of it too.
struct Need<'a> {
    req: &'a WindowReq,
    name: String,
    local: i64,
    remote: i64,
    block: bool,
}

fn lock(
    leases: &Mutex<HashMap<String, Lease>>,
) -> std::sync::MutexGuard<'_, HashMap<String, Lease>> {
    leases.lock().unwrap_or_else(|e| e.into_inner())
}

fn block(limit: i64) -> i64 {
    (limit / WINDOW_SHARE).max(1)
}

fn balance_block(draw: i64) -> i64 {
    draw.saturating_mul(BALANCE_DRAWS)
}

impl LeasedCounters {
    /// The shared store under the leases: for writes that must not be leased
    /// (putting windows back from the ledger).
    pub fn shared(&self) -> &dyn Counters {
        self.inner.as_ref()
    }

    pub fn new(inner: Arc<dyn Counters>) -> Self {
        LeasedCounters {
            inner,
            leases: Arc::new(Mutex::new(HashMap::new())),
            seen: Arc::new(Mutex::new(HashMap::new())),
            down_since: Mutex::new(None),
            fetching: Mutex::new(HashSet::new()),
        }
    }

    /// Whether the shared store failed a call within `RETRY_DOWN` (and has not
    /// answered since): a take then goes straight to the local allowances.
    fn recently_down(&self) -> bool {
        self.down_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|t| t.elapsed() < RETRY_DOWN)
    }

    fn mark(&self, up: bool) {
        let mut d = self.down_since.lock().unwrap_or_else(|e| e.into_inner());
        *d = if up { None } else { Some(Instant::now()) };
    }

    /// Whether the shared store is away (failed its last call).
    pub fn store_down(&self) -> bool {
        self.down_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Drops every lease, unreturned, and what local allowances used: the shared
    /// store lost its data, and its windows and balances are put back from the
    /// ledger, which has that use. A block leased of the lost counters is no
    /// longer taken from anything: spent on, it would be spent twice.
    pub fn forget_all(&self) {
        self.lock().clear();
    }

    /// Remembers what the shared store reported of the counters of a take.
    fn remember(&self, needs: &[Need<'_>], seen: &Observed, balance: Option<&BalanceReq>) {
        let mut map = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let now = super::now_secs();
        if map.len() > 100_000 {
            map.retain(|_, (_, end)| end.is_none_or(|e| e > now));
            if map.len() > 100_000 {
                map.clear();
            }
        }
        for (n, total) in needs.iter().zip(&seen.totals) {
            let end =
                (n.req.window_secs > 0).then(|| (now / n.req.window_secs + 1) * n.req.window_secs);
            map.insert(n.name.clone(), (*total, end));
        }
        if let (Some(b), Some(live)) = (balance, seen.balance) {
            map.insert(b.key.clone(), (live, None));
        }
    }

    /// The allowance this instance may grant itself of a counter while the shared
    /// store is away; `None`: refused.
    fn allowance(&self, name: &str, req: Option<&WindowReq>) -> Option<i64> {
        let live = crate::store::instances::live() as i64;
        let seen = || {
            let map = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            map.get(name)
                .filter(|(_, end)| end.is_none_or(|e| e > super::now_secs()))
                .map(|(v, _)| *v)
        };
        match req {
            // A balance: its share of what was live.
            None => seen().map(|live_balance| live_balance.max(0) / live),
            Some(w) => match w.down {
                Down::Refuse => None,
                Down::Share => Some((w.limit / live).max(1)),
                Down::Remaining => seen().map(|total| (w.limit - total).max(0) / live),
            },
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lease>> {
        lock(&self.leases)
    }

    /// Fetches the next block of a balance in the background, so the draw that
    /// would have found the lease empty does not wait on the shared store. What
    /// arrives after its lease went (returned, or reseeded) goes back at once.
    fn refill_balance(&self, draw: &BalanceReq) {
        let (inner, leases, seen) = (self.inner.clone(), self.leases.clone(), self.seen.clone());
        let mut req = draw.clone();
        req.amount = balance_block(draw.amount);
        tokio::spawn(async move {
            let got = match inner.take_observed(&[], Some(&req)).await {
                Ok((WindowOutcome::Added, observed)) => {
                    // What is left once this block is taken: an outage's share is
                    // of that, not of what the last request's take saw.
                    if let Some(live) = observed.balance {
                        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                        seen.insert(req.key.clone(), (live, None));
                    }
                    true
                }
                _ => false,
            };
            let orphan = {
                let mut leases = lock(&leases);
                match leases.get_mut(&req.key) {
                    Some(l) => {
                        l.refilling = false;
                        if got {
                            l.available += req.amount;
                        }
                        false
                    }
                    None => got,
                }
            };
            if orphan {
                if let Err(e) = inner.correct_many(&[(req.key.clone(), req.amount)]).await {
                    tracing::warn!(error = %e, "a balance block fetched for a lease that went was not given back");
                }
            }
        });
    }

    /// Gives back what idle leases hold and charges what their local allowances
    /// used, and drops leases of windows that ended. A lease whose allowance was
    /// used is kept until the shared store took its charge (while the store is
    /// away it keeps serving on what is left of it); with the store back it goes
    /// at the next return, idle or not.
    pub async fn return_idle(&self, all: bool) {
        let now = super::now_secs();
        let up = !self.store_down();
        let mut back = Vec::new();
        {
            let mut leases = self.lock();
            leases.retain(|_, l| l.ends.is_none_or(|e| e > now));
            for (name, l) in leases.iter() {
                let due = all || l.last_use.elapsed() >= IDLE || (up && l.local.is_some());
                if due {
                    back.push((name.clone(), l.settlement(), l.local.is_some()));
                }
            }
        }
        if back.is_empty() {
            return;
        }
        let charges: Vec<(String, i64)> = back
            .iter()
            .filter(|(_, d, _)| *d != 0)
            .map(|(n, d, _)| (n.clone(), *d))
            .collect();
        let delivered = charges.is_empty() || self.inner.correct_many(&charges).await.is_ok();
        self.mark(delivered);
        let mut leases = self.lock();
        for (name, _, local) in back {
            // What could not go back of a backed lease stays counted until its
            // window ends (a balance: until the next reseed from the ledger); a
            // local allowance's use is kept owing.
            if delivered || !local {
                leases.remove(&name);
            }
        }
        if !delivered {
            tracing::warn!(
                leases = charges.len(),
                "leases not given back; the shared store is away"
            );
        }
    }

    /// Reads again what the shared store holds of every counter this instance
    /// leases (one round trip for all, at most `FRESH_MAX` of them): an outage's
    /// shares are of what was left a moment before it, not of what this
    /// instance's last take saw (a lease that lasts takes nothing for a long
    /// while, as other instances take on).
    async fn refresh_seen(&self) {
        if self.store_down() {
            return;
        }
        let names: Vec<(String, Option<u64>)> = self
            .lock()
            .iter()
            .take(FRESH_MAX)
            .map(|(n, l)| (n.clone(), l.ends))
            .collect();
        if names.is_empty() {
            return;
        }
        let keys: Vec<String> = names.iter().map(|(n, _)| n.clone()).collect();
        let Ok(values) = self.inner.get_many(&keys).await else {
            return;
        };
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for ((name, ends), v) in names.into_iter().zip(values) {
            if let Some(v) = v {
                seen.insert(name, (v, ends));
            }
        }
    }

    /// Returns idle leases every `IDLE`, and reads the leased counters again every
    /// `FRESH`, while the process runs.
    pub fn spawn_returns(self: &Arc<Self>) {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(FRESH);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0u32;
            loop {
                tick.tick().await;
                me.refresh_seen().await;
                n += 1;
                if n.is_multiple_of(4) {
                    me.return_idle(false).await;
                }
            }
        });
    }

    /// Admits what the leases did not cover on this instance's local allowances,
    /// the shared store being away: each counter's allowance is granted once
    /// (`allowance`), and a part that does not fit what is left of it is refused
    /// as its limit would refuse it. A counter with no allowance at all (never
    /// seen here, or refused by rule) fails the take with `err`.
    fn take_local(
        &self,
        needs: &[Need<'_>],
        balance: Option<(&BalanceReq, i64)>,
        now: u64,
        give_back: impl Fn(&Self),
        err: impl FnOnce() -> anyhow::Error,
    ) -> anyhow::Result<WindowOutcome> {
        enum Verdict {
            Fits(Vec<(usize, i64)>, Option<i64>),
            Short { index: usize, current: i64 },
            NoAllowance,
        }
        let mut leases = self.lock();
        let left_of =
            |leases: &HashMap<String, Lease>, name: &str, req: Option<&WindowReq>| match leases
                .get(name)
                .and_then(|l| l.local)
            {
                Some(local) => Some((local.left, None)),
                None => self.allowance(name, req).map(|a| (a, Some(a))),
            };
        let verdict = 'check: {
            let mut fresh = Vec::new();
            for (i, n) in needs.iter().enumerate().filter(|(_, n)| n.remote > 0) {
                match left_of(&leases, &n.name, Some(n.req)) {
                    None => break 'check Verdict::NoAllowance,
                    Some((left, _)) if left < n.remote => {
                        break 'check Verdict::Short {
                            index: i,
                            current: n.req.limit.saturating_sub(left),
                        }
                    }
                    Some((_, granted)) => fresh.push((i, granted.unwrap_or(-1))),
                }
            }
            let mut bal_fresh = None;
            if let Some((b, remote)) = balance {
                match left_of(&leases, &b.key, None) {
                    None => break 'check Verdict::NoAllowance,
                    Some((left, _)) if left < remote => {
                        break 'check Verdict::Short {
                            index: needs.len(),
                            current: left,
                        }
                    }
                    Some((_, granted)) => bal_fresh = Some(granted.unwrap_or(-1)),
                }
            }
            Verdict::Fits(fresh, bal_fresh)
        };
        match verdict {
            Verdict::Fits(parts, bal) => {
                for (i, granted) in parts {
                    let n = &needs[i];
                    let l = leases
                        .entry(n.name.clone())
                        .or_insert_with(|| Lease::window(n.req, now, 0));
                    let local = l.local.get_or_insert(Local {
                        granted: granted.max(0),
                        left: granted.max(0),
                    });
                    local.left -= n.remote;
                    l.last_use = Instant::now();
                }
                if let (Some((b, remote)), Some(granted)) = (balance, bal) {
                    let l = leases.entry(b.key.clone()).or_insert_with(Lease::balance);
                    let local = l.local.get_or_insert(Local {
                        granted: granted.max(0),
                        left: granted.max(0),
                    });
                    local.left -= remote;
                    l.last_use = Instant::now();
                }
                Ok(WindowOutcome::Added)
            }
            Verdict::Short { index, current } => {
                drop(leases);
                give_back(self);
                Ok(WindowOutcome::Refused { index, current })
            }
            Verdict::NoAllowance => {
                drop(leases);
                give_back(self);
                Err(err())
            }
        }
    }

    /// Takes what the shared store must give for the uncovered windows and draw,
    /// with a block more of those the take claimed when `blocks` (`bal_block`:
    /// the balance's); the request's own amounts are consumed.
    async fn take_remote(
        &self,
        needs: &[Need<'_>],
        balance: Option<(&BalanceReq, i64)>,
        blocks: bool,
        bal_block: bool,
    ) -> anyhow::Result<(WindowOutcome, Vec<usize>, Observed)> {
        let mut reqs = Vec::new();
        let mut index = Vec::new();
        for (i, n) in needs.iter().enumerate().filter(|(_, n)| n.remote > 0) {
            let mut r = n.req.clone();
            r.amount = n.remote;
            if blocks && n.block {
                r.amount = r.amount.saturating_add(block(r.limit));
            }
            reqs.push(r);
            index.push(i);
        }
        // The block is eight of the request's whole draws, not of the part the
        // lease did not cover: a lease nearly enough would otherwise fetch a
        // sliver of a block, and the next request would wait on the store again.
        let bal = balance.map(|(b, remote)| {
            let mut req = b.clone();
            req.amount = remote;
            if blocks && bal_block {
                req.amount = req.amount.saturating_add(balance_block(b.amount));
            }
            req
        });
        let (out, seen) = self.inner.take_observed(&reqs, bal.as_ref()).await?;
        Ok((out, index, seen))
    }
}

#[async_trait]
impl Counters for LeasedCounters {
    async fn take(
        &self,
        windows: &[WindowReq],
        balance: Option<&BalanceReq>,
    ) -> anyhow::Result<WindowOutcome> {
        let now = super::now_secs();
        // What the leases cover is taken from them at once; the rest goes to the
        // shared store, and the local part is given back if it refuses.
        let mut needs: Vec<Need> = windows
            .iter()
            .map(|w| Need {
                req: w,
                name: super::window_counter(&w.key, w.window_secs, now),
                local: 0,
                remote: w.amount,
                block: false,
            })
            .collect();
        let (mut bal_local, mut bal_remote) = (0, balance.map_or(0, |b| b.amount));
        let mut refill = false;
        let mut bal_refilling = false;
        {
            let mut leases = self.lock();
            for n in &mut needs {
                if let Some(l) = leases.get_mut(&n.name) {
                    n.local = l.available.clamp(0, n.req.amount);
                    n.remote = n.req.amount - n.local;
                    l.available -= n.local;
                    l.last_use = Instant::now();
                }
            }
            if let Some(b) = balance {
                if let Some(l) = leases.get_mut(&b.key) {
                    bal_refilling = l.refilling;
                    bal_local = l.available.clamp(0, b.amount);
                    bal_remote = b.amount - bal_local;
                    l.available -= bal_local;
                    l.last_use = Instant::now();
                    // Covered, and half a block or less left: the next block is
                    // fetched now, off this request's path.
                    if bal_remote == 0
                        && !l.refilling
                        && l.local.is_none()
                        && l.available <= balance_block(b.amount) / 2
                    {
                        l.refilling = true;
                        refill = true;
                    }
                }
            }
        }
        if let (true, Some(b)) = (refill, balance) {
            self.refill_balance(b);
        }
        let remote_balance = balance.filter(|_| bal_remote > 0).map(|b| (b, bal_remote));
        if needs.iter().all(|n| n.remote == 0) && remote_balance.is_none() {
            return Ok(WindowOutcome::Added);
        }
        let mut fetching = Fetching {
            set: &self.fetching,
            names: Vec::new(),
        };
        for n in needs.iter_mut().filter(|n| n.remote > 0) {
            n.block = fetching.claim(&n.name);
        }
        let bal_block =
            remote_balance.is_some_and(|(b, _)| !bal_refilling && fetching.claim(&b.key));
        let give_back = |me: &Self| {
            let mut leases = me.lock();
            for n in needs.iter().filter(|n| n.local > 0) {
                if let Some(l) = leases.get_mut(&n.name) {
                    l.available += n.local;
                }
            }
            if let (Some(b), true) = (balance, bal_local > 0) {
                if let Some(l) = leases.get_mut(&b.key) {
                    l.available += bal_local;
                }
            }
        };
        // The shared store failed a moment ago: straight to the local allowances.
        if self.recently_down() {
            return self.take_local(&needs, remote_balance, now, give_back, || {
                anyhow::anyhow!("the shared counters are away")
            });
        }
        // With a block first; near a limit, the exact amount. A take that claimed
        // no block asks once.
        let passes: &[bool] = if bal_block || needs.iter().any(|n| n.block) {
            &[true, false]
        } else {
            &[false]
        };
        let mut result = None;
        for &blocks in passes {
            match self
                .take_remote(&needs, remote_balance, blocks, bal_block)
                .await
            {
                Ok((WindowOutcome::Added, remote, seen)) => {
                    let taken: Vec<Need> = remote
                        .iter()
                        .map(|&i| Need {
                            req: needs[i].req,
                            name: needs[i].name.clone(),
                            local: 0,
                            remote: 0,
                            block: false,
                        })
                        .collect();
                    self.remember(&taken, &seen, remote_balance.map(|(b, _)| b));
                    result = Some(Ok(blocks));
                    break;
                }
                Ok((WindowOutcome::Refused { index, current }, remote, _)) if !blocks => {
                    give_back(self);
                    // Map the shared store's index back to the request's windows.
                    let index = remote.get(index).copied().unwrap_or(windows.len());
                    // A balance this instance holds part of is that much larger.
                    let held = match (index == windows.len(), balance) {
                        (true, Some(b)) => {
                            self.lock().get(&b.key).map_or(0, |l| l.available.max(0))
                        }
                        _ => 0,
                    };
                    return Ok(WindowOutcome::Refused {
                        index,
                        current: current.saturating_add(held),
                    });
                }
                Ok((WindowOutcome::Refused { .. }, _, _)) => continue,
                Ok((WindowOutcome::Unseeded, _, _)) => {
                    give_back(self);
                    return Ok(WindowOutcome::Unseeded);
                }
                Err(e) => {
                    result = Some(Err(e));
                    break;
                }
            }
        }
        match result {
            Some(Ok(with_blocks)) => {
                self.mark(true);
                let mut leases = self.lock();
                for n in needs.iter().filter(|n| n.remote > 0) {
                    let l = leases
                        .entry(n.name.clone())
                        .or_insert_with(|| Lease::window(n.req, now, 0));
                    if with_blocks && n.block {
                        l.available += block(n.req.limit);
                    }
                    l.last_use = Instant::now();
                }
                if let Some((b, _)) = remote_balance {
                    let l = leases.entry(b.key.clone()).or_insert_with(Lease::balance);
                    if with_blocks && bal_block {
                        l.available += balance_block(b.amount);
                    }
                    l.last_use = Instant::now();
                }
                Ok(WindowOutcome::Added)
            }
            // Answered, but not restored yet: refused, the store being up.
            Some(Err(e)) if e.is::<super::redis::Unrestored>() => {
                give_back(self);
                Err(e)
            }
            Some(Err(e)) => {
                self.mark(false);
                self.take_local(&needs, remote_balance, now, give_back, || e)
            }
            None => {
                give_back(self);
                Err(anyhow::anyhow!("no answer from the shared counters"))
            }
        }
    }

    /// A balance seeded anew from the ledger already counts what this instance had
    /// leased of the lost one: the lease goes, unreturned.
    async fn seed_balance(&self, key: &str, balance: i64, credited: i64) -> anyhow::Result<()> {
        self.lock().remove(key);
        self.inner.seed_balance(key, balance, credited).await
    }

    async fn window_total(&self, key: &str, window_secs: u64) -> anyhow::Result<i64> {
        self.inner.window_total(key, window_secs).await
    }

    async fn add(&self, key: &str, amount: i64) -> anyhow::Result<i64> {
        self.inner.add(key, amount).await
    }

    async fn add_many(&self, adds: &[(String, i64)]) -> anyhow::Result<()> {
        self.inner.add_many(adds).await
    }

    /// Settling: what a correction gives back to a counter this instance holds a
    /// lease of goes to the lease, in memory; what takes more (a use past its
    /// hold, a payment reversed) goes to the shared store at once, so every
    /// instance sees it; so does any correction of a counter not leased here.
    async fn correct_many(&self, adds: &[(String, i64)]) -> anyhow::Result<()> {
        let mut remote = Vec::new();
        {
            let mut leases = self.lock();
            for (name, delta) in adds {
                match leases.get_mut(name) {
                    // A balance counts down: giving back adds to it.
                    Some(l) if l.balance && *delta > 0 => l.available += *delta,
                    // A window counts up: giving back takes off it.
                    Some(l) if !l.balance && *delta < 0 => l.available -= *delta,
                    // A balance drawn down from outside the requests (a payment
                    // reversed): this instance's lease goes back with it, so its
                    // next draw meets the shared balance as it now is.
                    // (A lease whose local allowance was used stays: its charge
                    // goes with its return.)
                    Some(l) if l.balance && l.local.is_some() => {
                        remote.push((name.clone(), *delta))
                    }
                    Some(l) if l.balance => {
                        remote.push((name.clone(), delta.saturating_add(l.settlement())));
                        leases.remove(name);
                    }
                    _ => remote.push((name.clone(), *delta)),
                }
            }
        }
        if remote.is_empty() {
            return Ok(());
        }
        self.inner.correct_many(&remote).await
    }

    async fn get(&self, key: &str) -> anyhow::Result<Option<i64>> {
        self.inner.get(key).await
    }

    async fn set(&self, key: &str, value: i64) -> anyhow::Result<()> {
        self.inner.set(key, value).await
    }

    async fn put_marker(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
        only_if_absent: bool,
    ) -> anyhow::Result<bool> {
        self.inner.put_marker(key, value, ttl, only_if_absent).await
    }

    async fn get_marker(&self, key: &str) -> anyhow::Result<Option<String>> {
        self.inner.get_marker(key).await
    }

    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        self.inner.delete(key).await
    }

    /// Whether the shared store answers; an answer ends the outage (the next
    /// return charges what the local allowances used).
    async fn ping(&self) -> bool {
        let ok = self.inner.ping().await;
        self.mark(ok);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::super::MemoryCounters;
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A shared store that can be made to stop answering.
    struct Flaky {
        inner: MemoryCounters,
        down: AtomicBool,
        takes: std::sync::atomic::AtomicUsize,
        /// Closed: takes wait until it opens (a slow shared store).
        gate: tokio::sync::watch::Sender<bool>,
    }

    impl Flaky {
        fn check(&self) -> anyhow::Result<()> {
            if self.down.load(Ordering::Relaxed) {
                anyhow::bail!("down");
            }
            Ok(())
        }
    }

    #[async_trait]
    impl Counters for Flaky {
        async fn take(
            &self,
            w: &[WindowReq],
            b: Option<&BalanceReq>,
        ) -> anyhow::Result<WindowOutcome> {
            Ok(self.take_observed(w, b).await?.0)
        }
        async fn take_observed(
            &self,
            w: &[WindowReq],
            b: Option<&BalanceReq>,
        ) -> anyhow::Result<(WindowOutcome, Observed)> {
            self.check()?;
            let _ = self.gate.subscribe().wait_for(|open| *open).await;
            self.takes.fetch_add(1, Ordering::Relaxed);
            self.inner.take_observed(w, b).await
        }
        async fn seed_balance(&self, k: &str, b: i64, c: i64) -> anyhow::Result<()> {
            self.inner.seed_balance(k, b, c).await
        }
        async fn window_total(&self, k: &str, s: u64) -> anyhow::Result<i64> {
            self.inner.window_total(k, s).await
        }
        async fn add(&self, k: &str, a: i64) -> anyhow::Result<i64> {
            self.inner.add(k, a).await
        }
        async fn correct_many(&self, adds: &[(String, i64)]) -> anyhow::Result<()> {
            self.check()?;
            self.inner.correct_many(adds).await
        }
        async fn get(&self, k: &str) -> anyhow::Result<Option<i64>> {
            self.inner.get(k).await
        }
        async fn set(&self, k: &str, v: i64) -> anyhow::Result<()> {
            self.inner.set(k, v).await
        }
        async fn put_marker(&self, k: &str, v: &str, t: Duration, o: bool) -> anyhow::Result<bool> {
            self.inner.put_marker(k, v, t, o).await
        }
        async fn get_marker(&self, k: &str) -> anyhow::Result<Option<String>> {
            self.inner.get_marker(k).await
        }
        async fn delete(&self, k: &str) -> anyhow::Result<()> {
            self.inner.delete(k).await
        }
        async fn ping(&self) -> bool {
            !self.down.load(Ordering::Relaxed)
        }
    }

    fn shared() -> Arc<Flaky> {
        Arc::new(Flaky {
            inner: MemoryCounters::new(),
            down: AtomicBool::new(false),
            takes: Default::default(),
            gate: tokio::sync::watch::Sender::new(true),
        })
    }

    fn rpm(limit: i64, local: bool) -> WindowReq {
        WindowReq {
            key: "krpm:key_1".into(),
            window_secs: 3600,
            amount: 1,
            limit,
            ttl_secs: 0,
            down: if local { Down::Share } else { Down::Remaining },
        }
    }

    #[tokio::test]
    async fn three_instances_never_pass_a_limit_and_all_refuse_at_it() {
        let store = shared();
        let instances: Vec<LeasedCounters> =
            (0..3).map(|_| LeasedCounters::new(store.clone())).collect();
        let w = [rpm(100, true)];
        let mut served = 0;
        let mut refused = [false; 3];
        // Round-robin until every instance refuses.
        for round in 0..1000 {
            let i = round % 3;
            match instances[i].take(&w, None).await.unwrap() {
                WindowOutcome::Added => served += 1,
                WindowOutcome::Refused { index, current } => {
                    assert_eq!((index, current), (0, 100));
                    refused[i] = true;
                }
                WindowOutcome::Unseeded => unreachable!(),
            }
            if refused.iter().all(|r| *r) {
                break;
            }
        }
        assert_eq!(served, 100, "exactly the limit, across instances");
        // Most admissions never reached the shared store.
        let takes = store.takes.load(Ordering::Relaxed);
        assert!(takes < 40, "{takes} shared takes for 100 admissions");
        // Every instance refuses at the limit, with nothing held back.
        for inst in &instances {
            assert!(matches!(
                inst.take(&w, None).await.unwrap(),
                WindowOutcome::Refused { .. }
            ));
        }
    }

    #[tokio::test]
    async fn settling_stays_local_and_unused_leases_go_back() {
        let store = shared();
        let a = LeasedCounters::new(store.clone());
        let tokens = |amount| WindowReq {
            key: "ktpm:key_1".into(),
            window_secs: 3600,
            amount,
            limit: 16_000,
            ttl_secs: 0,
            down: Down::Share,
        };
        let name = super::super::window_counter("ktpm:key_1", 3600, super::super::now_secs());
        // Held at 500, used 120: the shared counter has the take and a block.
        assert_eq!(
            a.take(&[tokens(500)], None).await.unwrap(),
            WindowOutcome::Added
        );
        assert_eq!(store.get(&name).await.unwrap(), Some(1500));
        a.correct_many(&[(name.clone(), 120 - 500)]).await.unwrap();
        assert_eq!(
            store.get(&name).await.unwrap(),
            Some(1500),
            "settled in memory"
        );
        // Given back: the shared counter ends at what was used.
        a.return_idle(true).await;
        assert_eq!(store.get(&name).await.unwrap(), Some(120));
    }

    /// Lets background refills run until the shared store has seen `takes`.
    async fn settle(store: &Flaky, takes: usize) {
        for _ in 0..1000 {
            if store.takes.load(Ordering::Relaxed) >= takes {
                break;
            }
            tokio::task::yield_now().await;
        }
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(store.takes.load(Ordering::Relaxed), takes);
    }

    #[tokio::test]
    async fn a_draw_never_waits_for_the_next_balance_block() {
        let store = shared();
        store
            .seed_balance("bal:org_1", 10_000, 10_000)
            .await
            .unwrap();
        let a = LeasedCounters::new(store.clone());
        let draw = BalanceReq {
            key: "bal:org_1".into(),
            org_id: "org_1".into(),
            credited: 10_000,
            amount: 10,
            floor: 0,
        };
        // The first draw takes a block of eight draws.
        assert_eq!(
            a.take(&[], Some(&draw)).await.unwrap(),
            WindowOutcome::Added
        );
        // The shared store stops answering promptly: every later draw the lease
        // covers is still admitted at once, though the next block is on its way.
        store.gate.send_replace(false);
        for i in 0..7 {
            let took = tokio::time::timeout(Duration::from_secs(1), a.take(&[], Some(&draw)))
                .await
                .unwrap_or_else(|_| panic!("draw {i} waited on the shared store"));
            assert_eq!(took.unwrap(), WindowOutcome::Added);
        }
        assert_eq!(store.takes.load(Ordering::Relaxed), 1);
        // Once it answers, the block lands in the lease: 10 left + 80.
        store.gate.send_replace(true);
        settle(&store, 2).await;
        assert_eq!(a.lock().get("bal:org_1").map(|l| l.available), Some(90));
        assert_eq!(
            store.get("bal:org_1").await.unwrap(),
            Some(10_000 - 90 - 80)
        );
        // A block that arrives after its lease went back is given back too.
        store.gate.send_replace(false);
        for _ in 0..5 {
            a.take(&[], Some(&draw)).await.unwrap();
        }
        a.return_idle(true).await;
        store.gate.send_replace(true);
        settle(&store, 3).await;
        assert_eq!(
            store.get("bal:org_1").await.unwrap(),
            Some(10_000 - 130),
            "the shared balance is down by exactly what was drawn"
        );
    }

    #[tokio::test]
    async fn balances_are_leased_in_blocks_and_exact_when_low() {
        let store = shared();
        store.seed_balance("bal:org_1", 1_000, 1_000).await.unwrap();
        let a = LeasedCounters::new(store.clone());
        let draw = |amount| BalanceReq {
            key: "bal:org_1".into(),
            org_id: "org_1".into(),
            credited: 1_000,
            amount,
            floor: 0,
        };
        // 10 and a block of eight draws more.
        assert_eq!(
            a.take(&[], Some(&draw(10))).await.unwrap(),
            WindowOutcome::Added
        );
        assert_eq!(store.get("bal:org_1").await.unwrap(), Some(910));
        for _ in 0..8 {
            assert_eq!(
                a.take(&[], Some(&draw(10))).await.unwrap(),
                WindowOutcome::Added
            );
        }
        // Half the block used: the next one was fetched in the background.
        settle(&store, 2).await;
        assert_eq!(store.get("bal:org_1").await.unwrap(), Some(830));
        // Low: a draw the blocks cannot cover asks for its exact amount, and one
        // the balance cannot cover is refused with the balance.
        assert_eq!(
            a.take(&[], Some(&draw(800))).await.unwrap(),
            WindowOutcome::Added
        );
        assert_eq!(store.get("bal:org_1").await.unwrap(), Some(110));
        assert_eq!(
            a.take(&[], Some(&draw(500))).await.unwrap(),
            WindowOutcome::Refused {
                index: 0,
                current: 110
            }
        );
        // A settled draw gives back to the lease, then to the shared balance.
        a.correct_many(&[("bal:org_1".into(), 10)]).await.unwrap();
        a.return_idle(true).await;
        assert_eq!(store.get("bal:org_1").await.unwrap(), Some(120));
    }

    /// Issue 52: with the shared store away an instance serves a rate window on
    /// its share of the limit, a money window and a balance on their share of
    /// what the store last reported, and a counter it never saw not at all; what
    /// it used is charged to the shared counters when they answer again.
    #[tokio::test]
    async fn with_the_shared_store_away_each_counter_runs_on_its_share_and_is_charged_back() {
        let store = shared();
        store.seed_balance("bal:org_1", 1_000, 1_000).await.unwrap();
        let a = LeasedCounters::new(store.clone());
        let draw = BalanceReq {
            key: "bal:org_1".into(),
            org_id: "org_1".into(),
            credited: 1_000,
            amount: 10,
            floor: 0,
        };
        let spend = |amount| WindowReq {
            key: "kspend:key_1".into(),
            window_secs: 86_400,
            amount,
            limit: 1_600,
            ttl_secs: 0,
            down: Down::Remaining,
        };
        // Up: a draw (and a block of eight), a spend (and a block of 100), a
        // request (and a block of 10).
        let w = [rpm(160, true)];
        assert_eq!(
            a.take(&[spend(100)], Some(&draw)).await.unwrap(),
            WindowOutcome::Added
        );
        assert_eq!(a.take(&w, None).await.unwrap(), WindowOutcome::Added);
        assert_eq!(store.get("bal:org_1").await.unwrap(), Some(910));
        store.down.store(true, Ordering::Relaxed);
        // A rate window: its backed block, then its share (one instance here: all
        // of it), then refused as the limit refuses.
        assert_eq!(futures_count(&a, &w).await, 10 + 160);
        assert!(matches!(
            a.take(&w, None).await.unwrap(),
            WindowOutcome::Refused { index: 0, .. }
        ));
        // The balance: the backed block, then what was live (910).
        let mut drawn = 0;
        while let Ok(WindowOutcome::Added) = a.take(&[], Some(&draw)).await {
            drawn += 10;
            assert!(drawn < 2_000);
        }
        assert_eq!(drawn, 80 + 910);
        // The spend window: its backed block (100), then what it had left (1,600 -
        // 200 taken): 1,400.
        let mut spent = 0;
        while let Ok(WindowOutcome::Added) = a.take(&[spend(100)], None).await {
            spent += 100;
            assert!(spent < 5_000);
        }
        assert_eq!(spent, 100 + 1_400);
        // A money window never seen here: refused, the store being away.
        let other = WindowReq {
            key: "kspend:key_2".into(),
            ..spend(1)
        };
        assert!(a.take(&[other], None).await.is_err());
        // Still away: nothing is charged yet, and the allowances are kept.
        a.return_idle(true).await;
        assert!(matches!(
            a.take(&w, None).await.unwrap(),
            WindowOutcome::Refused { .. }
        ));
        // Back: the use is charged to the shared counters.
        store.down.store(false, Ordering::Relaxed);
        assert!(a.ping().await);
        a.return_idle(true).await;
        // (A counter the store never had would be left gone: a rate's local use
        // then just ends with the outage.)
        assert_eq!(
            store.window_total("krpm:key_1", 3600).await.unwrap(),
            1 + 10 + 160
        );
        assert_eq!(
            store.window_total("kspend:key_1", 86_400).await.unwrap(),
            1_600
        );
        assert_eq!(store.get("bal:org_1").await.unwrap(), Some(0));
    }

    /// A burst on cold leases: 40 requests at once on each of three instances,
    /// inside an org's 256 in flight. Each instance asks one block at a time, so
    /// the blocks do not take the limit and every request is admitted (one block
    /// per request would lease it all to the first 15 and refuse the rest).
    #[tokio::test]
    async fn a_burst_on_cold_leases_asks_one_block_per_instance() {
        let store = shared();
        let instances: Vec<LeasedCounters> =
            (0..3).map(|_| LeasedCounters::new(store.clone())).collect();
        let slot = [WindowReq {
            key: "oconc:org_1".into(),
            window_secs: 0,
            amount: 1,
            limit: 256,
            ttl_secs: 900,
            down: Down::Share,
        }];
        // The store is slow: every take of the burst misses before one returns.
        store.gate.send_replace(false);
        let opener = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            opener.gate.send_replace(true);
        });
        let takes = (0..120).map(|i| instances[i % 3].take(&slot, None));
        let got = futures_util::future::join_all(takes).await;
        let admitted = got
            .iter()
            .filter(|g| matches!(g, Ok(WindowOutcome::Added)))
            .count();
        assert_eq!(admitted, 120, "{got:?}");
        let name = super::super::window_counter("oconc:org_1", 0, super::super::now_secs());
        assert_eq!(
            store.get(&name).await.unwrap(),
            Some(120 + 3 * block(256)),
            "one block per instance"
        );
    }

    async fn futures_count(a: &LeasedCounters, w: &[WindowReq]) -> usize {
        let mut n = 0;
        while let Ok(WindowOutcome::Added) = a.take(w, None).await {
            n += 1;
            assert!(n < 1000);
        }
        n
    }
}
