//! Fake web search vendors for the gateway's service-run search: SearXNG's JSON
//! API (`GET /search?q=…&format=json`) and the Brave Search API (`GET
//! /res/v1/web/search?q=…&count=…`, `X-Subscription-Token`), answering in each
//! vendor's real JSON, with scripted faults, and recording every request so a
//! test can assert what the gateway asked.
//!
//! ```no_run
//! # async fn demo() {
//! use sluice_mock::search::{SearchVendor, VendorStep};
//! let searx = SearchVendor::searxng().await;
//! searx.script(vec![VendorStep::Status(500)]);
//! // point `[search] url` at searx.base_url() ...
//! assert_eq!(searx.requests()[0].query("q").as_deref(), Some("latest rust release"));
//! # }
//! ```

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    extract::{RawQuery, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Json, Router,
};
use serde_json::{json, Value};
use tokio::{net::TcpListener, task::AbortHandle};

/// Which vendor's API the fake speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VendorKind {
    SearXng,
    Brave,
}

/// One result the fake answers with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VendorResult {
    pub title: String,
    pub url: String,
    pub snippet: String,
}

impl VendorResult {
    pub fn new(title: &str, url: &str, snippet: &str) -> Self {
        VendorResult {
            title: title.into(),
            url: url.into(),
            snippet: snippet.into(),
        }
    }
}

/// What the fake does with one request (after the queue: `Ok`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VendorStep {
    Ok,
    /// The vendor's own error answer with this status.
    Status(u16),
    /// Wait this long, then answer normally.
    Delay(Duration),
    /// A 200 whose body is not the vendor's JSON.
    Malformed,
}

/// One request as the fake received it.
#[derive(Clone, Debug)]
pub struct VendorRequest {
    pub path: String,
    /// The raw query string.
    pub raw_query: String,
    /// Header names (lowercase) and values.
    pub headers: Vec<(String, String)>,
}

impl VendorRequest {
    /// A query parameter, decoded.
    pub fn query(&self, name: &str) -> Option<String> {
        self.raw_query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == name).then(|| decode(v))
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Percent-decoding of a query component (`+` is a space).
fn decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(x) => {
                        out.push(x);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Inner {
    kind: VendorKind,
    /// Brave: the subscription token it accepts.
    key: Option<String>,
    results: Mutex<Vec<VendorResult>>,
    steps: Mutex<VecDeque<VendorStep>>,
    requests: Mutex<Vec<VendorRequest>>,
}

/// A running fake vendor. Clones share it.
#[derive(Clone)]
pub struct SearchVendor {
    inner: Arc<Inner>,
    addr: SocketAddr,
    server: AbortHandle,
}

/// The results a fake answers with until a test sets others.
pub fn default_results() -> Vec<VendorResult> {
    vec![
        VendorResult::new(
            "Rust 1.90 released",
            "https://blog.rust-lang.org/2025/09/18/Rust-1.90.0/",
            "The Rust team is happy to announce a new version of Rust, 1.90.0.",
        ),
        VendorResult::new(
            "Rust (programming language) - Wikipedia",
            "https://en.wikipedia.org/wiki/Rust_(programming_language)",
            "Rust is a general-purpose programming language emphasizing performance.",
        ),
        VendorResult::new(
            "The Rust Programming Language",
            "https://doc.rust-lang.org/book/",
            "An introductory book about Rust.",
        ),
    ]
}

impl SearchVendor {
    /// A fake SearXNG instance (JSON format enabled) on `127.0.0.1:0`.
    pub async fn searxng() -> SearchVendor {
        SearchVendor::start(VendorKind::SearXng, None).await
    }

    /// A fake Brave Search API on `127.0.0.1:0` that accepts `key`.
    pub async fn brave(key: &str) -> SearchVendor {
        SearchVendor::start(VendorKind::Brave, Some(key.to_string())).await
    }

    async fn start(kind: VendorKind, key: Option<String>) -> SearchVendor {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("sluice-mock: cannot bind a search vendor");
        let addr = listener.local_addr().expect("local addr");
        let inner = Arc::new(Inner {
            kind,
            key,
            results: Mutex::new(default_results()),
            steps: Mutex::new(VecDeque::new()),
            requests: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/search", get(searxng))
            .route("/res/v1/web/search", get(brave))
            .with_state(inner.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        })
        .abort_handle();
        SearchVendor {
            inner,
            addr,
            server,
        }
    }

    /// `http://127.0.0.1:PORT`: SearXNG's base URL, or Brave's API base.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The results every following search answers with.
    pub fn set_results(&self, results: Vec<VendorResult>) {
        *self.inner.results.lock().unwrap() = results;
    }

    /// Queues steps, one per request.
    pub fn script(&self, steps: Vec<VendorStep>) {
        self.inner.steps.lock().unwrap().extend(steps);
    }

    /// Every request received, oldest first.
    pub fn requests(&self) -> Vec<VendorRequest> {
        self.inner.requests.lock().unwrap().clone()
    }

    pub fn shutdown(&self) {
        self.server.abort();
    }
}

type Shared = State<Arc<Inner>>;

/// Records the request and takes its step (a delay is slept here).
async fn take(m: &Inner, path: &str, query: &str, headers: &HeaderMap) -> VendorStep {
    m.requests.lock().unwrap().push(VendorRequest {
        path: path.to_string(),
        raw_query: query.to_string(),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
    });
    let step = m
        .steps
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or(VendorStep::Ok);
    if let VendorStep::Delay(d) = step {
        tokio::time::sleep(d).await;
        return VendorStep::Ok;
    }
    step
}

async fn searxng(State(m): Shared, RawQuery(q): RawQuery, headers: HeaderMap) -> Response {
    let q = q.unwrap_or_default();
    if m.kind != VendorKind::SearXng {
        return StatusCode::NOT_FOUND.into_response();
    }
    let step = take(&m, "/search", &q, &headers).await;
    let req = VendorRequest {
        path: String::new(),
        raw_query: q,
        headers: Vec::new(),
    };
    // SearXNG answers 403 when the JSON format is not enabled or not asked for.
    if req.query("format").as_deref() != Some("json") {
        return (StatusCode::FORBIDDEN, "Forbidden").into_response();
    }
    match step {
        VendorStep::Status(s) => {
            let code = StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return (code, "<html><body>Internal Server Error</body></html>").into_response();
        }
        VendorStep::Malformed => return "<html>not json</html>".into_response(),
        _ => {}
    }
    let query = req.query("q").unwrap_or_default();
    let results: Vec<Value> = m
        .results
        .lock()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let host = r.url.split('/').nth(2).unwrap_or_default().to_string();
            json!({
                "url": r.url, "title": r.title, "content": r.snippet,
                "engine": "duckduckgo",
                "parsed_url": ["https", host, "/", "", "", ""],
                "template": "default.html", "engines": ["duckduckgo", "brave"],
                "positions": [i + 1], "score": 2.0 / (i as f64 + 1.0),
                "category": "general",
            })
        })
        .collect();
    Json(json!({
        "query": query,
        "number_of_results": 0,
        "results": results,
        "answers": [], "corrections": [], "infoboxes": [],
        "suggestions": [], "unresponsive_engines": [],
    }))
    .into_response()
}

/// Brave's error envelope.
fn brave_error(status: u16, code: &str, detail: &str) -> Response {
    let s = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        s,
        Json(json!({
            "type": "ErrorResponse",
            "error": {"id": "00000000-0000-0000-0000-000000000000", "status": status,
                      "code": code, "detail": detail, "meta": {"component": "authentication"}},
            "time": 1_700_000_000,
        })),
    )
        .into_response()
}

