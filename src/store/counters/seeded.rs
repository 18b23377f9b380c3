//! Counters whose balances are seeded from the ledger. A balance counter without
//! its credited mark (first use, an in-process restart, a Redis that lost data or
//! evicted the mark) starts from the database balance minus the usage this
//! instance has not written there yet (buffered, in flight or spooled), never from
//! the org snapshot: that snapshot's balance is not refreshed by settled usage,
//! so seeding from it would give back every credit spent since it was read.
//!
//! Seeding reads the database, once per org and loss, off every other request's
//! path; every other step is the inner store's one round trip.

use super::{BalanceReq, Counters, WindowOutcome, WindowReq};
use crate::store::usage::Unwritten;
use crate::store::Db;
use anyhow::Context;
use async_trait::async_trait;
use sqlx::Row;
use std::sync::Arc;
use std::time::Duration;

pub struct SeededCounters {
    inner: Arc<dyn Counters>,
    db: Db,
    unwritten: Arc<Unwritten>,
}

impl SeededCounters {
    pub fn new(inner: Arc<dyn Counters>, db: Db, unwritten: Arc<Unwritten>) -> Self {
        SeededCounters {
            inner,
            db,
            unwritten,
        }
    }

    /// The org's balance as the ledger has it: the database row less what this
    /// instance has charged but not written yet; and the row's credited total.
    async fn ledger_balance(&self, org_id: &str) -> anyhow::Result<(i64, i64)> {
        let db = &self.db;
        let (balance, credited, pending) = self
            .unwritten
            .read_with(org_id, || async move {
                let row = sqlx::query(
                    "SELECT balance_micro_usd, credited_micro_usd FROM orgs WHERE id = $1",
                )
                .bind(org_id)
                .fetch_optional(&db.pool)
                .await?
                .context("no such org")?;
                let balance: i64 = row.try_get("balance_micro_usd")?;
                let credited: i64 = row.try_get("credited_micro_usd")?;
                anyhow::Ok((balance, credited))
            })
            .await?;
        Ok((balance.saturating_sub(pending), credited))
    }
}

#[async_trait]
impl Counters for SeededCounters {
    async fn take(
        &self,
        windows: &[WindowReq],
        balance: Option<&BalanceReq>,
    ) -> anyhow::Result<WindowOutcome> {
        match self.inner.take(windows, balance).await? {
            WindowOutcome::Unseeded => {}
            done => return Ok(done),
        }
        let Some(b) = balance else {
            anyhow::bail!("the counters store asked for a seed without a balance");
        };
        let (live, credited) = self.ledger_balance(&b.org_id).await?;
        tracing::info!(org = %b.org_id, "balance counter seeded from the ledger");
        self.inner.seed_balance(&b.key, live, credited).await?;
        match self.inner.take(windows, balance).await? {
            WindowOutcome::Unseeded => anyhow::bail!("the balance counter lost its seed at once"),
            done => Ok(done),
        }
    }

    async fn seed_balance(&self, key: &str, balance: i64, credited: i64) -> anyhow::Result<()> {
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

    async fn correct_many(&self, adds: &[(String, i64)]) -> anyhow::Result<()> {
        self.inner.correct_many(adds).await
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

    async fn ping(&self) -> bool {
        self.inner.ping().await
    }
}
