//! Langfuse: `GET {base}/api/public/traces?page=&limit=` and
//! `/api/public/observations?page=&limit=` → `{data, meta: {page, totalPages}}`,
//! authenticated by HTTP Basic with `public_key:secret_key`. Traces come first
//! (they are what the bound counts); then the observations of those traces.

use super::http::send_json;
use super::{Collected, PullError, Source};
use std::collections::HashSet;

const PAGE: usize = 50;
/// Observation pages read at most per pull (each trace has several).
const MAX_OBS_PAGES: u64 = 400;

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
            || c.get(&url).query(&q).basic_auth(public, Some(secret)),
            "list traces",
        )
        .await?;
        let data = got["data"].as_array().cloned().unwrap_or_default();
        for t in &data {
            if !out.push(t) {
                break 'traces;
            }
            if let Some(id) = t["id"].as_str() {
                ids.insert(id.to_string());
            }
        }
        let total = got["meta"]["totalPages"].as_u64().unwrap_or(page);
        if data.is_empty() || page >= total {
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
            || c.get(&url).query(&q).basic_auth(public, Some(secret)),
            "list observations",
        )
        .await?;
        let data = got["data"].as_array().cloned().unwrap_or_default();
        for o in &data {
            if o["traceId"].as_str().is_some_and(|t| ids.contains(t)) && !out.push(o) {
                return Ok(());
            }
        }
        let total = got["meta"]["totalPages"].as_u64().unwrap_or(page);
        if data.is_empty() || page >= total {
            break;
        }
        page += 1;
    }
    Ok(())
}
