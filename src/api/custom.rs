//! An org's own models: `POST /api/models` creates one (its deployments are the
//! org's own endpoints: pass-through lane, cost 0), `POST /api/models/{slug}/providers`
//! adds a deployment to it, or, on a public model with `provider: "local"`, makes the
//! org's local variant: its own row of the same slug, served by its own server, for
//! it alone. Rows live only in the database; every instance's
//! catalog snapshot picks them up within a second (this one at once).

use super::respond::{json, parse_body, ApiResult, Failure};
use super::{Authed, Shared};
use crate::catalog::model::{FreeAllowance, ModelKind, ModelSpec, Price, Requires};
use crate::catalog::RungSpec;
use crate::error::Error;
use crate::store::now_ms;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use bytes::Bytes;
use serde::Deserialize;
use sluice_filters::{ApiError, ErrorCode};

/// Capabilities an org deployment is assumed to have unless it says otherwise.
const DEFAULT_CAPS: [&str; 4] = ["json_object", "json_schema", "sampling", "tools"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Deployment {
    provider: String,
    provider_model_id: String,
    #[serde(default)]
    base_url: String,
    caps: Option<Vec<String>>,
}

impl Deployment {
    fn rung(self) -> RungSpec {
        RungSpec {
            provider: self.provider,
            provider_model_id: self.provider_model_id,
            base_url: self.base_url,
            zdr: false,
            caps: self
                .caps
                .unwrap_or_else(|| DEFAULT_CAPS.iter().map(|c| c.to_string()).collect()),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewModel {
    slug: String,
    display_name: String,
    providers: Vec<Deployment>,
    context_window: Option<u64>,
    max_input_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
    modalities: Option<Vec<String>>,
    supported_params: Option<Vec<String>>,
    category: Option<String>,
}

fn invalid(field: &'static str, why: String) -> Failure {
    let param = match field {
        "provider" | "provider_model_id" | "base_url" | "caps" => "providers",
        f => f,
    };
    Failure(ApiError::invalid_parameter(param, why))
}

/// Where a deployment points, checked before it is stored: a base URL an org names
/// must obey the network rule, and a provider with no public endpoint (local,
/// hosted, azure) needs one: the operator's own endpoint is never an org's.
async fn check_deployment(state: &Shared, rung: &RungSpec, param: String) -> Result<(), Failure> {
    let refused = |why: String| {
        Failure(
            ApiError::new(ErrorCode::InvalidParameter, format!("{param} {why}"))
                .param(param.clone()),
        )
    };
    if rung.base_url.is_empty() {
        if !crate::config::has_public_endpoint(&rung.provider) {
            return Err(refused(format!(
                "is required: provider {:?} has no public endpoint, so a deployment of it names its own",
                rung.provider
            )));
        }
        return Ok(());
    }
    let allow = state.config.network.allow_private_upstreams;
    crate::upstream::egress::check_org_url(&rung.base_url, allow)
        .await
        .map_err(refused)
}

/// Writes a model row. A new one is inserted only while the org holds fewer than
/// `[limits] custom_models_per_org` (one statement: two creations at once on
/// SQLite cannot both pass; on PostgreSQL each sees the other only once it has
/// committed, so the cap can be passed by at most the creations that race).
async fn store(state: &Shared, org_id: &str, spec: &ModelSpec, new: bool) -> Result<(), Failure> {
    let text = serde_json::to_string(spec).map_err(|_| Failure(ApiError::internal()))?;
    let now = now_ms();
    let cap = state.config.limits.custom_models_per_org as i64;
    let q = if new {
        sqlx::query(
            "INSERT INTO models (owner, slug, spec, created_at, updated_at) \
             SELECT $1, $2, $3, $4, $4 WHERE (SELECT COUNT(*) FROM models WHERE owner = $1) < $5",
        )
    } else {
        sqlx::query("UPDATE models SET spec = $3, updated_at = $4 WHERE owner = $1 AND slug = $2")
    };
    let q = q.bind(org_id).bind(&spec.slug).bind(text).bind(now);
    let q = if new { q.bind(cap) } else { q };
    let done = q.execute(&state.db.pool).await.map_err(|e| match e {
        sqlx::Error::Database(d) if d.is_unique_violation() => {
            Failure(ApiError::invalid_parameter(
                "slug",
                "this organization already has a model with this slug",
            ))
        }
        e => Failure(Error::db("custom models")(e).into()),
    })?;
    if new && done.rows_affected() == 0 {
        return Err(over_models(cap));
    }
    if let Err(e) = state.catalog.reload_org(&state.db, org_id).await {
        tracing::warn!(error = %e, "catalog reload after a model write failed; the poll will catch up");
    }
    Ok(())
}

fn over_models(cap: i64) -> Failure {
    Failure(ApiError::new(
        ErrorCode::InvalidRequest,
        format!(
            "This organization has {cap} models, the most it may create ([limits] custom_models_per_org); add deployments to one of them instead."
        ),
    ))
}

/// Refuses a model with more deployments than `[limits] deployments_per_model`.
fn check_deployment_count(state: &Shared, spec: &ModelSpec) -> Result<(), Failure> {
    let cap = state.config.limits.deployments_per_model;
    if spec.rungs.len() > cap {
        return Err(Failure(ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "A model may have at most {cap} deployments ([limits] deployments_per_model); this one would have {}.",
                spec.rungs.len()
            ),
        )));
    }
    Ok(())
}

pub(crate) async fn create(
    Authed(c): Authed,
    State(state): State<Shared>,
    body: Bytes,
) -> ApiResult {
    let m: NewModel = parse_body(&body)?;
    let context_window = m.context_window.unwrap_or(128_000);
    let spec = ModelSpec {
        slug: m.slug,
        display_name: m.display_name,
        kind: ModelKind::Chat,
        owned_by: c.org.id.clone(),
        context_window,
        max_input_tokens: m.max_input_tokens.unwrap_or(context_window),
        modalities: m.modalities.unwrap_or_else(|| vec!["text".into()]),
        supported_params: m.supported_params.unwrap_or_default(),
        pinned: Default::default(),
        price: Price::default(),
        category: m.category.unwrap_or_else(|| "custom".into()),
        max_output_tokens: m.max_output_tokens.unwrap_or(4_096),
        regions: vec!["*".into()],
        restricted: false,
        requires: Requires::None,
        free: FreeAllowance::default(),
        rungs: m.providers.into_iter().map(Deployment::rung).collect(),
    };
    check_deployment_count(&state, &spec)?;
    spec.validate().map_err(|(f, why)| invalid(f, why))?;
    let held = state
        .catalog
        .snapshot()
        .by_org
        .get(&c.org.id)
        .map_or(0, |m| m.len());
    if held >= state.config.limits.custom_models_per_org {
        return Err(over_models(
            state.config.limits.custom_models_per_org as i64,
        ));
    }
    if state.catalog.snapshot().public.contains_key(&spec.slug) {
        return Err(Failure(ApiError::invalid_parameter(
            "slug",
            "this slug belongs to a catalog model; choose another",
        )));
    }
    for (i, r) in spec.rungs.iter().enumerate() {
        check_deployment(&state, r, format!("providers[{i}].base_url")).await?;
    }
    store(&state, &c.org.id, &spec, true).await?;
    let catalog = state.catalog.snapshot();
    let row = catalog
        .lookup(Some(&c.org.id), &spec.slug)
        .map(|m| m.row_json())
        .unwrap_or_default();
    Ok(json(StatusCode::CREATED, &row))
}

/// A public model as the org's own row of the same slug, to be served by the org's
/// local server: the model's facts (window, modalities, parameters, pins) are
/// kept; its platform rungs, prices and gates are not (the org's own lane costs
/// nothing and gates nothing). The row shadows the public model for that org
/// alone, and counts against `[limits] custom_models_per_org`.
fn local_variant(public: &ModelSpec) -> ModelSpec {
    ModelSpec {
        price: Price::default(),
        regions: vec!["*".into()],
        restricted: false,
        requires: Requires::None,
        free: FreeAllowance::default(),
        rungs: Vec::new(),
        ..public.clone()
    }
}

/// Adds a deployment (an endpoint) to one of the org's models, or makes a local
/// variant of a public one (`provider: "local"`).
pub(crate) async fn add_deployment(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path(slug): Path<String>,
    body: Bytes,
) -> ApiResult {
    let d: Deployment = parse_body(&body)?;
    let (mut spec, new) = {
        let catalog = state.catalog.snapshot();
        match catalog.lookup(Some(&c.org.id), &slug) {
            Some(m) if m.owner.as_deref() == Some(c.org.id.as_str()) => (m.spec.clone(), false),
            Some(m) if d.provider == "local" => (local_variant(&m.spec), true),
            Some(_) => {
                return Err(Failure(ApiError::invalid_parameter(
                    "providers",
                    "a catalog model takes a local variant (provider \"local\", the org's own server) here; other providers reach it through your provider connections and its waterfall",
                )))
            }
            None => {
                return Err(Failure(ApiError::new(
                    ErrorCode::NotFound,
                    format!("No model with slug {:?}.", slug.chars().take(128).collect::<String>()),
                )))
            }
        }
    };
    let rung = d.rung();
    if spec
        .rungs
        .iter()
        .any(|r| r.id() == rung.id() && r.base_url == rung.base_url)
    {
        return Err(Failure(ApiError::invalid_parameter(
            "provider_model_id",
            "the model already has this deployment",
        )));
    }
    spec.rungs.push(rung);
    check_deployment_count(&state, &spec)?;
    spec.validate().map_err(|(f, why)| invalid(f, why))?;
    let added = spec.rungs.last().expect("just pushed");
    check_deployment(&state, added, "base_url".into()).await?;
    store(&state, &c.org.id, &spec, new).await?;
    let catalog = state.catalog.snapshot();
    let row = catalog
        .lookup(Some(&c.org.id), &slug)
        .map(|m| m.row_json())
        .unwrap_or_default();
    Ok(json(StatusCode::CREATED, &row))
}
