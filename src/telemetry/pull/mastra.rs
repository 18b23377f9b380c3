//! Mastra: its server's observability API, `GET {base}/api/observability/traces
//! ?page=&perPage=` → `{spans: [root spans], pagination: {hasMore}}`, then each
//! trace's spans with `GET /api/observability/traces/{traceId}` → `{traceId,
//! spans}`; authenticated by `Authorization: Bearer <token>` when one is given.

use super::http::send_json;
use super::{Collected, Named, PullError, Source};
use serde::Deserialize;

const PAGE: usize = 50;

#[derive(Deserialize)]
struct Pagination {
    #[serde(rename = "hasMore")]
    has_more: Option<bool>,
}

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
        let got = send_json(&src.budget, || auth(c.get(&list).query(&q)), "list traces").await?;
        let mut added = false;
        for root in got.items("spans") {
            // Trace ids name a path segment: anything but a plain token is skipped.
            let Some(trace_id) = Named::of(root).trace_id.filter(|t| plain_token(t)) else {
                continue;
            };
            if traces >= limit {
                out.truncated = true;
                return Ok(());
            }
            let one = src.url(&format!("/api/observability/traces/{trace_id}"));
            let trace = send_json(&src.budget, || auth(c.get(&one)), "read a trace").await?;
            for span in trace.items("spans") {
                if !out.push_raw(span) {
                    return Ok(());
                }
            }
            traces += 1;
            added = true;
        }
        let more = got
            .get::<Pagination>("pagination")
            .and_then(|p| p.has_more)
            .unwrap_or(false);
        // A page that names no trace adds nothing: a source that keeps saying
        // `hasMore` over such pages is not followed further.
        if !added || !more {
            return Ok(());
        }
        page += 1;
    }
}

fn plain_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && s != "."
        && s != ".."
}
