//! Fake trace vendors for the telemetry pulls: Braintrust, LangSmith, Langfuse,
//! PostHog and Mastra, each on its own port, speaking the vendor's API shapes
//! (paths, auth schemes, pagination, records) and throttling with 429 and
//! `Retry-After` when told to. Each serves the same `TRACES` traces of two spans
//! (a root and an LLM call), in small pages so a pull must page through them.

use axum::{
    extract::{Path, Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;

/// Traces each fake holds.
pub const TRACES: usize = 7;
/// Records per page, whatever a client asks for.
const PAGE: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    Braintrust,
    Langsmith,
    Langfuse,
    Posthog,
    Mastra,
}

struct Shared {
    vendor: Vendor,
    credential: String,
    requests: AtomicUsize,
    /// (answers left to throttle, their Retry-After seconds)
    throttle: Mutex<(usize, u64)>,
    /// Every request's headers and body as text, for the credential checks.
    seen: Mutex<Vec<String>>,
}

pub struct TraceVendor {
    addr: std::net::SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TraceVendor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TraceVendor {
    /// A fake of `vendor` that accepts `credential` (langfuse: `public:secret`).
    pub async fn start(vendor: Vendor, credential: &str) -> TraceVendor {
        let shared = Arc::new(Shared {
            vendor,
            credential: credential.to_string(),
            requests: AtomicUsize::new(0),
            throttle: Mutex::new((0, 0)),
            seen: Mutex::new(Vec::new()),
        });
        let app = match vendor {
            Vendor::Braintrust => Router::new()
                .route("/v1/project", get(bt_project))
                .route("/v1/project_logs/{id}/fetch", post(bt_fetch)),
            Vendor::Langsmith => Router::new()
                .route("/api/v1/sessions", get(ls_sessions))
                .route("/api/v1/runs/query", post(ls_query)),
            Vendor::Langfuse => Router::new()
                .route("/api/public/traces", get(lf_traces))
                .route("/api/public/observations", get(lf_observations)),
            Vendor::Posthog => Router::new().route("/api/projects/{id}/query/", post(ph_query)),
            Vendor::Mastra => Router::new()
                .route("/api/observability/traces", get(ma_list))
                .route("/api/observability/traces/{id}", get(ma_trace)),
        }
        .with_state(shared.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        TraceVendor { addr, shared, task }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next `times` answers are 429 with `Retry-After: secs`.
    pub fn throttle(&self, times: usize, secs: u64) {
        *self.shared.throttle.lock().unwrap() = (times, secs);
    }

    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Every request the fake received (headers and body), as text.
    pub fn seen(&self) -> Vec<String> {
        self.shared.seen.lock().unwrap().clone()
    }
}

fn b64(input: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in input.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Counts the request, throttles when told, and checks the vendor's auth scheme.
#[allow(clippy::result_large_err)] // the refusal is the handler's answer, returned at once
fn gate(s: &Shared, headers: &HeaderMap, body: &str) -> Result<(), Response> {
    s.requests.fetch_add(1, Ordering::SeqCst);
    s.seen.lock().unwrap().push(format!("{headers:?} {body}"));
    {
        let mut t = s.throttle.lock().unwrap();
        if t.0 > 0 {
            t.0 -= 1;
            return Err((
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", t.1.to_string())],
                Json(json!({"error": "rate limited", "detail": "Request was throttled."})),
            )
                .into_response());
        }
    }
    let h = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).unwrap_or("");
    let ok = match s.vendor {
        Vendor::Braintrust | Vendor::Posthog | Vendor::Mastra => {
            h("authorization") == format!("Bearer {}", s.credential)
        }
        Vendor::Langsmith => h("x-api-key") == s.credential,
        Vendor::Langfuse => h("authorization") == format!("Basic {}", b64(s.credential.as_bytes())),
    };
    if ok {
        Ok(())
    } else {
        let body = match s.vendor {
            Vendor::Langsmith => json!({"detail": "Invalid token"}),
            Vendor::Langfuse => {
                json!({"message": "Invalid credentials. Confirm that you've configured the correct host."})
            }
            Vendor::Posthog => {
                json!({"type": "authentication_error", "code": "authentication_failed", "detail": "Personal API key found in request is invalid."})
            }
            _ => json!({"error": "Unauthorized"}),
        };
        Err((StatusCode::UNAUTHORIZED, Json(body)).into_response())
    }
}

fn trace_id(i: usize) -> String {
    format!("trace-{i:02}")
}

const T0: i64 = 1_748_779_200; // 2025-06-01T12:00:00Z

fn iso(secs: i64, ms: i64) -> String {
    // Only whole days past T0 matter here: minutes and seconds from the offset.
    let total = secs - T0;
    format!("2025-06-01T12:{:02}:{:02}.{ms:03}Z", total / 60, total % 60)
}

// --- Braintrust -----------------------------------------------------------------

fn bt_events() -> Vec<Value> {
    let mut out = Vec::new();
    for i in 0..TRACES {
        let root = trace_id(i);
        let start = (T0 + i as i64 * 10) as f64;
        out.push(json!({"id": root, "span_id": root, "root_span_id": root, "span_parents": null,
            "span_attributes": {"name": "answer", "type": "task"}, "input": {"q": format!("question {i}")},
            "output": format!("answer {i}"), "metadata": {}, "metrics": {"start": start, "end": start + 2.0},
            "tags": ["pulled"], "created": iso(T0 + i as i64 * 10, 0), "_xact_id": format!("{}", 1000 + i)}));
        out.push(json!({"id": format!("{root}-llm"), "span_id": format!("{root}-llm"), "root_span_id": root,
            "span_parents": [root], "span_attributes": {"name": "Chat Completion", "type": "llm"},
            "input": [{"role": "user", "content": format!("question {i}")}],
            "output": [{"index": 0, "message": {"role": "assistant", "content": format!("answer {i}")}, "finish_reason": "stop"}],
            "metadata": {"model": "gpt-4o-mini", "provider": "openai"},
            "metrics": {"start": start + 0.1, "end": start + 1.9, "prompt_tokens": 10 + i, "completion_tokens": 5, "estimated_cost": 0.00001},
            "created": iso(T0 + i as i64 * 10, 100), "_xact_id": format!("{}", 2000 + i)}));
    }
    out
}

async fn bt_project(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&s, &headers, "") {
        return r;
    }
    let objects = if q.get("project_name").map(String::as_str) == Some("support-bot") {
        json!([{"id": "proj-1", "name": "support-bot", "org_id": "org-1"}])
    } else {
        json!([])
    };
    Json(json!({"objects": objects})).into_response()
}

async fn bt_fetch(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Err(r) = gate(&s, &headers, &body.to_string()) {
        return r;
    }
    if id != "proj-1" {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "Project not found"})),
        )
            .into_response();
    }
    let all = bt_events();
    let from: usize = body["cursor"]
        .as_str()
        .and_then(|c| c.strip_prefix('c'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let n = (body["limit"].as_u64().unwrap_or(100) as usize).min(PAGE);
    let page: Vec<Value> = all.iter().skip(from).take(n).cloned().collect();
    let next = from + page.len();
    let cursor = if next < all.len() {
        json!(format!("c{next}"))
    } else {
        Value::Null
    };
    Json(json!({"events": page, "cursor": cursor})).into_response()
}

// --- LangSmith ------------------------------------------------------------------

fn ls_runs() -> Vec<Value> {
    let mut out = Vec::new();
    for i in 0..TRACES {
        let root = trace_id(i);
        out.push(json!({"id": root, "name": "RunnableSequence", "run_type": "chain", "trace_id": root, "parent_run_id": null,
            "start_time": iso(T0 + i as i64 * 10, 0).trim_end_matches('Z'), "end_time": iso(T0 + i as i64 * 10 + 2, 0).trim_end_matches('Z'),
            "inputs": {"question": format!("question {i}")}, "outputs": {"output": format!("answer {i}")},
            "extra": {"metadata": {}}, "tags": ["pulled"], "prompt_tokens": 10 + i, "completion_tokens": 5, "total_cost": 0.00001,
            "session_id": "sess-1", "status": "success"}));
        out.push(json!({"id": format!("{root}-llm"), "name": "ChatOpenAI", "run_type": "llm", "trace_id": root, "parent_run_id": root,
            "start_time": iso(T0 + i as i64 * 10, 100).trim_end_matches('Z'), "end_time": iso(T0 + i as i64 * 10 + 1, 900).trim_end_matches('Z'),
            "inputs": {"messages": [[{"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "HumanMessage"], "kwargs": {"content": format!("question {i}"), "type": "human"}}]]},
            "outputs": {"generations": [[{"text": format!("answer {i}"), "message": {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "AIMessage"], "kwargs": {"content": format!("answer {i}")}}}]]},
            "extra": {"invocation_params": {"model": "gpt-4o-mini"}, "metadata": {"ls_provider": "openai", "ls_model_name": "gpt-4o-mini"}},
            "prompt_tokens": 10 + i, "completion_tokens": 5, "total_cost": 0.00001, "session_id": "sess-1", "status": "success"}));
    }
    out
}

async fn ls_sessions(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&s, &headers, "") {
        return r;
    }
    if q.get("name").map(String::as_str) == Some("support-bot") {
        Json(json!([{"id": "sess-1", "name": "support-bot", "tenant_id": "t-1"}])).into_response()
    } else {
        Json(json!([])).into_response()
    }
}

async fn ls_query(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Err(r) = gate(&s, &headers, &body.to_string()) {
        return r;
    }
    if body["session"] != json!(["sess-1"]) {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"detail": "Session not found"})),
        )
            .into_response();
    }
    let all = ls_runs();
    let from: usize = body["cursor"]
        .as_str()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let n = (body["limit"].as_u64().unwrap_or(100) as usize).min(PAGE);
    let page: Vec<Value> = all.iter().skip(from).take(n).cloned().collect();
    let next = from + page.len();
    let cursor = if next < all.len() {
        json!(next.to_string())
    } else {
        Value::Null
    };
    Json(json!({"runs": page, "cursors": {"next": cursor, "prev": null}})).into_response()
}

