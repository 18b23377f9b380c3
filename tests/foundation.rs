//! The foundation as a client sees it: keys, the admin API and CLI, the catalog
//! reads, routing and the error envelopes, ops endpoints, several instances over one
//! database, the drain.

mod harness;

use harness::{admin_cli, assert_error, repo_path, Backend, Opts, Sluice};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn fixture() -> Opts {
    Opts::default().catalog(repo_path("tests/fixtures/catalog.toml"))
}

#[tokio::test]
async fn keys_authenticate_and_every_bad_key_gets_the_same_401() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let (org, key_id, key) = s.org_and_key().await;
    assert!(key.starts_with("xpl_") && key.len() == 44, "{key}");
    assert!(key[4..]
        .chars()
        .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));

    let (st, body) = s.get("/v1/models", Some(&key)).await;
    assert_eq!(st, 200, "{body}");

    // Expired key.
    let (st, exp) = s
        .admin(
            Method::POST,
            &format!("/admin/orgs/{org}/keys"),
            Some(json!({"expires_at": "2001-01-01T00:00:00Z"})),
        )
        .await;
    assert_eq!(st, 201);
    let expired = exp["api_key"].as_str().unwrap().to_string();
    // Revoked key.
    let (_, rev) = s
        .admin(Method::POST, &format!("/admin/orgs/{org}/keys"), None)
        .await;
    let revoked = rev["api_key"].as_str().unwrap().to_string();
    let (st, _) = s.get("/v1/models", Some(&revoked)).await;
    assert_eq!(st, 200);
    let (st, _) = s
        .admin(
            Method::DELETE,
            &format!("/admin/keys/{}", rev["api_key_id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(st, 204);

    let unknown = format!("xpl_{}", "0".repeat(40));
    let mut bodies = Vec::new();
    for bad in [
        None,
        Some("nonsense"),
        Some(unknown.as_str()),
        Some(expired.as_str()),
        Some(revoked.as_str()),
        Some(&key.to_uppercase()),
    ] {
        let (st, body) = s.get("/v1/models", bad).await;
        assert_error(st, &body, 401, "invalid_key");
        assert_eq!(body["error"]["type"], "authentication_error");
        bodies.push(body);
    }
    assert!(
        bodies.windows(2).all(|w| w[0] == w[1]),
        "identical 401 bodies: {bodies:?}"
    );

    // No query-parameter key, no other header; x-api-key only on the messages route.
    let r = s
        .http
        .get(format!("{}/v1/models?api_key={key}", s.gateway))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = s
        .http
        .get(format!("{}/v1/models", s.gateway))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = s
        .http
        .post(format!("{}/v1/messages", s.gateway))
        .header("x-api-key", &key)
        .json(&json!({"model": "no-such-model", "max_tokens": 5, "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "x-api-key authenticates on messages");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "permission_error");

    // The key list shows keys, never secrets.
    let r = s
        .http
        .get(format!("{}/api/keys", s.gateway))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(!text.contains(&key[4..]), "no plaintext in the key list");
    let list: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(list["data"].as_array().unwrap().len(), 3);
    assert!(list["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["id"] == key_id.as_str()));
}

#[tokio::test]
async fn admin_api_is_guarded_and_does_what_the_contract_says() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    // Wrong or missing token: 401; an API key never reaches /admin.
    let (_, _, key) = s.org_and_key().await;
    for auth in [None, Some("wrong"), Some(key.as_str())] {
        let mut req = s
            .http
            .post(format!("{}/admin/orgs", s.ops))
            .json(&json!({"name": "x"}));
        if let Some(a) = auth {
            req = req.bearer_auth(a);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_key");
    }

    let (st, org) = s
        .admin(
            Method::POST,
            "/admin/orgs",
            Some(json!({"name": "beta", "email": "ops@beta.test", "credits_usd": 2.5, "tier": 1})),
        )
        .await;
    assert_eq!(st, 201);
    let org_id = org["org_id"].as_str().unwrap();
    let (st, o) = s
        .admin(Method::GET, &format!("/admin/orgs/{org_id}"), None)
        .await;
    assert_eq!(st, 200);
    assert_eq!(o["balance_usd"], 2.5);
    assert_eq!(o["tier"], 1);
    assert_eq!(o["email_verified"], false);
    assert_eq!(o["card_verified"], false);
    assert_eq!(o["under_review"], false);

    let (st, v) = s
        .admin(
            Method::POST,
            &format!("/admin/orgs/{org_id}/credits"),
            Some(json!({"amount_usd": 5, "kind": "purchase"})),
        )
        .await;
    assert_eq!((st, v["balance_usd"].as_f64()), (200, Some(7.5)));
    let (_, o) = s
        .admin(Method::GET, &format!("/admin/orgs/{org_id}"), None)
        .await;
    assert_eq!(o["tier"], 2, "a purchase of 5 USD moves the org up a tier");
    let (st, v) = s
        .admin(
            Method::POST,
            &format!("/admin/orgs/{org_id}/credits"),
            Some(json!({"amount_usd": 1, "kind": "gift"})),
        )
        .await;
    assert_error(st, &v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], "kind");

    // Settling the 1 USD verification credits it back, once.
    let (st, v) = s
        .admin(
            Method::POST,
            &format!("/admin/orgs/{org_id}/verification"),
            Some(json!({"email": true, "card_on_file": true, "settled": true})),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(v["balance_usd"], 8.5);
    assert_eq!(v["card_verified"], true);
    let (_, v) = s
        .admin(
            Method::POST,
            &format!("/admin/orgs/{org_id}/verification"),
            Some(json!({"settled": true})),
        )
        .await;
    assert_eq!(v["balance_usd"], 8.5, "verification credited once");

    let (st, v) = s
        .admin(
            Method::PUT,
            &format!("/admin/orgs/{org_id}/grants"),
            Some(json!({"slugs": ["secret-1"]})),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(v["grants"], json!(["secret-1"]));
    let (st, v) = s
        .admin(
            Method::POST,
            &format!("/admin/orgs/{org_id}/review"),
            Some(json!({"under_review": true, "reason": "chargeback"})),
        )
        .await;
    assert_eq!((st, &v["under_review"]), (200, &json!(true)));
    let (st, v) = s
        .admin(
            Method::POST,
            &format!("/admin/orgs/{org_id}/tier"),
            Some(json!({"tier": 3})),
        )
        .await;
    assert_eq!((st, &v["tier"]), (200, &json!(3)));

    // Errors use the envelope with codes.
    let (st, v) = s.admin(Method::GET, "/admin/orgs/org_nope", None).await;
    assert_error(st, &v, 404, "not_found");
    let (st, v) = s.admin(Method::DELETE, "/admin/keys/key_nope", None).await;
    assert_error(st, &v, 404, "not_found");
    let r = s
        .http
        .post(format!("{}/admin/orgs", s.ops))
        .bearer_auth(harness::ADMIN_TOKEN)
        .body("{nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "invalid_json"
    );
    let (st, v) = s
        .admin(
            Method::POST,
            "/admin/orgs",
            Some(json!({"name": "x", "bogus": 1})),
        )
        .await;
    assert_error(st, &v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], "bogus");
    let (st, v) = s
        .admin(
            Method::POST,
            &format!("/admin/orgs/{org_id}/keys"),
            Some(json!({"expires_at": "soon"})),
        )
        .await;
    assert_error(st, &v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], "expires_at");
    // Seconds whose milliseconds overflow: refused, not wrapped into the past.
    for huge in [
        json!(9_000_000_000_000_000_000u64),
        json!(9_223_372_036_854_775_807i64),
    ] {
        let (st, v) = s
            .admin(
                Method::POST,
                &format!("/admin/orgs/{org_id}/keys"),
                Some(json!({ "expires_at": huge })),
            )
            .await;
        assert_error(st, &v, 400, "invalid_parameter");
        assert_eq!(v["error"]["param"], "expires_at");
    }
}

#[tokio::test]
async fn admin_settings_change_what_they_name_and_answer_them_all() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, Opts::default()).await;
    let (org_id, _, _) = s.org_and_key().await;
    let path = format!("/admin/orgs/{org_id}/settings");
    // Prompt capture follows [responses] prompt_capture_default (true) until set.
    let (st, v) = s.admin(Method::PUT, &path, Some(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"org_id": org_id, "prompt_capture": true, "require_zdr": false, "credits_overflow": false})
    );
    let (st, v) = s
        .admin(
            Method::PUT,
            &path,
            Some(json!({"prompt_capture": false, "require_zdr": true})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (&v["prompt_capture"], &v["require_zdr"]),
        (&json!(false), &json!(true))
    );
    // A later change leaves the others as they are.
    let (_, v) = s
        .admin(Method::PUT, &path, Some(json!({"credits_overflow": true})))
        .await;
    assert_eq!(
        (
            &v["prompt_capture"],
            &v["require_zdr"],
            &v["credits_overflow"]
        ),
        (&json!(false), &json!(true), &json!(true))
    );
    let (_, org) = s
        .admin(Method::GET, &format!("/admin/orgs/{org_id}"), None)
        .await;
    assert_eq!(
        (&org["prompt_capture"], &org["require_zdr"]),
        (&json!(false), &json!(true))
    );
    // Unknown settings and other orgs are refused.
    let (st, v) = s
        .admin(Method::PUT, &path, Some(json!({"bogus": true})))
        .await;
    assert_error(st, &v, 400, "invalid_parameter");
    let (st, v) = s
        .admin(
            Method::PUT,
            "/admin/orgs/org_nope/settings",
            Some(json!({"require_zdr": true})),
        )
        .await;
    assert_error(st, &v, 404, "not_found");
}

#[tokio::test]
async fn admin_is_disabled_without_a_token() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture().env("SLUICE_ADMIN__TOKEN", "")).await;
    let r = s
        .http
        .post(format!("{}/admin/orgs", s.ops))
        .bearer_auth("")
        .json(&json!({"name": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn admin_cli_writes_what_a_running_instance_sees() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let (ok, org) = admin_cli(
        &b,
        &["create-org", "--name", "cli-org", "--credits-usd", "3"],
    );
    assert!(ok, "{org}");
    let org_id = org["org_id"].as_str().unwrap().to_string();
    let (ok, key) = admin_cli(&b, &["create-key", &org_id, "--name", "cli", "--rpm", "60"]);
    assert!(ok, "{key}");
    let plaintext = key["api_key"].as_str().unwrap().to_string();
    // The running instance picks the new key up within a second.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (st, _) = s.get("/v1/models", Some(&plaintext)).await;
        if st == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "new key never accepted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (ok, shown) = admin_cli(&b, &["show-org", &org_id]);
    assert!(ok);
    assert_eq!(shown["balance_usd"], 3.0);
    let (ok, err) = admin_cli(&b, &["credits", &org_id, "--amount-usd=-1"]);
    assert!(!ok);
    assert_eq!(err["error"]["code"], "invalid_parameter");
    let (ok, _) = admin_cli(&b, &["revoke-key", key["api_key_id"].as_str().unwrap()]);
    assert!(ok);
    let revoked_at = Instant::now();
    loop {
        let (st, _) = s.get("/v1/models", Some(&plaintext)).await;
        if st == 401 {
            break;
        }
        assert!(
            revoked_at.elapsed() < Duration::from_secs(1),
            "revocation took over a second"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_key_revoked_through_one_instance_is_refused_by_another() {
    let b = Backend::fresh().await;
    let one = Sluice::start(&b, fixture()).await;
    let two = Sluice::start(&b, fixture()).await;
    let (_, key_id, key) = one.org_and_key().await;
    // The second instance learns of the key created through the first.
    let deadline = Instant::now() + Duration::from_secs(2);
    while two.get("/v1/models", Some(&key)).await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "second instance never saw the key"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (st, _) = one
        .admin(Method::DELETE, &format!("/admin/keys/{key_id}"), None)
        .await;
    assert_eq!(st, 204);
    assert_eq!(
        one.get("/v1/models", Some(&key)).await.0,
        401,
        "revoked at once where revoked"
    );
    let revoked = Instant::now();
    loop {
        let (st, body) = two.get("/v1/models", Some(&key)).await;
        if st == 401 {
            assert_eq!(body["error"]["code"], "invalid_key");
            break;
        }
        assert!(
            revoked.elapsed() < Duration::from_secs(1),
            "the other instance still accepts the key"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn model_listing_is_org_scoped_with_pricing() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let (org, _, key) = s.org_and_key().await;
    let (st, v) = s.get("/v1/models", Some(&key)).await;
    assert_eq!(st, 200);
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["alpha-1.0", "beta-2.5", "embed-small", "gamma-3"],
        "restricted secret-1 hidden"
    );
    let alpha = &v["data"][0];
    assert_eq!(alpha["object"], "model");
    assert_eq!(alpha["owned_by"], "openai");
    assert!(alpha["created"].as_i64().unwrap() > 1_600_000_000);
    assert_eq!(alpha["pricing"]["input_micro_usd_per_million"], 1_000_000);
    assert_eq!(
        alpha["pricing"]["cached_input_micro_usd_per_million"],
        250_000
    );
    assert_eq!(alpha["pricing"]["output_micro_usd_per_million"], 4_000_000);
    // The unprefixed twin and the single-model read.
    let (st, twin) = s.get("/models", Some(&key)).await;
    assert_eq!((st, &twin), (200, &v));
    let (st, one) = s.get("/v1/models/alpha-1.0", Some(&key)).await;
    assert_eq!((st, &one), (200, alpha));
    let (st, e) = s.get("/v1/models/secret-1", Some(&key)).await;
    assert_error(st, &e, 404, "not_found");
    // A grant makes the restricted model visible, on this instance at once.
    let (st, _) = s
        .admin(
            Method::PUT,
            &format!("/admin/orgs/{org}/grants"),
            Some(json!({"slugs": ["secret-1"]})),
        )
        .await;
    assert_eq!(st, 200);
    let (_, v) = s.get("/v1/models", Some(&key)).await;
    assert!(v["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["id"] == "secret-1"));
}

async fn list(s: &Sluice, query: &str) -> (u16, Value) {
    let r = s
        .http
        .get(format!("{}/api/models{query}", s.gateway))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn slugs(v: &Value) -> Vec<String> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["slug"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn catalog_reads_filter_sort_page_and_fold_retention() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let (st, all) = list(&s, "").await;
    assert_eq!(st, 200);
    assert_eq!(all["total"], 5, "keyless list shows public rows: {all}");
    let alpha = &all["data"][0];
    assert_eq!(alpha["slug"], "alpha-1.0");
    assert_eq!(alpha["retention"], "zdr_all_rungs");
    assert_eq!(alpha["context_window"], 128000);
    assert_eq!(alpha["max_input_tokens"], 120000);
    assert_eq!(alpha["pricing"]["input_micro_usd_per_million"], 1_000_000);
    assert_eq!(alpha["providers"][1]["rung_id"], "azure:alpha-b");

    for (q, want) in [
        (
            "?retention=zdr_all_rungs",
            vec!["alpha-1.0", "embed-small", "secret-1"],
        ),
        (
            "?retention=zdr_enforceable",
            vec!["alpha-1.0", "beta-2.5", "embed-small", "secret-1"],
        ),
        ("?retention=not_zdr", vec!["gamma-3"]),
        ("?modality=image", vec!["alpha-1.0"]),
        ("?category=reasoning", vec!["beta-2.5", "secret-1"]),
        ("?provider=openrouter", vec!["beta-2.5"]),
        ("?min_context=100000", vec!["alpha-1.0", "beta-2.5"]),
        (
            "?max_input_price=1000000",
            vec!["alpha-1.0", "embed-small", "gamma-3"],
        ),
        ("?max_output_price=600000&kind=chat", vec!["gamma-3"]),
        ("?kind=embedding", vec!["embed-small"]),
        (
            "?sort=-context_window&limit=2",
            vec!["beta-2.5", "alpha-1.0"],
        ),
        (
            "?sort=input_price&limit=2&offset=1",
            vec!["gamma-3", "alpha-1.0"],
        ),
    ] {
        let (st, v) = list(&s, q).await;
        assert_eq!(st, 200, "{q}: {v}");
        assert_eq!(slugs(&v), want, "{q}");
    }
    let (_, paged) = list(&s, "?sort=input_price&limit=2&offset=1").await;
    assert_eq!(paged["total"], 5);
    for (q, param) in [
        ("?retention=some", "retention"),
        ("?min_context=big", "min_context"),
        ("?limit=0", "limit"),
        ("?sort=vibes", "sort"),
        ("?colour=red", "colour"),
    ] {
        let (st, v) = list(&s, q).await;
        assert_error(st, &v, 400, "invalid_parameter");
        assert_eq!(v["error"]["param"], param, "{q}");
    }

    let r = s
        .http
        .get(format!("{}/api/models/beta-2.5", s.gateway))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let beta: Value = r.json().await.unwrap();
    assert_eq!(beta["retention"], "zdr_enforceable");
    assert_eq!(
        beta["default_waterfall"],
        json!(["anthropic:beta-a", "openrouter:vendor/beta-b"])
    );
    assert_eq!(beta["providers"][0]["provider_model_id"], "beta-a");
    let r = s
        .http
        .get(format!("{}/api/models/beta-2.5/providers", s.gateway))
        .send()
        .await
        .unwrap();
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["data"].as_array().unwrap().len(), 2);
    assert_eq!(p["data"][1]["provider"], "openrouter");
    let r = s
        .http
        .get(format!("{}/api/models/nope-1", s.gateway))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "not_found"
    );
    // A bad key on a keyless read is still refused.
    let r = s
        .http
        .get(format!("{}/api/models", s.gateway))
        .bearer_auth("xpl_bad")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn the_shipped_catalog_is_real_and_loads() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, Opts::default()).await;
    let (_, chat) = list(&s, "?kind=chat&limit=1000").await;
    let (_, emb) = list(&s, "?kind=embedding&limit=1000").await;
    assert!(chat["total"].as_u64().unwrap() >= 12, "{chat}");
    assert!(emb["total"].as_u64().unwrap() >= 3, "{emb}");
    let makers: std::collections::HashSet<_> = chat["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["owned_by"].as_str().unwrap().to_string())
        .collect();
    assert!(makers.len() >= 4, "{makers:?}");
    for m in chat["data"].as_array().unwrap() {
        assert!(!m["providers"].as_array().unwrap().is_empty());
        assert!(m["context_window"].as_u64().unwrap() >= m["max_input_tokens"].as_u64().unwrap());
    }
    let verdicts: std::collections::HashSet<_> = chat["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["retention"].to_string())
        .collect();
    assert!(
        verdicts.len() >= 3,
        "all three verdicts occur: {verdicts:?}"
    );
}

#[tokio::test]
async fn inference_routes_check_json_model_slug_and_access() {
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        fixture().env("SLUICE_SERVER__CLIENT_COUNTRY_HEADER", "cf-ipcountry"),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    let k = Some(key.as_str());
    let (st, v) = s.post_raw("/v1/chat/completions", k, "{\"model\": ").await;
    assert_error(st, &v, 400, "invalid_json");
    let (st, v) = s.post_raw("/v1/chat/completions", k, "[1,2]").await;
    assert_error(st, &v, 400, "invalid_request");
    let (st, v) = s
        .post("/v1/chat/completions", k, &json!({"messages": []}))
        .await;
    assert_error(st, &v, 400, "invalid_request");
    assert_eq!(v["error"]["param"], "model");
    // Dashed wire ids, dated ids and unknown names are not slugs.
    for name in [
        "alpha-1-0",
        "alpha-a",
        "alpha-1.0-2025-04-14",
        "nope",
        "secret-1",
    ] {
        let (st, v) = s
            .post(
                "/v1/chat/completions",
                k,
                &json!({"model": name, "messages": []}),
            )
            .await;
        assert_error(st, &v, 403, "model_not_granted");
    }
    // Suffixes are split off before the check: these pass it (and reach the engine).
    for name in ["alpha-1.0:online", "alpha-1.0[1m]"] {
        let (st, v) = s
            .post(
                "/v1/chat/completions",
                k,
                &json!({"model": name, "messages": []}),
            )
            .await;
        assert_ne!(st, 403, "{name}: {v}");
        assert_ne!(v["error"]["code"], "model_not_granted");
    }
    // Kind mismatch.
    let (st, v) = s
        .post(
            "/v1/embeddings",
            k,
            &json!({"model": "alpha-1.0", "input": "x"}),
        )
        .await;
    assert_error(st, &v, 400, "unsupported_capability");
    // Location: beta-2.5 serves US and DE only; unknown location is unverifiable.
    let send = |country: Option<&'static str>| {
        let mut req = s
            .http
            .post(format!("{}/v1/chat/completions", s.gateway))
            .bearer_auth(&key)
            .json(&json!({"model": "beta-2.5", "messages": []}));
        if let Some(c) = country {
            req = req.header("cf-ipcountry", c);
        }
        req.send()
    };
    for c in [None, Some("FR")] {
        let r = send(c).await.unwrap();
        assert_eq!(r.status(), 403);
        assert_eq!(
            r.json::<Value>().await.unwrap()["error"]["code"],
            "model_location_not_supported"
        );
    }
    let r = send(Some("de")).await.unwrap();
    assert_ne!(r.status(), 403);
}

#[tokio::test]
async fn routing_twins_not_found_body_cap_and_envelopes() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture().env("SLUICE_LIMITS__MAX_REQUEST_BYTES", 4096)).await;
    let (_, _, key) = s.org_and_key().await;
    let k = Some(key.as_str());
    for p in [
        "/v1/nope",
        "/v1/completions",
        "/completions",
        "/v2/models",
        "/",
    ] {
        let (st, v) = s.get(p, k).await;
        assert_error(st, &v, 404, "not_found");
        assert_eq!(v["error"]["type"], "not_found_error");
    }
    for p in [
        "/chat/completions",
        "/v1/chat/completions",
        "/responses",
        "/embeddings",
        "/api/v1/embeddings",
    ] {
        let (st, v) = s.post(p, k, &json!({"model": "nope"})).await;
        assert_error(st, &v, 403, "model_not_granted");
    }
    // Over the cap: 400 invalid_request naming the limit.
    let big = format!(
        "{{\"model\":\"alpha-1.0\",\"pad\":\"{}\"}}",
        "x".repeat(5000)
    );
    let (st, v) = s.post_raw("/v1/chat/completions", k, big).await;
    assert_error(st, &v, 400, "invalid_request");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("4096"),
        "{v}"
    );
    // The messages route answers in its own envelope.
    let r = s
        .http
        .post(format!("{}/v1/messages", s.gateway))
        .bearer_auth(&key)
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let r = s
        .http
        .post(format!("{}/v1/messages/count_tokens", s.gateway))
        .bearer_auth(&key)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["type"],
        "not_found_error"
    );
    let r = s
        .http
        .post(format!("{}/v1/messages", s.gateway))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["type"].as_str(), v["error"]["type"].as_str()),
        (Some("error"), Some("authentication_error"))
    );
    // Wrong method.
    let r = s
        .http
        .get(format!("{}/v1/chat/completions", s.gateway))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
}

#[tokio::test]
async fn ops_endpoints_and_metrics() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let r = s
        .http
        .get(format!("{}/healthz", s.ops))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = s
        .http
        .get(format!("{}/readyz", s.ops))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, _, key) = s.org_and_key().await;
    s.get("/v1/models", Some(&key)).await;
    s.get("/v1/nope", Some(&key)).await;
    // Requests are counted in the logging phase, just after the answer went out.
    let deadline = Instant::now() + Duration::from_secs(3);
    let text = loop {
        let text = s.metrics().await;
        if text.contains("route=\"not_found\",status=\"404\"} 1") || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        text.contains(
            "sluice_requests_total{code=\"ok\",lane=\"none\",model=\"none\",route=\"models\",status=\"200\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("sluice_requests_total{code=\"not_found\",lane=\"none\",model=\"none\",route=\"not_found\",status=\"404\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("sluice_request_duration_seconds_bucket{provider=\"none\",route=\"models\""),
        "{text}"
    );
    assert!(
        !text.contains("org_") && !text.contains("key_"),
        "no ids as labels"
    );
    let page = s
        .http
        .get(&s.web)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("alpha-1.0") && page.contains("<table"));
}

#[tokio::test]
async fn sigterm_drains() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture().env("SLUICE_SERVER__GRACE_PERIOD_SECONDS", 3)).await;
    let (_, _, key) = s.org_and_key().await;
    // A kept-alive connection opened before the signal.
    assert_eq!(s.get("/v1/models", Some(&key)).await.0, 200);
    s.terminate();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let r = s
            .http
            .get(format!("{}/readyz", s.ops))
            .send()
            .await
            .unwrap();
        if r.status() == 503 {
            assert_eq!(r.json::<Value>().await.unwrap()["draining"], true);
            break;
        }
        assert!(Instant::now() < deadline, "readyz never turned 503");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // New requests are refused with gateway_draining (or the connection is refused).
    match s
        .http
        .get(format!("{}/v1/models", s.gateway))
        .bearer_auth(&key)
        .send()
        .await
    {
        Ok(r) => {
            assert_eq!(r.status(), 503);
            assert_eq!(
                r.json::<Value>().await.unwrap()["error"]["code"],
                "gateway_draining"
            );
        }
        Err(e) => assert!(e.is_connect() || e.is_request(), "{e}"),
    }
    let mut s = s;
    let started = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "process did not exit after the grace period"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = status;
}

#[tokio::test]
async fn bad_configuration_fails_fast_with_a_message() {
    let b = Backend::fresh().await;
    let out = harness::command(
        &b,
        &fixture().env("SLUICE_SERVER__LISTEN", "not-an-address"),
    )
    .arg("serve")
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.listen"), "{err}");
    let out = harness::command(&b, &fixture())
        .arg("migrate")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn orchestrator_variables_are_ignored_and_a_bad_value_names_its_key() {
    let b = Backend::fresh().await;
    // What a Kubernetes Service named sluice injects, the test scripts' own
    // variables, and the hosted provider's credential as once documented.
    let injected = [
        ("SLUICE_SERVICE_HOST", "10.0.0.1"),
        ("SLUICE_SERVICE_PORT", "8080"),
        ("SLUICE_PORT", "tcp://10.0.0.1:8080"),
        ("SLUICE_PORT_8080_TCP_ADDR", "10.0.0.1"),
        ("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:1/"),
        ("SLUICE_HOSTED_API_KEY", "hosted-secret-value"),
    ];
    let mut opts = fixture();
    for (k, v) in injected {
        opts = opts.env(k, v);
    }
    let out = harness::command(&b, &opts).arg("migrate").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("SLUICE_")).collect();
    assert_eq!(warnings.len(), 1, "one warning line: {err}");
    for (k, _) in injected {
        assert!(warnings[0].contains(k), "{k} named: {err}");
    }
    assert!(
        !err.contains("hosted-secret-value"),
        "no value is logged: {err}"
    );

    // A known key with a bad value still refuses to start, naming the key.
    let out = harness::command(&b, &fixture().env("SLUICE_SERVER__THREADS", "many"))
        .arg("migrate")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(err.contains("server.threads"), "{err}");
}

/// CONTRACT.md's second-wave sections, as it prints them.
const CONTRACT_SECOND_WAVE: &str = r#"
[search]                                  # service-run web search
backend = "none"                          # none | searxng | brave  ("none": every search drops as search_unavailable)
url = ""                                  # searxng: its base URL (GET {url}/search?q=…&format=json); brave: its API base
api_key_env = ""                          # variable holding the vendor key (brave)
timeout_ms = 3000                         # past it the turn is served without results
results = 5                               # results given to the model
fee_usd = 0.007                           # per service-run search, platform lanes only

[tool_search]
max_rounds = 3                            # search rounds per request
max_results = 5                           # tools one search loads when the declaration sets none

[responses]
retention = "30d"
prompt_capture_default = true             # an org's prompt capture until it changes it

[storage]
objects = "file://data/objects"           # telemetry uploads, files, batch outputs; or s3://bucket/prefix
s3_endpoint = ""                          # an S3-compatible endpoint; empty: the AWS default chain
signing_secret_env = "GATEWAY_SIGNING_SECRET"  # variable holding the HMAC key of signed URLs; unset: a random per-process key and a warning (one instance only)

[telemetry]
max_upload_bytes = 52428800
ticket_ttl = "2h"
braintrust_url = "https://api.braintrust.dev"    # pull sources; a pull's config may name a self-hosted base URL instead
langsmith_url = "https://api.smith.langchain.com"
langfuse_url = "https://cloud.langfuse.com"
posthog_url = "https://us.posthog.com"
mastra_url = ""                                  # no public default: the pull's config must carry base_url

[email]
smtp_url = ""                             # smtp://host:port or smtps://user:pass@host:port; empty: mails are written to data/outbox/ as .eml files
from = "sluice <no-reply@localhost>"

[signup]
enabled = true                            # false: 403 signup_disabled
credits_usd = 0.0                         # granted at signup (credits_granted)
per_origin_per_hour = 5                   # 429 rate_limited past it (origin = client IP, or the trusted edge header)

[web]
session_ttl = "30d"
cookie_secure = false                     # true behind TLS

[payments]
provider = "none"                         # none | stripe
api_base = "https://api.stripe.com"       # fakes point here
secret_key_env = "STRIPE_SECRET_KEY"
webhook_secret_env = "STRIPE_WEBHOOK_SECRET"

[network]
allow_private_upstreams = false           # org-supplied base URLs (custom models, BYOK config, pull sources) may not reach loopback, private, link-local or metadata addresses unless true

[observability]
log_format = "text"                       # text | json
otlp_endpoint = ""                        # OTLP/HTTP traces endpoint; empty: no export
"#;

#[tokio::test]
async fn the_contracts_second_wave_sections_load_as_written() {
    let b = Backend::fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    std::fs::write(&file, CONTRACT_SECOND_WAVE).unwrap();
    let out = harness::command(&b, &fixture())
        .arg("migrate")
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Every section is built: none is named as doing nothing.
    assert!(!err.contains("no effect"), "{err}");
}

#[tokio::test]
async fn operator_orgs_are_email_verified_unless_an_address_awaits_verification() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let verified = |body: Value| {
        let s = &s;
        async move {
            let (st, o) = s.admin(Method::POST, "/admin/orgs", Some(body)).await;
            assert_eq!(st, 201, "{o}");
            let id = o["org_id"].as_str().unwrap().to_string();
            let (_, o) = s
                .admin(Method::GET, &format!("/admin/orgs/{id}"), None)
                .await;
            o["email_verified"].clone()
        }
    };
    assert_eq!(verified(json!({"name": "a"})).await, true);
    assert_eq!(
        verified(json!({"name": "b", "email": "b@x.test"})).await,
        false
    );
    assert_eq!(
        verified(json!({"name": "c", "email_verified": false})).await,
        false
    );
    let body = json!({"name": "d", "email": "d@x.test", "email_verified": true});
    assert_eq!(verified(body).await, true);
    // The CLI follows the same rule.
    let (ok, o) = admin_cli(&b, &["create-org", "--name", "e"]);
    assert!(ok, "{o}");
    let (_, shown) = admin_cli(&b, &["show-org", o["org_id"].as_str().unwrap()]);
    assert_eq!(shown["email_verified"], true);
    let (ok, o) = admin_cli(&b, &["create-org", "--name", "f", "--email", "f@x.test"]);
    assert!(ok, "{o}");
    let (_, shown) = admin_cli(&b, &["show-org", o["org_id"].as_str().unwrap()]);
    assert_eq!(shown["email_verified"], false);
    let (ok, o) = admin_cli(
        &b,
        &["create-org", "--name", "g", "--email-verified", "false"],
    );
    assert!(ok, "{o}");
    let (_, shown) = admin_cli(&b, &["show-org", o["org_id"].as_str().unwrap()]);
    assert_eq!(shown["email_verified"], false);
}

