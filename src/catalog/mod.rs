//! The catalog: public models from `conf/catalog.toml` (upserted into the database
//! at start-up) plus the models orgs create, served from an in-process snapshot that
//! a versioned poll keeps fresh.

pub mod model;
pub mod probe;
pub mod query;
pub mod retention;

pub use model::{ModelKind, ModelSpec, RungSpec};
pub use retention::Retention;

use crate::store::changes::{Feed, Topic};
use crate::store::{now_ms, Db};
use anyhow::{bail, Context};
use arc_swap::ArcSwap;
use serde_json::{json, Value};
use sqlx::Row;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// The owner column of public rows.
pub const PUBLIC: &str = "";

/// A model as the hot path sees it.
#[derive(Debug, PartialEq)]
pub struct Model {
    pub spec: ModelSpec,
    /// `None` for the public catalog, else the org that owns the row.
    pub owner: Option<String>,
    /// Unix seconds of first appearance (the `created` of model listings).
    pub created: i64,
    pub retention: Option<Retention>,
    /// Each rung with its id, shared: a request's route takes these without
    /// copying the rung.
    pub shared_rungs: Vec<(Arc<str>, Arc<RungSpec>)>,
}

impl Model {
    fn new(spec: ModelSpec, owner: &str, created_ms: i64) -> Model {
        // An org's own deployments are its own endpoints: no platform rungs.
        let retention = if owner == PUBLIC {
            retention::verdict(&spec.rungs)
        } else {
            None
        };
        let shared_rungs = spec
            .rungs
            .iter()
            .map(|r| (Arc::from(r.id()), Arc::new(r.clone())))
            .collect();
        Model {
            shared_rungs,
            spec,
            owner: (owner != PUBLIC).then(|| owner.to_string()),
            created: created_ms / 1000,
            retention,
        }
    }

    pub fn pricing_json(&self) -> Value {
        let p = &self.spec.price;
        json!({
            "input_micro_usd_per_million": p.input,
            "cached_input_micro_usd_per_million": p.cached_input,
            "output_micro_usd_per_million": p.output,
            "cache_write_input_micro_usd_per_million": p.cache_write(),
            "cache_write_1h_input_micro_usd_per_million": p.cache_write_1h(),
        })
    }

    /// The default chain of rung ids.
    pub fn default_chain(&self) -> Vec<String> {
        self.spec.rungs.iter().map(RungSpec::id).collect()
    }

    /// The `GET /v1/models` entry.
    pub fn listing_json(&self) -> Value {
        json!({
            "id": self.spec.slug,
            "object": "model",
            "created": self.created,
            "owned_by": self.spec.owned_by,
            "pricing": self.pricing_json(),
        })
    }

    /// A deployment entry as the management API shows it. A base URL shows only
    /// on an org's own model (whose reads only its org gets): the platform's rung
    /// URLs may name internal hosts.
    pub fn deployment_json(&self, r: &RungSpec) -> Value {
        let mut v = json!({
            "provider": r.provider,
            "provider_model_id": r.provider_model_id,
            "rung_id": r.id(),
            "zdr": r.zdr,
            "caps": r.caps,
        });
        if self.owner.is_some() && !r.base_url.is_empty() {
            v["base_url"] = Value::from(r.base_url.as_str());
        }
        v
    }

    /// The `GET /api/models` row.
    pub fn row_json(&self) -> Value {
        let s = &self.spec;
        json!({
            "slug": s.slug,
            "display_name": s.display_name,
            "kind": s.kind,
            "owned_by": s.owned_by,
            "category": s.category,
            "context_window": s.context_window,
            "max_input_tokens": s.max_input_tokens,
            "max_output_tokens": s.max_output_tokens,
            "modalities": s.modalities,
            "supported_params": s.supported_params,
            "pinned": s.pinned,
            "retention": self.retention.map(Retention::as_str),
            "pricing": self.pricing_json(),
            "providers": s.rungs.iter().map(|r| self.deployment_json(r)).collect::<Vec<_>>(),
            "regions": s.regions,
            "restricted": s.restricted,
            "requires": s.requires,
            "custom": self.owner.is_some(),
            "created": self.created,
        })
    }
}

/// An org's own models (or the public ones), by slug.
pub type Models = BTreeMap<String, Arc<Model>>;

/// One immutable view of every model. Each org's models are shared between
/// views: a write rebuilds its own org's map, and the next view takes the
/// others' as they were.
#[derive(Debug, Default)]
pub struct Catalog {
    pub public: Models,
    pub by_org: HashMap<String, Arc<Models>>,
}