// --- Langfuse -------------------------------------------------------------------

fn paged(all: Vec<Value>, q: &HashMap<String, String>) -> Value {
    let page: usize = q
        .get("page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(1)
        .max(1);
    let limit = q
        .get("limit")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(50)
        .min(PAGE);
    let total = all.len();
    let data: Vec<Value> = all
        .into_iter()
        .skip((page - 1) * limit)
        .take(limit)
        .collect();
    json!({"data": data, "meta": {"page": page, "limit": limit, "totalItems": total, "totalPages": total.div_ceil(limit)}})
}

async fn lf_traces(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&s, &headers, "") {
        return r;
    }
    let all: Vec<Value> = (0..TRACES)
        .map(|i| {
            json!({"id": trace_id(i), "timestamp": iso(T0 + i as i64 * 10, 0), "name": "rag-pipeline",
                "input": {"query": format!("question {i}")}, "output": format!("answer {i}"), "tags": ["pulled"],
                "observations": [format!("{}-obs", trace_id(i))], "totalCost": 0.00001, "latency": 2.0, "projectId": "p-1"})
        })
        .collect();
    Json(paged(all, &q)).into_response()
}

async fn lf_observations(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&s, &headers, "") {
        return r;
    }
    let mut all: Vec<Value> = (0..TRACES)
        .flat_map(|i| {
            let t = trace_id(i);
            vec![
                json!({"id": format!("{t}-span"), "traceId": t, "type": "SPAN", "name": "retrieval",
                    "startTime": iso(T0 + i as i64 * 10, 0), "endTime": iso(T0 + i as i64 * 10, 300), "parentObservationId": null, "level": "DEFAULT"}),
                json!({"id": format!("{t}-obs"), "traceId": t, "type": "GENERATION", "name": "answer", "model": "gpt-4o-mini",
                    "startTime": iso(T0 + i as i64 * 10, 400), "endTime": iso(T0 + i as i64 * 10 + 1, 900), "parentObservationId": format!("{t}-span"),
                    "input": [{"role": "user", "content": format!("question {i}")}], "output": {"role": "assistant", "content": format!("answer {i}")},
                    "usage": {"input": 10 + i, "output": 5, "total": 15 + i, "unit": "TOKENS"}, "calculatedTotalCost": 0.00001, "level": "DEFAULT"}),
            ]
        })
        .collect();
    // An observation of a trace the pull did not take (outside its bound) is
    // listed too, as the real API lists every observation.
    all.push(json!({"id": "stray", "traceId": "trace-elsewhere", "type": "SPAN", "name": "x", "startTime": iso(T0, 0)}));
    Json(paged(all, &q)).into_response()
}

