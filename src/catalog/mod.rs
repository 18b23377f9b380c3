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

/// One immutable view of every model.
#[derive(Debug, Default)]
pub struct Catalog {
    pub public: BTreeMap<String, Arc<Model>>,
    pub by_org: HashMap<String, BTreeMap<String, Arc<Model>>>,
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

/// The catalog snapshot and its refresher.
#[derive(Default)]
pub struct CatalogStore {
    current: ArcSwap<Catalog>,
    watermark: AtomicI64,
    rows: AtomicI64,
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

    /// Rebuilds the snapshot when a row (or a probe result) changed or disappeared
    /// since the last look.
    pub async fn refresh(&self, db: &Db) -> anyhow::Result<()> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM models) + (SELECT COUNT(*) FROM rung_probes) AS n, \
             (SELECT COALESCE(MAX(updated_at), 0) FROM models) + \
             (SELECT COALESCE(MAX(probed_at), 0) FROM rung_probes) AS t",
        )
        .fetch_one(&db.pool)
        .await?;
        let (n, t): (i64, i64) = (row.get("n"), row.get("t"));
        if n != self.rows.load(Ordering::Relaxed) || t != self.watermark.load(Ordering::Relaxed) {
            self.reload(db).await?;
        }
        Ok(())
    }

    pub async fn reload(&self, db: &Db) -> anyhow::Result<()> {
        let rows = sqlx::query("SELECT owner, slug, spec, created_at, updated_at FROM models")
            .fetch_all(&db.pool)
            .await?;
        let probes = probe::load(db).await?;
        let mut cat = Catalog::default();
        let mut max = probes.watermark;
        for row in &rows {
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
                probes.apply(&mut spec);
            }
            let slug = spec.slug.clone();
            let model = Arc::new(Model::new(spec, &owner, created));
            if owner == PUBLIC {
                cat.public.insert(slug, model);
            } else {
                cat.by_org.entry(owner).or_default().insert(slug, model);
            }
        }
        self.current.store(Arc::new(cat));
        self.watermark.store(max, Ordering::Relaxed);
        self.rows
            .store((rows.len() + probes.rows) as i64, Ordering::Relaxed);
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