impl Catalog {
    /// The model a slug names for an org: its own row first, then the public one.
    pub fn lookup(&self, org_id: Option<&str>, slug: &str) -> Option<&Arc<Model>> {
        org_id
            .and_then(|o| self.by_org.get(o))
            .and_then(|m| m.get(slug))
            .or_else(|| self.public.get(slug))
    }

    /// Every model an org sees (its own rows shadow public ones of the same slug),
    /// in slug order.
    pub fn visible(&self, org_id: Option<&str>) -> Vec<&Arc<Model>> {
        let own = org_id.and_then(|o| self.by_org.get(o));
        let mut out: Vec<&Arc<Model>> = self
            .public
            .iter()
            .filter(|(slug, _)| own.is_none_or(|m| !m.contains_key(*slug)))
            .map(|(_, m)| m)
            .collect();
        if let Some(own) = own {
            out.extend(own.values());
        }
        out.sort_by(|a, b| a.spec.slug.cmp(&b.spec.slug));
        out
    }
}

/// The public catalog built into the binary, served when no catalog file is
/// configured: a fresh binary works from any working directory.
pub const BUILTIN: &str = include_str!("../../conf/catalog.toml");

/// The configured public catalog: `catalog.path`, or the built-in one when the
/// path is empty; `None` when the file is missing (the stored catalog is served).
pub fn load_configured(path: &str) -> anyhow::Result<Option<Vec<ModelSpec>>> {
    if path.is_empty() {
        return parse(BUILTIN, "built-in catalog").map(Some);
    }
    let path = Path::new(path);
    if !path.exists() {
        tracing::warn!(path = %path.display(), "catalog file not found; serving the stored catalog");
        return Ok(None);
    }
    load_file(path).map(Some)
}

/// Reads and validates the catalog file.
pub fn load_file(path: &Path) -> anyhow::Result<Vec<ModelSpec>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the catalog {}", path.display()))?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates catalog text; `origin` names it in errors.
fn parse(text: &str, origin: &str) -> anyhow::Result<Vec<ModelSpec>> {
    let file: model::CatalogFile =
        toml::from_str(text).with_context(|| format!("parsing the catalog {origin}"))?;
    let mut seen = std::collections::HashSet::new();
    for m in &file.models {
        if let Err((field, why)) = m.validate() {
            bail!("catalog model {:?}: {field}: {why}", m.slug);
        }
        if !seen.insert(m.slug.clone()) {
            bail!("catalog: slug {:?} appears twice", m.slug);
        }
    }
    Ok(file.models)
}

