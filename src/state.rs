//! The one shared state every service holds through an `Arc`.

use crate::accounts::Directory;
use crate::catalog::CatalogStore;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::counters::{
    LeasedCounters, MemoryCounters, MeteredCounters, RedisCounters, SeededCounters, EPOCH,
};
use crate::store::usage::{spawn_writer, UsageSink};
use crate::store::{Counters, Db};
use anyhow::Context as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub(crate) struct AppState {
    pub(crate) config: Config,
    pub(crate) db: Db,
    pub(crate) counters: Arc<dyn Counters>,
    pub(crate) directory: Arc<Directory>,
    pub(crate) catalog: Arc<CatalogStore>,
    /// Org connections (secrets opened) and waterfall overrides.
    pub(crate) byok: Arc<crate::byok::ByokStore>,
    pub(crate) metrics: &'static Metrics,
    /// Access lines and spans (and their exporter).
    pub(crate) tracer: crate::trace::Tracer,
    pub(crate) usage: UsageSink,
    /// The leases this instance holds of the shared counters (Redis only).
    pub(crate) leases: Option<Arc<LeasedCounters>>,
    /// The responses store (`store`, `previous_response_id`).
    pub(crate) responses: Arc<crate::responses::Keeper>,
    /// Uploaded files: telemetry exports, batch inputs and outputs.
    pub(crate) objects: crate::store::objects::Objects,
    /// This process's id: it owns the Idempotency-Keys it claims while it lives.
    pub(crate) instance_id: String,
    /// The batch runner's credential on this instance's gateway listener
    /// ([`BATCH_HEADER`]): random per process, never stored nor sent elsewhere.
    internal_token: String,
    draining: AtomicBool,
    gateway_up: AtomicBool,
    /// The database and the counters store answered the last readiness probes
    /// (`spawn_readiness`): `/readyz` reads these, never the stores themselves.
    database_up: AtomicBool,
    counters_up: AtomicBool,
    /// The counters store's epoch marker as this instance last saw it (a change
    /// says the store lost its data).
    epoch: std::sync::Mutex<Option<String>>,
}

/// The header a batch line carries to this instance's gateway listener:
/// `<internal token> <key hash> <batch id>:<line>`.
pub(crate) const BATCH_HEADER: &str = "x-sluice-batch";

/// The nice value of the threads that run batch lines (the runner's and the batch
/// lines' listener's): live requests take the core first.
pub(crate) const BATCH_LINES_NICE: i32 = 10;

impl AppState {
    /// The batch runner's credential (see [`BATCH_HEADER`]).
    pub(crate) fn internal_token(&self) -> &str {
        &self.internal_token
    }

