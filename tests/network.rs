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

/// Sends a management request with a key; status and JSON body.
async fn api(
    s: &Sluice,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = s
        .http
        .request(method, format!("{}{path}", s.gateway))
        .bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

#[track_caller]
fn assert_refused(st: u16, v: &Value, param: &str) {
    assert_error(st, v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], param, "{v}");
}

/// A Vertex service-account key whose token endpoint is `token_uri`.
fn vertex_key(token_uri: &str) -> String {
    let text = std::fs::read_to_string(repo_path("tests/fixtures/vertex-test-sa.json")).unwrap();
    let mut sa: Value = serde_json::from_str(&text).unwrap();
    sa["token_uri"] = json!(token_uri);
    sa.to_string()
}

/// Every spelling of a non-public address (and plain http) is refused when an org
/// writes it, naming the field; nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn org_urls_to_non_public_addresses_are_refused_when_written() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, platform(&mock, "tests/fixtures/byok.toml")).await;
    let (org, _, key) = s.org_and_key().await;
    let conns = format!("/api/orgs/{org}/provider-connections");
    let private = [
        format!("{}/v1", mock.base_url()),
        "https://127.0.0.1/v1".into(),
        "https://2130706433/v1".into(),
        "https://0x7f.1/v1".into(),
        "https://127.1/v1".into(),
        "https://0177.0.0.1/v1".into(),
        "https://169.254.169.254/latest".into(),
        "https://0xa9fea9fe/latest".into(),
        "https://[::ffff:127.0.0.1]:443/v1".into(),
        "https://[::ffff:a9fe:a9fe]:443/".into(),
        "https://[fd00::1]:443/".into(),
        "https://10.0.0.5:6379".into(),
        "https://172.16.0.1/v1".into(),
        "https://192.168.1.1/v1".into(),
        "https://100.64.0.1/v1".into(),
        "https://0.0.0.0/v1".into(),
        "https://localhost/v1".into(),
        "http://api.example.com/v1".into(),
    ];
    for url in &private {
        let (st, v) = api(
            &s,
            reqwest::Method::POST,
            &format!("{conns}/openai"),
            &key,
            Some(json!({"setup_alias": "a", "secret": "sk-x", "config": {"base_url": url}})),
        )
        .await;
        assert_refused(st, &v, "config.base_url");
        let (st, v) = api(
            &s,
            reqwest::Method::POST,
            "/api/models",
            &key,
            Some(json!({"slug": "own-x", "display_name": "x", "providers": [
                {"provider": "openai", "provider_model_id": "o1"},
                {"provider": "mistral", "provider_model_id": "m1", "base_url": url}]})),
        )
        .await;
        assert_refused(st, &v, "providers[1].base_url");
    }
    let (st, v) = api(
        &s,
        reqwest::Method::POST,
        &format!("{conns}/vertex"),
        &key,
        Some(json!({"setup_alias": "gcp", "secret": vertex_key("https://169.254.169.254/token")})),
    )
    .await;
    assert_refused(st, &v, "secret.token_uri");
    // A deployment added later is checked the same way.
    let (st, v) = api(
        &s,
        reqwest::Method::POST,
        "/api/models",
        &key,
        Some(json!({"slug": "own-y", "display_name": "y", "providers": [
            {"provider": "openai", "provider_model_id": "o1"}]})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let (st, v) = api(
        &s,
        reqwest::Method::POST,
        "/api/models/own-y/providers",
        &key,
        Some(json!({"provider": "openai", "provider_model_id": "o2", "base_url": "https://2130706433/v1"})),
    )
    .await;
    assert_refused(st, &v, "base_url");
    let (st, v) = api(&s, reqwest::Method::GET, &conns, &key, None).await;
    assert_eq!(
        (st, v["data"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{v}"
    );
    assert_eq!(mock.requests().len(), 0, "nothing was called");
}

/// A custom deployment of a provider with no public endpoint must name its base
/// URL: the operator's internal endpoint is never an org's, at cost 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_never_fall_back_to_the_operators_internal_endpoints() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let opts = platform(&mock, "tests/fixtures/byok.toml")
        .env(
            "SLUICE_PROVIDERS__LOCAL__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        .env(
            "SLUICE_PROVIDERS__HOSTED__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        .env("SLUICE_NETWORK__ALLOW_PRIVATE_UPSTREAMS", "true");
    let s = Sluice::start(&b, opts).await;
    let (_, _, key) = s.org_and_key().await;
    for (i, p) in ["local", "hosted", "azure"].iter().enumerate() {
        let (st, v) = api(
            &s,
            reqwest::Method::POST,
            "/api/models",
            &key,
            Some(
                json!({"slug": format!("own-{i}"), "display_name": "x", "providers": [
                {"provider": "openai", "provider_model_id": "o1"},
                {"provider": p, "provider_model_id": "llama3"}]}),
            ),
        )
        .await;
        assert_refused(st, &v, "providers[1].base_url");
    }
    let (st, v) = api(
        &s,
        reqwest::Method::POST,
        "/api/models",
        &key,
        Some(json!({"slug": "own-ok", "display_name": "x", "providers": [
            {"provider": "openai", "provider_model_id": "o1"}]})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let (st, v) = api(
        &s,
        reqwest::Method::POST,
        "/api/models/own-ok/providers",
        &key,
        Some(json!({"provider": "local", "provider_model_id": "llama3"})),
    )
    .await;
    assert_refused(st, &v, "base_url");
    assert_eq!(mock.count("llama3"), 0);
}

/// Rows written while private upstreams were allowed are refused at connect time
/// once the flag is off (an address literal, and `localhost` as the stand-in for a
/// name whose DNS answer changed since it was written): no
/// request reaches the address, the check and spend reads relay nothing, and the
/// operator's own rungs on the same loopback address keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn org_urls_are_checked_again_on_every_connection() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let base = format!("{}/v1", mock.base_url());
    let by_name = base.replace("127.0.0.1", "localhost");
    let opts = |allow: bool| {
        platform(&mock, "tests/fixtures/byok.toml")
            .env(
                "SLUICE_PROVIDERS__OPENROUTER__BASE_URL",
                "https://openrouter.invalid/api/v1",
            )
            .env("SLUICE_NETWORK__ALLOW_PRIVATE_UPSTREAMS", allow)
    };
    let (org, key) = {
        let s = Sluice::start(&b, opts(true)).await;
        let (org, _, key) = s.org_and_key().await;
        let conns = format!("/api/orgs/{org}/provider-connections");
        for (provider, url) in [("openai", &base), ("openrouter", &by_name)] {
            let (st, v) = api(
                &s,
                reqwest::Method::POST,
                &format!("{conns}/{provider}"),
                &key,
                Some(
                    json!({"setup_alias": "own", "secret": "sk-own", "config": {"base_url": url}}),
                ),
            )
            .await;
            assert_eq!(st, 201, "{v}");
        }
        let (st, v) = api(
            &s,
            reqwest::Method::POST,
            "/api/models",
            &key,
            Some(json!({"slug": "own-x", "display_name": "x", "providers": [
                {"provider": "openai", "provider_model_id": "own-o", "base_url": base}]})),
        )
        .await;
        assert_eq!(st, 201, "{v}");
        let (st, v) = s
            .post("/v1/chat/completions", Some(&key), &chat("own-x"))
            .await;
        assert_eq!(st, 200, "allowed while the flag is on: {v}");
        (org, key)
    };
    assert_eq!(mock.count("own-o"), 1);
    let s = Sluice::start(&b, opts(false)).await;
    let conns = format!("/api/orgs/{org}/provider-connections");

    let (st, v) = s
        .post("/v1/chat/completions", Some(&key), &chat("own-x"))
        .await;
    assert_ne!(st, 200, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not allowed"),
        "{v}"
    );
    assert_eq!(
        mock.count("own-o"),
        1,
        "the refused address was never called"
    );

    let calls = mock.requests().len();
    let (st, v) = api(
        &s,
        reqwest::Method::POST,
        &format!("{conns}/openai/check?setup_alias=own"),
        &key,
        None,
    )
    .await;
    assert_eq!((st, v["status"].as_str()), (200, Some("failed")), "{v}");
    assert!(v["detail"].as_str().unwrap().contains("not called"), "{v}");
    let (st, v) = api(
        &s,
        reqwest::Method::POST,
        &format!("{conns}/openrouter/spend-refresh?setup_alias=own"),
        &key,
        None,
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert!(v["spend_usd"].is_null(), "no spend relayed: {v}");
    assert!(
        v["spend_error"].as_str().unwrap().contains("not called"),
        "{v}"
    );
    assert_eq!(
        mock.requests().len(),
        calls,
        "neither read reached the address"
    );

    // The operator's table is trusted: the platform rung on loopback still serves.
    let (st, v) = s
        .post("/v1/chat/completions", Some(&key), &chat("b-shared"))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], "openai:o1");
}
