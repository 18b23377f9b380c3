//! A model's active route for one org: the rungs in the order they are tried, each
//! with its lane. The default chain is the catalog's platform rungs; an org's
//! override (PUT /api/models/{slug}/waterfall) reorders them and places its own
//! connections (`byok:<connection_id>`) anywhere; an org's own model is served by
//! its own deployments. The require-ZDR policy keeps fail-over off platform rungs
//! without zero-retention terms.

use super::store::{Live, Routing};
use crate::accounts::orgs::OrgRecord;
use crate::catalog::{Model, RungSpec};
use sha2::{Digest, Sha256};
use sluice_filters::ApiError;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The org's credit balance pays.
    Platform,
    /// The org's own provider account pays the provider directly.
    PassThrough,
}

impl Lane {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Lane::Platform => "platform_funded",
            Lane::PassThrough => "pass_through",
        }
    }
}

/// One rung of a route.
#[derive(Clone, Debug)]
pub(crate) struct RouteRung {
    /// The rung id clients see: `<provider>:<model id>` or `byok:<connection_id>`.
    pub(crate) id: Arc<str>,
    pub(crate) spec: Arc<RungSpec>,
    pub(crate) lane: Lane,
    /// The org's account that authenticates the call (BYOK and org deployments);
    /// `None` on a platform rung, or an org deployment that needs no key.
    pub(crate) account: Option<Arc<Live>>,
}

impl RouteRung {
    pub(crate) fn is_platform(&self) -> bool {
        self.lane == Lane::Platform
    }
}

const BYOK: &str = "byok:";

/// The rung a connection becomes for a model: the provider's model id is the
/// connection's mapping for the slug, else the model's own id at that provider.
pub(crate) fn byok_rung(model: &Model, live: &Arc<Live>) -> Option<RouteRung> {
    let c = &live.conn;
    let same = model.spec.rungs.iter().find(|r| r.provider == c.provider);
    let model_id = c
        .model_for(&model.spec.slug)
        .map(str::to_string)
        .or_else(|| same.map(|r| r.provider_model_id.clone()))?;
    let caps = same
        .or(model.spec.rungs.first())
        .map(|r| r.caps.clone())
        .unwrap_or_default();
    Some(RouteRung {
        id: Arc::from(format!("{BYOK}{}", c.id)),
        spec: Arc::new(RungSpec {
            provider: c.provider.clone(),
            provider_model_id: model_id,
            base_url: c.base_url().to_string(),
            zdr: false,
            caps,
        }),
        lane: Lane::PassThrough,
        account: Some(live.clone()),
    })
}

/// The model's default rungs for the org: platform rungs, or the org's own
/// deployments (each authenticated by the org's first account of its provider).
pub(crate) fn default_rungs(model: &Model, org_id: &str, routing: &Routing) -> Vec<RouteRung> {
    let own = model.owner.as_deref() == Some(org_id);
    model
        .shared_rungs
        .iter()
        .map(|(id, r)| RouteRung {
            id: id.clone(),
            spec: r.clone(),
            lane: if own {
                Lane::PassThrough
            } else {
                Lane::Platform
            },
            account: own
                .then(|| routing.first_for(org_id, &r.provider).cloned())
                .flatten(),
        })
        .collect()
}

/// The route before the org's policy: the override when there is one (ids that no
/// longer resolve are skipped), else the default.
pub(crate) fn chain(model: &Model, org: &OrgRecord, routing: &Routing) -> Vec<RouteRung> {
    let defaults = default_rungs(model, &org.id, routing);
    let Some(ids) = routing.waterfall(&org.id, &model.spec.slug) else {
        return defaults;
    };
    ids.iter()
        .filter_map(|id| resolve(id, model, &org.id, routing, &defaults))
        .collect()
}

fn resolve(
    id: &str,
    model: &Model,
    org_id: &str,
    routing: &Routing,
    defaults: &[RouteRung],
) -> Option<RouteRung> {
    match id.strip_prefix(BYOK) {
        Some(conn) => byok_rung(model, routing.connection(org_id, conn)?),
        None => defaults.iter().find(|r| &*r.id == id).cloned(),
    }
}

/// The route requests are served on: the chain, with non-ZDR platform rungs left
/// out under the org's require-ZDR policy.
pub(crate) fn effective(model: &Model, org: &OrgRecord, routing: &Routing) -> Vec<RouteRung> {
    let mut rungs = chain(model, org, routing);
    if org.require_zdr {
        rungs.retain(|r| !r.is_platform() || r.spec.zdr);
    }
    rungs
}

/// The opaque per-request route handle of a rung, bound to the org and model (a
/// handle of another org never resolves).
pub(crate) fn route_id(org_id: &str, slug: &str, rung_id: &str) -> String {
    let mut h = Sha256::new();
    for part in ["sluice-route", org_id, slug, rung_id] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    format!("rt_{}", &hex::encode(h.finalize())[..24])
}

/// Validates an org's new chain for a model; returns it as stored.
pub(crate) fn check_chain(
    ids: &[String],
    model: &Model,
    org_id: &str,
    routing: &Routing,
) -> Result<Vec<String>, ApiError> {
    let param = "model_provider_ids";
    if ids.is_empty() || ids.len() > 32 {
        return Err(ApiError::invalid_parameter(
            param,
            "model_provider_ids must list 1 to 32 rung ids",
        ));
    }
    let defaults = default_rungs(model, org_id, routing);
    let mut last_platform: Option<usize> = None;
    let mut seen = std::collections::HashSet::new();
    let mut own = 0;
    for id in ids {
        if !seen.insert(id.as_str()) {
            return Err(ApiError::invalid_parameter(
                param,
                format!("{id:?} appears twice"),
            ));
        }
        if let Some(conn) = id.strip_prefix(BYOK) {
            let live = routing.connection(org_id, conn).ok_or_else(|| {
                ApiError::invalid_parameter(
                    param,
                    format!("{id:?} is not a connection of this organization"),
                )
            })?;
            if byok_rung(model, live).is_none() {
                return Err(ApiError::invalid_parameter(
                    param,
                    format!(
                        "{id:?} ({}) cannot serve {}: map it in the connection's config.models",
                        live.conn.provider, model.spec.slug
                    ),
                ));
            }
            own += 1;
            continue;
        }
        let Some(pos) = defaults.iter().position(|r| *r.id == **id) else {
            return Err(ApiError::invalid_parameter(
                param,
                format!("{id:?} is not a rung of {}", model.spec.slug),
            ));
        };
        if defaults[pos].is_platform() {
            if last_platform.is_some_and(|p| p > pos) {
                return Err(ApiError::invalid_parameter(
                    param,
                    "platform rungs keep their default order relative to each other",
                ));
            }
            last_platform = Some(pos);
        } else {
            own += 1;
        }
    }
    if model.owner.is_none() && own == 0 {
        return Err(ApiError::invalid_parameter(
            param,
            "on a shared model the chain must include one of the organization's own connections (byok:<connection_id>)",
        ));
    }
    Ok(ids.to_vec())
}
