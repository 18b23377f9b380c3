//! Bring your own keys and the org's own routing: provider connections (sealed at
//! rest, never read back), org waterfalls with `byok:` rungs on the pass-through
//! lane, custom models and per-request route selection, the retention verdict and
//! the require-ZDR policy, and cache affinity (warm conversations stay put).

mod harness;

use harness::{assert_error, repo_path, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use std::time::Duration;

fn opts(mock: &Mock) -> Opts {
    Opts::default()
        .catalog(repo_path("tests/fixtures/byok.toml"))
        .env(
            "SLUICE_PROVIDERS__OPENAI__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        .env(
            "SLUICE_PROVIDERS__MISTRAL__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        .env(
            "SLUICE_PROVIDERS__OPENROUTER__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        .env("OPENAI_API_KEY", "sk-platform-openai")
        .env("MISTRAL_API_KEY", "sk-platform-mistral")
        // Org URLs here point at the mock on loopback (tests/network.rs covers the
        // rule itself).
        .env("SLUICE_NETWORK__ALLOW_PRIVATE_UPSTREAMS", "true")
}

async fn send(
    s: &Sluice,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (u16, String) {
    let mut req = s
        .http
        .request(method, format!("{}{path}", s.gateway))
        .bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.unwrap();
    let st = r.status().as_u16();
    (st, r.text().await.unwrap())
}

fn parsed(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

async fn chat(s: &Sluice, key: &str, model: &str, content: &str) -> (u16, Value) {
    s.post(
        "/v1/chat/completions",
        Some(key),
        &json!({"model": model, "max_tokens": 20,
                "messages": [{"role": "user", "content": content}]}),
    )
    .await
}

async fn connect(
    s: &Sluice,
    org: &str,
    key: &str,
    provider: &str,
    alias: &str,
    secret: &str,
    config: Value,
) -> Value {
    let (st, text) = send(
        s,
        reqwest::Method::POST,
        &format!("/api/orgs/{org}/provider-connections/{provider}"),
        key,
        Some(json!({"setup_alias": alias, "secret": secret, "config": config})),
    )
    .await;
    assert_eq!(st, 201, "{text}");
    assert!(!text.contains(secret), "no secret in a response: {text}");
    parsed(&text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_sealed_listed_rotated_checked_and_deleted() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org, _, key) = s.org_and_key().await;
    let (other_org, _, _) = s.org_and_key().await;
    let base = format!("/api/orgs/{org}/provider-connections");

    let c = connect(
        &s,
        &org,
        &key,
        "openrouter",
        "main",
        "sk-or-secret-1",
        json!({}),
    )
    .await;
    assert_eq!(c["setup_alias"], "main");
    assert_eq!(c["provider"], "openrouter");
    assert!(c["id"].as_str().unwrap().starts_with("conn_"));
    // Never overwritten: the same alias again is 409.
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        &format!("{base}/openrouter"),
        &key,
        Some(json!({"setup_alias": "main", "secret": "sk-or-other"})),
    )
    .await;
    assert_error(st, &parsed(&text), 409, "account_exists");
    // local and hosted take no connections; a foreign org path is 404.
    for p in ["local", "hosted", "nope"] {
        let (st, text) = send(
            &s,
            reqwest::Method::POST,
            &format!("{base}/{p}"),
            &key,
            Some(json!({"setup_alias": "a", "secret": "x"})),
        )
        .await;
        let v = parsed(&text);
        assert_error(st, &v, 400, "invalid_parameter");
        assert_eq!(v["error"]["param"], "provider");
    }
    let (st, text) = send(
        &s,
        reqwest::Method::GET,
        &format!("/api/orgs/{other_org}/provider-connections"),
        &key,
        None,
    )
    .await;
    assert_error(st, &parsed(&text), 404, "not_found");

    // Sealed at rest: the database holds no plaintext.
    {
        use sqlx::{Connection, Row};
        sqlx::any::install_default_drivers();
        let mut db = sqlx::AnyConnection::connect(&b.database_url).await.unwrap();
        let rows = sqlx::query("SELECT sealed_secret FROM provider_connections")
            .fetch_all(&mut db)
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        let sealed: String = rows[0].get("sealed_secret");
        assert!(sealed.starts_with("v1:") && !sealed.contains("sk-or-secret-1"));
    }

    // Check: a working key, then a refused one after rotation (the PUT saves the
    // key and says why the spend could not be read).
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        &format!("{base}/openrouter/check?setup_alias=main"),
        &key,
        None,
    )
    .await;
    assert_eq!(
        (st, parsed(&text)["status"].clone()),
        (200, json!("ok")),
        "{text}"
    );
    let (st, text) = send(
        &s,
        reqwest::Method::PUT,
        &format!("{base}/openrouter"),
        &key,
        Some(json!({"setup_alias": "main", "secret": "bad-rotated"})),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    let v = parsed(&text);
    assert!(v["spend_error"].as_str().unwrap().contains("401"), "{v}");
    assert!(!text.contains("bad-rotated"));
    let (_, text) = send(
        &s,
        reqwest::Method::POST,
        &format!("{base}/openrouter/check?setup_alias=main"),
        &key,
        None,
    )
    .await;
    assert_eq!(parsed(&text)["status"], "failed", "{text}");
    // Rotating to a good key reads the spend; PUT of an unknown alias is 404.
    let (st, text) = send(
        &s,
        reqwest::Method::PUT,
        &format!("{base}/openrouter"),
        &key,
        Some(json!({"setup_alias": "main", "secret": "sk-or-secret-2"})),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    assert_eq!(parsed(&text)["spend_usd"], 12.5, "{text}");
    let (st, text) = send(
        &s,
        reqwest::Method::PUT,
        &format!("{base}/openrouter"),
        &key,
        Some(json!({"setup_alias": "nope", "secret": "x"})),
    )
    .await;
    assert_error(st, &parsed(&text), 404, "not_found");

    // Spend refresh where the provider reports it, and a clear error where not.
    connect(
        &s,
        &org,
        &key,
        "openai",
        "proj",
        "sk-openai-own",
        json!({"base_url": format!("{}/v1", mock.base_url())}),
    )
    .await;
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        &format!("{base}/openrouter/spend-refresh?setup_alias=main"),
        &key,
        None,
    )
    .await;
    assert_eq!(
        (st, parsed(&text)["spend_usd"].clone()),
        (200, json!(12.5)),
        "{text}"
    );
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        &format!("{base}/openai/spend-refresh?setup_alias=proj"),
        &key,
        None,
    )
    .await;
    assert_eq!(st, 200);
    assert!(parsed(&text)["spend_error"].is_string(), "{text}");
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        &format!("{base}/openai/check?setup_alias=proj"),
        &key,
        None,
    )
    .await;
    assert_eq!(
        (st, parsed(&text)["status"].clone()),
        (200, json!("ok")),
        "{text}"
    );

    // The list: both accounts, spend shown, no secret.
    let (st, text) = send(&s, reqwest::Method::GET, &base, &key, None).await;
    assert_eq!(st, 200);
    assert!(!text.contains("sk-or-secret") && !text.contains("sk-openai-own"));
    let list = parsed(&text)["data"].as_array().unwrap().clone();
    assert_eq!(list.len(), 2);
    let or = list.iter().find(|c| c["provider"] == "openrouter").unwrap();
    assert_eq!(or["spend_usd"], 12.5);

    // Delete removes only the named account.
    let (st, _) = send(
        &s,
        reqwest::Method::DELETE,
        &format!("{base}/openrouter?setup_alias=main"),
        &key,
        None,
    )
    .await;
    assert_eq!(st, 204);
    let (st, text) = send(
        &s,
        reqwest::Method::DELETE,
        &format!("{base}/openrouter?setup_alias=main"),
        &key,
        None,
    )
    .await;
    assert_error(st, &parsed(&text), 404, "not_found");
    let (_, text) = send(&s, reqwest::Method::GET, &base, &key, None).await;
    assert_eq!(parsed(&text)["data"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_org_waterfall_routes_its_own_rungs_on_the_pass_through_lane() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let other = match b.redis_url {
        Some(_) => Some(Sluice::start(&b, opts(&mock)).await),
        None => None,
    };
    let (org, _, key) = s.org_and_key().await;
    let c = connect(
        &s,
        &org,
        &key,
        "openai",
        "own",
        "sk-org-own",
        json!({"base_url": format!("{}/v1", mock.base_url())}),
    )
    .await;
    let byok = format!("byok:{}", c["id"].as_str().unwrap());
    let wf = "/api/models/b-shared/waterfall";

    // Validation: a shared model needs one of the org's connections; platform rungs
    // keep their order; unknown ids name the field.
    for (ids, why) in [
        (json!(["openai:o1"]), "own connections"),
        (json!([byok, "mistral:m1", "openai:o1"]), "default order"),
        (json!([byok, "openai:nope"]), "not a rung"),
        (json!(["byok:conn_foreign"]), "not a connection"),
    ] {
        let (st, text) = send(
            &s,
            reqwest::Method::PUT,
            wf,
            &key,
            Some(json!({"model_provider_ids": ids})),
        )
        .await;
        let v = parsed(&text);
        assert_error(st, &v, 400, "invalid_parameter");
        assert_eq!(v["error"]["param"], "model_provider_ids");
        assert!(text.contains(why), "{text}");
    }
    let (st, text) = send(
        &s,
        reqwest::Method::PUT,
        wf,
        &key,
        Some(json!({"model_provider_ids": [byok, "openai:o1"]})),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    let v = parsed(&text);
    assert_eq!(v["default"], json!(["openai:o1", "mistral:m1"]));
    assert_eq!(v["override"], json!([byok, "openai:o1"]));
    assert_eq!(v["effective"], json!([byok, "openai:o1"]));
    let (_, text) = send(&s, reqwest::Method::GET, wf, &key, None).await;
    assert_eq!(parsed(&text), v);

    // Served by the org's own key, at no cost to its balance.
    let before = s.balance_usd(&org).await;
    let (st, v) = chat(&s, &key, "b-shared", "hi").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], json!(byok));
    assert_eq!(v["usage"]["cost"], 0.0);
    let last = mock.requests_for("o1").pop().unwrap();
    assert_eq!(last.header("authorization"), Some("Bearer sk-org-own"));
    // The usage event records the lane; nothing is drawn.
    let event = loop {
        let (_, v) = s.get("/api/gateway/usage/events?limit=1", Some(&key)).await;
        if let Some(e) = v["data"].as_array().and_then(|d| d.first()).cloned() {
            break e;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(event["lane"], "pass_through", "{event}");
    assert_eq!(event["provider"], json!(byok));
    assert_eq!(s.balance_usd(&org).await, before);

    // When the org's key fails, the platform rung takes over (and is billed).
    mock.script("o1", vec![Step::Status(401)]);
    let (st, v) = chat(&s, &key, "b-shared", "hi").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], "openai:o1");
    assert!(v["usage"]["cost"].as_f64().unwrap() > 0.0);
    let last = mock.requests_for("o1").pop().unwrap();
    assert_eq!(
        last.header("authorization"),
        Some("Bearer sk-platform-openai")
    );

    // Another instance routes the new chain too (each try a new conversation: a
    // conversation served before the chain arrived stays warm where it was).
    if let Some(o) = &other {
        let mut seen = Value::Null;
        for i in 0..40 {
            let (st, v) = chat(o, &key, "b-shared", &format!("from the other instance {i}")).await;
            if st == 200 && v["provider"] == json!(byok) {
                seen = v;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            seen["provider"],
            json!(byok),
            "the second instance follows the org's chain"
        );
    }

    // An org whose platform gates refuse (no credits, unverified email) is still
    // served on its own key; platform credits are never touched.
    let (poor, poor_key) = s
        .org_with(json!({"name": "byok-only", "email": "poor@acme.test", "tier": 3}))
        .await;
    let (st, v) = chat(&s, &poor_key, "b-shared", "hi").await;
    assert_error(st, &v, 429, "insufficient_quota");
    let c = connect(
        &s,
        &poor,
        &poor_key,
        "openai",
        "own",
        "sk-poor-own",
        json!({"base_url": format!("{}/v1", mock.base_url())}),
    )
    .await;
    let poor_byok = format!("byok:{}", c["id"].as_str().unwrap());
    let (st, _) = send(
        &s,
        reqwest::Method::PUT,
        wf,
        &poor_key,
        Some(json!({"model_provider_ids": ["openai:o1", poor_byok]})),
    )
    .await;
    assert_eq!(st, 200);
    let (st, v) = chat(&s, &poor_key, "b-shared", "hi").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], json!(poor_byok));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_models_serve_the_orgs_deployments_and_routes_select_one_rung() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (_, _, key) = s.org_and_key().await;
    let (_, _, stranger) = s.org_and_key().await;
    let local = format!("{}/v1", mock.base_url());
    let create = |body: Value| send(&s, reqwest::Method::POST, "/api/models", &key, Some(body));

    for (body, param) in [
        (
            json!({"slug": "Bad Slug", "display_name": "x", "providers": [{"provider": "local", "provider_model_id": "o1"}]}),
            "slug",
        ),
        (
            json!({"slug": "acme-1", "display_name": "x", "providers": []}),
            "providers",
        ),
        (
            json!({"slug": "acme-1", "display_name": "x", "context_window": 1000, "max_input_tokens": 2000,
                "providers": [{"provider": "local", "provider_model_id": "o1"}]}),
            "max_input_tokens",
        ),
        (
            json!({"slug": "b-shared", "display_name": "x", "providers": [{"provider": "local", "provider_model_id": "o1"}]}),
            "slug",
        ),
    ] {
        let (st, text) = create(body).await;
        let v = parsed(&text);
        assert_error(st, &v, 400, "invalid_parameter");
        assert_eq!(v["error"]["param"], param, "{text}");
    }
    let (st, text) = create(json!({"slug": "acme-1", "display_name": "Acme 1",
        "providers": [{"provider": "local", "provider_model_id": "o1", "base_url": local}]}))
    .await;
    assert_eq!(st, 201, "{text}");
    assert_eq!(parsed(&text)["retention"], Value::Null);

    // Visible to the org only.
    let ids = |v: Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(ids(s.get("/v1/models", Some(&key)).await.1).contains(&"acme-1".to_string()));
    assert!(!ids(s.get("/v1/models", Some(&stranger)).await.1).contains(&"acme-1".to_string()));
    let (st, v) = chat(&s, &stranger, "acme-1", "hi").await;
    assert_error(st, &v, 403, "model_not_granted");

    // Served by its deployment, at no cost.
    let (st, v) = chat(&s, &key, "acme-1", "hi").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], "local:o1");
    assert_eq!(v["usage"]["cost"], 0.0);

    // A second deployment; route handles select one rung per request.
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        "/api/models/acme-1/providers",
        &key,
        Some(json!({"provider": "openai", "provider_model_id": "o2", "base_url": local})),
    )
    .await;
    assert_eq!(st, 201, "{text}");
    let (st, v) = s.get("/api/models/acme-1/providers", Some(&key)).await;
    assert_eq!(st, 200);
    let route_of = |v: &Value, rung: &str| -> String {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["rung_id"] == rung)
            .unwrap()["route_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let o2 = route_of(&v, "openai:o2");
    let r = s
        .http
        .post(format!("{}/v1/chat/completions", s.gateway))
        .bearer_auth(&key)
        .header("x-gateway-route", &o2)
        .json(&json!({"model": "acme-1", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["provider"], "openai:o2");
    // The org's own endpoint never receives the platform's key.
    let sent = mock.requests_for("o2").pop().unwrap();
    assert_eq!(sent.header("authorization"), None);

    // Unknown handles, and handles of another org, are refused.
    let (_, sv) = s
        .get("/api/models/b-shared/providers", Some(&stranger))
        .await;
    let foreign = route_of(&sv, "openai:o1");
    for handle in ["rt_nope", foreign.as_str()] {
        let r = s
            .http
            .post(format!("{}/v1/chat/completions", s.gateway))
            .bearer_auth(&key)
            .header("x-gateway-route", handle)
            .json(&json!({"model": "b-shared", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        let st = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        assert_error(st, &v, 400, "invalid_parameter");
        assert_eq!(v["error"]["param"], "x-gateway-route");
    }
    // Keyless reads show no handles.
    let (_, v) = s.get("/api/models/b-shared/providers", None).await;
    assert!(v["data"][0].get("route_id").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_org_serves_a_public_model_from_its_own_local_server_for_itself_only() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (_, _, key) = s.org_and_key().await;
    let (_, _, stranger) = s.org_and_key().await;
    let local = format!("{}/v1", mock.base_url());
    let (st, public) = chat(&s, &key, "b-shared", "hi").await;
    assert_eq!(st, 200, "{public}");
    let platform = public["provider"].clone();
    assert!(public["usage"]["cost"].as_f64().unwrap() > 0.0);

    // Only a local server makes a variant; other providers come through connections.
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        "/api/models/b-shared/providers",
        &key,
        Some(json!({"provider": "openai", "provider_model_id": "mine", "base_url": local})),
    )
    .await;
    let v = parsed(&text);
    assert_error(st, &v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], "providers");
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        "/api/models/b-shared/providers",
        &key,
        Some(json!({"provider": "local", "provider_model_id": "lv1", "base_url": local})),
    )
    .await;
    assert_eq!(st, 201, "{text}");
    let row = parsed(&text);
    assert_eq!(
        (row["slug"].as_str(), row["retention"].is_null()),
        (Some("b-shared"), true)
    );

    // The org's calls go to its own server, on its own lane: no cost.
    let (st, v) = chat(&s, &key, "b-shared", "hi").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], "local:lv1");
    assert_eq!(v["usage"]["cost"], 0.0);
    assert_eq!(mock.count("lv1"), 1);
    // Everyone else keeps the public model.
    let (st, v) = chat(&s, &stranger, "b-shared", "hi").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], platform);
    assert!(v["usage"]["cost"].as_f64().unwrap() > 0.0);
    assert_eq!(mock.count("lv1"), 1);
    // The org lists the slug once.
    let (_, models) = s.get("/v1/models", Some(&key)).await;
    let listed = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["id"] == "b-shared")
        .count();
    assert_eq!(listed, 1);
    // A second local deployment joins the variant.
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        "/api/models/b-shared/providers",
        &key,
        Some(json!({"provider": "local", "provider_model_id": "lv2", "base_url": local})),
    )
    .await;
    assert_eq!(st, 201, "{text}");
    let (_, v) = s.get("/api/models/b-shared/providers", Some(&key)).await;
    let rungs: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["rung_id"].as_str().unwrap())
        .collect();
    assert_eq!(rungs, ["local:lv1", "local:lv2"]);
    let (_, v) = s
        .get("/api/models/b-shared/providers", Some(&stranger))
        .await;
    assert!(v["data"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| !d["rung_id"].as_str().unwrap().starts_with("local:")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_verdict_and_require_zdr_keep_fail_over_on_zero_retention_rungs() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org, _, key) = s.org_and_key().await;
    let (other_org, _, _) = s.org_and_key().await;
    let (_, v) = s.get("/api/models/b-shared", None).await;
    assert_eq!(v["retention"], "zdr_enforceable");
    let slugs = |v: Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["slug"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(
        slugs(s.get("/api/models?retention=zdr_enforceable", None).await.1)
            .contains(&"b-shared".into())
    );
    assert!(
        !slugs(s.get("/api/models?retention=zdr_all_rungs", None).await.1)
            .contains(&"b-shared".into())
    );

    // Without the policy, a failing ZDR rung fails over to the other.
    mock.script("o1", vec![Step::Status(500)]);
    let (st, v) = chat(&s, &key, "b-shared", "one").await;
    assert_eq!(
        (st, v["provider"].clone()),
        (200, json!("mistral:m1")),
        "{v}"
    );

    let policy = format!("/api/orgs/{org}/policy");
    let (st, text) = send(
        &s,
        reqwest::Method::PUT,
        &policy,
        &key,
        Some(json!({"require_zdr": true})),
    )
    .await;
    assert_eq!(
        (st, parsed(&text)["require_zdr"].clone()),
        (200, json!(true)),
        "{text}"
    );
    let (_, text) = send(&s, reqwest::Method::GET, &policy, &key, None).await;
    assert_eq!(parsed(&text)["require_zdr"], true);
    let (st, text) = send(
        &s,
        reqwest::Method::GET,
        &format!("/api/orgs/{other_org}/policy"),
        &key,
        None,
    )
    .await;
    assert_error(st, &parsed(&text), 404, "not_found");
    let (_, v) = s.get("/api/models/b-shared", Some(&key)).await;
    assert_eq!(v["retention"], "zdr_all_rungs");
    assert_eq!(v["waterfall"], json!(["openai:o1"]));
    // The list filters by the org's verdict too; keyless reads keep the default.
    let (_, v) = s
        .get("/api/models?retention=zdr_all_rungs", Some(&key))
        .await;
    assert!(slugs(v).contains(&"b-shared".into()));
    assert!(
        !slugs(s.get("/api/models?retention=zdr_all_rungs", None).await.1)
            .contains(&"b-shared".into())
    );

    let before = mock.count("m1");
    mock.script("o1", vec![Step::Status(500)]);
    let (st, v) = chat(&s, &key, "b-shared", "two").await;
    assert_error(st, &v, 502, "all_routes_failed");
    assert_eq!(mock.count("m1"), before, "never a non-ZDR rung");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_conversation_stays_on_its_rung_and_a_cold_one_fails_over() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (_, _, key) = s.org_and_key().await;
    // Long enough for a provider to cache (about 1,024 tokens and more).
    let context = "Background for the whole conversation. ".repeat(120);
    let convo = |first: &str, more: bool| {
        let mut m = vec![json!({"role": "user", "content": format!("{first}\n{context}")})];
        if more {
            m.push(json!({"role": "assistant", "content": "sure"}));
            m.push(json!({"role": "user", "content": "and then?"}));
        }
        json!({"model": "b-shared", "max_tokens": 20, "messages": m})
    };
    // The first turn lands on o1, which now holds the conversation's cache.
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            Some(&key),
            &convo("plan a trip", false),
        )
        .await;
    assert_eq!((st, v["provider"].clone()), (200, json!("openai:o1")));
    // o1 throttles: the warm conversation gets the 429, not a cold rung.
    mock.script("o1", vec![Step::Status(429)]);
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            Some(&key),
            &convo("plan a trip", true),
        )
        .await;
    assert_error(st, &v, 429, "unavailable_route");
    assert_eq!(mock.count("m1"), 0);
    // A cold conversation fails over.
    mock.script("o1", vec![Step::Status(429)]);
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            Some(&key),
            &convo("write a poem", false),
        )
        .await;
    assert_eq!(
        (st, v["provider"].clone()),
        (200, json!("mistral:m1")),
        "{v}"
    );
    // ...and stays where its cache now is, even when o1 is healthy again.
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            Some(&key),
            &convo("write a poem", true),
        )
        .await;
    assert_eq!(
        (st, v["provider"].clone()),
        (200, json!("mistral:m1")),
        "{v}"
    );

    // prompt_cache_key routes: o1 (a cache_key_routing rung) gets a stable derived
    // value, never the client's.
    let body = json!({"model": "b-shared", "max_tokens": 20, "prompt_cache_key": "client-key-1",
                      "messages": [{"role": "user", "content": "keyed"}]});
    for _ in 0..2 {
        let (st, _) = s.post("/v1/chat/completions", Some(&key), &body).await;
        assert_eq!(st, 200);
    }
    let sent: Vec<Value> = mock
        .requests_for("o1")
        .iter()
        .rev()
        .take(2)
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    let routed = sent[0]["prompt_cache_key"].as_str().unwrap().to_string();
    assert!(routed.starts_with("sl-") && !routed.contains("client-key-1"));
    assert_eq!(
        sent[1]["prompt_cache_key"],
        json!(routed),
        "stable across requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_cloud_deployments_fail_over_in_order_and_never_fall_to_platform_credit() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org, _, key) = s.org_and_key().await;
    let base = mock.base_url();
    // Two Azure resources, each mapping the model to its deployment, then the
    // org's own maker key last.
    let east = connect(
        &s,
        &org,
        &key,
        "azure",
        "east",
        "az-key-east",
        json!({"base_url": base, "models": {"b-shared": "dep-east"}}),
    )
    .await;
    let west = connect(
        &s,
        &org,
        &key,
        "azure",
        "west",
        "az-key-west",
        json!({"base_url": base, "models": {"b-shared": "dep-west"}}),
    )
    .await;
    let maker = connect(
        &s,
        &org,
        &key,
        "openai",
        "maker",
        "sk-maker",
        json!({"base_url": format!("{base}/v1")}),
    )
    .await;
    let id = |c: &Value| format!("byok:{}", c["id"].as_str().unwrap());
    let chain = json!([id(&east), id(&west), id(&maker)]);
    let (st, text) = send(
        &s,
        reqwest::Method::PUT,
        "/api/models/b-shared/waterfall",
        &key,
        Some(json!({"model_provider_ids": chain})),
    )
    .await;
    assert_eq!(st, 200, "{text}");

    let (st, v) = chat(&s, &key, "b-shared", "one").await;
    assert_eq!((st, v["provider"].clone()), (200, json!(id(&east))), "{v}");
    let sent = mock.requests_for("dep-east").pop().unwrap();
    assert!(sent
        .path
        .starts_with("/openai/deployments/dep-east/chat/completions"));
    assert_eq!(sent.header("api-key"), Some("az-key-east"));
    // An exhausted quota moves on to the next account, in order.
    mock.script("dep-east", vec![Step::Status(429)]);
    let (st, v) = chat(&s, &key, "b-shared", "two").await;
    assert_eq!((st, v["provider"].clone()), (200, json!(id(&west))), "{v}");
    // Every account failing is all_routes_failed: never the platform's credit.
    mock.script("dep-east", vec![Step::Status(500)]);
    mock.script("dep-west", vec![Step::Status(500)]);
    mock.script("o1", vec![Step::Status(500)]);
    let platform_before = mock
        .requests_for("o1")
        .iter()
        .filter(|r| r.header("authorization") == Some("Bearer sk-platform-openai"))
        .count();
    let (st, v) = chat(&s, &key, "b-shared", "three").await;
    assert_error(st, &v, 502, "all_routes_failed");
    let platform_after = mock
        .requests_for("o1")
        .iter()
        .filter(|r| r.header("authorization") == Some("Bearer sk-platform-openai"))
        .count();
    assert_eq!(platform_after, platform_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orgs_own_bedrock_keys_and_vertex_account_serve_cloud_rungs() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org, _, key) = s.org_and_key().await;
    let base = mock.base_url();
    let conns = format!("/api/orgs/{org}/provider-connections");
    // Each cloud's own validation.
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        &format!("{conns}/bedrock"),
        &key,
        Some(json!({"setup_alias": "aws", "secret": "s", "config": {}})),
    )
    .await;
    let v = parsed(&text);
    assert_error(st, &v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], "config.access_key_id");
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        &format!("{conns}/vertex"),
        &key,
        Some(json!({"setup_alias": "gcp", "secret": "/etc/passwd"})),
    )
    .await;
    let v = parsed(&text);
    assert_error(st, &v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], "secret");

    let bed = connect(
        &s,
        &org,
        &key,
        "bedrock",
        "aws",
        "own-aws-secret",
        json!({"access_key_id": "AKIAOWNKEY", "base_url": base}),
    )
    .await;
    let sa = {
        let text =
            std::fs::read_to_string(repo_path("tests/fixtures/vertex-test-sa.json")).unwrap();
        let mut sa: Value = serde_json::from_str(&text).unwrap();
        sa["token_uri"] = json!(format!("{base}/token"));
        sa.to_string()
    };
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        &format!("{conns}/vertex"),
        &key,
        Some(json!({"setup_alias": "gcp", "secret": sa, "config": {"base_url": base}})),
    )
    .await;
    assert_eq!(st, 201, "{text}");
    assert!(!text.contains("PRIVATE KEY"));
    let vtx = parsed(&text);
    let id = |c: &Value| format!("byok:{}", c["id"].as_str().unwrap());
    let (st, text) = send(
        &s,
        reqwest::Method::PUT,
        "/api/models/b-claude/waterfall",
        &key,
        Some(json!({"model_provider_ids": [id(&bed), id(&vtx)]})),
    )
    .await;
    assert_eq!(st, 200, "{text}");

    // Bedrock, signed with the org's keys.
    let (st, v) = chat(&s, &key, "b-claude", "hi").await;
    assert_eq!((st, v["provider"].clone()), (200, json!(id(&bed))), "{v}");
    let sent = mock
        .requests_for("anthropic.claude-sonnet-4-5")
        .pop()
        .unwrap();
    let auth = sent.header("authorization").unwrap();
    assert!(
        auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIAOWNKEY/"),
        "{auth}"
    );
    assert!(!auth.contains("own-aws-secret"));
    // Bedrock failing, Vertex serves with a token minted for the org's account.
    mock.script("anthropic.claude-sonnet-4-5", vec![Step::Status(500)]);
    let (st, v) = chat(&s, &key, "b-claude", "hi again").await;
    assert_eq!((st, v["provider"].clone()), (200, json!(id(&vtx))), "{v}");
    let sent = mock.requests_for("claude-sonnet-4-5").pop().unwrap();
    assert!(
        sent.path.contains("/projects/sluice-test-project/"),
        "{}",
        sent.path
    );
    assert!(sent
        .header("authorization")
        .unwrap()
        .starts_with("Bearer mock-token-"));

    // Checks: Vertex mints a token; Bedrock has no cheap read and says so.
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        &format!("{conns}/vertex/check?setup_alias=gcp"),
        &key,
        None,
    )
    .await;
    assert_eq!(
        (st, parsed(&text)["status"].clone()),
        (200, json!("ok")),
        "{text}"
    );
    let (st, text) = send(
        &s,
        reqwest::Method::POST,
        &format!("{conns}/bedrock/check?setup_alias=aws"),
        &key,
        None,
    )
    .await;
    assert_eq!(
        (st, parsed(&text)["status"].clone()),
        (200, json!("unchecked")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_follow_the_orgs_waterfall_too() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org, _, key) = s.org_and_key().await;
    let c = connect(
        &s,
        &org,
        &key,
        "openai",
        "own",
        "sk-org-embed",
        json!({"base_url": format!("{}/v1", mock.base_url())}),
    )
    .await;
    let byok = format!("byok:{}", c["id"].as_str().unwrap());
    let (st, text) = send(
        &s,
        reqwest::Method::PUT,
        "/api/models/b-embed/waterfall",
        &key,
        Some(json!({"model_provider_ids": [byok, "openai:te1"]})),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    let body = json!({"model": "b-embed", "input": ["one", "two"]});
    let (st, v) = s.post("/v1/embeddings", Some(&key), &body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], json!(byok));
    assert_eq!(v["usage"]["cost"], 0.0);
    let sent = mock.requests_for("te1").pop().unwrap();
    assert_eq!(sent.header("authorization"), Some("Bearer sk-org-embed"));
    // The org's key failing, the platform rung serves and is billed.
    mock.script("te1", vec![Step::Status(401)]);
    let (st, v) = s.post("/v1/embeddings", Some(&key), &body).await;
    assert_eq!(
        (st, v["provider"].clone()),
        (200, json!("openai:te1")),
        "{v}"
    );
    let sent = mock.requests_for("te1").pop().unwrap();
    assert_eq!(
        sent.header("authorization"),
        Some("Bearer sk-platform-openai")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_daily_spend_cap_refuses_platform_spend_only() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org, _, admin_key) = s.org_and_key().await;
    // A cap far below any call's worst case, and two requests a minute.
    let (st, k) = s
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org}/keys"),
            Some(json!({"name": "capped", "daily_spend_cap_usd": 0.000001, "rpm": 3})),
        )
        .await;
    assert_eq!(st, 201, "{k}");
    let key = k["api_key"].as_str().unwrap().to_string();
    s.wait_for_key(&key).await;
    clear_of_minute_boundary().await;
    // Platform only: the cap refuses.
    let (st, v) = chat(&s, &key, "b-shared", "hi").await;
    assert_error(st, &v, 429, "insufficient_quota");
    assert_eq!(v["error"]["reason"], "key_daily_cap", "{v}");

    let c = connect(
        &s,
        &org,
        &admin_key,
        "openai",
        "own",
        "sk-org-own",
        json!({"base_url": format!("{}/v1", mock.base_url())}),
    )
    .await;
    let byok = format!("byok:{}", c["id"].as_str().unwrap());
    let wf = "/api/models/b-shared/waterfall";
    // The org's own key first, platform after: the cap refuses the platform rung
    // alone, and the call goes on on the org's own key.
    let (st, text) = send(
        &s,
        reqwest::Method::PUT,
        wf,
        &admin_key,
        Some(json!({"model_provider_ids": [byok, "openai:o1"]})),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    let (st, v) = chat(&s, &key, "b-shared", "first").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], json!(byok));
    // Only the org's own key on the chain: nothing there is platform spend.
    let (st, text) = send(
        &s,
        reqwest::Method::PUT,
        wf,
        &admin_key,
        Some(json!({"model_provider_ids": [byok]})),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    let (st, v) = chat(&s, &key, "b-shared", "second").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], json!(byok));
    // Requests per minute count every lane: the first (refused) call took none,
    // the two BYOK calls took two of three, and the fourth is refused.
    let (st, v) = chat(&s, &key, "b-shared", "third").await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = chat(&s, &key, "b-shared", "fourth").await;
    assert_error(st, &v, 429, "insufficient_quota");
    assert_eq!(v["error"]["reason"], "key_rate_limit", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_shows_the_lane_the_orgs_chain_serves_first() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org, _, key) = s.org_and_key().await;
    let lane = |v: &Value, slug: &str| {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["alias"] == slug)
            .map(|m| m["lane"].clone())
            .unwrap_or(Value::Null)
    };
    let (st, v) = s.get("/api/gateway/catalog", Some(&key)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(lane(&v, "b-shared"), "platform_funded");
    let c = connect(
        &s,
        &org,
        &key,
        "openai",
        "own",
        "sk-org-own",
        json!({"base_url": format!("{}/v1", mock.base_url())}),
    )
    .await;
    let byok = format!("byok:{}", c["id"].as_str().unwrap());
    let wf = "/api/models/b-shared/waterfall";
    for (chain, want) in [
        (json!([byok, "openai:o1"]), "pass_through"),
        (json!([byok]), "pass_through"),
        (json!(["openai:o1", byok]), "platform_funded"),
    ] {
        let (st, text) = send(
            &s,
            reqwest::Method::PUT,
            wf,
            &key,
            Some(json!({"model_provider_ids": chain})),
        )
        .await;
        assert_eq!(st, 200, "{text}");
        let (st, v) = s.get("/api/gateway/catalog", Some(&key)).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(lane(&v, "b-shared"), want, "chain {chain}");
    }
}

