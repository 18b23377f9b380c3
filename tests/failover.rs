//! The proxy engine on the chat-completions route, against the mock provider:
//! fail-over from every failure kind before the first content, none after it, the
//! retry-once rule, the cut stream, empty completions, refusals, the breaker, the
//! deadline, the output cap, early keep-alives, client disconnects and the drain.

mod harness;

use harness::{assert_error, Env, Provider, Sluice};
use serde_json::{json, Value};
use sluice_mock::Step;
use std::time::{Duration, Instant};

async fn start(extra: &[(&str, &str)]) -> Env {
    use Provider::*;
    let providers = [OpenAi, Azure, Mistral, OpenRouter];
    Env::start("tests/fixtures/engine.toml", &providers, |o, _| {
        let mut o = o.each(&providers, "HEADER_TIMEOUT_MS", 600).each(
            &providers,
            "FIRST_TOKEN_TIMEOUT_MS",
            600,
        );
        for (k, v) in extra {
            o = o.env(k, v);
        }
        o
    })
    .await
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Say hello"}]})
}

fn stream_body(model: &str) -> Value {
    json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "Say hello"}]})
}

struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

/// Sends a chat-completions request with the env's key.
async fn send(e: &Env, body: &Value) -> reqwest::Response {
    e.s.http
        .post(format!("{}/v1/chat/completions", e.s.gateway))
        .bearer_auth(&e.key)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn post(e: &Env, body: &Value) -> Answer {
    let r = send(e, body).await;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    Answer {
        status,
        headers,
        body: r.json().await.unwrap_or(Value::Null),
    }
}

fn header(a: &reqwest::header::HeaderMap, name: &str) -> String {
    a.get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// A whole SSE answer: status, headers, raw text, and its data payloads.
struct Sse {
    status: u16,
    headers: reqwest::header::HeaderMap,
    text: String,
    data: Vec<String>,
}

async fn post_stream(e: &Env, body: &Value) -> Sse {
    let mut r = send(e, body).await;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let mut text = String::new();
    while let Ok(Some(c)) = r.chunk().await {
        text.push_str(&String::from_utf8_lossy(&c));
    }
    let data = text
        .split("\n\n")
        .filter_map(|ev| ev.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(str::to_string)
        .collect();
    Sse {
        status,
        headers,
        text,
        data,
    }
}

fn chunks(sse: &Sse) -> Vec<Value> {
    sse.data
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn content(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect()
}

#[tokio::test]
async fn a_plain_answer_names_its_rung_and_model_with_usage_and_receipt() {
    let e = start(&[]).await;
    let a = post(&e, &json!({"model": "chat-a", "prompt_cache_key": "conv-1", "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["provider"], "openai:a1");
    assert_eq!(
        a.body["model"], "a1-2025-04-14",
        "the model id the provider reported"
    );
    assert_eq!(
        a.body["choices"][0]["message"]["content"],
        "Hello from mock a1."
    );
    assert!(a.body["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(header(&a.headers, "x-gateway-attempts"), "openai:ok");
    assert!(header(&a.headers, "x-gateway-overhead-us")
        .parse::<u64>()
        .is_ok());
    // What the provider received: its own model id, the platform credential, never
    // the caller's key, never prompt_cache_key.
    let got = e.mock.requests_for("a1");
    assert_eq!(got.len(), 1);
    let r = &got[0];
    assert_eq!(r.header("authorization"), Some("Bearer sk-platform-openai"));
    assert!(!r.body_str().contains(&e.key));
    let sent = r.json().unwrap();
    assert_eq!(sent["model"], "a1");
    assert!(sent.get("prompt_cache_key").is_none());
    assert_eq!(sent["messages"][0]["content"], "hi");
    assert_eq!(r.header("host").unwrap(), e.mock.addr().to_string());
}

#[tokio::test]
async fn every_failure_kind_before_content_fails_over() {
    let e = start(&[("SLUICE_BREAKER__FAILURE_THRESHOLD", "1000")]).await;
    let cases: Vec<(Step, &str, bool)> = vec![
        (Step::Status(500), "openai:500", false),
        (Step::Status(429), "openai:429", false),
        (Step::Status(401), "openai:401", false),
        (Step::Status(403), "openai:403", false),
        (Step::Status(404), "openai:404", false),
        (Step::CloseConnection, "openai:died", false),
        (
            Step::DelayHeaders(Duration::from_millis(1500)),
            "openai:header_timeout",
            false,
        ),
        (
            Step::DelayFirstToken(Duration::from_millis(1500)),
            "openai:first_token_timeout",
            true,
        ),
        (Step::ErrorEvent, "openai:error_event", true),
    ];
    for (step, first, stream) in cases {
        // CloseConnection dies before output: the same rung is retried once first.
        let steps = if matches!(step, Step::CloseConnection) {
            vec![step.clone(), step.clone()]
        } else {
            vec![step.clone()]
        };
        e.mock.script("a1", steps);
        let (status, attempts, provider, text) = if stream {
            let sse = post_stream(&e, &stream_body("chat-a")).await;
            let c = chunks(&sse);
            (
                sse.status,
                header(&sse.headers, "x-gateway-attempts"),
                c[0]["provider"].clone(),
                content(&c),
            )
        } else {
            let a = post(&e, &chat("chat-a")).await;
            let text = a.body["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (
                a.status,
                header(&a.headers, "x-gateway-attempts"),
                a.body["provider"].clone(),
                text,
            )
        };
        assert_eq!(status, 200, "{step:?}");
        assert_eq!(provider, "azure:a2", "{step:?}");
        assert_eq!(text, "Hello from mock a2.", "{step:?}");
        assert!(attempts.starts_with(first), "{step:?}: {attempts}");
        assert!(attempts.ends_with("azure:ok"), "{step:?}: {attempts}");
    }
    // Azure was called with its own auth header and deployment path.
    let az = e.mock.requests_for("a2");
    assert!(az[0]
        .path
        .starts_with("/openai/deployments/a2/chat/completions?api-version="));
    assert_eq!(az[0].header("api-key"), Some("az-platform"));
}

#[tokio::test]
async fn no_fail_over_after_commit_and_a_cut_stream_settles_as_length() {
    let e = start(&[]).await;
    e.mock.script("a1", vec![Step::CutAfter(2)]);
    let sse = post_stream(&e, &stream_body("chat-a")).await;
    assert_eq!(sse.status, 200);
    let c = chunks(&sse);
    assert_eq!(
        content(&c),
        "Hello from",
        "the two chunks that came, nothing from another rung"
    );
    assert_eq!(e.mock.count("a2"), 0, "no fail-over after commit");
    assert!(c.iter().all(|ch| ch["provider"] == "openai:a1"));
    let last = c.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    // Without stream_options.include_usage no chunk carries a usage.
    assert!(c.iter().all(|ch| ch["usage"].is_null()), "{c:?}");
    assert_eq!(sse.data.last().unwrap(), "[DONE]");
    // With it, the usage of what was delivered comes in its own last chunk.
    e.mock.script("a1", vec![Step::CutAfter(2)]);
    let mut body = stream_body("chat-a");
    body["stream_options"] = json!({"include_usage": true});
    let c = chunks(&post_stream(&e, &body).await);
    let (usage, fin) = (&c[c.len() - 1], &c[c.len() - 2]);
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    assert_eq!(fin["usage"], Value::Null, "{fin}");
    assert_eq!(usage["choices"], json!([]));
    assert!(
        usage["usage"]["completion_tokens"].as_u64().unwrap() > 0,
        "{usage}"
    );
}

#[tokio::test]
async fn a_stream_is_rewritten_event_by_event() {
    let e = start(&[]).await;
    e.mock.script("a1", vec![Step::Chunks(50)]);
    let sse = post_stream(&e, &stream_body("chat-a")).await;
    assert_eq!(sse.status, 200);
    assert_eq!(header(&sse.headers, "content-type"), "text/event-stream");
    assert_eq!(header(&sse.headers, "x-gateway-attempts"), "openai:ok");
    let c = chunks(&sse);
    let pieces = c
        .iter()
        .filter(|ch| {
            ch["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        })
        .count();
    assert_eq!(pieces, 50, "every chunk delivered");
    assert!(c
        .iter()
        .all(|ch| ch["provider"] == "openai:a1" && ch["model"] == "a1-2025-04-14"));
    assert!(
        c.iter()
            .all(|ch| ch.get("usage").is_none_or(Value::is_null)),
        "usage chunk stripped when not asked for"
    );
    let fin = c
        .iter()
        .find(|ch| ch["choices"][0]["finish_reason"] == "stop")
        .unwrap();
    assert_eq!(fin["x_gateway"]["attempts"], "openai:ok");
    assert!(fin["x_gateway"]["overhead_us"].as_u64().is_some());
    assert_eq!(sse.data.last().unwrap(), "[DONE]");
    // Asking for usage keeps the usage chunk.
    let mut body = stream_body("chat-a");
    body["stream_options"] = json!({"include_usage": true});
    let sse = post_stream(&e, &body).await;
    let c = chunks(&sse);
    let u = c
        .iter()
        .find(|ch| ch["usage"].is_object())
        .expect("usage chunk");
    assert!(u["usage"]["total_tokens"].as_u64().unwrap() > 0);
    assert_eq!(u["choices"], json!([]));
    // Upstream was always asked for usage.
    for r in e.mock.requests_for("a1") {
        assert_eq!(r.json().unwrap()["stream_options"]["include_usage"], true);
    }
}

#[tokio::test]
async fn the_same_rung_is_retried_once_after_dying_before_output() {
    let e = start(&[]).await;
    e.mock.script("a1", vec![Step::CutAfter(0)]);
    let sse = post_stream(&e, &stream_body("chat-a")).await;
    assert_eq!(
        header(&sse.headers, "x-gateway-attempts"),
        "openai:died,openai:ok"
    );
    assert_eq!(chunks(&sse)[0]["provider"], "openai:a1");
    e.mock
        .script("a1", vec![Step::CutAfter(0), Step::CutAfter(0)]);
    let sse = post_stream(&e, &stream_body("chat-a")).await;
    assert_eq!(
        header(&sse.headers, "x-gateway-attempts"),
        "openai:died,openai:died,azure:ok"
    );
    // A route of one rung that dies twice: provider_internal.
    e.mock
        .script("s1", vec![Step::CutAfter(0), Step::CutAfter(0)]);
    let a = post(&e, &stream_body("chat-solo")).await;
    assert_error(a.status, &a.body, 502, "provider_internal");
}

#[tokio::test]
async fn every_rung_failing_is_all_routes_failed_naming_them() {
    let e = start(&[]).await;
    e.mock.script("a1", vec![Step::Status(500)]);
    e.mock.script("a2", vec![Step::Status(503)]);
    let a = post(&e, &chat("chat-a")).await;
    assert_error(a.status, &a.body, 502, "all_routes_failed");
    let msg = a.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("openai:a1") && msg.contains("azure:a2") && msg.contains("503"),
        "{msg}"
    );
    assert!(
        !msg.contains("sk-platform") && !msg.contains("az-platform"),
        "no secrets: {msg}"
    );
    assert_eq!(
        header(&a.headers, "x-gateway-attempts"),
        "openai:500,azure:503"
    );
}

#[tokio::test]
async fn a_one_megabyte_body_fails_over_across_three_rungs() {
    let e = start(&[]).await;
    e.mock.script("t1", vec![Step::Status(500)]);
    e.mock.script("t2", vec![Step::Status(429)]);
    let big = "x".repeat(1024 * 1024);
    let a = post(
        &e,
        &json!({"model": "chat-three", "messages": [{"role": "user", "content": big}]}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["provider"], "openrouter:t3");
    assert_eq!(
        header(&a.headers, "x-gateway-attempts"),
        "openai:500,mistral:429,openrouter:ok"
    );
    for m in ["t1", "t2", "t3"] {
        let r = &e.mock.requests_for(m)[0];
        let sent = r.json().unwrap();
        assert_eq!(
            sent["messages"][0]["content"].as_str().unwrap().len(),
            1024 * 1024,
            "{m} got the whole body"
        );
    }
}

#[tokio::test]
async fn empty_turns_on_every_rung_are_an_empty_completion() {
    let e = start(&[]).await;
    e.mock.script("a1", vec![Step::Empty, Step::Empty]);
    e.mock.script("a2", vec![Step::Empty, Step::Empty]);
    let a = post(&e, &chat("chat-a")).await;
    assert_eq!(a.status, 200);
    assert_eq!(header(&a.headers, "x-gateway-warning"), "empty_completion");
    assert_eq!(a.body["choices"][0]["finish_reason"], "stop");
    assert!(a.body["choices"][0]["message"]["content"].is_null());
    assert_eq!(
        header(&a.headers, "x-gateway-attempts"),
        "openai:empty_completion,azure:empty_completion"
    );
    let sse = post_stream(&e, &stream_body("chat-a")).await;
    assert_eq!(sse.status, 200);
    assert_eq!(
        header(&sse.headers, "x-gateway-warning"),
        "empty_completion"
    );
    let c = chunks(&sse);
    assert_eq!(c.last().unwrap()["choices"][0]["finish_reason"], "stop");
    assert_eq!(sse.data.last().unwrap(), "[DONE]");
    // The ledger records the failed attempts under SPEC's class, at zero cost.
    let mut event = Value::Null;
    for _ in 0..50 {
        let (_, all) =
            e.s.get("/api/gateway/usage/events?limit=10", Some(&e.key))
                .await;
        if let Some(ev) = all["data"].as_array().and_then(|d| d.last()) {
            event = ev.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        event["attempts"], "openai:empty_completion,azure:empty_completion",
        "{event}"
    );
    assert_eq!(event["empty_attempts"], 2, "{event}");
    // One empty rung, then content: the waterfall goes on.
    e.mock.script("a1", vec![Step::Empty]);
    let a = post(&e, &chat("chat-a")).await;
    assert_eq!(a.body["provider"], "azure:a2");
}

#[tokio::test]
async fn a_refusal_does_not_fail_over() {
    let e = start(&[]).await;
    e.mock
        .script("a1", vec![Step::Refusal("I can't help with that.".into())]);
    let a = post(&e, &chat("chat-a")).await;
    assert_error(a.status, &a.body, 400, "refusal");
    assert!(a.body["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("provider refused the request: "));
    assert!(a.body["error"]["refusal_reason"].is_string());
    assert_eq!(e.mock.count("a2"), 0);
}

#[tokio::test]
async fn a_rung_that_keeps_failing_cools_down_then_is_probed() {
    let e = start(&[
        ("SLUICE_BREAKER__FAILURE_THRESHOLD", "2"),
        ("SLUICE_BREAKER__COOLDOWN_MS", "800"),
    ])
    .await;
    e.mock
        .script("a1", vec![Step::Status(500), Step::Status(500)]);
    for _ in 0..2 {
        assert_eq!(post(&e, &chat("chat-a")).await.body["provider"], "azure:a2");
    }
    let a = post(&e, &chat("chat-a")).await;
    assert_eq!(
        header(&a.headers, "x-gateway-attempts"),
        "azure:ok",
        "open rung skipped"
    );
    assert_eq!(e.mock.count("a1"), 2);
    tokio::time::sleep(Duration::from_millis(900)).await;
    let a = post(&e, &chat("chat-a")).await;
    assert_eq!(
        header(&a.headers, "x-gateway-attempts"),
        "openai:ok",
        "half-open probe succeeds"
    );
    // A model whose every rung is open: 503 unavailable_route.
    e.mock
        .script("s1", vec![Step::Status(500), Step::Status(500)]);
    for _ in 0..2 {
        assert_eq!(post(&e, &chat("chat-solo")).await.status, 502);
    }
    let a = post(&e, &chat("chat-solo")).await;
    assert_error(a.status, &a.body, 503, "unavailable_route");
}

#[tokio::test]
async fn deadline_and_output_limit() {
    let e = start(&[("SLUICE_LIMITS__REQUEST_DEADLINE_MS", "300")]).await;
    e.mock
        .script("a1", vec![Step::DelayHeaders(Duration::from_millis(500))]);
    let a = post(&e, &chat("chat-a")).await;
    assert_error(a.status, &a.body, 504, "deadline_exceeded");
    let e = start(&[("SLUICE_LIMITS__MAX_RESPONSE_BYTES", "100")]).await;
    let a = post(&e, &chat("chat-a")).await;
    assert_error(a.status, &a.body, 502, "provider_output_too_large");
}

#[tokio::test]
async fn a_slow_first_token_gets_an_early_header_and_keepalives() {
    let e = start(&[
        ("SLUICE_LIMITS__EARLY_HEADER_MS", "150"),
        ("SLUICE_PROVIDERS__OPENAI__FIRST_TOKEN_TIMEOUT_MS", "3000"),
    ])
    .await;
    e.mock.script(
        "a1",
        vec![Step::DelayFirstToken(Duration::from_millis(1300))],
    );
    let sse = post_stream(&e, &stream_body("chat-a")).await;
    assert_eq!(sse.status, 200);
    assert!(sse.text.starts_with(": keep-alive"), "{}", sse.text);
    assert_eq!(content(&chunks(&sse)), "Hello from mock a1.");
    // Fail-over after the early header stays invisible.
    e.mock.script(
        "a1",
        vec![Step::DelayFirstToken(Duration::from_millis(3500))],
    );
    let sse = post_stream(&e, &stream_body("chat-a")).await;
    assert_eq!(sse.status, 200);
    let c = chunks(&sse);
    assert_eq!(content(&c), "Hello from mock a2.");
    assert_eq!(
        c.last().unwrap()["x_gateway"]["attempts"],
        "openai:first_token_timeout,azure:ok"
    );
    // Every rung failing after the early header: an in-band error with the code.
    e.mock.script(
        "a1",
        vec![Step::DelayFirstToken(Duration::from_millis(3500))],
    );
    e.mock.script("a2", vec![Step::Status(500)]);
    let sse = post_stream(&e, &stream_body("chat-a")).await;
    assert_eq!(sse.status, 200);
    assert_eq!(sse.data.last().unwrap(), "[DONE]");
    let err: Value = serde_json::from_str(&sse.data[sse.data.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "all_routes_failed");
}

#[tokio::test]
async fn a_client_that_leaves_ends_the_call_and_is_recorded_as_cancelled() {
    let e = start(&[("SLUICE_PROVIDERS__OPENAI__HEADER_TIMEOUT_MS", "5000")]).await;
    e.mock
        .script("a1", vec![Step::DelayHeaders(Duration::from_millis(3000))]);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let r = client
        .post(format!("{}/v1/chat/completions", e.s.gateway))
        .bearer_auth(&e.key)
        .json(&chat("chat-a"))
        .send()
        .await;
    assert!(r.is_err(), "the client gave up");
    let db = usage_db(&e.s).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let rows = sqlx::query_scalar::<_, i64>("SELECT status FROM usage_events")
            .fetch_all(&db)
            .await
            .unwrap();
        if rows.contains(&499) {
            break;
        }
        assert!(Instant::now() < deadline, "no 499 record: {rows:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(e.mock.count("a2"), 0, "no fail-over for a client that left");
}

async fn usage_db(s: &Sluice) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    sqlx::AnyPool::connect(&s.database_url).await.unwrap()
}

#[tokio::test]
async fn usage_events_are_recorded_per_request() {
    let e = start(&[]).await;
    e.mock.script("a1", vec![Step::Status(429)]);
    assert_eq!(post(&e, &chat("chat-a")).await.status, 200);
    let db = usage_db(&e.s).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    let row = loop {
        let rows: Vec<(String, String, i64, i64)> =
            sqlx::query_as("SELECT rung, attempts, status, input_tokens FROM usage_events")
                .fetch_all(&db)
                .await
                .unwrap();
        if let Some(r) = rows.into_iter().next() {
            break r;
        }
        assert!(Instant::now() < deadline, "no usage event");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(row.0, "azure:a2");
    assert_eq!(row.1, "openai:429,azure:ok");
    assert_eq!(row.2, 200);
    assert!(row.3 > 0);
}

#[tokio::test]
async fn rungs_of_another_wire_are_skipped_on_this_route() {
    let e = start(&[]).await;
    let a = post(&e, &chat("chat-mixed")).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["provider"], "openai:m2");
}

#[tokio::test]
async fn sigterm_lets_open_streams_finish() {
    let e = start(&[("SLUICE_SERVER__GRACE_PERIOD_SECONDS", "4")]).await;
    e.mock.script(
        "a1",
        vec![Step::SlowChunks {
            n: 8,
            every: Duration::from_millis(150),
        }],
    );
    let mut r = send(&e, &stream_body("chat-a")).await;
    assert_eq!(r.status(), 200);
    e.s.terminate();
    let mut text = String::new();
    while let Ok(Some(c)) = r.chunk().await {
        text.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(
        text.trim_end().ends_with("data: [DONE]"),
        "the open stream finished: {text}"
    );
    assert_eq!(text.matches("\"finish_reason\":\"stop\"").count(), 1);
    // New requests are refused while draining.
    match e
        .s
        .http
        .post(format!("{}/v1/chat/completions", e.s.gateway))
        .bearer_auth(&e.key)
        .json(&chat("chat-a"))
        .send()
        .await
    {
        Ok(r) => assert_eq!(r.status(), 503),
        Err(err) => assert!(err.is_connect() || err.is_request(), "{err}"),
    }
}

#[tokio::test]
async fn a_cooled_down_rung_not_reached_keeps_its_probe() {
    let e = start(&[
        ("SLUICE_BREAKER__FAILURE_THRESHOLD", "1"),
        ("SLUICE_BREAKER__COOLDOWN_MS", "300"),
    ])
    .await;
    e.mock.script("a1", vec![Step::Status(500)]);
    e.mock.script("a2", vec![Step::Status(500)]);
    assert_eq!(
        post(&e, &chat("chat-a")).await.status,
        502,
        "both rungs fail and open"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The first rung's probe serves; the second is never reached.
    let a = post(&e, &chat("chat-a")).await;
    assert_eq!(header(&a.headers, "x-gateway-attempts"), "openai:ok");
    // Later the first rung fails: the second, cooled down and never probed, is tried.
    e.mock.script("a1", vec![Step::Status(500)]);
    let a = post(&e, &chat("chat-a")).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        header(&a.headers, "x-gateway-attempts"),
        "openai:500,azure:ok"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_dribbled_past_the_read_bound_is_refused_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let e = start(&[("SLUICE_LIMITS__REQUEST_READ_TIMEOUT_MS", "800")]).await;
    let addr = e.s.gateway.trim_start_matches("http://").to_string();
    for path in ["/v1/chat/completions", "/api/models"] {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{{\"model\"",
            e.key
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let started = Instant::now();
        // A byte every 300 ms: each read is quick, the whole never arrives.
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        for _ in 0..40 {
            if conn.write_all(b" ").await.is_err() {
                break;
            }
            match tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
            if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 408"), "{path}: {text}");
        assert!(started.elapsed() < Duration::from_secs(10), "{path}");
    }
    assert_eq!(e.mock.count("a1"), 0);
}

#[tokio::test]
async fn a_request_every_rung_refuses_as_malformed_is_the_callers_400() {
    let e = start(&[]).await;
    // One rung refuses, the next serves: fail-over as before.
    e.mock.script("a1", vec![Step::Status(400)]);
    let a = post(&e, &chat("chat-a")).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.body["provider"], "azure:a2");
    assert_eq!(
        header(&a.headers, "x-gateway-attempts"),
        "openai:400,azure:ok"
    );
    // Every rung refuses: the last refusal is the answer, a 400 the caller fixes
    // (not a 502 that retry rules would repeat), every rung still in the receipt.
    e.mock.script("a1", vec![Step::Status(400)]);
    e.mock.script("a2", vec![Step::Status(422)]);
    let a = post(&e, &chat("chat-a")).await;
    assert_error(a.status, &a.body, 400, "invalid_request");
    assert!(
        a.body["error"]["message"].as_str().unwrap().contains("422"),
        "the provider's own message: {}",
        a.body
    );
    assert_eq!(
        header(&a.headers, "x-gateway-attempts"),
        "openai:400,azure:400"
    );
    // A refusal followed by a failure is a failure.
    e.mock.script("a1", vec![Step::Status(400)]);
    e.mock.script("a2", vec![Step::Status(503)]);
    let a = post(&e, &chat("chat-a")).await;
    assert_error(a.status, &a.body, 502, "all_routes_failed");
    // The provider's message never carries the rung's credential back, and a
    // field it names is the param.
    let echo = json!({"error": {"message": "Bad key sk-platform-openai for tools[0].name", "type": "invalid_request_error", "param": "tools[0].name", "code": null}});
    e.mock.script(
        "s1",
        vec![Step::Reply {
            status: 400,
            body: echo.to_string(),
            retry_after: None,
        }],
    );
    let a = post(&e, &chat("chat-solo")).await;
    assert_error(a.status, &a.body, 400, "invalid_parameter");
    assert_eq!(a.body["error"]["param"], "tools[0].name");
    let message = a.body["error"]["message"].as_str().unwrap();
    assert_eq!(message, "Bad key [redacted] for tools[0].name");
}

/// M8 of the 2026-12-01 security review: timeouts a request explains (a whole
/// answer waits for all its output; a first token for all the thinking before
/// it) never open a rung's breaker, which every org on a platform rung shares.
/// A stream whose header does not come, however, says the rung is unwell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_a_request_explains_never_open_the_shared_breaker() {
    let e = start(&[
        ("SLUICE_BREAKER__FAILURE_THRESHOLD", "2"),
        ("SLUICE_BREAKER__COOLDOWN_MS", "60000"),
    ])
    .await;
    // Whole answers slower than the header timeout, and streams whose first token
    // is slower than the first-token timeout: served by the next rung each time.
    for _ in 0..3 {
        e.mock
            .script("a1", vec![Step::DelayHeaders(Duration::from_millis(1500))]);
        let a = post(&e, &chat("chat-a")).await;
        assert_eq!(a.body["provider"], "azure:a2", "{:?}", a.body);
        e.mock.script(
            "a1",
            vec![Step::DelayFirstToken(Duration::from_millis(1500))],
        );
        let r = send(&e, &stream_body("chat-a")).await;
        assert_eq!(r.status(), 200);
        let _ = r.text().await;
    }
    // The rung's breaker stayed closed: the next request is its own.
    let a = post(&e, &chat("chat-a")).await;
    assert_eq!(header(&a.headers, "x-gateway-attempts"), "openai:ok");
    // Streams whose header never comes do open it.
    for _ in 0..2 {
        e.mock
            .script("a1", vec![Step::DelayHeaders(Duration::from_millis(1500))]);
        let r = send(&e, &stream_body("chat-a")).await;
        let _ = r.text().await;
    }
    let a = post(&e, &chat("chat-a")).await;
    assert_eq!(
        header(&a.headers, "x-gateway-attempts"),
        "azure:ok",
        "open rung skipped"
    );
}

/// Issue 52: an instance bounds the inference requests it holds admitted and not
/// yet committed (`[limits] max_pending`). Past it a request is answered 429
/// `gateway_overloaded` with `Retry-After` at once, before any work is spent on
/// it, while the admitted ones are served; a stream that committed no longer
/// holds a place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_pending_bound_an_instance_sheds_at_once() {
    let e = start(&[("SLUICE_LIMITS__MAX_PENDING", "2")]).await;
    let e = std::sync::Arc::new(e);
    e.mock.script(
        "s1",
        vec![
            // Under the rung's header timeout here (600 ms).
            Step::DelayHeaders(Duration::from_millis(500)),
            Step::DelayHeaders(Duration::from_millis(500)),
        ],
    );
    let mut slow = Vec::new();
    for _ in 0..2 {
        let e = e.clone();
        slow.push(tokio::spawn(
            async move { post(&e, &chat("chat-solo")).await },
        ));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = std::time::Instant::now();
    let shed = post(&e, &chat("chat-solo")).await;
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert_error(shed.status, &shed.body, 429, "gateway_overloaded");
    assert_eq!(header(&shed.headers, "retry-after"), "1");
    for s in slow {
        let a = s.await.unwrap();
        assert_eq!(a.status, 200, "{:?}", a.body);
    }
    // Two streams that committed and go on slowly hold no place.
    e.mock.script(
        "s1",
        vec![
            Step::SlowChunks {
                n: 20,
                every: Duration::from_millis(100),
            },
            Step::SlowChunks {
                n: 20,
                every: Duration::from_millis(100),
            },
        ],
    );
    let mut streams = Vec::new();
    for _ in 0..2 {
        let mut r = send(&e, &stream_body("chat-solo")).await;
        assert_eq!(r.status(), 200);
        let first = r.chunk().await.unwrap();
        assert!(first.is_some());
        streams.push(r);
    }
    let a = post(&e, &chat("chat-solo")).await;
    assert_eq!(a.status, 200, "{:?}", a.body);
    for r in streams {
        let _ = r.text().await;
    }
}
