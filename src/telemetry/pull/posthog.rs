//! PostHog: its query API, `POST {base}/api/projects/{project_id}/query/` with a
//! HogQL query over the LLM analytics events (`$ai_generation`, `$ai_span`,
//! `$ai_trace`, `$ai_embedding`) → `{columns, results, hasMore}`, paged by LIMIT
//! and OFFSET, authenticated by `Authorization: Bearer <personal API key>`.

use super::http::send_json;
use super::{Collected, PullError, Source};
use serde_json::{json, Map, Value};

const PAGE: usize = 100;

pub async fn pull(src: &Source<'_>, key: &str, out: &mut Collected) -> Result<(), PullError> {
    let project = src
        .str("project_id")
        .filter(|p| {
            p.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
        .ok_or_else(|| {
            PullError::Config(
                "config.project_id",
                "a posthog pull needs config.project_id".into(),
            )
        })?
        .to_string();
    let since = src.since()?;
    let c = src.client();
    let url = src.url(&format!("/api/projects/{project}/query/"));
    let mut offset = 0usize;
    loop {
        let when = since
            .as_ref()
            .map(|s| format!(" AND timestamp >= toDateTime('{s}')"))
            .unwrap_or_default();
        let query = format!(
            "SELECT uuid, event, timestamp, distinct_id, properties FROM events \
             WHERE event IN ('$ai_generation', '$ai_span', '$ai_trace', '$ai_embedding'){when} \
             ORDER BY timestamp ASC LIMIT {PAGE} OFFSET {offset}"
        );
        let body = json!({"query": {"kind": "HogQLQuery", "query": query}});
        let page = send_json(|| c.post(&url).bearer_auth(key).json(&body), "query events").await?;
        let cols: Vec<String> = page["columns"]
            .as_array()
            .map(|c| {
                c.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let rows = page["results"].as_array().cloned().unwrap_or_default();
        for row in &rows {
            let Some(cells) = row.as_array() else {
                continue;
            };
            let mut event = Map::new();
            for (k, v) in cols.iter().zip(cells) {
                event.insert(k.clone(), v.clone());
            }
            if !out.push(&Value::Object(event)) {
                return Ok(());
            }
        }
        offset += rows.len();
        if rows.is_empty() || !page["hasMore"].as_bool().unwrap_or(false) {
            return Ok(());
        }
        if out.full() {
            out.truncated = true;
            return Ok(());
        }
    }
}
