//! sluice-mock: a fake upstream model provider for sluice's integration tests
//! and load benches.
//!
//! It speaks the real wire formats of OpenAI (chat completions, responses,
//! embeddings, Azure deployment paths), Anthropic messages, Gemini and Bedrock
//! Converse (JSON and the binary converse-stream), and (module [`search`]) the
//! web search vendors SearXNG and Brave, and
//! plays scripted faults per model: error statuses, delays, cut streams,
//! in-band error events, refusals, tool calls, dropped connections.
//!
//! Beside it: [`smtp::SmtpSink`], a real SMTP server that keeps the mails it is
//! sent, and [`stripe::FakeStripe`], Stripe's Checkout Sessions API with webhooks
//! signed the real way.
//!
//! ```no_run
//! # async fn demo() {
//! use sluice_mock::{Mock, Step};
//! let mock = Mock::start().await;
//! mock.script("gpt-4.1-mini", vec![Step::Status(500), Step::Ok]);
//! let base = mock.base_url(); // "http://127.0.0.1:PORT"
//! // ... point the gateway at `base`, send requests ...
//! assert_eq!(mock.count("gpt-4.1-mini"), 2);
//! # }
//! ```

mod accounts;
mod anthropic;
mod bedrock;
mod control;
mod embed;
pub mod fault_proxy;
mod gemini;
mod handlers;
pub mod oauth;
mod openai;
mod responses;
pub mod search;
pub mod smtp;
mod sse;
mod step;
pub mod stripe;
pub mod traces;
mod wire;

use std::{
    collections::{HashMap, VecDeque},
    io,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard,
    },
};

use axum::{
    http::request::Parts,
    routing::{get, post},
    serve::ListenerExt,
    Router,
};
use bytes::Bytes;
use serde_json::Value;
use tokio::{net::TcpListener, task::AbortHandle};

pub use step::Step;

/// Stream content chunks per answer unless a script says otherwise.
pub const DEFAULT_CHUNKS: usize = 5;

/// One request as the mock received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// `GET`, `POST`...
    pub method: String,
    /// Path with the query string, e.g. `/openai/deployments/d/chat/completions?api-version=2024-10-21`.
    pub path: String,
    /// Header names (lowercase) and values, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// The upstream model id the request was matched by (body `model`, Gemini
    /// path model or Azure deployment), if any.
    pub model: Option<String>,
}

impl Recorded {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The body as text (lossy).
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

#[derive(Default)]
struct Scripts {
    queues: HashMap<String, VecDeque<Step>>,
    defaults: HashMap<String, Step>,
    counts: HashMap<String, u64>,
    requests: Vec<Recorded>,
}

struct Inner {
    scripts: Mutex<Scripts>,
    recording: AtomicBool,
    chunks: AtomicUsize,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Scripts> {
        // A panic while holding the lock cannot leave the maps inconsistent.
        self.scripts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn chunks(&self) -> usize {
        self.chunks.load(Ordering::Relaxed)
    }

    fn script(&self, model: String, steps: Vec<Step>) {
        self.lock().queues.entry(model).or_default().extend(steps);
    }

    fn set_default(&self, model: String, step: Step) {
        self.lock().defaults.insert(model, step);
    }

    fn clear(&self) {
        let mut s = self.lock();
        s.requests.clear();
        s.counts.clear();
    }

    fn reset(&self) {
        *self.lock() = Scripts::default();
    }

    /// Records the request and takes the step that applies to it.
    fn admit(&self, parts: &Parts, body: &Bytes, model: Option<&str>) -> Step {
        let recorded = self
            .recording
            .load(Ordering::Relaxed)
            .then(|| record(parts, body, model));
        let mut s = self.lock();
        if let Some(r) = recorded {
            s.requests.push(r);
        }
        let Some(model) = model else {
            return Step::Ok;
        };
        match s.counts.get_mut(model) {
            Some(c) => *c += 1,
            None => {
                s.counts.insert(model.to_owned(), 1);
            }
        }
        if let Some(step) = s.queues.get_mut(model).and_then(VecDeque::pop_front) {
            return step;
        }
        s.defaults.get(model).cloned().unwrap_or(Step::Ok)
    }
}

fn record(parts: &Parts, body: &Bytes, model: Option<&str>) -> Recorded {
    Recorded {
        method: parts.method.as_str().to_owned(),
        path: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned()),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: body.clone(),
        model: model.map(str::to_owned),
    }
}

/// Handle on a running mock provider. Cheap to clone; all clones share the
/// same scripts and recordings. The server keeps running when handles are
/// dropped (until [`Mock::shutdown`] or the end of its tokio runtime).
#[derive(Clone)]
pub struct Mock {
    inner: Arc<Inner>,
    addr: SocketAddr,
    server: AbortHandle,
}

impl Mock {
    /// Starts a mock on `127.0.0.1:0` in the current tokio runtime.
    ///
    /// # Panics
    /// If no loopback port can be bound (use [`Mock::bind`] to handle that).
    pub async fn start() -> Mock {
        match Mock::bind("127.0.0.1:0").await {
            Ok(mock) => mock,
            Err(e) => panic!("sluice-mock: cannot bind 127.0.0.1:0: {e}"),
        }
    }

