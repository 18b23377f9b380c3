//! Keys and the admin surface as a client and an operator see them: every bad key
//! gets the same 401, the admin API and CLI do what the contract says, and a
//! revocation through one instance reaches every other.

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
