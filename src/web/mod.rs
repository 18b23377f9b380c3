//! The web app on the web listener: server-rendered pages over the same state.
//! For now the public catalog page; sign-up, keys and usage pages come with their
//! issues.

use crate::api::Shared;
use axum::extract::State;
use axum::response::Html;
use axum::routing::get;
use axum::Router;

pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The catalog as a page: slug, maker, context window, prices, retention.
async fn index(State(state): State<Shared>) -> Html<String> {
    let catalog = state.catalog.snapshot();
    let mut rows = String::new();
    for m in catalog.visible(None) {
        let s = &m.spec;
        rows.push_str(&format!(
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>${:.2}</td><td>${:.2}</td><td>{}</td></tr>\n",
            escape(&s.slug),
            escape(&s.display_name),
            escape(&s.owned_by),
            s.context_window,
            s.price.input as f64 / 1e6,
            s.price.output as f64 / 1e6,
            m.retention.map_or("-", |r| r.as_str()),
        ));
    }
    Html(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>sluice</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:2rem}}table{{border-collapse:collapse}}\
         td,th{{padding:.3rem .8rem;border-bottom:1px solid #ddd;text-align:left}}</style></head>\
         <body><h1>sluice</h1><p>One base URL for many models: <code>{}/v1</code></p>\
         <table><thead><tr><th>Model</th><th>Name</th><th>Maker</th><th>Context</th>\
         <th>Input / M</th><th>Output / M</th><th>Retention</th></tr></thead><tbody>{rows}</tbody></table>\
         </body></html>",
        escape(&state.config.server.public_base_url)
    ))
}
