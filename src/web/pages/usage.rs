//! The usage page: the org's (or, `scope=self`, the member's own keys') spend per
//! day as a chart, totals by model and by member, the requests one page at a
//! time, and every request as CSV.

use super::overview::last_days;
use super::{org, shell};
use crate::api::respond::Failure;
use crate::api::usage::{self, Scope};
use crate::web::chart;
use crate::web::session::PageMember;
use crate::web::WebShared;
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::{json as j, Value};
use std::collections::HashMap;

/// Rows a CSV export holds at most (newest first).
const CSV_MAX_ROWS: usize = 50_000;

fn scope_of(q: &HashMap<String, String>) -> Scope {
    Scope {
        scope: Some(if q.get("scope").map(String::as_str) == Some("self") {
            "self".into()
        } else {
            "org".into()
        }),
        ..Scope::default()
    }
}

pub(crate) async fn page(
    State(web): State<WebShared>,
    m: PageMember,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let org = match org(&web, &m).await {
        Ok(o) => o,
        Err(r) => return r,
    };
    let scope = scope_of(&q);
    let s = &m.session;
    let reader = match usage::session_reader(&scope, &s.org_id, &s.user_id) {
        Ok(r) => r,
        Err(f) => return f.into_response(),
    };
    let by = |g: &str| Scope {
        group_by: Some(g.into()),
        ..Scope::default()
    };
    let events_q = Scope {
        limit: Some("25".into()),
        cursor: q.get("cursor").filter(|c| !c.is_empty()).cloned(),
        ..Scope::default()
    };
    let app = &web.app;
    let results = (
        usage::daily_rollup(app, reader, &by("day")).await,
        usage::daily_rollup(app, reader, &by("model")).await,
        usage::daily_rollup(app, reader, &by("member")).await,
        usage::events_page(app, reader, &events_q).await,
    );
    let (daily, models, members, events) = match results {
        (Ok(a), Ok(b), Ok(c), Ok(d)) => (a, b, c, d),
        (Err(e), ..) | (_, Err(e), ..) | (_, _, Err(e), _) | (.., Err(e)) => {
            return e.into_response()
        }
    };
    let days = last_days(&daily, 30, "cost_usd");
    let requests = last_days(&daily, 30, "requests");
    let mut ctx = shell(&web, &m, &org, "usage", "Usage", None);
    ctx["scope"] = j!(scope.scope);
    ctx["chart_cost"] = j!(chart::bars(
        &days,
        "Spend per day, last 30 days",
        false,
        &|v| { crate::web::render::usd(v) }
    ));
    ctx["chart_requests"] = j!(chart::bars(
        &requests,
        "Requests per day, last 30 days",
        true,
        &|v| crate::web::render::count(v.round() as i64)
    ));
    ctx["by_model"] = models["data"].clone();
    ctx["by_member"] = members["data"].clone();
    ctx["events"] = events["data"].clone();
    ctx["next_cursor"] = events["next_cursor"].clone();
    ctx["paged"] = j!(q.get("cursor").is_some_and(|c| !c.is_empty()));
    web.templates.page("usage.html", &ctx).into_response()
}

/// A CSV field, quoted when it needs to be; a leading `=`, `+`, `-` or `@` is
/// defused so a spreadsheet never runs a cell as a formula.
fn field(v: &Value) -> String {
    let text = match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let text = if text.starts_with(['=', '+', '@'])
        || (text.starts_with('-') && text.parse::<f64>().is_err())
    {
        format!("'{text}")
    } else {
        text
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

const COLUMNS: [&str; 16] = [
    "id",
    "created_at",
    "api_key_id",
    "route",
    "model",
    "provider",
    "lane",
    "status",
    "error_class",
    "input_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cost_usd",
    "latency_ms",
];

/// `GET /usage/events.csv`: the requests of the scope, newest first.
pub(crate) async fn csv(
    State(web): State<WebShared>,
    m: PageMember,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let scope = scope_of(&q);
    let s = &m.session;
    let reader = match usage::session_reader(&scope, &s.org_id, &s.user_id) {
        Ok(r) => r,
        Err(f) => return f.into_response(),
    };
    let mut out = COLUMNS.join(",");
    out.push('\n');
    let mut cursor: Option<String> = None;
    let mut rows = 0;
    loop {
        let page_q = Scope {
            limit: Some("500".into()),
            cursor: cursor.clone(),
            ..Scope::default()
        };
        let page = match usage::events_page(&web.app, reader, &page_q).await {
            Ok(p) => p,
            Err(Failure(e)) => return Failure(e).into_response(),
        };
        for e in page["data"].as_array().into_iter().flatten() {
            let mut line: Vec<String> = Vec::with_capacity(COLUMNS.len());
            for c in COLUMNS {
                if c == "created_at" {
                    let ms = e[c].as_i64().unwrap_or(0);
                    line.push(crate::web::render::iso(ms));
                } else {
                    line.push(field(&e[c]));
                }
            }
            out.push_str(&line.join(","));
            out.push('\n');
            rows += 1;
        }
        cursor = page["next_cursor"].as_str().map(str::to_string);
        if cursor.is_none() || rows >= CSV_MAX_ROWS {
            break;
        }
    }
    let name = format!(
        "attachment; filename=\"sluice-usage-{}.csv\"",
        crate::time::day_string(crate::store::now_ms() / 86_400_000)
    );
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/csv; charset=utf-8"),
            ),
            (
                header::CONTENT_DISPOSITION,
                HeaderValue::from_str(&name).unwrap_or(HeaderValue::from_static("attachment")),
            ),
        ],
        out,
    )
        .into_response()
}
