//! The web session API (CONTRACT.md, "Web session API"): keys minted and revoked
//! only with a session, CSRF on every change, 401 without a session, another org's
//! ids 404, the org settings, and the usage reads with `scope=self` and
//! `scope=org` on {web_url} (and refused to an API key on {base_url}).

mod harness;

use harness::web::{Member, Web};
use harness::{assert_error, Backend};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_minted_and_revoked_with_a_session_and_its_csrf_token() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let m = w.sign_up_and_in("alice@example.com").await;

    let body = json!({"name": "ci", "daily_spend_cap_usd": 1.5, "rpm": 10, "tpm": 1000,
                      "expires_at": "2030-01-01T00:00:00Z"});
    // Without a session: 401; without the token, or a wrong one: 403, nothing made.
    let (st, v) = w
        .call_raw(
            None,
            None,
            Method::POST,
            "/api/session/keys",
            Some(body.clone()),
        )
        .await;
    assert_error(st, &v, 401, "session_required");
    let (st, v) = w
        .call_raw(None, None, Method::GET, "/api/session/keys", None)
        .await;
    assert_error(st, &v, 401, "session_required");
    for csrf in [None, Some("0".repeat(64))] {
        let (st, v) = w
            .call_raw(
                Some(&m.cookie),
                csrf.as_deref(),
                Method::POST,
                "/api/session/keys",
                Some(body.clone()),
            )
            .await;
        assert_error(st, &v, 403, "csrf_failed");
    }
    let (_, list) = w.call(&m, Method::GET, "/api/session/keys", None).await;
    assert_eq!(
        list["data"].as_array().unwrap().len(),
        1,
        "only the signup's key: {list}"
    );

    let (st, made) = w
        .call(&m, Method::POST, "/api/session/keys", Some(body))
        .await;
    assert_eq!(st, 201, "{made}");
    let key = made["api_key"].as_str().unwrap().to_string();
    let id = made["api_key_id"].as_str().unwrap().to_string();
    assert_eq!(w.s.get("/v1/models", Some(&key)).await.0, 200);
    let (_, limits) =
        w.s.get(&format!("/api/gateway/keys/{id}/limits"), Some(&key))
            .await;
    assert_eq!(limits["daily_spend_cap_usd"], json!(1.5));
    assert_eq!(limits["requests_per_minute"], json!(10));
    assert_eq!(limits["tokens_per_minute"], json!(1000));

    let (st, list) = w.call(&m, Method::GET, "/api/session/keys", None).await;
    assert_eq!(st, 200);
    let text = list.to_string();
    assert!(!text.contains(&key), "never a secret: {text}");
    assert!(!text.contains(m.api_key.as_deref().unwrap()));
    let entry = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["api_key_id"] == json!(id))
        .unwrap()
        .clone();
    for (field, want) in [
        ("name", json!("ci")),
        ("revoked", json!(false)),
        ("daily_spend_cap_usd", json!(1.5)),
        ("rpm", json!(10)),
        ("tpm", json!(1000)),
        ("expires_at", json!(1_893_456_000)),
        ("user_id", json!(m.user_id)),
    ] {
        assert_eq!(entry[field], want, "{field}: {entry}");
    }
    assert!(entry["created_at"].is_i64());

    // Bad bodies.
    for (bad, param) in [
        (json!({"name": ""}), "name"),
        (json!({"name": "x", "rpm": -1}), "rpm"),
        (json!({"name": "x", "expires_at": "tomorrow"}), "expires_at"),
        (json!({"name": "x", "owner": "me"}), "owner"),
    ] {
        let (st, v) = w
            .call(&m, Method::POST, "/api/session/keys", Some(bad))
            .await;
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }

    // Another org's key is not found, and stays working.
    let (_, other_key_id, other_key) = w.s.org_and_key().await;
    let (st, v) = w
        .call(
            &m,
            Method::DELETE,
            &format!("/api/session/keys/{other_key_id}"),
            None,
        )
        .await;
    assert_error(st, &v, 404, "not_found");
    assert_eq!(w.s.get("/v1/models", Some(&other_key)).await.0, 200);

    // Revoking: without the token nothing; with it the key fails at once.
    let (st, v) = w
        .call_raw(
            Some(&m.cookie),
            None,
            Method::DELETE,
            &format!("/api/session/keys/{id}"),
            None,
        )
        .await;
    assert_error(st, &v, 403, "csrf_failed");
    assert_eq!(w.s.get("/v1/models", Some(&key)).await.0, 200);
    let (st, _) = w
        .call(&m, Method::DELETE, &format!("/api/session/keys/{id}"), None)
        .await;
    assert_eq!(st, 204);
    let (st, v) = w.s.get("/v1/models", Some(&key)).await;
    assert_error(st, &v, 401, "invalid_key");
    let (_, list) = w.call(&m, Method::GET, "/api/session/keys", None).await;
    assert!(list["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["api_key_id"] == json!(id) && k["revoked"] == json!(true)));

    // An API key never reaches the session API: not as a cookie-less bearer on
    // {web_url}, and the route does not exist on {base_url}.
    let r = w
        .http
        .post(w.url("/api/session/keys"))
        .bearer_auth(m.api_key.as_deref().unwrap())
        .json(&json!({"name": "sneaky"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let (st, _) =
        w.s.post(
            "/api/session/keys",
            m.api_key.as_deref(),
            &json!({"name": "sneaky"}),
        )
        .await;
    assert_eq!(st, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_changes_the_org_settings_and_credits_overflow_needs_the_verified_org() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let m = w.sign_up_and_in("alice@example.com").await;
    let (st, v) = w.call(&m, Method::GET, "/api/session/settings", None).await;
    assert_eq!(st, 200);
    assert_eq!(
        (
            v["prompt_capture"].clone(),
            v["require_zdr"].clone(),
            v["credits_overflow"].clone()
        ),
        (json!(true), json!(false), json!(false))
    );

    let (st, v) = w
        .call(
            &m,
            Method::PUT,
            "/api/session/settings",
            Some(json!({"require_zdr": true, "prompt_capture": false})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["require_zdr"].clone(), v["prompt_capture"].clone()),
        (json!(true), json!(false))
    );
    let (_, org) =
        w.s.admin(Method::GET, &format!("/admin/orgs/{}", m.org_id), None)
            .await;
    assert_eq!(org["require_zdr"], json!(true));

    let (st, v) = w
        .call(
            &m,
            Method::PUT,
            "/api/session/settings",
            Some(json!({"credits_overflow": true})),
        )
        .await;
    assert_error(st, &v, 402, "verification_required");
    let (st, v) = w
        .call_raw(
            Some(&m.cookie),
            None,
            Method::PUT,
            "/api/session/settings",
            Some(json!({"require_zdr": false})),
        )
        .await;
    assert_error(st, &v, 403, "csrf_failed");
    let (st, v) = w
        .call(
            &m,
            Method::PUT,
            "/api/session/settings",
            Some(json!({"overflow": true})),
        )
        .await;
    assert_eq!(st, 400, "{v}");
    let (_, v) = w.call(&m, Method::GET, "/api/session/settings", None).await;
    assert_eq!(
        (v["credits_overflow"].clone(), v["require_zdr"].clone()),
        (json!(false), json!(true))
    );

    // Once the card is verified, a member may turn overflow on (and off).
    let (st, _) =
        w.s.admin(
            Method::POST,
            &format!("/admin/orgs/{}/verification", m.org_id),
            Some(json!({"card_on_file": true, "settled": true})),
        )
        .await;
    assert_eq!(st, 200);
    let (st, v) = w
        .call(
            &m,
            Method::PUT,
            "/api/session/settings",
            Some(json!({"credits_overflow": true})),
        )
        .await;
    assert_eq!(
        (st, v["credits_overflow"].clone()),
        (200, json!(true)),
        "{v}"
    );
    let (st, v) = w
        .call(
            &m,
            Method::PUT,
            "/api/session/settings",
            Some(json!({"credits_overflow": false})),
        )
        .await;
    assert_eq!(
        (st, v["credits_overflow"].clone()),
        (200, json!(false)),
        "{v}"
    );
}

async fn events_seen(w: &Web, m: &Member, scope: &str, want: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (st, v) = w
            .call(
                m,
                Method::GET,
                &format!("/api/gateway/usage/events?scope={scope}"),
                None,
            )
            .await;
        assert_eq!(st, 200, "{v}");
        if v["data"].as_array().unwrap().len() >= want {
            return v;
        }
        assert!(Instant::now() < deadline, "usage never reached {want}: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_reads_on_the_web_app_serve_scope_self_and_scope_org() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let alice = w.sign_up_and_in("alice@example.com").await;
    let (st, _) = w
        .call(
            &alice,
            Method::POST,
            "/api/session/members",
            Some(json!({"email": "bob@example.com"})),
        )
        .await;
    assert_eq!(st, 201);
    let cookie = w.sign_in_by_mail("bob@example.com", 0).await;
    let bob = w.member(&cookie, None).await;
    let (st, made) = w
        .call(
            &bob,
            Method::POST,
            "/api/session/keys",
            Some(json!({"name": "bob's"})),
        )
        .await;
    assert_eq!(st, 201);
    let bob_key = made["api_key"].as_str().unwrap().to_string();
    let alice_key = alice.api_key.clone().unwrap();
    for key in [&alice_key, &alice_key, &bob_key] {
        let (st, v) = w.chat(key, "b-shared").await;
        assert_eq!(st, 200, "{v}");
    }
    let all = events_seen(&w, &bob, "org", 3).await;
    assert_eq!(all["data"].as_array().unwrap().len(), 3);
    let own = events_seen(&w, &bob, "self", 1).await;
    let own = own["data"].as_array().unwrap();
    assert_eq!(own.len(), 1, "{own:?}");
    assert_eq!(own[0]["api_key_id"], made["api_key_id"]);
    assert_eq!(
        events_seen(&w, &alice, "self", 2).await["data"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    let (st, v) = w
        .call(
            &alice,
            Method::GET,
            "/api/gateway/usage/daily?group_by=member",
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let rows = v["data"].as_array().unwrap();
    let requests = |email: &str| {
        rows.iter()
            .find(|r| r["email"] == json!(email))
            .map(|r| r["requests"].as_i64().unwrap())
    };
    assert_eq!(
        (requests("alice@example.com"), requests("bob@example.com")),
        (Some(2), Some(1)),
        "{v}"
    );
    assert_eq!(
        rows.iter()
            .find(|r| r["email"] == json!("bob@example.com"))
            .unwrap()["member"],
        json!(bob.user_id)
    );
    let (st, v) = w
        .call(
            &bob,
            Method::GET,
            "/api/gateway/usage/daily?group_by=model&scope=self",
            None,
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(v["data"][0]["model"], "b-shared");
    assert_eq!(v["data"][0]["requests"], json!(1));

    // Another org's id, a bad scope, no session.
    let (other, _) = w.s.org_with(json!({"name": "other"})).await;
    let (st, v) = w
        .call(
            &alice,
            Method::GET,
            &format!("/api/gateway/usage/events?org_id={other}"),
            None,
        )
        .await;
    assert_error(st, &v, 404, "not_found");
    let (st, v) = w
        .call(
            &alice,
            Method::GET,
            "/api/gateway/usage/daily?scope=everyone",
            None,
        )
        .await;
    assert_error(st, &v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], "scope");
    let (st, v) = w
        .call_raw(None, None, Method::GET, "/api/gateway/usage/daily", None)
        .await;
    assert_error(st, &v, 401, "session_required");

    // An API key on {base_url}: scope=org works, scope=self needs a session.
    let (st, v) =
        w.s.get("/api/gateway/usage/daily?group_by=member", Some(&alice_key))
            .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) =
        w.s.get("/api/gateway/usage/events?scope=self", Some(&alice_key))
            .await;
    assert_error(st, &v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], "scope");
}
