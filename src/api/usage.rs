//! Usage reads for a key's org: per-request events (newest first, cursor
//! pagination), daily rollups grouped by day, model or member, the catalog as the
//! org resolves it, and a key's effective guardrails. An `org_id` that is not the
//! key's own org answers 404, as if it did not exist. The web app serves the same
//! reads for a member's session (`events_page`, `daily_rollup` over a [`Reader`]),
//! where `scope=self` works too.

use super::respond::{json, ApiResult, Failure};
use super::{Authed, Shared};
use crate::error::Error;
use crate::money::micro_to_usd;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::{json as j, Value};
use sluice_filters::{ApiError, ErrorCode};
use sqlx::Row;

/// The query every usage read takes.
#[derive(Deserialize, Default)]
pub(crate) struct Scope {
    pub(crate) org_id: Option<String>,
    pub(crate) scope: Option<String>,
    pub(crate) group_by: Option<String>,
    pub(crate) limit: Option<String>,
    pub(crate) cursor: Option<String>,
}

/// Whose usage a read covers: an org's, or (`scope=self`, web sessions only) the
/// requests of the keys one member minted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reader<'a> {
    pub(crate) org_id: &'a str,
    pub(crate) member: Option<&'a str>,
}

fn no_org() -> Failure {
    Failure(ApiError::new(ErrorCode::NotFound, "No such organization."))
}

/// The org the read is about: the key's own; another org is 404.
fn own_org<'a>(q: &'a Scope, caller_org: &'a str) -> Result<&'a str, Failure> {
    if let Some(o) = &q.org_id {
        if o != caller_org {
            return Err(no_org());
        }
    }
    match q.scope.as_deref() {
        None | Some("org") => Ok(caller_org),
        Some("self") => Err(Failure(
            ApiError::new(
                ErrorCode::InvalidParameter,
                "scope=self needs a signed-in member session; an API key reads scope=org.",
            )
            .param("scope"),
        )),
        Some(_) => Err(Failure(
            ApiError::new(ErrorCode::InvalidParameter, "scope must be org.").param("scope"),
        )),
    }
}

/// The reader of a member's session: the session's org (another org is 404), and
/// `scope=self` for the member's own keys or `scope=org` (the default).
pub(crate) fn session_reader<'a>(
    q: &'a Scope,
    org_id: &'a str,
    user_id: &'a str,
) -> Result<Reader<'a>, Failure> {
    if q.org_id.as_deref().is_some_and(|o| o != org_id) {
        return Err(no_org());
    }
    match q.scope.as_deref() {
        None | Some("org") => Ok(Reader {
            org_id,
            member: None,
        }),
        Some("self") => Ok(Reader {
            org_id,
            member: Some(user_id),
        }),
        Some(_) => Err(Failure(
            ApiError::new(ErrorCode::InvalidParameter, "scope must be self or org.").param("scope"),
        )),
    }
}

fn limit(q: &Scope) -> Result<i64, Failure> {
    match q.limit.as_deref() {
        None => Ok(50),
        Some(l) => l
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=500).contains(n))
            .ok_or_else(|| {
                Failure(
                    ApiError::new(
                        ErrorCode::InvalidParameter,
                        "limit must be an integer from 1 to 500.",
                    )
                    .param("limit"),
                )
            }),
    }
}

/// The events of a reader's scope: the member's keys when it is a member's.
fn scope_filter(reader: &Reader<'_>, param: usize) -> String {
    match reader.member {
        Some(_) => {
            format!(" AND e.key_id IN (SELECT k2.id FROM api_keys k2 WHERE k2.user_id = ${param})")
        }
        None => String::new(),
    }
}

/// `GET /api/gateway/usage/events`: one entry per request, newest first.
pub(crate) async fn events(
    Authed(c): Authed,
    State(state): State<Shared>,
    Query(q): Query<Scope>,
) -> ApiResult {
    let org = own_org(&q, &c.org.id)?;
    let reader = Reader {
        org_id: org,
        member: None,
    };
    Ok(json(
        http::StatusCode::OK,
        &events_page(&state, reader, &q).await?,
    ))
}

