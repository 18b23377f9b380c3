//! Langfuse: `GET {base}/api/public/traces?page=&limit=` and
//! `/api/public/observations?page=&limit=` → `{data, meta: {page, totalPages}}`,
//! authenticated by HTTP Basic with `public_key:secret_key`. Traces come first
//! (they are what the bound counts); then the observations of those traces.

use super::http::send_json;
use super::{Collected, Named, PullError, Source};
use serde::Deserialize;
use std::collections::HashSet;

const PAGE: usize = 50;
/// Observation pages read at most per pull (each trace has several).
const MAX_OBS_PAGES: u64 = 400;

#[derive(Deserialize)]
struct Meta {
    #[serde(rename = "totalPages")]
    total_pages: Option<u64>,
}

pub async fn pull(
    src: &Source<'_>,
    credential: &str,
    out: &mut Collected,
) -> Result<(), PullError> {
    let Some((public, secret)) = credential.split_once(':') else {
        return Err(PullError::Credential(
            "a langfuse credential is public_key:secret_key".into(),
        ));
    };
    let c = src.client();
    let since = src.since()?;
    let mut ids = HashSet::new();
    let url = src.url("/api/public/traces");
    let mut page = 1u64;
    'traces: loop {
        let mut q = vec![("page", page.to_string()), ("limit", PAGE.to_string())];
        if let Some(s) = &since {
            q.push(("fromTimestamp", s.clone()));
        }
        let got = send_json(
            &src.budget,
            || c.get(&url).query(&q).basic_auth(public, Some(secret)),
            "list traces",
        )
        .await?;
        let data = got.items("data");
        let empty = data.is_empty();
        for t in data {
            if !out.push_raw(t) {
                break 'traces;
            }
            if let Some(id) = Named::of(t).id {
                ids.insert(id);
            }
        }
        let total = got
            .get::<Meta>("meta")
            .and_then(|m| m.total_pages)
            .unwrap_or(page);
        if empty || page >= total {
            break;
        }
        if out.full() {
            out.truncated = true;
            break;
        }
        page += 1;
    }
    if ids.is_empty() {
        return Ok(());
    }
    // Observations are not bounded by the record count (they belong to traces
    // already taken), only by the byte bound.
    out.limit = usize::MAX;
    let url = src.url("/api/public/observations");
    let mut page = 1u64;
    while page <= MAX_OBS_PAGES {
        let mut q = vec![("page", page.to_string()), ("limit", PAGE.to_string())];
        if let Some(s) = &since {
            q.push(("fromStartTime", s.clone()));
        }
        let got = send_json(
            &src.budget,
            || c.get(&url).query(&q).basic_auth(public, Some(secret)),
            "list observations",
        )
        .await?;
        let data = got.items("data");
        let empty = data.is_empty();
        for o in data {
            let ours = Named::of(o).trace_id.is_some_and(|t| ids.contains(&t));
            if ours && !out.push_raw(o) {
                return Ok(());
            }
        }
        let total = got
            .get::<Meta>("meta")
            .and_then(|m| m.total_pages)
            .unwrap_or(page);
        if empty || page >= total {
            break;
        }
        page += 1;
    }
    Ok(())
}
