//! Braintrust: `POST {base}/v1/project_logs/{project_id}/fetch` with `{limit,
//! cursor}` → `{events, cursor}`, authenticated by `Authorization: Bearer <API
//! key>`; a `project_name` is looked up with `GET /v1/project?project_name=`.

use super::http::send_json;
use super::{Collected, Named, PullError, Source};
use serde_json::json;

const PAGE: usize = 200;

pub async fn pull(src: &Source<'_>, key: &str, out: &mut Collected) -> Result<(), PullError> {
    let c = src.client();
    let project = match (src.str("project_id"), src.str("project_name")) {
        (Some(id), _) => id.to_string(),
        (None, Some(name)) => {
            let url = src.url("/v1/project");
            let found = send_json(
                &src.budget,
                || {
                    c.get(&url)
                        .query(&[("project_name", name)])
                        .bearer_auth(key)
                },
                "project lookup",
            )
            .await?;
            found
                .items("objects")
                .first()
                .and_then(|p| Named::of(p).id)
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
            &src.budget,
            || c.post(&url).bearer_auth(key).json(&body),
            "fetch project logs",
        )
        .await?;
        let events = page.items("events");
        if events.is_empty() {
            return Ok(());
        }
        for e in events {
            if !out.push_raw(e) {
                return Ok(());
            }
        }
        cursor = page.get::<String>("cursor");
        if cursor.is_none() {
            return Ok(());
        }
        if out.full() {
            out.truncated = true;
            return Ok(());
        }
    }
}