    /// Whether `presented` is this process's internal token (compared in constant
    /// time).
    pub(crate) fn internal_token_matches(&self, presented: &str) -> bool {
        let (a, b) = (presented.as_bytes(), self.internal_token.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// Connects storage, applies migrations, upserts the catalog file and loads the
    /// snapshots. Must run inside the runtime that will keep driving the connections.
    pub(crate) async fn build(config: Config) -> anyhow::Result<Arc<AppState>> {
        let timeout = std::time::Duration::from_millis(config.storage.database_timeout_ms);
        let db = Db::open(&config.storage.database_url, None, timeout).await?;
        db.migrate().await?;
        if let Some(specs) = crate::catalog::load_configured(&config.catalog.path)? {
            crate::catalog::upsert_public(&db, &specs).await?;
        }
        let in_process = config.storage.redis_url.is_empty();
        let inner: Arc<dyn Counters> = if in_process {
            let memory = Arc::new(MemoryCounters::new());
            memory.spawn_sweeper();
            memory
        } else {
            let redis = Arc::new(
                RedisCounters::connect(
                    &config.storage.redis_url,
                    std::time::Duration::from_millis(config.storage.redis_timeout_ms),
                )
                .await?,
            );
            // Metered below the leases: each call that reaches Redis is counted.
            Arc::new(MeteredCounters::new(redis))
        };
        // Usage a previous run spooled goes in first, so the ledger is whole.
        let spool = std::path::PathBuf::from(&config.storage.usage_spool);
        // A process that died on this machine left its journal: into the spool.
        crate::store::usage::adopt_orphans(&spool);
        crate::store::usage::replay(&db, &spool, &Default::default()).await;
        if in_process {
            // Fresh in-process counters know no free allowance use nor key spend
            // today: put back what the ledger (and a spool the database still
            // refuses) says. Without the ledger they are not known: the start fails.
            let now = crate::store::counters::now_secs();
            let unstored = crate::store::usage::read_spool(&spool);
            crate::billing::gate::restore_money(inner.as_ref(), &db, now, &unstored)
                .await
                .context("reading free allowance use and key spend from the ledger")?;
        }
        let directory = Arc::new(Directory::load(&db).await?);
        let instance_id = crate::store::new_id("inst");
        let usage = spawn_writer(
            db.clone(),
            &config.storage.database_url,
            spool,
            &instance_id,
        )?;
        // Shared counters are leased: the common request never waits on Redis.
        let leases = (!in_process).then(|| Arc::new(LeasedCounters::new(inner.clone())));
        let inner: Arc<dyn Counters> = match &leases {
            Some(l) => l.clone(),
            None => inner,
        };
        // Balances a counter does not hold are seeded from the ledger (a reseed
        // also drops what this instance leased of the lost balance).
        let counters: Arc<dyn Counters> = Arc::new(SeededCounters::new(
            inner,
            db.clone(),
            usage.unwritten.clone(),
        ));
        let catalog = Arc::new(CatalogStore::load(&db).await?);
        let sealer =
            crate::byok::secrets::Sealer::load(&config.secrets.key, &config.secrets.key_file)?;
        let byok = Arc::new(crate::byok::ByokStore::load(&db, sealer).await?);
        let retention = crate::config::parse_duration(&config.responses.retention)?;
        let responses = Arc::new(crate::responses::Keeper::new(
            db.clone(),
            retention,
            config.limits.max_request_bytes,
        ));
        let objects = crate::store::objects::Objects::open(
            &config.storage.objects,
            &config.storage.s3_endpoint,
        )?;
        let tracer = crate::trace::Tracer::new(&config.observability, &instance_id)?;
        Ok(Arc::new(AppState {
            config,
            db,
            counters,
            leases,
            directory,
            catalog,
            byok,
            metrics: crate::metrics::global(),
            tracer,
            usage,
            responses,
            objects,
            instance_id,
            internal_token: crate::store::new_id("bt") + &crate::store::new_id(""),
            draining: AtomicBool::new(false),
            gateway_up: AtomicBool::new(false),
            database_up: AtomicBool::new(true),
            counters_up: AtomicBool::new(true),
            epoch: std::sync::Mutex::new(None),
        }))
    }

    /// Starts the pollers that keep the snapshots fresh.
    pub(crate) fn spawn_refreshers(&self) {
        if let Some(l) = &self.leases {
            l.spawn_returns();
        }
        let feed = Arc::new(crate::store::changes::Feed::default());
        feed.spawn(self.db.engine, &self.config.storage.database_url);
        self.directory.spawn_sync(self.db.clone(), &feed);
        self.catalog.spawn_refresh(self.db.clone(), &feed);
        self.byok.spawn_refresh(self.db.clone(), &feed);
    }

    /// Probes the database and the counters store every 250 ms (each call within
    /// its configured bound) for `/readyz`: a store is down after two failed probes
    /// in a row and up again at the first that answers, so readiness follows an
    /// outage within about half a second and a recovery within a quarter.
    pub(crate) fn spawn_readiness(self: &Arc<Self>) {
        let state = self.clone();
        tokio::spawn(async move {
            let (mut db_fails, mut counter_fails) = (0u32, 0u32);
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let (db, counters) = tokio::join!(state.db.ping(), state.counters.ping());
                if counters && state.leases.is_some() {
                    state.restore_if_counters_lost().await;
                }
                db_fails = if db { 0 } else { db_fails + 1 };
                counter_fails = if counters { 0 } else { counter_fails + 1 };
                state.database_up.store(db_fails < 2, Ordering::Relaxed);
                state
                    .counters_up
                    .store(counter_fails < 2, Ordering::Relaxed);
            }
        });
    }

    /// A shared counters store that lost its data (a Redis restarted empty) lost
    /// the money windows with it: key daily spend and free allowance use. The
    /// store holds a marker with no natural end, a random value; the instance
    /// that finds it gone (one, by `SET NX`) puts those windows back from the
    /// ledger. Every instance that sees the value change (or go) drops its
    /// leases: they were blocks of counters that no longer exist. Balances
    /// reseed themselves on their next draw (`SeededCounters`); rate windows
    /// restart.
    pub(crate) async fn restore_if_counters_lost(&self) {
        const EPOCH_TTL: std::time::Duration = std::time::Duration::from_secs(90 * 86_400);
        let Some(leases) = &self.leases else { return };
        let Ok(current) = self.counters.get_marker(EPOCH).await else {
            return;
        };
        let known = self.epoch.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let (Some(c), Some(k)) = (&current, &known) {
            if c == k {
                return;
            }
        }
        if known.is_some() {
            tracing::warn!("the counters store lost its data: this instance's leases are dropped");
            leases.forget_all();
        }
        if let Some(c) = current {
            // Another instance found it gone first, and restored.
            *self.epoch.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
            return;
        }
        let nonce = crate::store::new_id("epoch");
        let set = self
            .counters
            .put_marker(EPOCH, &nonce, EPOCH_TTL, true)
            .await;
        if !matches!(set, Ok(true)) {
            return;
        }
        let now = crate::store::counters::now_secs();
        let unstored =
            crate::store::usage::read_spool(std::path::Path::new(&self.config.storage.usage_spool));
        // Straight to the shared store: the ledger's totals are not leased.
        let restore =
            crate::billing::gate::restore_money(leases.shared(), &self.db, now, &unstored);
        let failed = match tokio::time::timeout(std::time::Duration::from_secs(10), restore).await {
            Ok(Ok(())) => {
                tracing::warn!(
                    "the counters store had no epoch marker (first start, or it lost its data): \
                     key daily spend and free allowance use restored from the ledger"
                );
                *self.epoch.lock().unwrap_or_else(|e| e.into_inner()) = Some(nonce);
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        // The marker goes, so the next readiness tick tries again.
        tracing::error!(error = %failed, "restoring money windows from the ledger failed; retrying");
        let _ = self.counters.delete(EPOCH).await;
    }

    /// Whether the database answered the last readiness probes.
    pub(crate) fn database_up(&self) -> bool {
        self.database_up.load(Ordering::Relaxed)
    }

    /// Whether the counters store answered the last readiness probes.
    pub(crate) fn counters_up(&self) -> bool {
        self.counters_up.load(Ordering::Relaxed)
    }

    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub(crate) fn gateway_up(&self) -> bool {
        self.gateway_up.load(Ordering::Relaxed)
    }

    pub(crate) fn set_gateway_up(&self) {
        self.gateway_up.store(true, Ordering::Relaxed);
    }
}
