//! The models pages: the catalog with the filters of `GET /api/models` (and a
//! text search), and a model's page: its deployments, prices, the retention
//! verdict of the org's route, and the org's waterfall, ordered with up and down
//! buttons (or by dragging, with the script) through the same checks as
//! `PUT /api/models/{slug}/waterfall`.
//!
//! Both are open to visitors, as `/api/models` is: they see the public catalog with
//! its prices, deployments and retention verdicts; a signed-in member also sees the
//! org's own models, its verdicts and its waterfall.

use super::{org, shell, status_of, visitor_shell, with_status};
use crate::accounts::orgs::OrgRecord;
use crate::api::byok::{reset_waterfall, set_waterfall, waterfall_json};
use crate::api::models::org_verdict;
use crate::byok::{active_route, connections};
use crate::catalog::query::ListQuery;
use crate::catalog::{Model, Retention};
use crate::web::session::{checked_form, PageMember, PageVisitor};
use crate::web::WebShared;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::{json as j, Value};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

const PAGE_SIZE: usize = 50;

/// The filters the page passes to the catalog query, as the form names them.
const FILTERS: [&str; 6] = [
    "modality",
    "category",
    "provider",
    "min_context",
    "retention",
    "sort",
];

pub(crate) async fn list(
    State(web): State<WebShared>,
    PageVisitor(m): PageVisitor,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let org = match &m {
        Some(m) => match org(&web, m).await {
            Ok(o) => Some(o),
            Err(r) => return r,
        },
        None => None,
    };
    let page: usize = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(0);
    let mut query: HashMap<String, String> = FILTERS
        .iter()
        .filter_map(|f| {
            let v = q.get(*f)?.trim();
            (!v.is_empty()).then(|| (f.to_string(), v.to_string()))
        })
        .collect();
    // The page takes the price in USD per million tokens; the query, micro-USD.
    let mut bad_price = false;
    if let Some(usd) = q
        .get("max_input_usd")
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
    {
        match usd.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => {
                query.insert(
                    "max_input_price".into(),
                    ((v * 1e6).round() as u64).to_string(),
                );
            }
            _ => bad_price = true,
        }
    }
    query.insert("limit".into(), PAGE_SIZE.to_string());
    query.insert("offset".into(), (page * PAGE_SIZE).to_string());
    let mut ctx = match (&m, &org) {
        (Some(m), Some(org)) => shell(&web, m, org, "models", "Models", None),
        _ => visitor_shell(&web, "models", "Models"),
    };
    let parsed = if bad_price {
        Err(sluice_filters::ApiError::invalid_parameter(
            "max_input_usd",
            "The maximum input price is a number of USD per million tokens.",
        ))
    } else {
        ListQuery::parse(&query)
    };
    let catalog = web.app.catalog.snapshot();
    let routing = web.app.byok.snapshot();
    // A member sees the org's verdict (its order, its ZDR policy); a visitor
    // the catalog's.
    let verdict = |m: &Model| match &org {
        Some(org) => org_verdict(m, org, &routing),
        None => m.retention,
    };
    let visible = catalog.visible(org.as_ref().map(|o| o.id.as_str()));
    let (mut categories, mut providers, mut modalities) =
        (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for mdl in &visible {
        categories.insert(mdl.spec.category.clone());
        modalities.extend(mdl.spec.modalities.iter().cloned());
        providers.extend(mdl.spec.rungs.iter().map(|r| r.provider.clone()));
    }
    categories.remove("");
    let search = q
        .get("q")
        .map(|s| s.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let searched: Vec<&Arc<Model>> = visible
        .into_iter()
        .filter(|mdl| {
            search.is_empty()
                || mdl.spec.slug.to_ascii_lowercase().contains(&search)
                || mdl.spec.display_name.to_ascii_lowercase().contains(&search)
        })
        .collect();
    match parsed {
        Ok(lq) => {
            let (rows, total) = lq.apply(searched, &verdict);
            let rows: Vec<Value> = rows
                .iter()
                .map(|mdl| {
                    let s = &mdl.spec;
                    j!({
                        "slug": s.slug, "name": s.display_name, "maker": s.owned_by,
                        "category": s.category, "context": s.context_window,
                        "input": s.price.input, "output": s.price.output,
                        "retention": verdict(mdl).map(Retention::as_str),
                        "custom": mdl.owner.is_some(),
                        "kind": s.kind,
                    })
                })
                .collect();
            ctx["models"] = j!(rows);
            ctx["total"] = j!(total);
            ctx["page"] = j!(page);
            ctx["has_next"] = j!((page + 1) * PAGE_SIZE < total);
        }
        Err(e) => {
            ctx["models"] = j!([]);
            ctx["total"] = j!(0);
            ctx["error"] = j!(e.message);
        }
    }
    let mut shown: HashMap<&str, &str> = HashMap::new();
    for f in FILTERS.iter().copied().chain(["q", "max_input_usd"]) {
        if let Some(v) = q.get(f) {
            shown.insert(f, v.as_str());
        }
    }
    // The query of the current filters, for the pager's links.
    let mut keep = form_urlencoded::Serializer::new(String::new());
    for (k, v) in &shown {
        if !v.is_empty() {
            keep.append_pair(k, v);
        }
    }
    ctx["filters"] = j!(shown);
    ctx["keep"] = j!(keep.finish());
    ctx["options"] = j!({
        "categories": categories, "providers": providers, "modalities": modalities,
        "retention": ["zdr_all_rungs", "zdr_enforceable", "not_zdr"],
        "sort": [["", "Name"], ["input_price", "Input price, low first"],
                 ["-input_price", "Input price, high first"],
                 ["output_price", "Output price, low first"],
                 ["-context_window", "Context, largest first"], ["-created", "Newest"]],
    });
    web.templates.page("models.html", &ctx).into_response()
}

/// What the page says of a rung id: its provider, model id, terms and lane.
fn describe(
    id: &str,
    model: &Model,
    org: &OrgRecord,
    routing: &crate::byok::Routing,
    conns: &HashMap<String, connections::Connection>,
) -> Value {
    if let Some(conn_id) = id.strip_prefix("byok:") {
        let alias = conns.get(conn_id).map(|c| c.setup_alias.clone());
        let rung = routing
            .connection(&org.id, conn_id)
            .and_then(|live| active_route::byok_rung(model, live));
        return j!({
            "id": id,
            "label": alias.map_or_else(|| "a deleted connection".to_string(), |a| format!("Your {} account \u{201c}{a}\u{201d}", rung.as_ref().map_or("", |r| r.spec.provider.as_str()))),
            "provider": rung.as_ref().map(|r| r.spec.provider.clone()),
            "provider_model_id": rung.as_ref().map(|r| r.spec.provider_model_id.clone()),
            "lane": "pass_through",
            "zdr": Value::Null,
            "own": true,
        });
    }
    let rung = model.spec.rungs.iter().find(|r| r.id() == id);
    j!({
        "id": id,
        "label": rung.map_or_else(|| id.to_string(), |r| format!("{} (platform)", r.provider)),
        "provider": rung.map(|r| r.provider.clone()),
        "provider_model_id": rung.map(|r| r.provider_model_id.clone()),
        "lane": if model.owner.is_some() { "pass_through" } else { "platform_funded" },
        "zdr": rung.map(|r| r.zdr),
        "own": model.owner.is_some(),
    })
}

async fn render_model(
    web: &WebShared,
    m: &PageMember,
    slug: &str,
    notice: Option<&str>,
    error: Option<String>,
    status: StatusCode,
) -> Response {
    let org = match org(web, m).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let conns = match connections::list(&web.app.db, &org.id).await {
        Ok(c) => c,
        Err(e) => return crate::api::respond::Failure(e).into_response(),
    };
    let catalog = web.app.catalog.snapshot();
    let Some(model) = catalog.lookup(Some(&org.id), slug) else {
        return super::not_found(web);
    };
    let routing = web.app.byok.snapshot();
    let read = match waterfall_json(&web.app, &org, slug) {
        Ok(v) => v,
        Err(f) => return f.into_response(),
    };
    let ids = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let current = if read["override"].is_array() {
        ids(&read["override"])
    } else {
        ids(&read["default"])
    };
    let effective = ids(&read["effective"]);
    let by_id: HashMap<String, connections::Connection> =
        conns.iter().map(|c| (c.id.clone(), c.clone())).collect();
    let info = |id: &str| describe(id, model, &org, &routing, &by_id);
    // What can join the chain: platform rungs not in it, and the org's accounts
    // that can serve this model.
    let mut addable: Vec<Value> = ids(&read["default"])
        .into_iter()
        .filter(|id| !current.contains(id))
        .map(|id| info(&id))
        .collect();
    for c in &conns {
        let id = format!("byok:{}", c.id);
        let serves = routing
            .connection(&org.id, &c.id)
            .is_some_and(|live| active_route::byok_rung(model, live).is_some());
        if serves && !current.contains(&id) {
            addable.push(info(&id));
        }
    }
    let mut ctx = shell(web, m, &org, "models", &model.spec.display_name, notice);
    ctx["model"] = model_json(model, org_verdict(model, &org, &routing));
    ctx["deployments"] = deployments_json(model);
    ctx["chain"] = j!(current.iter().map(|id| info(id)).collect::<Vec<_>>());
    ctx["is_override"] = j!(read["override"].is_array());
    ctx["effective"] = j!(effective.iter().map(|id| info(id)).collect::<Vec<_>>());
    ctx["effective_differs"] = j!(effective != current);
    ctx["addable"] = j!(addable);
    ctx["has_connections"] = j!(!conns.is_empty());
    ctx["require_zdr"] = j!(org.require_zdr);
    ctx["error"] = j!(error);
    with_status(status, web.templates.page("model.html", &ctx))
}

pub(crate) async fn one(
    State(web): State<WebShared>,
    PageVisitor(m): PageVisitor,
    Path(slug): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let notice = q.get("notice").map(String::as_str);
    match m {
        Some(m) => render_model(&web, &m, &slug, notice, None, StatusCode::OK).await,
        None => public_model(&web, &slug),
    }
}

/// A model's page for a visitor: the public model, its prices, deployments and
/// the catalog's retention verdict; no waterfall (that is an org's).
fn public_model(web: &WebShared, slug: &str) -> Response {
    let catalog = web.app.catalog.snapshot();
    let Some(model) = catalog.lookup(None, slug) else {
        return super::not_found(web);
    };
    let mut ctx = visitor_shell(web, "models", &model.spec.display_name);
    ctx["model"] = model_json(model, model.retention);
    ctx["deployments"] = deployments_json(model);
    web.templates.page("model.html", &ctx).into_response()
}

/// The model's facts as the page shows them.
fn model_json(model: &Model, retention: Option<Retention>) -> Value {
    let s = &model.spec;
    j!({
        "slug": s.slug, "name": s.display_name, "maker": s.owned_by, "kind": s.kind,
        "category": s.category, "context": s.context_window, "max_input": s.max_input_tokens,
        "max_output": s.max_output_tokens, "modalities": s.modalities,
        "params": s.supported_params, "custom": model.owner.is_some(),
        "restricted": s.restricted, "requires": s.requires,
        "price": {"input": s.price.input, "cached_input": s.price.cached_input,
                  "output": s.price.output, "cache_write": s.price.cache_write()},
        "retention": retention.map(Retention::as_str),
    })
}

fn deployments_json(model: &Model) -> Value {
    j!(model
        .spec
        .rungs
        .iter()
        .map(|r| j!({
            "id": r.id(), "provider": r.provider, "provider_model_id": r.provider_model_id,
            "zdr": r.zdr, "caps": r.caps,
        }))
        .collect::<Vec<_>>())
}

/// The chain a form asks for: its current `order`, with one move applied
/// (`move=up:<i>`, `move=down:<i>`, `remove=<i>`, `add` with `add_id=<rung id>`); a
/// plain save
/// takes the order as it is (the script reorders the fields when a rung is dragged).
fn requested_chain(form: &crate::web::session::Form) -> Vec<String> {
    let mut order = form.all("order");
    let at = |v: &str| v.parse::<usize>().ok().filter(|i| *i < order.len());
    if let Some((dir, i)) = form.get("move").split_once(':') {
        if let Some(i) = at(i) {
            match dir {
                "up" if i > 0 => order.swap(i, i - 1),
                "down" if i + 1 < order.len() => order.swap(i, i + 1),
                _ => {}
            }
        }
    } else if let Some(i) = at(form.get("remove")) {
        order.remove(i);
    } else if form.has("add") && !form.get("add_id").is_empty() {
        order.push(form.get("add_id").to_string());
    }
    order
}

/// `POST /models/{slug}/waterfall`: saves the org's chain through the checks of
/// `PUT /api/models/{slug}/waterfall`, or drops it (`reset`).
pub(crate) async fn waterfall(
    State(web): State<WebShared>,
    m: PageMember,
    Path(slug): Path<String>,
    body: Bytes,
) -> Response {
    let form = match checked_form(&m, &body) {
        Ok(f) => f,
        Err(r) => return r.into_response(),
    };
    let org = match org(&web, &m).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let done = if form.has("reset") {
        reset_waterfall(&web.app, &org, &slug)
            .await
            .map(|_| "waterfall_reset")
    } else {
        let chain = requested_chain(&form);
        set_waterfall(&web.app, &org, &slug, &chain)
            .await
            .map(|_| "waterfall_saved")
    };
    match done {
        Ok(notice) => {
            let path: String = form_urlencoded::byte_serialize(slug.as_bytes()).collect();
            Redirect::to(&format!("/models/{path}?notice={notice}#waterfall")).into_response()
        }
        Err(f) if f.0.status == 404 => super::not_found(&web),
        Err(f) => {
            let status = status_of(&f);
            render_model(&web, &m, &slug, None, Some(f.0.message.to_string()), status).await
        }
    }
}