/// `sluice` run the way a new user runs it: from a folder of their own, no config
/// file, the built-in defaults (SQLite under ./data, the built-in catalog).
fn bare(cwd: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn")
        .env("SLUICE_SERVER__LISTEN", "127.0.0.1:0")
        .env("SLUICE_SERVER__WEB_LISTEN", "127.0.0.1:0")
        .env("SLUICE_SERVER__OPS_LISTEN", "127.0.0.1:0");
    cmd
}

fn cli(cwd: &std::path::Path, args: &[&str]) -> Value {
    let out = bare(cwd).arg("admin").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn the_quickstart_answers_from_any_folder_with_the_mock_as_local_provider() {
    let mock = sluice_mock::Mock::start().await;
    let home = tempfile::tempdir().unwrap();
    let mut cmd = bare(home.path());
    // The README runs the mock on the local provider's default port; here any port.
    cmd.env(
        "SLUICE_PROVIDERS__LOCAL__BASE_URL",
        format!("{}/v1", mock.base_url()),
    );
    let db = format!("sqlite://{}/data/sluice.db", home.path().display());
    let s = Sluice::spawn(cmd, &db).await;
    // The README's commands, verbatim: an org with credits and no more, a key.
    let org = cli(
        home.path(),
        &["create-org", "--name", "acme", "--credits-usd", "10"],
    );
    let key = cli(
        home.path(),
        &["create-key", org["org_id"].as_str().unwrap()],
    );
    let key = key["api_key"].as_str().unwrap();
    // The key works at once: no wait for the directory's poll.
    let (st, models) = s.get("/v1/models", Some(key)).await;
    assert_eq!(st, 200, "{models}");
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            Some(key),
            &json!({"model": "llama-3.2-3b", "messages": [{"role": "user", "content": "Hello"}]}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    // The built-in catalog is served, though no catalog file is anywhere near.
    let (_, all) = list(&s, "?limit=1000").await;
    assert!(slugs(&all).contains(&"gpt-4.1-mini".to_string()), "{all}");
    assert!(home.path().join("data/sluice.db").exists());
}

#[tokio::test]
async fn relative_paths_in_a_config_file_resolve_against_its_folder() {
    let home = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let conf = home.path().join("conf");
    std::fs::create_dir(&conf).unwrap();
    std::fs::copy(
        repo_path("tests/fixtures/catalog.toml"),
        conf.join("models.toml"),
    )
    .unwrap();
    std::fs::write(
        conf.join("sluice.toml"),
        "[catalog]\npath = \"models.toml\"\n\
         [storage]\ndatabase_url = \"sqlite://../state/sluice.db\"\n\
         usage_spool = \"../state/spool.jsonl\"\n\
         [secrets]\nkey_file = \"../state/secret.key\"\n",
    )
    .unwrap();
    let mut cmd = bare(elsewhere.path());
    cmd.arg("--config").arg(conf.join("sluice.toml"));
    let db = format!("sqlite://{}/state/sluice.db", home.path().display());
    let s = Sluice::spawn(cmd, &db).await;
    let (st, all) = list(&s, "?limit=1000").await;
    assert_eq!(st, 200, "{all}");
    let fixture = sluice::catalog::load_file(std::path::Path::new(&repo_path(
        "tests/fixtures/catalog.toml",
    )))
    .unwrap();
    let mut want: Vec<String> = fixture.iter().map(|m| m.slug.clone()).collect();
    want.sort();
    let mut got = slugs(&all);
    got.sort();
    assert_eq!(got, want, "the file's catalog, not the built-in one");
    assert!(home.path().join("state/sluice.db").exists());
    assert!(home.path().join("state/secret.key").exists());
    assert!(!elsewhere.path().join("data").exists());
    assert!(!elsewhere.path().join("state").exists());
}

#[tokio::test]
async fn platform_rung_base_urls_are_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.toml");
    let mut text = std::fs::read_to_string(repo_path("tests/fixtures/catalog.toml")).unwrap();
    text.push_str(
        "\n[[model]]\nslug = \"inner-1.0\"\ndisplay_name = \"Inner\"\nkind = \"chat\"\n\
         owned_by = \"meta\"\ncontext_window = 8192\nmax_input_tokens = 8192\n\
         modalities = [\"text\"]\nsupported_params = [\"max_tokens\"]\n\
         price = { input = 1, cached_input = 1, output = 1 }\ncategory = \"general\"\n\
         max_output_tokens = 1024\n\n[[model.rung]]\nprovider = \"hosted\"\n\
         provider_model_id = \"inner\"\nbase_url = \"http://gpu-7.corp.internal:8000/v1\"\n",
    );
    std::fs::write(&catalog, text).unwrap();
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, Opts::default().catalog(catalog.display())).await;
    let (_, _, key) = s.org_and_key().await;
    for (path, key) in [
        ("/api/models/inner-1.0/providers", None),
        ("/api/models/inner-1.0/providers", Some(key.as_str())),
        ("/api/models/inner-1.0", None),
        ("/api/models?limit=1000", None),
    ] {
        let r = s.get(path, key).await;
        assert_eq!(r.0, 200, "{path}: {}", r.1);
        assert!(
            !r.1.to_string().contains("gpu-7.corp.internal"),
            "{path}: {}",
            r.1
        );
    }
}

