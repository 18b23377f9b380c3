//! Braintrust: `POST {base}/v1/project_logs/{project_id}/fetch` with `{limit,
//! cursor}` → `{events, cursor}`, authenticated by `Authorization: Bearer <API
//! key>`; a `project_name` is looked up with `GET /v1/project?project_name=`.

use super::http::send_json;
use super::{Collected, PullError, Source};
use serde_json::{json, Value};

const PAGE: usize = 200;

pub async fn pull(src: &Source<'_>, key: &str, out: &mut Collected) -> Result<(), PullError> {
    let c = src.client();
    let project = match (src.str("project_id"), src.str("project_name")) {
        (Some(id), _) => id.to_string(),
        (None, Some(name)) => {
            let url = src.url("/v1/project");
            let found = send_json(
                || {
                    c.get(&url)
                        .query(&[("project_name", name)])
                        .bearer_auth(key)
                },
                "project lookup",
            )
            .await?;
            found["objects"]
                .as_array()
                .and_then(|o| o.first())
                .and_then(|p| p["id"].as_str())
                .map(str::to_string)
                .ok_or_else(|| {
                    PullError::Config(
                        "config.project_name",
                        "no Braintrust project has that name".into(),
                    )
                })?
        }
        _ => {
            return Err(PullError::Config(
                "config.project_id",
                "a braintrust pull needs config.project_id or config.project_name".into(),
            ))
        }
    };
    let url = src.url(&format!("/v1/project_logs/{project}/fetch"));
    let mut cursor: Option<String> = None;
    loop {
        let mut body = json!({"limit": PAGE.min(out.limit - out.records)});
        if let Some(cur) = &cursor {
            body["cursor"] = json!(cur);
        }
        let page = send_json(
            || c.post(&url).bearer_auth(key).json(&body),
            "fetch project logs",
        )
        .await?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            return Ok(());
        }
        for e in &events {
            if !out.push(e) {
                return Ok(());
            }
        }
        cursor = page
            .get("cursor")
            .and_then(Value::as_str)
            .map(str::to_string);
        if cursor.is_none() {
            return Ok(());
        }
        if out.full() {
            out.truncated = true;
            return Ok(());
        }
    }
}
