//! The overview: the balance, the verification state and what to do next, the
//! last 30 days of usage as a chart, and the most recent requests.

use super::{org, shell};
use crate::accounts::{keys, signin};
use crate::api::usage::{self, Reader, Scope};
use crate::web::chart;
use crate::web::session::{checked_form, PageMember};
use crate::web::WebShared;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::{json as j, Value};
use std::collections::HashMap;

/// The last `n` UTC days, oldest first, each with its total from a day rollup.
pub(crate) fn last_days(rollup: &Value, n: i64, field: &str) -> Vec<chart::Day> {
    let today = crate::store::now_ms().div_euclid(86_400_000);
    let by_day: HashMap<&str, f64> = rollup["data"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter_map(|r| Some((r["day"].as_str()?, r[field].as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    (today - n + 1..=today)
        .map(|d| {
            let date = crate::time::day_string(d);
            let value = by_day.get(date.as_str()).copied().unwrap_or(0.0);
            chart::Day { date, value }
        })
        .collect()
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
    let reader = Reader {
        org_id: &org.id,
        member: None,
    };
    let daily = usage::daily_rollup(&web.app, reader, &Scope::default()).await;
    let recent = usage::events_page(
        &web.app,
        reader,
        &Scope {
            limit: Some("8".into()),
            ..Scope::default()
        },
    )
    .await;
    let (daily, recent) = match (daily, recent) {
        (Ok(d), Ok(r)) => (d, r),
        (Err(e), _) | (_, Err(e)) => return e.into_response(),
    };
    let days = last_days(&daily, 30, "cost_usd");
    let requests_30d: f64 = last_days(&daily, 30, "requests")
        .iter()
        .map(|d| d.value)
        .sum();
    let spent_30d: f64 = days.iter().map(|d| d.value).sum();
    let svg = chart::bars(&days, "Spend per day, last 30 days", false, &|v| {
        crate::web::render::usd(v)
    });
    let now = crate::store::now_ms();
    let live_keys = match keys::list_for_org(&web.app.db, &org.id).await {
        Ok(k) => k.iter().filter(|k| k.is_live(now)).count(),
        Err(e) => return crate::api::respond::Failure(e).into_response(),
    };
    let has_requests = recent["data"].as_array().is_some_and(|d| !d.is_empty());
    let mut ctx = shell(
        &web,
        &m,
        &org,
        "overview",
        "Overview",
        q.get("notice").map(String::as_str),
    );
    ctx["chart"] = j!(svg);
    ctx["recent"] = recent["data"].clone();
    ctx["spent_30d"] = j!(spent_30d);
    ctx["requests_30d"] = j!(requests_30d as i64);
    ctx["live_keys"] = j!(live_keys);
    ctx["owns_org_email"] = j!(org.email.as_deref() == Some(m.session.email.as_str()));
    ctx["steps"] = j!([
        {"done": org.email_verified, "title": "Verify your email address",
         "text": "Follow the link we mailed you. Until then, calls paid from credits are refused; calls on your own provider keys work."},
        {"done": live_keys > 0, "title": "Create an API key", "href": "/keys",
         "text": "Keys are shown once. Use one as the Bearer token with any OpenAI-compatible client."},
        {"done": has_requests, "title": "Make your first call", "href": "/playground",
         "text": "Try a model in the playground, or point your SDK's base URL at the gateway."},
        {"done": org.card_on_file && org.settled, "title": "Verify a card", "href": "/billing",
         "text": "A 1 USD charge, credited back, unlocks paid models, credit purchases and credits overflow."},
    ]);
    web.templates.page("overview.html", &ctx).into_response()
}

/// `POST /verify/resend`: a fresh verification link for the org's address.
pub(crate) async fn resend(State(web): State<WebShared>, m: PageMember, body: Bytes) -> Response {
    if let Err(r) = checked_form(&m, &body) {
        return r.into_response();
    }
    let user = match crate::web::api::user_of(&web, &m.session.user_id).await {
        Ok(u) => u,
        Err(f) => return f.into_response(),
    };
    let app = &web.app;
    match signin::resend_verification(&app.db, &web.mailer, &app.config, &m.session.org_id, &user)
        .await
    {
        Ok(_) => Redirect::to("/overview?notice=verification_sent").into_response(),
        Err(e) => crate::api::respond::Failure(e).into_response(),
    }
}
