//! Redis counters, shared by every instance. Each multi-key step is one Lua script,
//! so it is atomic and one round trip.

use super::{
    credited_mark, now_secs, window_counter, BalanceReq, Counters, Observed, WindowOutcome,
    WindowReq,
};
use anyhow::Context;
use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use std::time::Duration;

/// KEYS: the window keys, then (with a balance) the balance and its credited mark,
/// then (when the take has a money window) the epoch marker. ARGV[1]: the number
/// of windows; per window (amount, limit, ttl; ttl 0 never expires, a negative ttl
/// sets -ttl only on a key without an expiry); with a balance (credited, amount,
/// floor); last, 1 when the epoch marker is checked, else 0. A take with a money
/// window on a store without its epoch marker (it lost its data, and the windows
/// are not restored from the ledger yet) answers {-2, 0}: nothing taken. Syncs the balance with the credited total,
/// checks every window and the balance, then adds to all, or to none; returns
/// {0, 0, total of each window after it, live balance after the draw (0 without
/// one)} when taken, {-1, 0} when the balance has no credited mark (nothing
/// taken), else {index+1, current}.
const TAKE: &str = r#"
local n = tonumber(ARGV[1])
local guard = tonumber(ARGV[#ARGV])
if guard == 1 and redis.call('EXISTS', KEYS[#KEYS]) == 0 then
  return {-2, 0}
end
local live = nil
local draw = 0
if #KEYS - guard > n then
  local bk, mk = KEYS[n+1], KEYS[n+2]
  local base = n*3 + 1
  local credited = tonumber(ARGV[base+1])
  local seen = redis.call('GET', mk)
  if not seen then
    return {-1, 0}
  end
  live = tonumber(redis.call('GET', bk) or '0')
  if credited > tonumber(seen) then
    live = live + credited - tonumber(seen)
    redis.call('SET', bk, live)
    redis.call('SET', mk, credited)
  end
  draw = tonumber(ARGV[base+2])
  if live - draw < tonumber(ARGV[base+3]) then
    for i = 1, n do
      local cur = tonumber(redis.call('GET', KEYS[i]) or '0')
      if cur + tonumber(ARGV[(i-1)*3+2]) > tonumber(ARGV[(i-1)*3+3]) then
        return {i, cur}
      end
    end
    return {n+1, live}
  end
end
for i = 1, n do
  local cur = tonumber(redis.call('GET', KEYS[i]) or '0')
  if cur + tonumber(ARGV[(i-1)*3+2]) > tonumber(ARGV[(i-1)*3+3]) then
    return {i, cur}
  end
end
for i = 1, n do
  local ttl = tonumber(ARGV[(i-1)*3+4])
  redis.call('INCRBY', KEYS[i], tonumber(ARGV[(i-1)*3+2]))
  if ttl > 0 then
    redis.call('EXPIRE', KEYS[i], ttl)
  elseif ttl < 0 and redis.call('TTL', KEYS[i]) < 0 then
    redis.call('EXPIRE', KEYS[i], -ttl)
  end
end
local out = {0, 0}
for i = 1, n do
  out[#out+1] = tonumber(redis.call('GET', KEYS[i]) or '0')
end
if live then
  out[#out+1] = redis.call('DECRBY', KEYS[n+1], draw)
end
return out
"#;

/// KEYS: an affinity marker, its org's index (a sorted set of markers in the
/// order they were made) and the index's sequence. ARGV: value, ttl ms, the
/// per-org cap. Sets the marker; a new one joins the index, and past the cap the
/// oldest entries go (an entry whose marker already expired counts until then, so
/// the live markers stay at or under the cap).
const AFFINITY_PUT: &str = r#"
local fresh = redis.call('EXISTS', KEYS[1]) == 0
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if fresh then
  local ttl, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), KEYS[1])
  redis.call('PEXPIRE', KEYS[3], ttl)
  local over = redis.call('ZCARD', KEYS[2]) - cap
  if over > 0 then
    local old = redis.call('ZPOPMIN', KEYS[2], over)
    for i = 1, #old, 2 do
      redis.call('DEL', old[i])
    end
  end
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return 1
"#;

/// KEYS: a balance and its credited mark. ARGV: balance, credited. Sets both
/// unless the mark exists.
const SEED: &str = r#"
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[2], ARGV[2])
end
return 0
"#;

/// KEYS: counters; ARGV: an amount per counter. Adds each amount to its counter
/// when the counter exists (INCRBY keeps its expiry); a missing one stays missing.
const CORRECT: &str = r#"
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('INCRBY', KEYS[i], ARGV[i])
  end
end
return 0
"#;

/// The marker a store that keeps its data has (`AppState::restore_if_counters_lost`).
pub const EPOCH: &str = "epoch";

/// The store lost its data and its money windows are not restored from the
/// ledger yet: a take of one waits for the restore (it is not the store being
/// away: no outage share applies).
#[derive(Debug, thiserror::Error)]
#[error("the counters store lost its data; money windows are being restored from the ledger")]
pub struct Unrestored;

/// The state runtime's threads (`server.rs`): they use the connection made at start.
const STATE_THREAD: &str = "sluice-state";

thread_local! {
    /// This thread's own connections, by store.
    static OWN: std::cell::RefCell<Vec<(u64, ConnectionManager)>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub struct RedisCounters {
    /// The connection made at start, on the state runtime (its reads run there).
    conn: ConnectionManager,
    /// What makes another connection: each service thread gets one of its own.
    client: redis::Client,
    config: redis::aio::ConnectionManagerConfig,
    /// Tells this store's thread connections from another's (tests make several).
    id: u64,
    /// The longest one call may take.
    timeout: Duration,
    prefix: String,
    take: Script,
    affinity_put: Script,
    correct: Script,
}

impl RedisCounters {
    /// Connects with every call bounded by `timeout`, and a lost connection made
    /// again within about a second of Redis answering (retries 100 ms apart, at
    /// most 1 s), never the default backoff that grows to minutes.
    pub async fn connect(url: &str, timeout: Duration) -> anyhow::Result<Self> {
        let client = redis::Client::open(url).context("invalid storage.redis_url")?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Duration::from_millis(500))
            .set_response_timeout(timeout)
            .set_exponent_base(1)
            .set_factor(100)
            .set_max_delay(1_000)
            .set_number_of_retries(3);
        let conn = ConnectionManager::new_with_config(client.clone(), config.clone())
            .await
            .context("connecting to Redis")?;
        Ok(RedisCounters {
            conn,
            client,
            config,
            id: rand::random(),
            timeout,
            prefix: "sluice:".into(),
            take: Script::new(TAKE),
            affinity_put: Script::new(AFFINITY_PUT),
            correct: Script::new(CORRECT),
        })
    }

    /// The connection a call goes through. On a service's own thread (the
    /// gateway's, where requests wait on a lease's refill or a window's block) it
    /// is that thread's, made on its first call: its replies are read by the
    /// thread that waits for them, never by the state runtime, a background
    /// thread that busy cores starve (a reply it has not read is a request that
    /// waits). On the state runtime, and when a thread's own cannot be made in
    /// time, the one made at start.
    async fn conn(&self) -> ConnectionManager {
        if std::thread::current().name() == Some(STATE_THREAD) {
            return self.conn.clone();
        }
        let own = OWN.with(|o| {
            o.borrow()
                .iter()
                .find(|(id, _)| *id == self.id)
                .map(|(_, c)| c.clone())
        });
        if let Some(c) = own {
            return c;
        }
        let made = tokio::time::timeout(
            self.timeout.max(Duration::from_millis(500)),
            ConnectionManager::new_with_config(self.client.clone(), self.config.clone()),
        )
        .await;
        match made {
            Ok(Ok(c)) => {
                OWN.with(|o| o.borrow_mut().push((self.id, c.clone())));
                c
            }
            _ => self.conn.clone(),
        }
    }

    /// Runs one call within the timeout: a Redis that hangs fails the call.
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> anyhow::Result<T> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => Ok(r?),
            Err(_) => anyhow::bail!("Redis did not answer within {:?}", self.timeout),
        }
    }

    fn k(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn window_key(&self, key: &str, window_secs: u64, now: u64) -> String {
        format!("{}{}", self.prefix, window_counter(key, window_secs, now))
    }
}

#[async_trait]
impl Counters for RedisCounters {
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
        if windows.is_empty() && balance.is_none() {
            return Ok((WindowOutcome::Added, Observed::default()));
        }
        let now = now_secs();
        let mut inv = self.take.prepare_invoke();
        inv.arg(windows.len());
        for w in windows {
            inv.key(self.window_key(&w.key, w.window_secs, now));
            let ttl = if w.window_secs == 0 {
                -i64::try_from(w.ttl_secs).unwrap_or(i64::MAX)
            } else {
                i64::try_from(w.window_secs + 1).unwrap_or(i64::MAX)
            };
            inv.arg(w.amount).arg(w.limit).arg(ttl);
        }
        if let Some(b) = balance {
            inv.key(self.k(&b.key)).key(self.k(&credited_mark(&b.key)));
            inv.arg(b.credited).arg(b.amount).arg(b.floor);
        }
        // Money windows are only taken from a store that has its epoch marker.
        let guard = windows.iter().any(|w| w.down == super::Down::Remaining);
        if guard {
            inv.key(self.k(EPOCH));
        }
        inv.arg(i64::from(guard));
        let mut conn = self.conn().await;
        let got: Vec<i64> = self.bounded(inv.invoke_async(&mut conn)).await?;
        let (idx, cur) = (
            got.first().copied().unwrap_or(0),
            got.get(1).copied().unwrap_or(0),
        );
        Ok(if idx == 0 {
            let totals = got.get(2..2 + windows.len()).unwrap_or_default().to_vec();
            let balance = balance.and_then(|_| got.get(2 + windows.len()).copied());
            (WindowOutcome::Added, Observed { totals, balance })
        } else if idx == -2 {
            return Err(Unrestored.into());
        } else if idx < 0 {
            (WindowOutcome::Unseeded, Observed::default())
        } else {
            (
                WindowOutcome::Refused {
                    index: (idx - 1) as usize,
                    current: cur,
                },
                Observed::default(),
            )
        })
    }

    async fn seed_balance(&self, key: &str, balance: i64, credited: i64) -> anyhow::Result<()> {
        // Rare (once per org after a loss): the script is not kept prepared.
        let mut conn = self.conn().await;
        let script = redis::Script::new(SEED);
        let mut inv = script.prepare_invoke();
        inv.key(self.k(key))
            .key(self.k(&credited_mark(key)))
            .arg(balance)
            .arg(credited);
        let _: () = self.bounded(inv.invoke_async(&mut conn)).await?;
        Ok(())
    }

    async fn add_many(&self, adds: &[(String, i64)]) -> anyhow::Result<()> {
        let mut pipe = redis::pipe();
        for (k, v) in adds {
            pipe.incr(self.k(k), *v).ignore();
        }
        let mut conn = self.conn().await;
        let _: () = self.bounded(pipe.query_async(&mut conn)).await?;
        Ok(())
    }

    async fn correct_many(&self, adds: &[(String, i64)]) -> anyhow::Result<()> {
        if adds.is_empty() {
            return Ok(());
        }
        let mut inv = self.correct.prepare_invoke();
        for (k, v) in adds {
            inv.key(self.k(k)).arg(*v);
        }
        let mut conn = self.conn().await;
        let _: i64 = self.bounded(inv.invoke_async(&mut conn)).await?;
        Ok(())
    }

    async fn window_total(&self, key: &str, window_secs: u64) -> anyhow::Result<i64> {
        let mut conn = self.conn().await;
        let name = self.window_key(key, window_secs, now_secs());
        let v: Option<i64> = self.bounded(conn.get(name)).await?;
        Ok(v.unwrap_or(0))
    }

    async fn add(&self, key: &str, amount: i64) -> anyhow::Result<i64> {
        let mut conn = self.conn().await;
        self.bounded(conn.incr(self.k(key), amount)).await
    }

    async fn get(&self, key: &str) -> anyhow::Result<Option<i64>> {
        let mut conn = self.conn().await;
        self.bounded(conn.get(self.k(key))).await
    }

    async fn get_many(&self, keys: &[String]) -> anyhow::Result<Vec<Option<i64>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await;
        let names: Vec<String> = keys.iter().map(|k| self.k(k)).collect();
        self.bounded(redis::cmd("MGET").arg(&names).query_async(&mut conn))
            .await
    }

    async fn set(&self, key: &str, value: i64) -> anyhow::Result<()> {
        let mut conn = self.conn().await;
        let _: () = self.bounded(conn.set(self.k(key), value)).await?;
        Ok(())
    }

    async fn put_marker(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
        only_if_absent: bool,
    ) -> anyhow::Result<bool> {
        let mut conn = self.conn().await;
        let ttl_ms = ttl.as_millis().max(1) as u64;
        // Affinity markers are capped per org, like the in-process ones.
        let org = key
            .strip_prefix(super::AFFINITY)
            .and_then(|rest| rest.split(':').next());
        if let (Some(org), false) = (org, only_if_absent) {
            let mut inv = self.affinity_put.prepare_invoke();
            inv.key(self.k(key))
                .key(self.k(&["affidx:", org].concat()))
                .key(self.k(&["affseq:", org].concat()))
                .arg(value)
                .arg(ttl_ms)
                .arg(super::AFFINITY_PER_ORG);
            let _: i64 = self.bounded(inv.invoke_async(&mut conn)).await?;
            return Ok(true);
        }
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.k(key)).arg(value).arg("PX").arg(ttl_ms);
        if only_if_absent {
            cmd.arg("NX");
        }
        let r: Option<String> = self.bounded(cmd.query_async(&mut conn)).await?;
        Ok(r.is_some())
    }

    async fn get_marker(&self, key: &str) -> anyhow::Result<Option<String>> {
        let mut conn = self.conn().await;
        self.bounded(conn.get(self.k(key))).await
    }

    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        let mut conn = self.conn().await;
        let _: () = self.bounded(conn.del(self.k(key))).await?;
        Ok(())
    }

    async fn ping(&self) -> bool {
        let mut conn = self.conn().await;
        self.bounded(redis::cmd("PING").query_async::<String>(&mut conn))
            .await
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    /// Runs when the test command provides Redis; then it must pass, never skip.
    #[tokio::test]
    async fn redis_counters_keep_the_contract() {
        let Ok(url) = std::env::var("SLUICE_TEST_REDIS_URL") else {
            eprintln!("SLUICE_TEST_REDIS_URL unset: Redis contract runs in the Redis pass");
            return;
        };
        let c = super::RedisCounters::connect(&url, std::time::Duration::from_secs(2))
            .await
            .expect("Redis is up");
        let ns = format!("test{}", rand::random::<u32>());
        super::super::contract::run(&c, &ns).await;
        super::super::contract::affinity_cap(&c, &ns).await;
    }
}