// --- PostHog --------------------------------------------------------------------

fn ph_rows() -> Vec<Value> {
    let mut out = Vec::new();
    for i in 0..TRACES {
        let t = trace_id(i);
        out.push(json!([
            format!("{t}-trace-evt"),
            "$ai_trace",
            iso(T0 + i as i64 * 10 + 2, 0),
            "user_1",
            json!({"$ai_trace_id": t, "$ai_trace_name": "checkout", "$ai_latency": 2.0})
                .to_string()
        ]));
        out.push(json!([format!("{t}-gen-evt"), "$ai_generation", iso(T0 + i as i64 * 10 + 1, 900), "user_1",
            json!({"$ai_trace_id": t, "$ai_span_id": format!("{t}-gen"), "$ai_parent_id": t, "$ai_model": "gpt-4o-mini", "$ai_provider": "openai",
                "$ai_input": [{"role": "user", "content": format!("question {i}")}], "$ai_output_choices": [{"role": "assistant", "content": format!("answer {i}")}],
                "$ai_input_tokens": 10 + i, "$ai_output_tokens": 5, "$ai_total_cost_usd": 0.00001, "$ai_latency": 1.8}).to_string()]));
        out.push(json!([format!("{t}-span-evt"), "$ai_span", iso(T0 + i as i64 * 10, 500), "user_1",
            json!({"$ai_trace_id": t, "$ai_span_id": format!("{t}-span"), "$ai_parent_id": t, "$ai_span_name": "lookup", "$ai_latency": 0.4}).to_string()]));
    }
    out
}