/// Stays clear of a minute boundary, so a per-minute window holds for the test.
async fn clear_of_minute_boundary() {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if secs % 60 > 50 {
        tokio::time::sleep(Duration::from_secs(61 - secs % 60)).await;
    }
}

/// An org whose chain for b-shared is its own key alone (the pass-through lane),
/// with `keys` keys; returns them.
async fn byok_only_org(s: &Sluice, mock: &Mock, keys: usize) -> Vec<String> {
    let (org, _, key) = s.org_and_key().await;
    let c = connect(
        s,
        &org,
        &key,
        "openai",
        "own",
        "sk-org-own",
        json!({"base_url": format!("{}/v1", mock.base_url())}),
    )
    .await;
    let byok = format!("byok:{}", c["id"].as_str().unwrap());
    let (st, text) = send(
        s,
        reqwest::Method::PUT,
        "/api/models/b-shared/waterfall",
        &key,
        Some(json!({"model_provider_ids": [byok]})),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    let mut out = vec![key];
    while out.len() < keys {
        let (st, k) = s
            .admin(
                reqwest::Method::POST,
                &format!("/admin/orgs/{org}/keys"),
                Some(json!({})),
            )
            .await;
        assert_eq!(st, 201, "{k}");
        let k = k["api_key"].as_str().unwrap().to_string();
        s.wait_for_key(&k).await;
        out.push(k);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lane_has_an_org_request_rate_and_concurrency_caps() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        opts(&mock)
            .env("SLUICE_BILLING__ORG_REQUESTS_PER_MINUTE_ALL_LANES", 3)
            .env("SLUICE_BILLING__ORG_CONCURRENCY_ALL_LANES", 2)
            .env("SLUICE_BILLING__KEY_DEFAULTS__CONCURRENCY", 1),
    )
    .await;
    let throttled = |st: u16, v: &Value, reason: &str| {
        assert_error(st, v, 429, "unavailable_route");
        assert_eq!(v["error"]["reason"], reason, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{reason}:")),
            "{v}"
        );
    };

    // The org's requests per minute count on its own keys' lane too, across keys.
    let keys = byok_only_org(&s, &mock, 2).await;
    clear_of_minute_boundary().await;
    for (i, k) in [&keys[0], &keys[1], &keys[0]].into_iter().enumerate() {
        let (st, v) = chat(&s, k, "b-shared", &format!("rate {i}")).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["usage"]["cost"], 0.0);
    }
    let (st, v) = chat(&s, &keys[1], "b-shared", "rate 3").await;
    throttled(st, &v, "org_request_rate");

    // Concurrency: one request in flight per key, two per org, on every lane.
    let keys = byok_only_org(&s, &mock, 3).await;
    let seen = mock.count("o1");
    mock.script(
        "o1",
        vec![
            Step::DelayFirstToken(Duration::from_secs(3)),
            Step::DelayFirstToken(Duration::from_secs(3)),
        ],
    );
    let slow = |key: String| {
        let http = s.http.clone();
        let url = format!("{}/v1/chat/completions", s.gateway);
        tokio::spawn(async move {
            http.post(url)
                .bearer_auth(key)
                .json(&json!({"model": "b-shared", "max_tokens": 20,
                              "messages": [{"role": "user", "content": "slow"}]}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    let mock = &mock;
    let wait_sent = |n: u64| async move {
        for _ in 0..100 {
            if mock.count("o1") >= seen + n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the slow request never reached the provider");
    };
    let first = slow(keys[0].clone());
    wait_sent(1).await;
    let second = slow(keys[1].clone());
    wait_sent(2).await;
    let (st, v) = chat(&s, &keys[0], "b-shared", "busy key").await;
    throttled(st, &v, "key_concurrency");
    let (st, v) = chat(&s, &keys[2], "b-shared", "busy org").await;
    throttled(st, &v, "org_concurrency");
    // The first client goes away: its slots come back once the request ends.
    first.abort();
    let _ = first.await;
    assert_eq!(second.await.unwrap().unwrap(), 200);
    let mut last = (0, Value::Null);
    for _ in 0..100 {
        last = chat(&s, &keys[0], "b-shared", "after").await;
        if last.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last.0, 200, "{}", last.1);
}
