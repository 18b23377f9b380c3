//! A recording tap in front of the gateway, for the client-library tests: the
//! libraries are pointed at it by base URL, it hands every request on to the
//! gateway unchanged and every answer back unchanged, and it keeps a copy of
//! both, so every body and stream event the gateway gave the libraries can be
//! checked against OpenAI's published schemas afterwards.
//!
//! An answer is handed back whole once the gateway has finished it: these tests
//! are about what the gateway says, not its pacing.

use std::sync::{Arc, Mutex};

use axum::{
    body::{to_bytes, Body},
    extract::{Request, State},
    http::{HeaderName, HeaderValue, StatusCode},
    response::Response,
    Router,
};
use serde::Serialize;
use tokio::{net::TcpListener, task::AbortHandle};

/// One request and the gateway's answer, as the client saw them.
#[derive(Clone, Debug, Serialize)]
pub struct Exchange {
    pub method: String,
    /// Path and query, e.g. `/v1/chat/completions`.
    pub path: String,
    /// The request body (lossy UTF-8).
    pub request: String,
    pub status: u16,
    pub content_type: String,
    /// The answer body (lossy UTF-8): JSON, or the stream's bytes.
    pub body: String,
}

struct Shared {
    upstream: String,
    http: reqwest::Client,
    log: Mutex<Vec<Exchange>>,
}

/// A running tap; it stops when dropped.
pub struct Tap {
    pub url: String,
    shared: Arc<Shared>,
    server: AbortHandle,
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Hop-by-hop and framing headers the tap sets itself.
const SKIP: [&str; 6] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    // An answer is recorded as text: no compression on the gateway's side.
    "accept-encoding",
];

impl Tap {
    /// Starts a tap on a free loopback port in front of `upstream`
    /// (`http://127.0.0.1:PORT`).
    pub async fn start(upstream: &str) -> Tap {
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_string(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("tap client"),
            log: Mutex::new(Vec::new()),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind tap");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = Router::new().fallback(relay).with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        })
        .abort_handle();
        Tap {
            url,
            shared,
            server,
        }
    }

    /// Every exchange so far, oldest first.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.shared.log.lock().unwrap().clone()
    }
}

async fn relay(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = to_bytes(body, 64 << 20).await.unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    let method = reqwest::Method::from_bytes(parts.method.as_str().as_bytes()).unwrap();
    let mut out = s
        .http
        .request(method, format!("{}{path}", s.upstream))
        .body(body.clone());
    for (k, v) in &parts.headers {
        if !SKIP.contains(&k.as_str()) {
            out = out.header(k.as_str(), v.as_bytes());
        }
    }
    let (status, headers, answer) = match out.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let headers: Vec<(String, Vec<u8>)> = r
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
                .collect();
            // A stream the gateway cut still counts: keep what came.
            let mut bytes = Vec::new();
            let mut r = r;
            while let Ok(Some(chunk)) = r.chunk().await {
                bytes.extend_from_slice(&chunk);
            }
            (status, headers, bytes)
        }
        Err(e) => (
            502,
            Vec::new(),
            format!("tap: gateway unreachable: {e}").into_bytes(),
        ),
    };
    let content_type = headers
        .iter()
        .find(|(k, _)| k == "content-type")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default();
    s.log.lock().unwrap().push(Exchange {
        method: parts.method.to_string(),
        path,
        request: String::from_utf8_lossy(&body).into_owned(),
        status,
        content_type,
        body: String::from_utf8_lossy(&answer).into_owned(),
    });
    let mut resp = Response::new(Body::from(answer));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (k, v) in headers {
        if SKIP.contains(&k.as_str()) {
            continue;
        }
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::from_bytes(&v)) {
            resp.headers_mut().append(k, v);
        }
    }
    resp
}
