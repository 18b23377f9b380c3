//! What an org's provider connections may cost every instance: a bounded number
//! per org, and checks and spend reads that never make routing re-read (and
//! re-open) a connection.

mod harness;

use harness::{assert_error, repo_path, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sluice_mock::Mock;

fn opts(mock: &Mock) -> Opts {
    Opts::default()
        .catalog(repo_path("tests/fixtures/byok.toml"))
        .env(
            "SLUICE_PROVIDERS__OPENROUTER__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        // The org's Vertex account points at the mock on loopback.
        .env("SLUICE_NETWORK__ALLOW_PRIVATE_UPSTREAMS", "true")
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_org_holds_at_most_fifty_connections() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org, _, key) = s.org_and_key().await;
    let (other, _, other_key) = s.org_and_key().await;
    let conns = format!("/api/orgs/{org}/provider-connections/openrouter");
    let create = |alias: String| {
        api(
            &s,
            reqwest::Method::POST,
            &conns,
            &key,
            Some(json!({"setup_alias": alias, "secret": "sk-or"})),
        )
    };
    for i in 0..50 {
        let (st, v) = create(format!("a{i}")).await;
        assert_eq!(st, 201, "{v}");
    }
    let (st, v) = create("one-more".into()).await;
    assert_error(st, &v, 400, "invalid_request");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("50"),
        "{v}"
    );
    // Per org: another org is not affected, and a freed place can be used again.
    let (st, v) = api(
        &s,
        reqwest::Method::POST,
        &format!("/api/orgs/{other}/provider-connections/openrouter"),
        &other_key,
        Some(json!({"setup_alias": "main", "secret": "sk-or"})),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    let (st, _) = api(
        &s,
        reqwest::Method::DELETE,
        &format!("{conns}?setup_alias=a0"),
        &key,
        None,
    )
    .await;
    assert_eq!(st, 204);
    let (st, v) = create("one-more".into()).await;
    assert_eq!(st, 201, "{v}");
}

/// A check writes a status, which is not what routing reads: the connection is not
/// re-opened, so its Vertex token cache survives and the next request mints no
/// token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_leaves_the_routed_connection_and_its_token_alone() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org, _, key) = s.org_and_key().await;
    let base = mock.base_url();
    let sa = {
        let text =
            std::fs::read_to_string(repo_path("tests/fixtures/vertex-test-sa.json")).unwrap();
        let mut sa: Value = serde_json::from_str(&text).unwrap();
        sa["token_uri"] = json!(format!("{base}/token"));
        sa.to_string()
    };
    let conns = format!("/api/orgs/{org}/provider-connections/vertex");
    let (st, c) = api(
        &s,
        reqwest::Method::POST,
        &conns,
        &key,
        Some(json!({"setup_alias": "gcp", "secret": sa, "config": {"base_url": base}})),
    )
    .await;
    assert_eq!(st, 201, "{c}");
    let rung = format!("byok:{}", c["id"].as_str().unwrap());
    let (st, v) = api(
        &s,
        reqwest::Method::PUT,
        "/api/models/b-claude/waterfall",
        &key,
        Some(json!({"model_provider_ids": [rung]})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let chat = json!({"model": "b-claude", "max_tokens": 20,
                      "messages": [{"role": "user", "content": "hi"}]});
    let (st, v) = s.post("/v1/chat/completions", Some(&key), &chat).await;
    assert_eq!(st, 200, "{v}");
    let tokens = sluice_mock::oauth::SCRIPT_KEY;
    assert_eq!(mock.count(tokens), 1);
    let (st, v) = api(
        &s,
        reqwest::Method::POST,
        &format!("{conns}/check?setup_alias=gcp"),
        &key,
        None,
    )
    .await;
    assert_eq!((st, v["status"].as_str()), (200, Some("ok")), "{v}");
    assert_eq!(mock.count(tokens), 2, "the check mints its own");
    let (st, v) = s.post("/v1/chat/completions", Some(&key), &chat).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(mock.count(tokens), 2, "the routed account kept its token");
    // The status is still recorded and listed.
    let (_, v) = api(
        &s,
        reqwest::Method::GET,
        &format!("/api/orgs/{org}/provider-connections"),
        &key,
        None,
    )
    .await;
    assert_eq!(v["data"][0]["status"], "ok", "{v}");
}