/// A page of a reader's events, newest first (`cursor`: the last id of the page
/// before).
pub(crate) async fn events_page(
    state: &Shared,
    reader: Reader<'_>,
    q: &Scope,
) -> Result<Value, Failure> {
    let n = limit(q)?;
    let sql = format!(
        "SELECT e.id, e.key_id, e.route, e.model, e.rung, e.lane, e.input_tokens, e.cached_tokens, \
         e.output_tokens, e.reasoning_tokens, e.cost_micro_usd, e.status, e.error_class, e.incomplete, \
         e.attempts, e.empty_attempts, e.latency_ms, e.created_at, e.cache_write_tokens, e.web_search_requests, \
         e.batch, e.estimated FROM usage_events e WHERE e.org_id = $1 AND e.id < $2{} ORDER BY e.id DESC LIMIT $3",
        scope_filter(&reader, 4)
    );
    let mut query = sqlx::query(&sql)
        .bind(reader.org_id)
        // Ids are ordered by creation time: "~" sorts after every id.
        .bind(q.cursor.as_deref().unwrap_or("~"))
        .bind(n + 1);
    if let Some(member) = reader.member {
        query = query.bind(member);
    }
    let rows = query
        .fetch_all(&state.db.pool)
        .await
        .map_err(Error::db("usage reads"))?;
    let has_more = rows.len() as i64 > n;
    let data: Vec<Value> = rows
        .iter()
        .take(n as usize)
        .map(|r| {
            j!({
                "id": r.get::<String, _>("id"),
                "api_key_id": r.get::<String, _>("key_id"),
                "route": r.get::<String, _>("route"),
                "model": r.get::<String, _>("model"),
                "provider": r.get::<Option<String>, _>("rung"),
                "lane": r.get::<String, _>("lane"),
                "input_tokens": r.get::<i64, _>("input_tokens"),
                "cached_tokens": r.get::<i64, _>("cached_tokens"),
                "cache_write_tokens": r.get::<i64, _>("cache_write_tokens"),
                "web_search_requests": r.get::<i64, _>("web_search_requests"),
                "output_tokens": r.get::<i64, _>("output_tokens"),
                "reasoning_tokens": r.get::<i64, _>("reasoning_tokens"),
                "cost_usd": micro_to_usd(r.get::<i64, _>("cost_micro_usd")),
                "status": r.get::<i64, _>("status"),
                "error_class": r.get::<Option<String>, _>("error_class"),
                "incomplete": r.get::<i64, _>("incomplete") != 0,
                // The provider reported no usage: the tokens are the gateway's count.
                "estimated": r.get::<i64, _>("estimated") != 0,
                "attempts": r.get::<String, _>("attempts"),
                "empty_attempts": r.get::<i64, _>("empty_attempts"),
                "latency_ms": r.get::<i64, _>("latency_ms"),
                "created_at": r.get::<i64, _>("created_at"),
                // Served as a line of a /v1/batches batch.
                "batch": r.get::<i64, _>("batch") != 0,
            })
        })
        .collect();
    let next = if has_more {
        data.last()
            .and_then(|d| d["id"].as_str())
            .map(str::to_string)
    } else {
        None
    };
    Ok(j!({"object": "list", "data": data, "has_more": has_more, "next_cursor": next}))
}

/// `GET /api/gateway/usage/daily`: totals grouped by UTC day (default), model or
/// member (who minted the key that made the calls; an operator's key stands for
/// itself).
pub(crate) async fn daily(
    Authed(c): Authed,
    State(state): State<Shared>,
    Query(q): Query<Scope>,
) -> ApiResult {
    let org = own_org(&q, &c.org.id)?;
    let reader = Reader {
        org_id: org,
        member: None,
    };
    Ok(json(
        http::StatusCode::OK,
        &daily_rollup(&state, reader, &q).await?,
    ))
}