/// Makes the public rows of the database equal the file's (rows no longer in the
/// file are removed); unchanged rows keep their stamps.
pub async fn upsert_public(db: &Db, specs: &[ModelSpec]) -> anyhow::Result<()> {
    let now = now_ms();
    let mut tx = db.pool.begin().await?;
    for spec in specs {
        let text = serde_json::to_string(spec)?;
        sqlx::query(
            "INSERT INTO models (owner, slug, spec, created_at, updated_at) VALUES ($1, $2, $3, $4, $4) \
             ON CONFLICT (owner, slug) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at \
             WHERE models.spec <> excluded.spec",
        )
        .bind(PUBLIC)
        .bind(&spec.slug)
        .bind(&text)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    let rows = sqlx::query("SELECT slug FROM models WHERE owner = $1")
        .bind(PUBLIC)
        .fetch_all(&mut *tx)
        .await?;
    for row in rows {
        let slug: String = row.get("slug");
        if !specs.iter().any(|s| s.slug == slug) {
            sqlx::query("DELETE FROM models WHERE owner = $1 AND slug = $2")
                .bind(PUBLIC)
                .bind(&slug)
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// How often the snapshot checks the database for changes.
const REFRESH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
/// How far back a look reads rows behind the newest stamp it saw: a write whose
/// instance's clock runs a little behind is still read.
const OVERLAP_MS: i64 = 5_000;

/// The catalog snapshot and its refresher.
#[derive(Default)]
pub struct CatalogStore {
    current: ArcSwap<Catalog>,
    /// The newest model stamp read, and how many rows there were.
    watermark: AtomicI64,
    rows: AtomicI64,
    /// The same of the probe results (they change the public models only).
    probe_watermark: AtomicI64,
    probe_rows: AtomicI64,
}

const ROW_COLUMNS: &str = "owner, slug, spec, created_at, updated_at";

/// Models of read rows, and the newest stamp among them.
fn models_of(
    rows: &[sqlx::any::AnyRow],
    probes: Option<&probe::Probes>,
) -> (HashMap<String, Models>, i64) {
    let mut by_owner: HashMap<String, Models> = HashMap::new();
    let mut max = 0;
    for row in rows {
        let owner: String = row.get("owner");
        let spec_text: String = row.get("spec");
        let created: i64 = row.get("created_at");
        max = max.max(row.get::<i64, _>("updated_at"));
        let mut spec: ModelSpec = match serde_json::from_str(&spec_text) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(owner, slug = %row.get::<String, _>("slug"), error = %e, "unreadable model row skipped");
                continue;
            }
        };
        if owner == PUBLIC {
            if let Some(p) = probes {
                p.apply(&mut spec);
            }
        }
        let slug = spec.slug.clone();
        let model = Arc::new(Model::new(spec, &owner, created));
        by_owner.entry(owner).or_default().insert(slug, model);
    }
    (by_owner, max)
}

impl CatalogStore {
    pub async fn load(db: &Db) -> anyhow::Result<CatalogStore> {
        let store = CatalogStore::default();
        store.reload(db).await?;
        Ok(store)
    }

    pub fn snapshot(&self) -> arc_swap::Guard<Arc<Catalog>> {
        self.current.load()
    }

    /// Rebuilds what changed since the last look: the orgs whose rows were
    /// written, the public models when theirs or a probe result changed. A count
    /// that moved with no stamp to explain it (a row removed) rebuilds everything.
    pub async fn refresh(&self, db: &Db) -> anyhow::Result<()> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM models) AS n, \
             (SELECT COALESCE(MAX(updated_at), 0) FROM models) AS t, \
             (SELECT COUNT(*) FROM rung_probes) AS pn, \
             (SELECT COALESCE(MAX(probed_at), 0) FROM rung_probes) AS pt",
        )
        .fetch_one(&db.pool)
        .await?;
        let (n, t, pn, pt): (i64, i64, i64, i64) =
            (row.get("n"), row.get("t"), row.get("pn"), row.get("pt"));
        let probes_moved = pn != self.probe_rows.load(Ordering::Relaxed)
            || pt != self.probe_watermark.load(Ordering::Relaxed);
        let models_moved =
            n != self.rows.load(Ordering::Relaxed) || t != self.watermark.load(Ordering::Relaxed);
        if !models_moved {
            if probes_moved {
                self.reload_public(db).await?;
            }
            return Ok(());
        }
        let since = self.watermark.load(Ordering::Relaxed) - OVERLAP_MS;
        let owners: Vec<String> =
            sqlx::query("SELECT DISTINCT owner FROM models WHERE updated_at >= $1")
                .bind(since)
                .fetch_all(&db.pool)
                .await?
                .iter()
                .map(|r| r.get("owner"))
                .collect();
        if owners.is_empty() || n < self.rows.load(Ordering::Relaxed) {
            return self.reload(db).await;
        }
        if probes_moved || owners.iter().any(|o| o == PUBLIC) {
            self.reload_public(db).await?;
        }
        for owner in owners.iter().filter(|o| o.as_str() != PUBLIC) {
            self.reload_org(db, owner).await?;
        }
        self.watermark.fetch_max(t, Ordering::Relaxed);
        self.rows.store(n, Ordering::Relaxed);
        Ok(())
    }

    /// Reads every row and probe result and serves them (start-up, SIGHUP, and
    /// a look that cannot tell what changed).
    pub async fn reload(&self, db: &Db) -> anyhow::Result<()> {
        let rows = sqlx::query(&format!("SELECT {ROW_COLUMNS} FROM models"))
            .fetch_all(&db.pool)
            .await?;
        let probes = probe::load(db).await?;
        let (mut by_owner, max) = models_of(&rows, Some(&probes));
        let cat = Catalog {
            public: by_owner.remove(PUBLIC).unwrap_or_default(),
            by_org: by_owner
                .into_iter()
                .map(|(o, m)| (o, Arc::new(m)))
                .collect(),
        };
        self.current.store(Arc::new(cat));
        self.watermark.store(max, Ordering::Relaxed);
        self.rows.store(rows.len() as i64, Ordering::Relaxed);
        self.probe_watermark
            .store(probes.watermark, Ordering::Relaxed);
        self.probe_rows.store(probes.rows as i64, Ordering::Relaxed);
        Ok(())
    }

    /// Reads the public rows and the probe results again; the orgs' models stay.
    async fn reload_public(&self, db: &Db) -> anyhow::Result<()> {
        let rows = sqlx::query(&format!(
            "SELECT {ROW_COLUMNS} FROM models WHERE owner = $1"
        ))
        .bind(PUBLIC)
        .fetch_all(&db.pool)
        .await?;
        let probes = probe::load(db).await?;
        let (mut by_owner, _) = models_of(&rows, Some(&probes));
        let public = by_owner.remove(PUBLIC).unwrap_or_default();
        self.current.rcu(|cur| {
            Arc::new(Catalog {
                public: public.clone(),
                by_org: cur.by_org.clone(),
            })
        });
        self.probe_watermark
            .store(probes.watermark, Ordering::Relaxed);
        self.probe_rows.store(probes.rows as i64, Ordering::Relaxed);
        Ok(())
    }

    /// Reads one org's rows again and serves them beside everyone else's as
    /// they were (an org's write, here or on another instance).
    pub async fn reload_org(&self, db: &Db, owner: &str) -> anyhow::Result<()> {
        let rows = sqlx::query(&format!(
            "SELECT {ROW_COLUMNS} FROM models WHERE owner = $1"
        ))
        .bind(owner)
        .fetch_all(&db.pool)
        .await?;
        let (mut by_owner, _) = models_of(&rows, None);
        let mine = by_owner.remove(owner).map(Arc::new);
        self.current.rcu(|cur| {
            let mut by_org = cur.by_org.clone();
            match &mine {
                Some(m) => by_org.insert(owner.to_string(), m.clone()),
                None => by_org.remove(owner),
            };
            Arc::new(Catalog {
                public: cur.public.clone(),
                by_org,
            })
        });
        Ok(())
    }

    pub fn spawn_refresh(self: &Arc<Self>, db: Db, feed: &Arc<Feed>) {
        let store = Arc::clone(self);
        crate::store::spawn_poll(
            REFRESH_EVERY,
            (feed, Topic::Catalog),
            "catalog",
            move || {
                let (store, db) = (store.clone(), db.clone());
                async move { store.refresh(&db).await }
            },
        );
    }
}

