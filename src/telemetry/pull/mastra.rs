//! Mastra: its server's observability API, `GET {base}/api/observability/traces
//! ?page=&perPage=` → `{spans: [root spans], pagination: {hasMore}}`, then each
//! trace's spans with `GET /api/observability/traces/{traceId}` → `{traceId,
//! spans}`; authenticated by `Authorization: Bearer <token>` when one is given.

use super::http::send_json;
use super::{Collected, PullError, Source};

const PAGE: usize = 50;

pub async fn pull(src: &Source<'_>, token: &str, out: &mut Collected) -> Result<(), PullError> {
    let c = src.client();
    let auth = |r: reqwest::RequestBuilder| {
        if token.is_empty() {
            r
        } else {
            r.bearer_auth(token)
        }
    };
    let list = src.url("/api/observability/traces");
    let mut page = 0u64;
    let mut traces = 0usize;
    let limit = out.limit;
    // The bound counts traces here; their spans are all kept.
    out.limit = usize::MAX;
    loop {
        let q = [("page", page.to_string()), ("perPage", PAGE.to_string())];
        let got = send_json(|| auth(c.get(&list).query(&q)), "list traces").await?;
        let roots = got["spans"].as_array().cloned().unwrap_or_default();
        for root in &roots {
            let Some(trace_id) = root["traceId"].as_str() else {
                continue;
            };
            if traces >= limit {
                out.truncated = true;
                return Ok(());
            }
            let one = src.url(&format!("/api/observability/traces/{trace_id}"));
            let trace = send_json(|| auth(c.get(&one)), "read a trace").await?;
            for span in trace["spans"].as_array().into_iter().flatten() {
                if !out.push(span) {
                    return Ok(());
                }
            }
            traces += 1;
        }
        if roots.is_empty() || !got["pagination"]["hasMore"].as_bool().unwrap_or(false) {
            return Ok(());
        }
        page += 1;
    }
}