fn number_after(q: &str, word: &str) -> Option<usize> {
    let at = q.find(word)? + word.len();
    q[at..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

async fn ph_query(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    if let Err(r) = gate(&s, &headers, &body.to_string()) {
        return r;
    }
    if id != "12345" {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"type": "invalid_request", "code": "not_found", "detail": "Not found."})),
        )
            .into_response();
    }
    let query = body["query"]["query"].as_str().unwrap_or("");
    if body["query"]["kind"] != "HogQLQuery" || !query.contains("FROM events") {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"type": "validation_error", "detail": "bad query"})),
        )
            .into_response();
    }
    let limit = number_after(query, "LIMIT").unwrap_or(100).min(PAGE);
    let offset = number_after(query, "OFFSET").unwrap_or(0);
    let all = ph_rows();
    let rows: Vec<Value> = all.iter().skip(offset).take(limit).cloned().collect();
    let has_more = offset + rows.len() < all.len();
    Json(json!({"columns": ["uuid", "event", "timestamp", "distinct_id", "properties"],
        "types": [["uuid", "UUID"], ["event", "String"], ["timestamp", "DateTime64(6, 'UTC')"], ["distinct_id", "String"], ["properties", "String"]],
        "results": rows, "hasMore": has_more, "limit": limit, "offset": offset, "is_cached": false}))
    .into_response()
}

// --- Mastra ---------------------------------------------------------------------

fn ma_spans(i: usize) -> Vec<Value> {
    let t = trace_id(i);
    vec![
        json!({"traceId": t, "spanId": format!("{t}-root"), "parentSpanId": null, "name": "agent run: 'support'", "spanType": "agent_run",
            "startedAt": iso(T0 + i as i64 * 10, 0), "endedAt": iso(T0 + i as i64 * 10 + 2, 0),
            "input": [{"role": "user", "content": format!("question {i}")}], "output": {"text": format!("answer {i}")}, "attributes": {"agentId": "support"}}),
        json!({"traceId": t, "spanId": format!("{t}-llm"), "parentSpanId": format!("{t}-root"), "name": "llm: 'gpt-4o-mini'", "spanType": "model_generation",
            "startedAt": iso(T0 + i as i64 * 10, 100), "endedAt": iso(T0 + i as i64 * 10 + 1, 900),
            "input": {"messages": [{"role": "user", "content": format!("question {i}")}]}, "output": {"text": format!("answer {i}")},
            "attributes": {"model": "gpt-4o-mini", "provider": "openai.chat", "usage": {"inputTokens": 10 + i, "outputTokens": 5}}}),
    ]
}

async fn ma_list(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&s, &headers, "") {
        return r;
    }
    let page: usize = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(0);
    let per = q
        .get("perPage")
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(10)
        .min(PAGE);
    let roots: Vec<Value> = (0..TRACES)
        .map(|i| ma_spans(i)[0].clone())
        .skip(page * per)
        .take(per)
        .collect();
    let has_more = (page + 1) * per < TRACES;
    Json(json!({"pagination": {"total": TRACES, "page": page, "perPage": per, "hasMore": has_more}, "spans": roots})).into_response()
}

async fn ma_trace(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = gate(&s, &headers, "") {
        return r;
    }
    match (0..TRACES).find(|i| trace_id(*i) == id) {
        Some(i) => Json(json!({"traceId": id, "spans": ma_spans(i)})).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "Trace not found"})),
        )
            .into_response(),
    }
}
