//! Redis calls as the operator sees them: each call of the counters store timed
//! and its failures counted by operation (`sluice_redis_call_seconds`,
//! `sluice_redis_errors_total`). A thin layer over the Redis store; the
//! in-process store is not wrapped (its calls are map lookups).

use super::{BalanceReq, Counters, Observed, WindowOutcome, WindowReq};
use async_trait::async_trait;
use prometheus::Histogram;
use prometheus::IntCounter;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The operations, in the order `timed!` indexes them.
const OPS: [&str; 12] = crate::metrics::REDIS_OPS;

pub struct MeteredCounters {
    inner: Arc<dyn Counters>,
    /// Per operation, in `OPS` order: resolved once, so a call only observes.
    calls: Vec<(Histogram, IntCounter)>,
}

impl MeteredCounters {
    pub fn new(inner: Arc<dyn Counters>) -> MeteredCounters {
        let m = crate::metrics::global();
        let calls = OPS
            .iter()
            .map(|op| {
                (
                    m.redis_calls.with_label_values(&[op]),
                    m.redis_errors.with_label_values(&[op]),
                )
            })
            .collect();
        MeteredCounters { inner, calls }
    }

    fn observe<T>(&self, op: usize, started: Instant, out: &anyhow::Result<T>) {
        let (h, errors) = &self.calls[op];
        h.observe(started.elapsed().as_secs_f64());
        if out.is_err() {
            errors.inc();
        }
    }
}

/// Times one call of the inner store under operation `$op` (an index of `OPS`).
macro_rules! timed {
    ($self:ident, $op:expr, $call:expr) => {{
        let started = Instant::now();
        let out = $call.await;
        $self.observe($op, started, &out);
        out
    }};
}

#[async_trait]
impl Counters for MeteredCounters {
    async fn take(
        &self,
        windows: &[WindowReq],
        balance: Option<&BalanceReq>,
    ) -> anyhow::Result<WindowOutcome> {
        timed!(self, 0, self.inner.take(windows, balance))
    }

    async fn take_observed(
        &self,
        windows: &[WindowReq],
        balance: Option<&BalanceReq>,
    ) -> anyhow::Result<(WindowOutcome, Observed)> {
        timed!(self, 0, self.inner.take_observed(windows, balance))
    }

    async fn seed_balance(&self, key: &str, balance: i64, credited: i64) -> anyhow::Result<()> {
        timed!(self, 1, self.inner.seed_balance(key, balance, credited))
    }

    async fn window_total(&self, key: &str, window_secs: u64) -> anyhow::Result<i64> {
        timed!(self, 2, self.inner.window_total(key, window_secs))
    }

    async fn add(&self, key: &str, amount: i64) -> anyhow::Result<i64> {
        timed!(self, 3, self.inner.add(key, amount))
    }

    async fn add_many(&self, adds: &[(String, i64)]) -> anyhow::Result<()> {
        timed!(self, 4, self.inner.add_many(adds))
    }

    async fn correct_many(&self, adds: &[(String, i64)]) -> anyhow::Result<()> {
        timed!(self, 5, self.inner.correct_many(adds))
    }

    async fn get(&self, key: &str) -> anyhow::Result<Option<i64>> {
        timed!(self, 6, self.inner.get(key))
    }

    async fn get_many(&self, keys: &[String]) -> anyhow::Result<Vec<Option<i64>>> {
        timed!(self, 6, self.inner.get_many(keys))
    }

    async fn set(&self, key: &str, value: i64) -> anyhow::Result<()> {
        timed!(self, 7, self.inner.set(key, value))
    }

    async fn put_marker(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
        only_if_absent: bool,
    ) -> anyhow::Result<bool> {
        timed!(
            self,
            8,
            self.inner.put_marker(key, value, ttl, only_if_absent)
        )
    }

    async fn get_marker(&self, key: &str) -> anyhow::Result<Option<String>> {
        timed!(self, 9, self.inner.get_marker(key))
    }

    async fn delete(&self, key: &str) -> anyhow::Result<()> {
        timed!(self, 10, self.inner.delete(key))
    }

    async fn ping(&self) -> bool {
        let started = Instant::now();
        let up = self.inner.ping().await;
        let out = if up {
            Ok(())
        } else {
            Err(anyhow::anyhow!("down"))
        };
        self.observe(11, started, &out);
        up
    }
}
