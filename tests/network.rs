//! Where the gateway's outbound calls may go and what a failure there costs:
//! org-supplied URLs kept off private networks (at write time and at connect time),
//! no free use of the operator's internal endpoints, and a shared breaker that only
//! the rung's own failures move.

mod harness;

use harness::{assert_error, repo_path, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};

fn chat(model: &str) -> Value {
    json!({"model": model, "max_tokens": 20,
           "messages": [{"role": "user", "content": "Say hello"}]})
}

/// The mock as the operator's openai endpoint (a trusted table on loopback).
fn platform(mock: &Mock, catalog: &str) -> Opts {
    Opts::default()
        .catalog(repo_path(catalog))
        .env(
            "SLUICE_PROVIDERS__OPENAI__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        .env("OPENAI_API_KEY", "sk-platform-openai")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_bad_requests_do_not_open_the_shared_breaker() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        platform(&mock, "tests/fixtures/engine.toml")
            .env("SLUICE_BREAKER__FAILURE_THRESHOLD", "2")
            .env("SLUICE_BREAKER__COOLDOWN_MS", "60000"),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    // One org's requests the provider rejects as bad input...
    mock.script("s1", vec![Step::Status(400); 3]);
    for _ in 0..3 {
        let (st, _) = s
            .post("/v1/chat/completions", Some(&key), &chat("chat-solo"))
            .await;
        assert_ne!(st, 200);
    }
    assert_eq!(mock.count("s1"), 3, "each reached the rung");
    // ...leave the model open for the next good request (any org's).
    let (st, v) = s
        .post("/v1/chat/completions", Some(&key), &chat("chat-solo"))
        .await;
    assert_eq!(st, 200, "{v}");
    // The rung's own failures still count: two 500s open it.
    mock.script("s1", vec![Step::Status(500); 2]);
    for _ in 0..2 {
        s.post("/v1/chat/completions", Some(&key), &chat("chat-solo"))
            .await;
    }
    let (st, v) = s
        .post("/v1/chat/completions", Some(&key), &chat("chat-solo"))
        .await;
    assert_error(st, &v, 503, "unavailable_route");
}
