//! LangSmith: `POST {base}/api/v1/runs/query` with `{session: [project id], limit,
//! cursor, start_time}` → `{runs, cursors: {next}}`, authenticated by `x-api-key`;
//! a `project_name` is looked up with `GET /api/v1/sessions?name=`.

use super::http::send_json;
use super::{Collected, Named, PullError, Source};
use serde::Deserialize;
use serde_json::json;

const PAGE: usize = 100;

#[derive(Deserialize)]
struct Cursors {
    next: Option<String>,
}

pub async fn pull(src: &Source<'_>, key: &str, out: &mut Collected) -> Result<(), PullError> {
    let c = src.client();
    let session = match (src.str("project_id"), src.str("project_name")) {
        (Some(id), _) => id.to_string(),
        (None, Some(name)) => {
            let url = src.url("/api/v1/sessions");
            let found = send_json(
                &src.budget,
                || {
                    c.get(&url)
                        .query(&[("name", name)])
                        .header("x-api-key", key)
                },
                "project lookup",
            )
            .await?;
            found
                .items("")
                .first()
                .and_then(|p| Named::of(p).id)
                .ok_or_else(|| {
                    PullError::Config(
                        "config.project_name",
                        "no LangSmith project has that name".into(),
                    )
                })?
        }
        _ => {
            return Err(PullError::Config(
                "config.project_id",
                "a langsmith pull needs config.project_id or config.project_name".into(),
            ))
        }
    };
    let since = src.since()?;
    let url = src.url("/api/v1/runs/query");
    let mut cursor: Option<String> = None;
    loop {
        let mut body = json!({"session": [session], "limit": PAGE.min(out.limit - out.records)});
        if let Some(cur) = &cursor {
            body["cursor"] = json!(cur);
        }
        if let Some(s) = &since {
            body["start_time"] = json!(s);
        }
        let page = send_json(
            &src.budget,
            || c.post(&url).header("x-api-key", key).json(&body),
            "query runs",
        )
        .await?;
        let runs = page.items("runs");
        let empty = runs.is_empty();
        for r in runs {
            if !out.push_raw(r) {
                return Ok(());
            }
        }
        cursor = page.get::<Cursors>("cursors").and_then(|c| c.next);
        if empty || cursor.is_none() {
            return Ok(());
        }
        if out.full() {
            out.truncated = true;
            return Ok(());
        }
    }
}