#[tokio::test]
async fn a_revocation_stamped_by_a_lagging_clock_still_reaches_every_instance() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let (_, key_id, key) = s.org_and_key().await;
    // A second key, made later, moves the instance's watermark past the first.
    let (_, _, later) = s.org_and_key().await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(s.get("/v1/models", Some(&later)).await.0, 200);
    assert_eq!(s.get("/v1/models", Some(&key)).await.0, 200);
    // Revoked by a writer whose clock runs ten seconds behind (another instance,
    // or the CLI on another machine), straight in the shared database.
    let db = sluice::store::Db::connect(&b.database_url).await.unwrap();
    let lagging = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 10_000;
    sqlx::query("UPDATE api_keys SET revoked_at = $1, updated_at = $1 WHERE id = $2")
        .bind(lagging)
        .bind(&key_id)
        .execute(&db.pool)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.get("/v1/models", Some(&key)).await.0 != 401 {
        assert!(Instant::now() < deadline, "the revocation was never seen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.get("/v1/models", Some(&later)).await.0, 200);
}

/// One raw HTTP/1.1 exchange on `conn`: writes `request`, reads one answer (its
/// head, and a body of the length the head gives), returns the head and body.
async fn exchange(conn: &mut tokio::net::TcpStream, request: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= len || n == 0 {
                return (head.to_string(), body.to_string());
            }
        }
        assert!(n > 0, "the connection closed mid-answer: {text}");
    }
}

