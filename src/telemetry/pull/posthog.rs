//! PostHog: its query API, `POST {base}/api/projects/{project_id}/query/` with a
//! HogQL query over the LLM analytics events (`$ai_generation`, `$ai_span`,
//! `$ai_trace`, `$ai_embedding`) → `{columns, results, hasMore}`, paged by LIMIT
//! and OFFSET, authenticated by `Authorization: Bearer <personal API key>`.

use super::http::send_json;
use super::{Collected, PullError, Source};
use serde_json::json;
use serde_json::value::RawValue;

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
        let page = send_json(
            &src.budget,
            || c.post(&url).bearer_auth(key).json(&body),
            "query events",
        )
        .await?;
        let cols: Vec<String> = page.get("columns").unwrap_or_default();
        let rows = page.items("results");
        let count = rows.len();
        let mut added = false;
        for row in rows {
            let Ok(cells) = serde_json::from_str::<Vec<&RawValue>>(row.get()) else {
                continue;
            };
            if !out.push_line(&event_line(&cols, &cells)) {
                return Ok(());
            }
            added = true;
        }
        offset += count;
        // A page whose rows are no events adds nothing: a source that keeps
        // saying `hasMore` over such pages is not followed further.
        if !added || !page.get::<bool>("hasMore").unwrap_or(false) {
            return Ok(());
        }
        if out.full() {
            out.truncated = true;
            return Ok(());
        }
    }
}

/// One event as a JSON object: the query's columns named, each cell as it came.
fn event_line(cols: &[String], cells: &[&RawValue]) -> Vec<u8> {
    let mut line = vec![b'{'];
    for (i, (k, v)) in cols.iter().zip(cells).enumerate() {
        if i > 0 {
            line.push(b',');
        }
        line.extend_from_slice(&serde_json::to_vec(k).unwrap_or_default());
        line.push(b':');
        line.extend_from_slice(v.get().as_bytes());
    }
    line.push(b'}');
    line
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_event_line_names_each_cell_by_its_column() {
        let cells: Vec<&serde_json::value::RawValue> =
            serde_json::from_str(r#"["u1", {"a": [1, 2]}, null]"#).unwrap();
        let cols = ["uuid".to_string(), "properties".into(), "x\"y".into()];
        let line = super::event_line(&cols, &cells);
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"uuid": "u1", "properties": {"a": [1, 2]}, "x\"y": null})
        );
    }
}