/// A reader's totals grouped as `group_by` asks.
pub(crate) async fn daily_rollup(
    state: &Shared,
    reader: Reader<'_>,
    q: &Scope,
) -> Result<Value, Failure> {
    let (group, column) = match q.group_by.as_deref() {
        None | Some("day") => ("day", "e.created_at / 86400000"),
        Some("model") => ("model", "e.model"),
        Some("member") => ("member", "COALESCE(k.user_id, e.key_id)"),
        Some(_) => {
            return Err(Failure(
                ApiError::new(
                    ErrorCode::InvalidParameter,
                    "group_by must be day, model or member.",
                )
                .param("group_by"),
            ))
        }
    };
    let sql = format!(
        // Sums cast back to BIGINT: PostgreSQL widens SUM(BIGINT) to NUMERIC.
        "SELECT {column} AS k, COUNT(*) AS requests, \
         CAST(SUM(e.input_tokens) AS BIGINT) AS input_tokens, \
         CAST(SUM(e.cached_tokens) AS BIGINT) AS cached_tokens, \
         CAST(SUM(e.cache_write_tokens) AS BIGINT) AS cache_write_tokens, \
         CAST(SUM(e.web_search_requests) AS BIGINT) AS web_search_requests, \
         CAST(SUM(e.output_tokens) AS BIGINT) AS output_tokens, \
         CAST(SUM(e.cost_micro_usd) AS BIGINT) AS cost, MAX(u.email) AS email \
         FROM usage_events e LEFT JOIN api_keys k ON k.id = e.key_id \
         LEFT JOIN users u ON u.id = k.user_id WHERE e.org_id = $1{} \
         GROUP BY {column} ORDER BY {column}",
        scope_filter(&reader, 2)
    );
    let mut query = sqlx::query(&sql).bind(reader.org_id);
    if let Some(member) = reader.member {
        query = query.bind(member);
    }
    let rows = query
        .fetch_all(&state.db.pool)
        .await
        .map_err(Error::db("usage reads"))?;
    let data: Vec<Value> = rows
        .iter()
        .map(|r| {
            let key = if group == "day" {
                let day: i64 = r.get("k");
                Value::from(crate::time::day_string(day))
            } else {
                Value::from(r.get::<String, _>("k"))
            };
            let mut row = j!({
                group: key,
                "requests": r.get::<i64, _>("requests"),
                "input_tokens": r.get::<i64, _>("input_tokens"),
                "cached_tokens": r.get::<i64, _>("cached_tokens"),
                "cache_write_tokens": r.get::<i64, _>("cache_write_tokens"),
                "web_search_requests": r.get::<i64, _>("web_search_requests"),
                "output_tokens": r.get::<i64, _>("output_tokens"),
                "cost_usd": micro_to_usd(r.get::<i64, _>("cost")),
            });
            if group == "member" {
                row["email"] = j!(r.get::<Option<String>, _>("email"));
            }
            row
        })
        .collect();
    Ok(j!({"object": "list", "group_by": group, "data": data}))
}

/// `GET /api/gateway/catalog`: the models the org can call, each with its lane.
pub(crate) async fn catalog(
    Authed(c): Authed,
    State(state): State<Shared>,
    Query(q): Query<Scope>,
) -> ApiResult {
    let org = own_org(&q, &c.org.id)?;
    let snapshot = state.catalog.snapshot();
    let routing = state.byok.snapshot();
    let data: Vec<Value> = snapshot
        .visible(Some(org))
        .into_iter()
        .filter(|m| !m.spec.restricted || m.owner.is_some() || c.org.grants.contains(&m.spec.slug))
        .map(|m| {
            // The lane is the one the org's effective chain serves first: an
            // org chain that starts with a `byok:` rung is pass-through. A chain
            // the ZDR policy empties falls back to where the model itself lives.
            let first = crate::byok::active_route::effective(m, &c.org, &routing)
                .first()
                .map(|r| r.lane);
            let lane = match first {
                Some(l) => l.as_str(),
                None if m.owner.is_some() => "pass_through",
                None => "platform_funded",
            };
            j!({"alias": m.spec.slug, "kind": m.spec.kind, "lane": lane,
                "providers": m.default_chain()})
        })
        .collect();
    Ok(json(
        http::StatusCode::OK,
        &j!({"object": "list", "data": data}),
    ))
}

/// `GET /api/gateway/keys/{api_key_id}/limits`: a key's guardrails in force (its
/// own, else the platform default; null is uncapped), the platform defaults, and the
/// org's tier limits. A key of another org is 404.
pub(crate) async fn key_limits(
    Authed(c): Authed,
    State(state): State<Shared>,
    Path(id): Path<String>,
) -> ApiResult {
    let keys = crate::accounts::keys::list_for_org(&state.db, &c.org.id).await?;
    let k = keys
        .iter()
        .find(|k| k.id == id)
        .ok_or_else(|| Failure(ApiError::new(ErrorCode::NotFound, "No such API key.")))?;
    let billing = &state.config.billing;
    let g = crate::billing::gate::guardrails(k, billing);
    let d = &billing.key_defaults;
    let t = billing.tier(c.org.tier);
    Ok(json(
        http::StatusCode::OK,
        &j!({
            "api_key_id": k.id,
            "daily_spend_cap_usd": g.daily_spend_cap_micro_usd.map(micro_to_usd),
            "requests_per_minute": g.rpm,
            "tokens_per_minute": g.tpm,
            "platform_defaults": {
                "daily_spend_cap_usd": d.daily_spend_cap_usd,
                "requests_per_minute": d.rpm,
                "tokens_per_minute": d.tpm,
            },
            "org_tier": {
                "tier": c.org.tier,
                "requests_per_minute": t.requests_per_minute,
                "tokens_per_minute": t.tokens_per_minute,
                "tokens_per_hour": t.tokens_per_hour,
                "tokens_per_day": t.tokens_per_day,
            },
        }),
    ))
}