#[tokio::test]
async fn a_connection_serves_request_after_request_and_a_broken_head_gets_a_400() {
    use tokio::io::AsyncReadExt;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let (_, _, key) = s.org_and_key().await;
    let addr = s.gateway.trim_start_matches("http://").to_string();
    let get = format!("GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\r\n");

    // Three requests on one connection, each answered in full with its own id.
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (head, body) = exchange(&mut conn, &get).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(body.contains("\"object\":\"list\""), "{body}");
        let id = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("x-request-id: ")
                    .map(str::to_string)
            })
            .expect("x-request-id on every answer");
        ids.push(id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 3, "each request has an id of its own");
    // A client's own id is kept.
    let (head, _) = exchange(
        &mut conn,
        &format!("GET /v1/models HTTP/1.1\r\nhost: x\r\nx-request-id: mine-1\r\nauthorization: Bearer {key}\r\n\r\n"),
    )
    .await;
    assert!(
        head.to_ascii_lowercase().contains("x-request-id: mine-1"),
        "{head}"
    );

    // A head that is not HTTP: a 400, and the connection is closed.
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (head, _) = exchange(&mut conn, "NOT HTTP AT ALL\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest))
        .await
        .expect("closed after the 400")
        .unwrap_or(0);
    assert_eq!(n, 0);

    // CONNECT is not served: a 405.
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (head, _) = exchange(
        &mut conn,
        "CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_configured_keepalive() {
    // 1 s: the answer keeps the connection, which is closed once idle past a
    // second (the default would wait 60 s).
    let (head, idle_then_closed) = answer_then_wait("1").await;
    assert!(head.contains("connection: keep-alive"), "{head}");
    assert!(idle_then_closed, "the idle connection is closed");
    // 0: each answer says the connection closes, and it does.
    let (head, closed) = answer_then_wait("0").await;
    assert!(head.contains("connection: close"), "{head}");
    assert!(closed, "closed after the answer");
}

/// One request on a fresh connection to a sluice with `server.keepalive_seconds`
/// = `keepalive`: the answer's head (lowercased), and whether the server closed
/// the connection within 10 s of it.
async fn answer_then_wait(keepalive: &str) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        fixture().env("SLUICE_SERVER__KEEPALIVE_SECONDS", keepalive),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    let addr = s.gateway.trim_start_matches("http://").to_string();
    let get = format!("GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\r\n");
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (head, _) = exchange(&mut conn, &get).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut rest)).await;
    let closed = matches!(read, Ok(Ok(0)) | Ok(Err(_)));
    (head.to_ascii_lowercase(), closed)
}