    /// Starts a mock on `addr` in the current tokio runtime.
    pub async fn bind(addr: &str) -> io::Result<Mock> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            scripts: Mutex::new(Scripts::default()),
            recording: AtomicBool::new(true),
            chunks: AtomicUsize::new(DEFAULT_CHUNKS),
        });
        let app = router(inner.clone());
        let listener = listener.tap_io(|tcp| {
            // Stream chunks must leave as they are written.
            let _ = tcp.set_nodelay(true);
        });
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        })
        .abort_handle();
        Ok(Mock {
            inner,
            addr,
            server,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Appends steps to `model`'s queue; each request for `model` consumes one.
    pub fn script(&self, model: &str, steps: Vec<Step>) {
        self.inner.script(model.to_owned(), steps);
    }

    /// Behaviour for `model` once its queue is empty (instead of [`Step::Ok`]).
    pub fn set_default(&self, model: &str, step: Step) {
        self.inner.set_default(model.to_owned(), step);
    }

    /// Number of stream content chunks for plain answers (default 5).
    pub fn set_default_chunks(&self, chunks: usize) {
        self.inner.chunks.store(chunks, Ordering::Relaxed);
    }

    /// Turns request recording on or off (on by default). Counts are always kept.
    pub fn set_recording(&self, on: bool) {
        self.inner.recording.store(on, Ordering::Relaxed);
    }

    /// All recorded requests, oldest first (control requests excluded).
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.lock().requests.clone()
    }

    /// Recorded requests for upstream model id `model`.
    pub fn requests_for(&self, model: &str) -> Vec<Recorded> {
        self.inner
            .lock()
            .requests
            .iter()
            .filter(|r| r.model.as_deref() == Some(model))
            .cloned()
            .collect()
    }

    /// Requests received for `model` since start or the last [`Mock::clear`].
    pub fn count(&self, model: &str) -> u64 {
        self.inner.lock().counts.get(model).copied().unwrap_or(0)
    }

    /// Forgets recorded requests and counts (scripts stay).
    pub fn clear(&self) {
        self.inner.clear();
    }

    /// Forgets everything: recordings, counts, queued scripts and defaults.
    pub fn reset(&self) {
        self.inner.reset();
    }

    /// Stops accepting connections (the port is released).
    pub fn shutdown(&self) {
        self.server.abort();
    }
}

impl std::fmt::Debug for Mock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mock")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

fn router(inner: Arc<Inner>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/chat/completions", post(handlers::chat))
        .route("/v1/models", get(accounts::models))
        .route("/models", get(accounts::models))
        .route("/openai/models", get(accounts::models))
        .route("/v1beta/models", get(accounts::gemini_models))
        .route("/v1/key", get(accounts::openrouter_key))
        .route("/key", get(accounts::openrouter_key))
        .route("/api/v1/key", get(accounts::openrouter_key))
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            post(handlers::azure_chat),
        )
        .route("/v1/responses", post(handlers::responses))
        .route("/responses", post(handlers::responses))
        .route("/v1/embeddings", post(handlers::embeddings))
        .route("/embeddings", post(handlers::embeddings))
        .route(
            "/openai/deployments/{deployment}/embeddings",
            post(handlers::azure_embeddings),
        )
        .route("/v1/messages", post(handlers::messages))
        .route("/v1beta/models/{*rest}", post(handlers::gemini))
        .route("/v1/models/{*rest}", post(handlers::gemini))
        .route("/token", post(oauth::token))
        .route(
            "/v1/projects/{project}/locations/{region}/publishers/google/models/{*rest}",
            post(handlers::vertex_google),
        )
        .route(
            "/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{*rest}",
            post(handlers::vertex_anthropic),
        )
        .route("/model/{model}/converse", post(handlers::bedrock_converse))
        .route("/model/{model}/invoke", post(handlers::bedrock_invoke))
        .route(
            "/model/{model}/converse-stream",
            post(handlers::bedrock_converse_stream),
        )
        .route("/_mock/script", post(control::script))
        .route("/_mock/default", post(control::set_default))
        .route("/_mock/requests", get(control::requests))
        .route("/_mock/clear", post(control::clear))
        .route("/_mock/reset", post(control::reset))
        .route("/_mock/recording", post(control::recording))
        .route("/_mock/chunks", post(control::chunks))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .with_state(inner)
}