#[cfg(test)]
mod refresh_tests {
    use super::*;

    async fn write(db: &Db, owner: &str, slug: &str, stamp: i64) {
        let spec = ModelSpec {
            slug: slug.into(),
            display_name: slug.into(),
            kind: ModelKind::Chat,
            owned_by: owner.into(),
            context_window: 1_000,
            max_input_tokens: 1_000,
            modalities: vec!["text".into()],
            supported_params: vec![],
            pinned: Default::default(),
            price: Default::default(),
            category: "custom".into(),
            max_output_tokens: 100,
            regions: vec!["*".into()],
            restricted: false,
            requires: Default::default(),
            free: Default::default(),
            rungs: vec![RungSpec {
                provider: "openai".into(),
                provider_model_id: "m".into(),
                base_url: String::new(),
                zdr: false,
                caps: vec![],
            }],
        };
        sqlx::query(
            "INSERT INTO models (owner, slug, spec, created_at, updated_at) VALUES ($1, $2, $3, $4, $4) \
             ON CONFLICT (owner, slug) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at",
        )
        .bind(owner)
        .bind(slug)
        .bind(serde_json::to_string(&spec).unwrap())
        .bind(stamp)
        .execute(&db.pool)
        .await
        .unwrap();
    }

    /// H3 of the 2026-12-01 review: a write re-reads only its own org's models;
    /// every other org's stay the very same values in the next snapshot.
    #[tokio::test]
    async fn a_write_rebuilds_only_the_org_it_changed() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("c.db").display()))
            .await
            .unwrap();
        db.migrate().await.unwrap();
        let t = now_ms() - 60_000;
        // org_a's write is older than the look-back (OVERLAP_MS) of the next look.
        write(&db, "org_a", "a-one", t).await;
        write(&db, "org_b", "b-one", t + 10_000).await;
        let store = CatalogStore::load(&db).await.unwrap();
        let before = store.snapshot().by_org.clone();
        // Another instance writes org_b's models.
        write(&db, "org_b", "b-two", t + 30_000).await;
        store.refresh(&db).await.unwrap();
        let after = store.snapshot();
        assert!(
            Arc::ptr_eq(&before["org_a"], &after.by_org["org_a"]),
            "org_a was rebuilt"
        );
        assert!(!Arc::ptr_eq(&before["org_b"], &after.by_org["org_b"]));
        assert_eq!(after.by_org["org_b"].len(), 2);
        // Nothing changed: nothing is rebuilt.
        let again = store.snapshot().by_org.clone();
        store.refresh(&db).await.unwrap();
        assert!(Arc::ptr_eq(
            &again["org_b"],
            &store.snapshot().by_org["org_b"]
        ));
        // This instance's own write reloads its org at once.
        write(&db, "org_a", "a-two", t + 31_000).await;
        store.reload_org(&db, "org_a").await.unwrap();
        assert_eq!(store.snapshot().by_org["org_a"].len(), 2);
        assert!(Arc::ptr_eq(
            &again["org_b"],
            &store.snapshot().by_org["org_b"]
        ));
    }
}
