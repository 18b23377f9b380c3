//! Capabilities learned by probing. `sluice probe` (and the periodic task when
//! `[probe] enabled`) sends each platform rung a minimal request per capability and
//! records here whether the provider accepted it; the catalog snapshot then serves
//! the probed verdict over the declared one. Declared capabilities stay the
//! starting point for rungs never probed, or whose probe was inconclusive.

use super::model::ModelSpec;
use crate::store::{now_ms, Db};
use sqlx::Row;
use std::collections::HashMap;

/// The capabilities a probe can settle with one cheap request each.
pub const PROBED: [&str; 4] = ["json_object", "json_schema", "tools", "sampling"];

/// One verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub provider: String,
    pub provider_model_id: String,
    pub base_url: String,
    pub capability: String,
    pub supported: bool,
    /// The provider's status (0 when nothing was sent: the wire cannot carry it).
    pub status: u16,
}

/// Every stored verdict, keyed by rung.
#[derive(Default)]
pub struct Probes {
    by_rung: HashMap<(String, String, String), Vec<(String, bool)>>,
    pub rows: usize,
    pub watermark: i64,
}

impl Probes {
    /// Applies the verdicts to a model's rungs: a supported capability is added, an
    /// unsupported one removed.
    pub fn apply(&self, spec: &mut ModelSpec) {
        for r in &mut spec.rungs {
            let key = (
                r.provider.clone(),
                r.provider_model_id.clone(),
                r.base_url.clone(),
            );
            let Some(found) = self.by_rung.get(&key) else {
                continue;
            };
            for (cap, supported) in found {
                let has = r.caps.iter().any(|c| c == cap);
                if *supported && !has {
                    r.caps.push(cap.clone());
                } else if !supported && has {
                    r.caps.retain(|c| c != cap);
                }
            }
        }
    }
}

pub async fn load(db: &Db) -> anyhow::Result<Probes> {
    let rows = sqlx::query(
        "SELECT provider, provider_model_id, base_url, capability, supported, probed_at FROM rung_probes",
    )
    .fetch_all(&db.pool)
    .await?;
    let mut p = Probes {
        rows: rows.len(),
        ..Probes::default()
    };
    for row in rows {
        p.watermark = p.watermark.max(row.get::<i64, _>("probed_at"));
        p.by_rung
            .entry((
                row.get("provider"),
                row.get("provider_model_id"),
                row.get("base_url"),
            ))
            .or_default()
            .push((row.get("capability"), row.get::<i64, _>("supported") != 0));
    }
    Ok(p)
}

/// Stores verdicts (replacing earlier ones for the same rung and capability).
pub async fn record(db: &Db, verdicts: &[Verdict]) -> anyhow::Result<()> {
    let now = now_ms();
    let mut tx = db.pool.begin().await?;
    for v in verdicts {
        sqlx::query(
            "INSERT INTO rung_probes (provider, provider_model_id, base_url, capability, supported, status, probed_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (provider, provider_model_id, base_url, capability) DO UPDATE SET \
             supported = excluded.supported, status = excluded.status, probed_at = excluded.probed_at",
        )
        .bind(&v.provider)
        .bind(&v.provider_model_id)
        .bind(&v.base_url)
        .bind(&v.capability)
        .bind(v.supported as i64)
        .bind(v.status as i64)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
