//! Rendering: the page templates (minijinja, built into the binary, HTML-escaped by
//! default), the filters they format money, times and counts with, and the one
//! stylesheet and script every page loads.

use axum::http::{header, HeaderValue};
use axum::response::{Html, IntoResponse, Response};
use minijinja::Environment;
use serde::Serialize;

/// Every template, by name.
const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("landing.html", include_str!("templates/landing.html")),
    ("signup.html", include_str!("templates/signup.html")),
    ("login.html", include_str!("templates/login.html")),
    ("message.html", include_str!("templates/message.html")),
    ("overview.html", include_str!("templates/overview.html")),
    ("keys.html", include_str!("templates/keys.html")),
    ("models.html", include_str!("templates/models.html")),
    ("model.html", include_str!("templates/model.html")),
    (
        "connections.html",
        include_str!("templates/connections.html"),
    ),
    ("usage.html", include_str!("templates/usage.html")),
    ("billing.html", include_str!("templates/billing.html")),
    ("settings.html", include_str!("templates/settings.html")),
    ("playground.html", include_str!("templates/playground.html")),
];

const STYLESHEET: &str = include_str!("static/app.css");
const SCRIPT: &str = include_str!("static/app.js");
const ICON: &str = include_str!("static/icon.svg");

pub(crate) struct Templates {
    env: Environment<'static>,
}

impl Templates {
    pub(crate) fn new() -> anyhow::Result<Templates> {
        let mut env = Environment::new();
        for (name, text) in TEMPLATES {
            env.add_template(name, text)
                .map_err(|e| anyhow::anyhow!("template {name}: {e}"))?;
        }
        env.add_filter("usd", usd);
        env.add_filter("per_million", per_million);
        env.add_filter("when", when);
        env.add_filter("day", day);
        env.add_filter("count", count);
        Ok(Templates { env })
    }

    /// A page, or a plain error page when the template fails (a defect: logged).
    pub(crate) fn page<T: Serialize>(&self, name: &str, ctx: &T) -> Html<String> {
        let rendered = self
            .env
            .get_template(name)
            .and_then(|t| t.render(minijinja::Value::from(minijinja::value::Serde(ctx))));
        match rendered {
            Ok(html) => Html(html),
            Err(e) => {
                tracing::error!(template = name, error = %e, "a page failed to render");
                Html(
                    "<!doctype html><title>Error</title><p>This page could not be shown.</p>"
                        .into(),
                )
            }
        }
    }
}

/// USD with cents, or more digits for amounts under a cent.
pub(crate) fn usd(v: f64) -> String {
    let sign = if v < 0.0 { "-" } else { "" };
    let a = v.abs();
    if a == 0.0 || a >= 0.01 {
        format!("{sign}${}", thousands_f(a, 2))
    } else {
        format!("{sign}${a:.6}").trim_end_matches('0').to_string()
    }
}

/// A price in micro-USD per million tokens, as USD per million.
fn per_million(micro: i64) -> String {
    usd(micro as f64 / 1_000_000.0)
}

/// A count with thousands separators.
pub(crate) fn count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        out.insert(0, '-');
    }
    out
}

fn thousands_f(v: f64, decimals: usize) -> String {
    let text = format!("{v:.decimals$}");
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let int = count(int.parse::<i64>().unwrap_or(0));
    if frac.is_empty() {
        int
    } else {
        format!("{int}.{frac}")
    }
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM UTC`.
pub(crate) fn when(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let day = crate::time::day_string(secs.div_euclid(86_400));
    let rest = secs.rem_euclid(86_400);
    format!("{day} {:02}:{:02} UTC", rest / 3600, rest % 3600 / 60)
}

/// Unix milliseconds as RFC 3339 UTC, to the second.
pub(crate) fn iso(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let day = crate::time::day_string(secs.div_euclid(86_400));
    let rest = secs.rem_euclid(86_400);
    format!(
        "{day}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Unix milliseconds as the UTC date.
fn day(ms: i64) -> String {
    crate::time::day_string(ms.div_euclid(86_400_000))
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(kind)),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=300"),
            ),
        ],
        body,
    )
        .into_response()
}

pub(crate) async fn stylesheet() -> Response {
    asset(STYLESHEET, "text/css; charset=utf-8")
}

pub(crate) async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

pub(crate) async fn icon() -> Response {
    asset(ICON, "image/svg+xml")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(usd(1234.5), "$1,234.50");
        assert_eq!(usd(0.0), "$0.00");
        assert_eq!(usd(0.0012), "$0.0012");
        assert_eq!(usd(-3.0), "-$3.00");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(-12), "-12");
        assert_eq!(when(0), "1970-01-01 00:00 UTC");
        assert_eq!(when(1_798_765_200_000), "2027-01-01 01:00 UTC");
        assert_eq!(per_million(400_000), "$0.40");
        assert_eq!(iso(1_798_765_205_000), "2027-01-01T01:00:05Z");
    }

    #[test]
    fn every_template_parses() {
        Templates::new().unwrap();
    }
}
