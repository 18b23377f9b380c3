//! The one shared state every service holds through an `Arc`.

use crate::accounts::Directory;
use crate::catalog::CatalogStore;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::counters::{MemoryCounters, MeteredCounters, RedisCounters, SeededCounters};
use crate::store::usage::{spawn_writer, UsageSink};
use crate::store::{Counters, Db};
use anyhow::Context as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct AppState {
    pub config: Config,
    pub db: Db,
    pub counters: Arc<dyn Counters>,
    pub directory: Arc<Directory>,
    pub catalog: Arc<CatalogStore>,
    /// Org connections (secrets opened) and waterfall overrides.
    pub byok: Arc<crate::byok::ByokStore>,
    pub metrics: &'static Metrics,
    /// Access lines and spans (and their exporter).
    pub tracer: crate::trace::Tracer,
    pub usage: UsageSink,
    /// The responses store (`store`, `previous_response_id`).
    pub responses: crate::responses::Keeper,
    /// This process's id: it owns the Idempotency-Keys it claims while it lives.
    pub instance_id: String,
    draining: AtomicBool,
    gateway_up: AtomicBool,
}

impl AppState {
    /// Connects storage, applies migrations, upserts the catalog file and loads the
    /// snapshots. Must run inside the runtime that will keep driving the connections.
    pub async fn build(config: Config) -> anyhow::Result<Arc<AppState>> {
        let db = Db::connect(&config.storage.database_url).await?;
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
            let redis = Arc::new(RedisCounters::connect(&config.storage.redis_url).await?);
            Arc::new(MeteredCounters::new(redis))
        };
        // Usage a previous run spooled goes in first, so the ledger is whole.
        let spool = std::path::PathBuf::from(&config.storage.usage_spool);
        crate::store::usage::replay(&db, &spool, &Default::default()).await;
        if in_process {
            // Fresh in-process counters know no free allowance use: put back what
            // the ledger (and a spool the database still refuses) says. Without
            // the ledger the allowances are not known, so the start fails.
            let now = crate::store::counters::now_secs();
            let unstored = crate::store::usage::read_spool(&spool);
            let uses = crate::billing::gate::free_use(&db, now, &unstored)
                .await
                .context("reading free allowance use from the ledger")?;
            crate::billing::gate::restore_free(inner.as_ref(), &uses, now).await?;
        }
        let directory = Arc::new(Directory::load(&db).await?);
        let usage = spawn_writer(db.clone(), &config.storage.database_url, spool)?;
        // Balances a counter does not hold are seeded from the ledger.
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
        let responses = crate::responses::Keeper::new(db.clone(), retention);
        let instance_id = crate::store::new_id("inst");
        let tracer = crate::trace::Tracer::new(&config.observability, &instance_id)?;
        Ok(Arc::new(AppState {
            config,
            db,
            counters,
            directory,
            catalog,
            byok,
            metrics: crate::metrics::global(),
            tracer,
            usage,
            responses,
            instance_id,
            draining: AtomicBool::new(false),
            gateway_up: AtomicBool::new(false),
        }))
    }

    /// Starts the pollers that keep the snapshots fresh.
    pub fn spawn_refreshers(&self) {
        self.directory.spawn_sync(self.db.clone());
        self.catalog.spawn_refresh(self.db.clone());
        self.byok.spawn_refresh(self.db.clone());
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn gateway_up(&self) -> bool {
        self.gateway_up.load(Ordering::Relaxed)
    }

    pub fn set_gateway_up(&self) {
        self.gateway_up.store(true, Ordering::Relaxed);
    }
}