async fn brave(State(m): Shared, RawQuery(q): RawQuery, headers: HeaderMap) -> Response {
    let q = q.unwrap_or_default();
    if m.kind != VendorKind::Brave {
        return StatusCode::NOT_FOUND.into_response();
    }
    let step = take(&m, "/res/v1/web/search", &q, &headers).await;
    let token = headers
        .get("x-subscription-token")
        .and_then(|v| v.to_str().ok());
    if token != m.key.as_deref() {
        return brave_error(
            422,
            "SUBSCRIPTION_TOKEN_INVALID",
            "The provided subscription token is invalid.",
        );
    }
    match step {
        VendorStep::Status(s) => return brave_error(s, "RATE_LIMITED", "Request rate limited"),
        VendorStep::Malformed => return "{\"truncated\":".into_response(),
        _ => {}
    }
    let req = VendorRequest {
        path: String::new(),
        raw_query: q,
        headers: Vec::new(),
    };
    let query = req.query("q").unwrap_or_default();
    let count = req
        .query("count")
        .and_then(|c| c.parse::<usize>().ok())
        .unwrap_or(20);
    let results: Vec<Value> = m
        .results
        .lock()
        .unwrap()
        .iter()
        .take(count)
        .map(|r| {
            json!({
                "type": "search_result", "title": r.title, "url": r.url,
                "is_source_local": false, "is_source_both": false,
                "description": format!("<strong>{}</strong>", r.snippet),
                "page_age": "2025-09-18T00:00:00", "age": "September 18, 2025",
                "profile": {"name": "Example", "url": r.url, "long_name": "example", "img": ""},
                "language": "en", "family_friendly": true,
            })
        })
        .collect();
    Json(json!({
        "type": "search",
        "query": {"original": query, "show_strict_warning": false, "is_navigational": false,
                  "spellcheck_off": true, "country": "us", "more_results_available": false},
        "mixed": {"type": "mixed", "main": [{"type": "web", "index": 0, "all": true}], "top": [], "side": []},
        "web": {"type": "search", "results": results, "family_friendly": true},
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn query_components_decode() {
        assert_eq!(decode("rust+1.80+%26+co%2F%C3%A9"), "rust 1.80 & co/é");
        assert_eq!(decode("100%"), "100%");
    }
}
