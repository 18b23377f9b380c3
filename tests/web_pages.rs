//! The web app's pages for a signed-in member: each renders with the secure
//! headers, no page's HTML holds a secret (but the one key shown once on the
//! answer that minted it), every form needs the session's CSRF token, another
//! org's ids are not found, and the actions (keys, connections, the waterfall,
//! settings, the playground, the CSV export) do what the API does.

mod harness;

use harness::web::{Member, Web};
use harness::{Backend, ADMIN_TOKEN};
use reqwest::Method;
use serde_json::{json, Value};
use sluice_mock::stripe::{self, FakeStripe};
use std::time::{Duration, Instant};

const PAGES: [&str; 10] = [
    "/overview",
    "/playground",
    "/keys",
    "/models",
    "/models/b-shared",
    "/connections",
    "/usage",
    "/billing",
    "/settings",
    "/usage/events.csv",
];

/// The value of the `name="<field>"` input after `marker` in a page (what a
/// browser would submit).
fn key_on_page(page: &str) -> String {
    let at = page
        .find("id=\"new-key\">")
        .expect("the new key on the page");
    let rest = &page[at + "id=\"new-key\">".len()..];
    rest[..rest.find('<').unwrap()].to_string()
}

async fn waterfall(w: &Web, key: &str) -> Value {
    w.s.get("/api/models/b-shared/waterfall", Some(key)).await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_renders_for_a_member_with_the_secure_headers() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let (st, page, h) = w.page(None, "/").await;
    assert_eq!(st, 200);
    assert!(
        page.contains("<table") && page.contains("b-shared"),
        "the public catalog"
    );
    assert!(h["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("frame-ancestors 'none'"));
    for path in PAGES.into_iter().filter(|p| !p.starts_with("/models")) {
        let (st, _, h) = w.page(None, path).await;
        assert_eq!((st, Web::location(&h).as_str()), (303, "/login"), "{path}");
    }

    let m = w.sign_up_and_in("alice@example.com").await;
    for path in PAGES {
        let (st, page, h) = w.page(Some(&m), path).await;
        assert_eq!(st, 200, "{path}: {page}");
        let csp = h["content-security-policy"].to_str().unwrap();
        for directive in [
            "default-src 'self'",
            "script-src 'self'",
            "frame-ancestors 'none'",
            "object-src 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        assert_eq!(h["cache-control"], "no-store", "{path}");
        if path.ends_with(".csv") {
            assert!(page.starts_with("id,created_at,api_key_id"), "{page}");
        } else {
            assert!(page.contains("<main id=\"main\""), "{path}");
            assert!(page.contains(&m.email), "{path} names the member");
            // No inline script or style for the policy to refuse.
            assert!(
                !page.contains("<script>") && !page.contains(" style=\""),
                "{path}"
            );
        }
    }
    // Signed in, the start page is the overview; unknown pages are 404.
    let (st, _, h) = w.page(Some(&m), "/").await;
    assert_eq!((st, Web::location(&h).as_str()), (303, "/overview"));
    let (st, _, _) = w.page(Some(&m), "/nowhere").await;
    assert_eq!(st, 404);
    let (st, _, _) = w.page(Some(&m), "/models/no-such-model").await;
    assert_eq!(st, 404);
    let (st, css, h) = w.page(None, "/static/app.css").await;
    assert_eq!(st, 200);
    assert!(
        h["content-type"].to_str().unwrap().starts_with("text/css") && css.contains("--accent")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_page_holds_a_secret_and_a_minted_key_is_shown_once() {
    let b = Backend::fresh().await;
    let fake = FakeStripe::start().await;
    let w = Web::start(&b, |o| {
        o.env("SLUICE_PAYMENTS__PROVIDER", "stripe")
            .env("SLUICE_PAYMENTS__API_BASE", fake.api_base())
            .env("STRIPE_SECRET_KEY", stripe::SECRET_KEY)
            .env("STRIPE_WEBHOOK_SECRET", stripe::WEBHOOK_SECRET)
    })
    .await;
    let m = w.sign_up_and_in("alice@example.com").await;
    let byok_secret = "sk-byok-very-secret-0042";
    let (st, _, h) = w
        .form(
            &m,
            "/connections",
            &[
                ("provider", "openai"),
                ("setup_alias", "main"),
                ("secret", byok_secret),
                ("base_url", &format!("{}/v1", w.mock.base_url())),
                ("models", ""),
            ],
            true,
        )
        .await;
    assert_eq!(
        (st, Web::location(&h).as_str()),
        (303, "/connections?notice=connection_added")
    );

    // Minting on the keys page: the answer shows the plaintext once, uncached.
    let (st, page, h) = w
        .form(
            &m,
            "/keys",
            &[
                ("name", "web key"),
                ("daily_spend_cap_usd", "2"),
                ("rpm", ""),
                ("tpm", ""),
                ("expires_on", ""),
            ],
            true,
        )
        .await;
    assert_eq!(st, 200, "{page}");
    assert_eq!(h["cache-control"], "no-store");
    let minted = key_on_page(&page);
    assert!(minted.starts_with("xpl_") && minted.len() == 44, "{minted}");
    assert_eq!(w.s.get("/v1/models", Some(&minted)).await.0, 200);
    let (st, _) = w.chat(&minted, "b-shared").await;
    assert_eq!(st, 200);

    let secrets = [
        minted.as_str(),
        m.api_key.as_deref().unwrap(),
        byok_secret,
        m.cookie.as_str(),
        ADMIN_TOKEN,
        stripe::SECRET_KEY,
        stripe::WEBHOOK_SECRET,
        "sk-platform-openai",
    ];
    for path in PAGES.iter().copied().chain(["/", "/login", "/signup"]) {
        let (st, page, _) = w.page(Some(&m), path).await;
        assert!(st == 200 || st == 303, "{path}: {st}");
        for s in secrets {
            assert!(!page.contains(s), "{path} shows a secret ({})", &s[..6]);
        }
    }
    let (_, list) = w.call(&m, Method::GET, "/api/session/keys", None).await;
    let (_, conns) =
        w.s.get(
            &format!("/api/orgs/{}/provider-connections", m.org_id),
            Some(&minted),
        )
        .await;
    for body in [list.to_string(), conns.to_string()] {
        for s in secrets {
            assert!(!body.contains(s), "a secret in {body}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_need_the_csrf_token_and_another_orgs_ids_are_not_found() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let m = w.sign_up_and_in("alice@example.com").await;
    let count_keys = |m: &Member| {
        let (w, m) = (&w, m.clone());
        async move {
            let (_, v) = w.call(&m, Method::GET, "/api/session/keys", None).await;
            v["data"].as_array().unwrap().len()
        }
    };
    let before = count_keys(&m).await;
    for (path, fields) in [
        ("/keys", vec![("name", "forged")]),
        ("/settings", vec![("require_zdr", "on")]),
        ("/settings/members", vec![("email", "mallory@example.com")]),
        (
            "/connections",
            vec![
                ("provider", "openai"),
                ("setup_alias", "x"),
                ("secret", "s"),
            ],
        ),
        ("/logout", vec![]),
        ("/billing/checkout", vec![("kind", "verification")]),
    ] {
        let (st, _, _) = w.form(&m, path, &fields, false).await;
        assert_eq!(st, 403, "{path}");
    }
    assert_eq!(count_keys(&m).await, before);
    assert_eq!(w.session(&m.cookie).await.0, 200, "still signed in");
    assert!(w.sink.mails_to("mallory@example.com").is_empty());
    let (_, s) = w.call(&m, Method::GET, "/api/session/settings", None).await;
    assert_eq!(s["require_zdr"], json!(false));

    // The signup form without its form token changes nothing either.
    let r = w
        .http
        .post(w.url("/signup"))
        .form(&[("email", "forged@example.com")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(w.sink.mails_to("forged@example.com").is_empty());

    // Another org's things: a key, a connection, a custom model.
    let (other_org, other_key_id, other_key) = w.s.org_and_key().await;
    let (st, c) =
        w.s.post(
            &format!("/api/orgs/{other_org}/provider-connections/openai"),
            Some(&other_key),
            &json!({"setup_alias": "theirs", "secret": "sk-theirs"}),
        )
        .await;
    assert_eq!(st, 201, "{c}");
    let (st, v) = w
        .s
        .post(
            "/api/models",
            Some(&other_key),
            &json!({"slug": "their-model", "display_name": "Theirs",
                    "providers": [{"provider": "openai", "provider_model_id": "t", "base_url": w.mock.base_url()}]}),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let (st, _, _) = w
        .form(&m, &format!("/keys/{other_key_id}/revoke"), &[], true)
        .await;
    assert_eq!(st, 404);
    assert_eq!(w.s.get("/v1/models", Some(&other_key)).await.0, 200);
    for action in ["check", "rotate", "delete"] {
        let (st, _, _) = w
            .form(
                &m,
                &format!("/connections/openai/theirs/{action}"),
                &[("secret", "sk-mine")],
                true,
            )
            .await;
        assert_eq!(st, 404, "{action}");
    }
    let (_, list) =
        w.s.get(
            &format!("/api/orgs/{other_org}/provider-connections"),
            Some(&other_key),
        )
        .await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    let (st, _, _) = w.page(Some(&m), "/models/their-model").await;
    assert_eq!(st, 404);
    let (st, _, _) = w
        .form(
            &m,
            "/models/their-model/waterfall",
            &[("order", "openai:t"), ("save", "1")],
            true,
        )
        .await;
    assert_eq!(st, 404);
    let (st, page, _) = w.page(Some(&m), "/models").await;
    assert_eq!(st, 200);
    assert!(!page.contains("their-model"));
    // The session API likewise.
    let (st, _) = w
        .call(
            &m,
            Method::GET,
            &format!("/api/gateway/usage/daily?org_id={other_org}"),
            None,
        )
        .await;
    assert_eq!(st, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_visitor_sees_the_public_catalog_and_a_member_also_the_orgs_own_models() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let m = w.sign_up_and_in("alice@example.com").await;
    let key = m.api_key.clone().unwrap();
    let (st, v) = w
        .s
        .post(
            "/api/models",
            Some(&key),
            &json!({"slug": "alices-model", "display_name": "Alice's",
                    "providers": [{"provider": "openai", "provider_model_id": "t", "base_url": w.mock.base_url()}]}),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    // What /api/models tells anyone, the pages show without an account.
    let (_, api) = w.s.get("/api/models?limit=200", None).await;
    let shared = api["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["slug"] == "b-shared")
        .expect("b-shared is public")
        .clone();
    let retention = shared["retention"].as_str().unwrap().to_string();
    let (st, page, h) = w.page(None, "/models").await;
    assert_eq!(st, 200, "{page}");
    assert_eq!(h["cache-control"], "no-store");
    assert!(
        page.contains("/models/b-shared") && page.contains(&retention),
        "{page}"
    );
    assert!(
        !page.contains("alices-model"),
        "an org's own model is not public"
    );
    assert!(page.contains("href=\"/login\"") && !page.contains("Sign out"));
    let (st, page, _) = w.page(None, "/models/b-shared").await;
    assert_eq!(st, 200, "{page}");
    for fact in ["openai", "o1", "mistral", "m1", retention.as_str()] {
        assert!(page.contains(fact), "{fact}: {page}");
    }
    assert!(
        !page.contains("waterfall-form"),
        "no org, no waterfall to order"
    );
    let (st, _, _) = w.page(None, "/models/alices-model").await;
    assert_eq!(st, 404);
    // Ordering a waterfall still needs a session.
    let r = w
        .http
        .post(w.url("/models/b-shared/waterfall"))
        .form(&[("order", "openai:o1"), ("save", "1")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    // Signed in, the org's own rows appear, and the waterfall form.
    let (_, page, _) = w.page(Some(&m), "/models/b-shared").await;
    assert!(page.contains("waterfall-form"));
    let (st, page, _) = w.page(Some(&m), "/models").await;
    assert_eq!(st, 200);
    assert!(page.contains(&m.email) && page.contains("alices-model"));
    let (st, _, _) = w.page(Some(&m), "/models/alices-model").await;
    assert_eq!(st, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_page_orders_the_waterfall_through_the_apis_checks() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let m = w.sign_up_and_in("alice@example.com").await;
    let key = m.api_key.clone().unwrap();
    let (st, page, _) = w.page(Some(&m), "/models/b-shared").await;
    assert_eq!(st, 200);
    assert!(page.contains("connect your own provider account"), "{page}");
    assert!(page.contains("openai:o1") && page.contains("mistral:m1"));

    // A platform-only chain is refused as the API refuses it, and nothing changes.
    let (st, page, _) = w
        .form(
            &m,
            "/models/b-shared/waterfall",
            &[
                ("order", "openai:o1"),
                ("order", "mistral:m1"),
                ("move", "down:0"),
            ],
            true,
        )
        .await;
    assert_eq!(st, 400);
    assert!(page.contains("role=\"alert\""), "{page}");
    assert_eq!(waterfall(&w, &key).await["override"], Value::Null);

    let (st, _, _) = w
        .form(
            &m,
            "/connections",
            &[
                ("provider", "openai"),
                ("setup_alias", "mine"),
                ("secret", "sk-mine"),
                ("base_url", &format!("{}/v1", w.mock.base_url())),
            ],
            true,
        )
        .await;
    assert_eq!(st, 303);
    let (_, conns) =
        w.s.get(
            &format!("/api/orgs/{}/provider-connections", m.org_id),
            Some(&key),
        )
        .await;
    let byok = format!("byok:{}", conns["data"][0]["id"].as_str().unwrap());

    // Add the account's rung (it goes last), then move it up twice.
    let order = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect()
    };
    let (st, _, h) = w
        .form(
            &m,
            "/models/b-shared/waterfall",
            &[
                ("order", "openai:o1"),
                ("order", "mistral:m1"),
                ("add_id", &byok),
                ("add", "1"),
            ],
            true,
        )
        .await;
    assert_eq!(
        (st, Web::location(&h).as_str()),
        (303, "/models/b-shared?notice=waterfall_saved#waterfall")
    );
    assert_eq!(
        order(&waterfall(&w, &key).await["override"]),
        vec!["openai:o1", "mistral:m1", byok.as_str()]
    );
    let mut current = vec![
        "openai:o1".to_string(),
        "mistral:m1".to_string(),
        byok.clone(),
    ];
    for at in ["2", "1"] {
        let mut fields: Vec<(&str, &str)> =
            current.iter().map(|id| ("order", id.as_str())).collect();
        let mv = format!("up:{at}");
        fields.push(("move", &mv));
        fields.push(("add_id", "openai:o1"));
        let (st, _, _) = w
            .form(&m, "/models/b-shared/waterfall", &fields, true)
            .await;
        assert_eq!(st, 303);
        current = order(&waterfall(&w, &key).await["override"]);
    }
    assert_eq!(current, vec![byok.as_str(), "openai:o1", "mistral:m1"]);
    let (_, page, _) = w.page(Some(&m), "/models/b-shared").await;
    let (first, second) = (
        page.find(&format!("data-rung=\"{byok}\"")).unwrap(),
        page.find("data-rung=\"openai:o1\"").unwrap(),
    );
    assert!(first < second, "the page shows the saved order");
    // Requests follow it (within the routing refresh).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (st, v) = w.chat(&key, "b-shared").await;
        assert_eq!(st, 200, "{v}");
        if v["provider"] == json!(byok) {
            break;
        }
        assert!(Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A plain save keeps a dragged order as sent; reset drops the override.
    let (st, _, _) = w
        .form(
            &m,
            "/models/b-shared/waterfall",
            &[("order", "openai:o1"), ("order", &byok), ("save", "1")],
            true,
        )
        .await;
    assert_eq!(st, 303);
    assert_eq!(
        order(&waterfall(&w, &key).await["override"]),
        vec!["openai:o1", byok.as_str()]
    );
    let (st, _, _) = w
        .form(
            &m,
            "/models/b-shared/waterfall",
            &[("order", "openai:o1"), ("reset", "1")],
            true,
        )
        .await;
    assert_eq!(st, 303);
    assert_eq!(waterfall(&w, &key).await["override"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_connections_settings_and_the_playground_work_from_their_pages() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let m = w.sign_up_and_in("alice@example.com").await;

    // The playground answers a chat call through the gateway.
    let key = m.api_key.clone().unwrap();
    let (st, page, _) = w
        .form(
            &m,
            "/playground",
            &[
                ("api_key", &key),
                ("model", "b-shared"),
                ("message", "Hello there"),
            ],
            true,
        )
        .await;
    assert_eq!(st, 200);
    assert!(page.contains("Hello from mock o1."), "{page}");
    assert!(!page.contains(&key), "the key is not shown back");
    let (_, page, _) = w
        .form(
            &m,
            "/playground",
            &[
                ("api_key", "xpl_wrong"),
                ("model", "b-shared"),
                ("message", "Hi"),
            ],
            true,
        )
        .await;
    assert!(page.contains("invalid_key"), "{page}");

    // Revoking from the keys page.
    let (_, page, _) = w
        .form(
            &m,
            "/keys",
            &[("name", "temp"), ("expires_on", "2031-05-01")],
            true,
        )
        .await;
    let temp = key_on_page(&page);
    let (_, list) = w.call(&m, Method::GET, "/api/session/keys", None).await;
    let entry = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "temp")
        .unwrap()
        .clone();
    assert_eq!(entry["expires_at"], json!(1_935_360_000));
    let id = entry["api_key_id"].as_str().unwrap().to_string();
    let (st, _, h) = w.form(&m, &format!("/keys/{id}/revoke"), &[], true).await;
    assert_eq!(
        (st, Web::location(&h).as_str()),
        (303, "/keys?notice=key_revoked")
    );
    assert_eq!(w.s.get("/v1/models", Some(&temp)).await.0, 401);
    let (_, page, _) = w
        .form(&m, "/keys", &[("name", "bad"), ("rpm", "lots")], true)
        .await;
    assert!(page.contains("rpm must be a number"), "{page}");

    // Connections: add, check against the provider, rotate, delete.
    let base = format!("{}/v1", w.mock.base_url());
    let (st, _, _) = w
        .form(
            &m,
            "/connections",
            &[
                ("provider", "openai"),
                ("setup_alias", "main"),
                ("secret", "sk-1"),
                ("base_url", &base),
                ("models", "b-shared = o1"),
            ],
            true,
        )
        .await;
    assert_eq!(st, 303);
    let (st, page, _) = w
        .form(
            &m,
            "/connections",
            &[
                ("provider", "openai"),
                ("setup_alias", "main"),
                ("secret", "sk-2"),
            ],
            true,
        )
        .await;
    assert_eq!(st, 409, "an alias is never overwritten");
    assert!(page.contains("already exists"));
    let (st, page, _) = w
        .form(&m, "/connections/openai/main/check", &[], true)
        .await;
    assert_eq!(st, 200);
    assert!(page.contains("accepted the key"), "{page}");
    let (st, _, h) = w
        .form(
            &m,
            "/connections/openai/main/rotate",
            &[("secret", "sk-3")],
            true,
        )
        .await;
    assert_eq!(
        (st, Web::location(&h).as_str()),
        (303, "/connections?notice=connection_rotated")
    );
    let (st, _, _) = w
        .form(&m, "/connections/openai/main/delete", &[], true)
        .await;
    assert_eq!(st, 303);
    let (_, conns) =
        w.s.get(
            &format!("/api/orgs/{}/provider-connections", m.org_id),
            Some(&key),
        )
        .await;
    assert!(conns["data"].as_array().unwrap().is_empty());

    // Settings: checkboxes, and overflow refused until the card is verified.
    let (st, _, _) = w
        .form(
            &m,
            "/settings",
            &[("require_zdr", "on"), ("prompt_capture", "on")],
            true,
        )
        .await;
    assert_eq!(st, 303);
    let (_, s) = w.call(&m, Method::GET, "/api/session/settings", None).await;
    assert_eq!(
        (s["require_zdr"].clone(), s["prompt_capture"].clone()),
        (json!(true), json!(true))
    );
    let (st, page, _) = w
        .form(&m, "/settings", &[("credits_overflow", "on")], true)
        .await;
    assert_eq!(st, 402);
    assert!(page.contains("verified organization"), "{page}");
    let (st, _, _) = w
        .form(
            &m,
            "/settings/members",
            &[("email", "bob@example.com")],
            true,
        )
        .await;
    assert_eq!(st, 303);
    assert_eq!(w.sink.next_to("bob@example.com").await.links().len(), 1);
    let (_, page, _) = w.page(Some(&m), "/settings").await;
    assert!(page.contains("bob@example.com"));

    // The usage page and its CSV list the calls.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = w
            .http
            .get(w.url("/usage/events.csv?scope=org"))
            .header("cookie", format!("sluice_session={}", m.cookie))
            .send()
            .await
            .unwrap();
        assert!(r.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment"));
        let csv = r.text().await.unwrap();
        let rows: Vec<&str> = csv.lines().skip(1).collect();
        if !rows.is_empty() {
            assert!(rows.iter().all(|r| r.contains(",b-shared,")), "{csv}");
            break;
        }
        assert!(Instant::now() < deadline, "{csv}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, page, _) = w.page(Some(&m), "/usage?scope=self").await;
    assert!(page.contains("<svg class=\"chart\""), "{page}");
}
