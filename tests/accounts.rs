//! Accounts (issue 24): signup on {web_url}, the verification mail through a real
//! SMTP server, mailed links (single use, expiring), sign-in by link, sessions
//! (issued afresh, revocable on every instance), members invited by a member or
//! added by an operator, and the email-verification gate on credit-drawing calls.

mod harness;

use harness::web::{session_cookie_line, Web, PUBLIC_WEB};
use harness::{assert_error, Backend, Sluice, ADMIN_TOKEN};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Runs one statement against the test's database (what an operator's SQL would
/// do; used to age a link past its expiry).
async fn sql(database_url: &str, statement: &str) {
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(database_url).await.unwrap();
    sqlx::query(statement).execute(&pool).await.unwrap();
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signup_grants_credits_and_its_mailed_link_verifies_and_opens_a_session() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let (st, v) = w.signup("  Alice@Example.COM ").await;
    assert_eq!(st, 200, "{v}");
    let key = v["api_key"].as_str().unwrap().to_string();
    assert!(key.starts_with("xpl_") && key.len() == 44, "{v}");
    let org = v["org_id"].as_str().unwrap().to_string();
    assert_eq!(v["credits_granted"], json!(5.0));
    assert_eq!(v["verification_required"], json!(true));
    assert_eq!(v["overview_url"], json!(format!("{PUBLIC_WEB}/overview")));

    // The key works at once; credit-drawing calls wait for the address.
    assert_eq!(w.s.get("/v1/models", Some(&key)).await.0, 200);
    let (st, e) = w.chat(&key, "b-shared").await;
    assert_error(st, &e, 429, "insufficient_quota");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("email_unverified"),
        "{e}"
    );

    // One mail, to the normalized address, with exactly one link under the public
    // web URL, and no secret in it.
    let mail = w.sink.next_to("alice@example.com").await;
    assert!(mail.from.contains("no-reply@sluice.test"), "{}", mail.from);
    let link = mail.single_link();
    assert!(link.starts_with(&format!("{PUBLIC_WEB}/link/")), "{link}");
    assert!(!mail.data.contains(&key), "the key is never mailed");

    // Following it: a new session cookie, HttpOnly and SameSite=Lax, not Secure
    // (web.cookie_secure is off here); the overview is next.
    let (st, cookie, headers) = w.follow(&link, None).await;
    assert_eq!(st, 303);
    assert!(
        Web::location(&headers).starts_with("/overview"),
        "{headers:?}"
    );
    let line = session_cookie_line(&headers).unwrap();
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(line.contains(attr), "{line}");
    }
    assert!(!line.contains("Secure"), "{line}");
    let cookie = cookie.unwrap();
    let (st, me) = w.session(&cookie).await;
    assert_eq!(st, 200, "{me}");
    assert_eq!(me["email"], "alice@example.com");
    assert_eq!(me["org_id"], json!(org));
    assert_eq!(me["email_verified"], json!(true));
    assert_eq!(me["csrf_token"].as_str().unwrap().len(), 64);
    assert!(me["user_id"].as_str().unwrap().starts_with("user_"));

    // Verified: the same key now draws its credits.
    let (st, c) = w.chat(&key, "b-shared").await;
    assert_eq!(st, 200, "{c}");
    let (_, o) =
        w.s.admin(reqwest::Method::GET, &format!("/admin/orgs/{org}"), None)
            .await;
    assert_eq!(o["email_verified"], json!(true));
    assert_eq!(o["email"], "alice@example.com");

    // A link works once: the second visit opens nothing.
    let (st, again, _) = w.follow(&link, None).await;
    assert_eq!(st, 410);
    assert!(again.is_none());

    // The address has an account now, in any case.
    let (st, e) = w.signup("ALICE@example.com").await;
    assert_error(st, &e, 409, "account_exists");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signups_are_refused_for_bad_addresses_and_limited_per_origin() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o.env("SLUICE_SIGNUP__PER_ORIGIN_PER_HOUR", "4")).await;
    for (body, code, status) in [
        (json!({"email": "not-an-address"}), "invalid_request", 400),
        (
            json!({"email": "someone@mailinator.com"}),
            "invalid_request",
            400,
        ),
    ] {
        let r = w
            .http
            .post(w.url("/api/signup/instant"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let st = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        assert_error(st, &v, status, code);
        assert_eq!(v["error"]["param"], "email", "{v}");
    }
    // Without an email string the email is rejected (SPEC's code), before
    // anything counts.
    for raw in ["{}", "{\"email\": 5}", "{\"email\": null}"] {
        let r = w
            .http
            .post(w.url("/api/signup/instant"))
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        let st = r.status().as_u16();
        let v: Value = r.json().await.unwrap();
        assert_error(st, &v, 400, "invalid_request");
        assert_eq!(v["error"]["param"], "email", "{raw}: {v}");
    }
    // A body that is not the signup's shape is refused before anything counts.
    for raw in ["{", "{\"email\": \"a@b.co\", \"admin\": true}"] {
        let r = w
            .http
            .post(w.url("/api/signup/instant"))
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400, "{raw}");
    }
    let long = format!("{}@example.com", "a".repeat(250));
    let (st, v) = w.signup(&long).await;
    assert_error(st, &v, 400, "invalid_request");
    // Three attempts counted (the bad addresses); the fourth goes through, the
    // fifth is refused even for a good address, and creates nothing.
    let (st, v) = w.signup("bob@example.com").await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = w.signup("eve@example.com").await;
    assert_error(st, &v, 429, "rate_limited");
    let (st, v) =
        w.s.admin(
            reqwest::Method::POST,
            "/admin/orgs/org_none/members",
            Some(json!({"email": "x@example.com"})),
        )
        .await;
    assert_error(st, &v, 404, "not_found");
    let to: Vec<String> = w.sink.mails().iter().flat_map(|m| m.to.clone()).collect();
    assert_eq!(to, vec!["bob@example.com".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_signup_is_403_and_within_the_limit_a_signup_works() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o.env("SLUICE_SIGNUP__ENABLED", "false")).await;
    let (st, v) = w.signup("carol@example.com").await;
    assert_error(st, &v, 403, "signup_disabled");
    // Refused before the body is judged, too.
    let r = w
        .http
        .post(w.url("/api/signup/instant"))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let (st, page, _) = w.page(None, "/signup").await;
    assert_eq!(st, 200);
    assert!(page.contains("Signup is disabled"), "{page}");
    drop(w);

    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o.env("SLUICE_SIGNUP__PER_ORIGIN_PER_HOUR", "2")).await;
    assert_eq!(w.signup("d1@example.com").await.0, 200);
    assert_eq!(w.signup("d2@example.com").await.0, 200);
    let (st, v) = w.signup("d3@example.com").await;
    assert_error(st, &v, 429, "rate_limited");
}

/// Behind an edge every peer address is the edge's: with
/// `server.client_ip_header` the per-origin limit counts each client by the
/// address the edge reports (of a forwarded-for list the last, the one the edge
/// appended). Without the setting the header is the client's word and counts for
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_an_edge_signups_are_limited_per_client_address_the_edge_reports() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| {
        o.env("SLUICE_SIGNUP__PER_ORIGIN_PER_HOUR", "1")
            .env("SLUICE_SERVER__CLIENT_IP_HEADER", "x-forwarded-for")
    })
    .await;
    let edge = |client_claim: &str, seen: &str| format!("{client_claim}, {seen}");
    let (st, v) = w
        .signup_via(Some(&edge("198.51.100.1", "203.0.113.7")), "e1@example.com")
        .await;
    assert_eq!(st, 200, "{v}");
    // The same client claiming another address before the edge's: still counted
    // as 203.0.113.7.
    let (st, v) = w
        .signup_via(Some(&edge("198.51.100.2", "203.0.113.7")), "e2@example.com")
        .await;
    assert_error(st, &v, 429, "rate_limited");
    // Another client behind the same edge has a limit of its own.
    let (st, v) = w.signup_via(Some("2001:db8::8"), "e3@example.com").await;
    assert_eq!(st, 200, "{v}");
    // An IPv6 client is counted by its /64: another address of it is the same
    // client (L1 of the 2026-12-01 security review); another /64 is not.
    let (st, v) = w
        .signup_via(Some("2001:db8::1:2:3:4"), "e3b@example.com")
        .await;
    assert_error(st, &v, 429, "rate_limited");
    let (st, v) = w
        .signup_via(Some("2001:db8:0:1::8"), "e3c@example.com")
        .await;
    assert_eq!(st, 200, "{v}");
    // A request without the header (one that did not come through the edge) is
    // counted by its peer address.
    assert_eq!(w.signup_via(None, "e4@example.com").await.0, 200);
    let (st, v) = w.signup_via(None, "e5@example.com").await;
    assert_error(st, &v, 429, "rate_limited");
    drop(w);

    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o.env("SLUICE_SIGNUP__PER_ORIGIN_PER_HOUR", "1")).await;
    assert_eq!(
        w.signup_via(Some("203.0.113.1"), "f1@example.com").await.0,
        200
    );
    let (st, v) = w.signup_via(Some("203.0.113.2"), "f2@example.com").await;
    assert_error(st, &v, 429, "rate_limited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_the_orgs_own_keys_work_before_the_address_is_verified() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let (st, v) = w.signup("erin@example.com").await;
    assert_eq!(st, 200);
    let key = v["api_key"].as_str().unwrap();
    let org = v["org_id"].as_str().unwrap();
    let (st, c) =
        w.s.post(
            &format!("/api/orgs/{org}/provider-connections/openai"),
            Some(key),
            &json!({"setup_alias": "own", "secret": "sk-own-openai",
                    "config": {"base_url": format!("{}/v1", w.mock.base_url())}}),
        )
        .await;
    assert_eq!(st, 201, "{c}");
    let byok = format!("byok:{}", c["id"].as_str().unwrap());
    let r =
        w.s.http
            .put(format!("{}/api/models/b-shared/waterfall", w.s.gateway))
            .bearer_auth(key)
            .json(&json!({"model_provider_ids": [byok]}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (st, v) = w.chat(key, "b-shared").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], json!(byok));
    // The platform lane still waits for the address.
    let r =
        w.s.http
            .put(format!("{}/api/models/b-shared/waterfall", w.s.gateway))
            .bearer_auth(key)
            .json(&json!({"model_provider_ids": ["openai:o1", byok]}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (st, v) = w.chat(key, "b-shared").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["provider"],
        json!(byok),
        "the unverified org's platform rung is skipped"
    );
    // Every call the provider saw carried the org's own key, none the platform's.
    let seen = w.mock.requests_for("o1");
    assert_eq!(seen.len(), 2);
    assert!(seen
        .iter()
        .all(|r| r.header("authorization") == Some("Bearer sk-own-openai")));
}

/// M1 of the 2026-12-01 security review: instant signup answers with a key for
/// an address nobody proved. When the address's owner later proves it some other
/// way than the link that signup mailed (told at signup that the account exists,
/// they sign in by mail), every key minted before the proof is revoked: whoever
/// signed up with their address never spends their credits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_signed_up_for_an_unproved_address_dies_when_its_owner_proves_it() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let (st, v) = w.signup("victim@corp.example").await;
    assert_eq!(st, 200, "{v}");
    let squatted = v["api_key"].as_str().unwrap().to_string();
    let (st, e) = w.chat(&squatted, "b-shared").await;
    assert_error(st, &e, 429, "insufficient_quota");

    // The owner is told the account exists, and signs in by a mailed link.
    let (st, e) = w.signup("victim@corp.example").await;
    assert_error(st, &e, 409, "account_exists");
    let r = w
        .http
        .post(w.url("/login"))
        .form(&[("email", "victim@corp.example")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mail = w.sink.wait_for("victim@corp.example", 1).await;
    let (st, cookie, headers) = w.follow(&mail.single_link(), None).await;
    assert_eq!(st, 303);
    assert_eq!(
        Web::location(&headers),
        "/overview?notice=verified_keys_revoked"
    );
    let owner = w.member(&cookie.unwrap(), None).await;
    let (_, me) = w.session(&owner.cookie).await;
    assert_eq!(me["email_verified"], json!(true));

    // The squatter's key is dead on every lane; the overview says why.
    let (st, e) = w.chat(&squatted, "b-shared").await;
    assert_error(st, &e, 401, "invalid_key");
    assert_eq!(w.s.get("/v1/models", Some(&squatted)).await.0, 401);
    let (st, page, _) = w
        .page(Some(&owner), "/overview?notice=verified_keys_revoked")
        .await;
    assert_eq!(st, 200);
    assert!(page.contains("were revoked"), "{page}");
    // A key the owner mints draws the org's credits.
    let (st, k) = w
        .call(
            &owner,
            reqwest::Method::POST,
            "/api/session/keys",
            Some(json!({"name": "mine"})),
        )
        .await;
    assert_eq!(st, 201, "{k}");
    let (st, c) = w.chat(k["api_key"].as_str().unwrap(), "b-shared").await;
    assert_eq!(st, 200, "{c}");
    // The link the signup mailed proves nothing more now, and revives nothing.
    let first = w.sink.wait_for("victim@corp.example", 0).await;
    let _ = w.follow(&first.single_link(), None).await;
    assert_eq!(w.s.get("/v1/models", Some(&squatted)).await.0, 401);
}

/// M2 of the 2026-12-01 security review: an invitation makes nobody a member
/// until its link is followed. Until then the address signs up for an org of its
/// own as if never invited; following the link later joins the inviter's org.
/// An org mails at most 20 invitations an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invitation_is_only_an_offer_until_its_link_is_followed() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let alice = w.sign_up_and_in("alice@example.com").await;
    let (st, v) = w
        .call(
            &alice,
            reqwest::Method::POST,
            "/api/session/members",
            Some(json!({"email": "ceo@corp.example"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let invite = w.sink.next_to("ceo@corp.example").await;
    // Not a member: the settings page lists an invitation, and a sign-in request
    // mails nothing (the address has no account).
    let (_, page, _) = w.page(Some(&alice), "/settings").await;
    assert!(
        page.contains("ceo@corp.example") && page.contains("follow the link"),
        "{page}"
    );
    // The invitee's own signup works: an org of their own, their key.
    let (st, v) = w.signup("ceo@corp.example").await;
    assert_eq!(st, 200, "{v}");
    let own_org = v["org_id"].as_str().unwrap().to_string();
    assert_ne!(own_org, alice.org_id);
    let verify = w.sink.wait_for("ceo@corp.example", 1).await;
    let cookie = {
        let (st, c, _) = w.follow(&verify.single_link(), None).await;
        assert_eq!(st, 303);
        c.unwrap()
    };
    let ceo = w
        .member(&cookie, v["api_key"].as_str().map(str::to_string))
        .await;
    assert_eq!(ceo.org_id, own_org);
    // Following the invitation later joins alice's org, in a session there.
    let (st, c, _) = w.follow(&invite.single_link(), None).await;
    assert_eq!(st, 303);
    let joined = w.member(&c.unwrap(), None).await;
    assert_eq!(joined.org_id, alice.org_id);
    assert_eq!(joined.user_id, ceo.user_id);

    // An org mails at most 20 invitations an hour, whatever the addresses.
    let mut refused = None;
    for i in 0..25 {
        let (st, v) = w
            .call(
                &alice,
                reqwest::Method::POST,
                "/api/session/members",
                Some(json!({"email": format!("person{i}@example.com")})),
            )
            .await;
        if st != 201 {
            refused = Some((i, st, v));
            break;
        }
    }
    let (i, st, v) = refused.expect("some invitation is refused");
    assert_error(st, &v, 429, "rate_limited");
    assert_eq!(i, 19, "the first invitation counted too: {v}");
    assert!(w.sink.mails_to("person19@example.com").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_mails_only_members_and_every_sign_in_issues_a_new_session() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let alice = w.sign_up_and_in("alice@example.com").await;

    // The same page whether or not the address has an account; mail only for one.
    let login = |email: &'static str| {
        let w = &w;
        async move {
            let r = w
                .http
                .post(w.url("/login"))
                .form(&[("email", email)])
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (st, nobody) = login("nobody@example.com").await;
    assert_eq!(st, 200);
    let (st, page) = login("alice@example.com").await;
    assert_eq!(st, 200);
    assert_eq!(
        nobody.replace("nobody@example.com", "X"),
        page.replace("alice@example.com", "X")
    );
    assert!(w.sink.mails_to("nobody@example.com").is_empty());
    let mail = w.sink.wait_for("alice@example.com", 1).await;
    let link = mail.single_link();

    // A cookie the browser already holds (a valid one, or one an attacker planted)
    // is never adopted: the link sets a new one, and the held ones stop working.
    let planted = "ab".repeat(32);
    let (st, fresh, _) = w.follow(&link, Some(&alice.cookie)).await;
    assert_eq!(st, 303);
    let fresh = fresh.unwrap();
    assert_ne!(fresh, alice.cookie);
    assert_ne!(fresh, planted);
    assert_eq!(w.session(&fresh).await.0, 200);
    let (st, v) = w.session(&alice.cookie).await;
    assert_error(st, &v, 401, "session_required");
    let (st, v) = w.session(&planted).await;
    assert_error(st, &v, 401, "session_required");

    // A link past its 24 hours opens nothing.
    let (st, _) = login("alice@example.com").await;
    assert_eq!(st, 200);
    let old = w.sink.wait_for("alice@example.com", 2).await.single_link();
    sql(
        &w.s.database_url,
        "UPDATE email_links SET expires_at = 1 WHERE used_at IS NULL",
    )
    .await;
    let (st, none, _) = w.follow(&old, None).await;
    assert_eq!(st, 410);
    assert!(none.is_none());
    // Garbage is not a link either.
    let (st, none, _) = w
        .follow(&format!("{PUBLIC_WEB}/link/{}", "0".repeat(64)), None)
        .await;
    assert_eq!((st, none), (410, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_out_ends_the_session_on_every_instance() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let m = w.sign_up_and_in("frank@example.com").await;
    // A second instance on the same database.
    let other = Sluice::start(&b, harness::web::web_opts(&w.mock, &w.sink)).await;
    let on_other = |cookie: String| {
        let http = harness::web::client();
        let url = format!("{}/api/session", other.web);
        async move {
            http.get(url)
                .header("cookie", format!("sluice_session={cookie}"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(on_other(m.cookie.clone()).await, 200);

    // Without the CSRF token nothing happens.
    let (st, v) = w
        .call_raw(
            Some(&m.cookie),
            None,
            reqwest::Method::POST,
            "/api/session/logout",
            None,
        )
        .await;
    assert_error(st, &v, 403, "csrf_failed");
    assert_eq!(w.session(&m.cookie).await.0, 200);

    let (st, _) = w
        .call(&m, reqwest::Method::POST, "/api/session/logout", None)
        .await;
    assert_eq!(st, 204);
    assert_eq!(w.session(&m.cookie).await.0, 401);
    // The other instance trusts what it looked up for at most a second.
    let deadline = Instant::now() + Duration::from_secs(10);
    while on_other(m.cookie.clone()).await != 401 {
        assert!(
            Instant::now() < deadline,
            "the other instance still takes the cookie"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Pages send a signed-out browser to sign in.
    let (st, _, h) = w.page(Some(&m), "/overview").await;
    assert_eq!((st, Web::location(&h).as_str()), (303, "/login"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_invited_by_a_member_or_added_by_an_operator_sign_in_to_the_org() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let alice = w.sign_up_and_in("alice@example.com").await;

    let (st, v) = w
        .call(
            &alice,
            reqwest::Method::POST,
            "/api/session/members",
            Some(json!({"email": "Bob@Example.com"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let bob_id = v["user_id"].as_str().unwrap().to_string();
    let invite = w.sink.next_to("bob@example.com").await;
    assert!(
        invite.text().contains("alice@example.com"),
        "{}",
        invite.text()
    );
    let cookie = w.sign_in_by_mail("bob@example.com", 0).await;
    let bob = w.member(&cookie, None).await;
    assert_eq!(
        (bob.org_id.as_str(), bob.user_id.as_str()),
        (alice.org_id.as_str(), bob_id.as_str())
    );

    // Without the token, or with a bad address: nothing.
    let (st, v) = w
        .call_raw(
            Some(&alice.cookie),
            None,
            reqwest::Method::POST,
            "/api/session/members",
            Some(json!({"email": "c@example.com"})),
        )
        .await;
    assert_error(st, &v, 403, "csrf_failed");
    let (st, v) = w
        .call(
            &alice,
            reqwest::Method::POST,
            "/api/session/members",
            Some(json!({"email": "nope"})),
        )
        .await;
    assert_error(st, &v, 400, "invalid_request");
    assert!(w.sink.mails_to("c@example.com").is_empty());

    // An operator adds a member, who signs in by mailed link.
    let r =
        w.s.http
            .post(format!("{}/admin/orgs/{}/members", w.s.ops, alice.org_id))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"email": "carol@example.com"}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let carol: Value = r.json().await.unwrap();
    let r = w
        .http
        .post(w.url("/login"))
        .form(&[("email", "carol@example.com")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let cookie = w.sign_in_by_mail("carol@example.com", 0).await;
    let c = w.member(&cookie, None).await;
    assert_eq!(c.org_id, alice.org_id);
    assert_eq!(json!(c.user_id), carol["user_id"]);

    // An operator's org (made with the CLI's API) gets members the same way.
    let (org, _) = w.s.org_with(json!({"name": "ops-made"})).await;
    let (st, v) =
        w.s.admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org}/members"),
            Some(json!({"email": "dave@example.com"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let (st, v) =
        w.s.admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org}/members"),
            Some(json!({"email": "??"})),
        )
        .await;
    assert_error(st, &v, 400, "invalid_request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_smtp_server_mails_are_eml_files_in_the_outbox() {
    let b = Backend::fresh().await;
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = harness::command(&b, &harness::Opts::default());
    cmd.current_dir(cwd.path())
        .env("SLUICE_SERVER__PUBLIC_WEB_URL", PUBLIC_WEB);
    let s = Sluice::spawn(cmd, &b.database_url).await;
    let r = s
        .http
        .post(format!("{}/api/signup/instant", s.web))
        .json(&json!({"email": "gina@example.com"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let outbox = cwd.path().join("data/outbox");
    let files: Vec<_> = std::fs::read_dir(&outbox)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0].extension().unwrap(), "eml");
    let eml = std::fs::read_to_string(&files[0]).unwrap();
    assert!(eml.contains("To: gina@example.com"), "{eml}");
    assert!(eml.contains("Content-Transfer-Encoding: 7bit"), "{eml}");
    let links: Vec<&str> = eml
        .split_whitespace()
        .filter(|w| w.starts_with("http://") || w.starts_with("https://"))
        .collect();
    assert_eq!(links.len(), 1, "{eml}");
    let path = links[0].strip_prefix(PUBLIC_WEB).unwrap();
    let r = harness::web::client()
        .get(format!("{}{path}", s.web))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert!(harness::web::set_session(r.headers()).is_some());
    // The outbox holds live sign-in links: the service's user alone reads it
    // (L9 of the 2026-12-01 security review).
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&outbox), 0o700);
        assert_eq!(mode(&files[0]), 0o600);
    }
    // A sign-in mail is handed over in the background (the answer takes as long
    // for an address with an account as for one without).
    let r = s
        .http
        .post(format!("{}/login", s.web))
        .form(&[("email", "gina@example.com")])
        .send()
        .await
        .unwrap();
    let page = r.text().await.unwrap();
    harness::wait_for("the sign-in mail in the outbox", async || {
        std::fs::read_dir(&outbox).unwrap().count() == 2
    })
    .await;
    // Public pages of a service others reach never name the folder.
    assert!(!page.contains(".eml"), "{page}");
    drop(s);
    // On a developer's own machine (a loopback public URL) the page tells a
    // newcomer where the mail went.
    let b = Backend::fresh().await;
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = harness::command(&b, &harness::Opts::default());
    cmd.current_dir(cwd.path());
    let s = Sluice::spawn(cmd, &b.database_url).await;
    let page = s
        .http
        .get(format!("{}/login", s.web))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!page.contains(".eml"), "only after a mail went out");
    let r = s
        .http
        .post(format!("{}/login", s.web))
        .form(&[("email", "nobody@example.com")])
        .send()
        .await
        .unwrap();
    assert!(r.text().await.unwrap().contains(".eml</code> file"));
}

/// The value of the first `name="csrf"` field of a page.
fn csrf_field(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    page[at..at + page[at..].find('"').unwrap()].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_goes_from_signup_to_a_first_answer_without_the_admin_cli() {
    // The README's path: the built-in catalog, no mail server (the outbox), no
    // credits, the bundled mock standing in for the local provider.
    let b = Backend::fresh().await;
    let mock = sluice_mock::Mock::start().await;
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = harness::command(&b, &harness::Opts::default());
    cmd.current_dir(cwd.path())
        .env("SLUICE_CATALOG__PATH", "")
        .env(
            "SLUICE_PROVIDERS__LOCAL__BASE_URL",
            format!("{}/v1", mock.base_url()),
        );
    let s = Sluice::spawn(cmd, &b.database_url).await;
    let http = harness::web::client();

    let r = http.get(format!("{}/signup", s.web)).send().await.unwrap();
    let form_cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let token = csrf_field(&r.text().await.unwrap());
    let r = http
        .post(format!("{}/signup", s.web))
        .header("cookie", &form_cookie)
        .form(&[("email", "newcomer@example.com"), ("csrf", &token)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let page = r.text().await.unwrap();
    let at = page.find("id=\"new-key\">").unwrap() + 13;
    let key = page[at..at + 44].to_string();
    assert!(key.starts_with("xpl_"), "{page}");

    let outbox = cwd.path().join("data/outbox");
    let eml = std::fs::read_dir(&outbox)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let eml = std::fs::read_to_string(eml).unwrap();
    let link = eml
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:8081/link/"))
        .expect("the link under the default public_web_url");
    let path = link.strip_prefix("http://127.0.0.1:8081").unwrap();
    let r = http.get(format!("{}{path}", s.web)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let cookie = harness::web::set_session(r.headers()).unwrap();

    let page = http
        .get(format!("{}/playground", s.web))
        .header("cookie", format!("sluice_session={cookie}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = csrf_field(&page);
    let r = http
        .post(format!("{}/playground", s.web))
        .header("cookie", format!("sluice_session={cookie}"))
        .form(&[
            ("csrf", csrf.as_str()),
            ("api_key", &key),
            ("model", "llama-3.2-3b"),
            ("message", "Hello"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let answer = r.text().await.unwrap();
    assert!(answer.contains("Hello from mock llama3.2:3b."), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_tls_the_session_cookie_is_secure_and_lasts_the_session_ttl() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| {
        o.env("SLUICE_WEB__COOKIE_SECURE", "true")
            .env("SLUICE_WEB__SESSION_TTL", "2h")
    })
    .await;
    let (st, _) = w.signup("hana@example.com").await;
    assert_eq!(st, 200);
    let mail = w.sink.next_to("hana@example.com").await;
    let (st, cookie, headers) = w.follow(&mail.single_link(), None).await;
    assert_eq!(st, 303);
    let line = session_cookie_line(&headers).unwrap();
    for attr in ["HttpOnly", "SameSite=Lax", "Secure", "Max-Age=7200"] {
        assert!(line.contains(attr), "{line}");
    }
    assert_eq!(w.session(&cookie.unwrap()).await.0, 200);
}

/// L2 of the 2026-12-01 security review: `POST /login` answers at once whether
/// or not the address has an account; the sign-in mail is handed over in the
/// background. Here the mail server never answers: a member's request still
/// comes back without waiting out the SMTP timeout (20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_request_never_waits_on_the_mail_server() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let smtp = format!("smtp://{}", silent.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            held.push(c);
        }
    });
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        harness::Opts::default().env("SLUICE_EMAIL__SMTP_URL", &smtp),
    )
    .await;
    let (org, _) = s.org_with(json!({"name": "quiet"})).await;
    let (st, v) = s
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org}/members"),
            Some(json!({"email": "member@example.com"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    for email in ["member@example.com", "stranger@example.com"] {
        let started = Instant::now();
        let r = s
            .http
            .post(format!("{}/login", s.web))
            .form(&[("email", email)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{email}: {:?}",
            started.elapsed()
        );
    }
}

/// L3 of the 2026-12-01 security review: a web app whose public URL is https
/// sets its cookies Secure (the session's and the signup form's) and answers
/// with HSTS, without `[web] cookie_secure`; on plain http neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_web_app_sets_its_cookies_secure_and_sends_hsts() {
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        harness::Opts::default().env("SLUICE_SERVER__PUBLIC_WEB_URL", "https://app.example.com"),
    )
    .await;
    let r = s
        .http
        .get(format!("{}/signup", s.web))
        .send()
        .await
        .unwrap();
    let hsts = r.headers().get("strict-transport-security").cloned();
    assert_eq!(hsts.unwrap(), "max-age=31536000");
    let form = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|c| c.starts_with("sluice_form="))
        .unwrap();
    assert!(form.contains("; Secure"), "{form}");
    drop(s);
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, harness::Opts::default()).await;
    let r = s
        .http
        .get(format!("{}/signup", s.web))
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("strict-transport-security").is_none());
    let form = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(!form.contains("Secure"), "{form}");
}

/// L7 of the 2026-12-01 security review: an owner removes a member, and the
/// member's sessions in the org and the keys they minted there end at once; a
/// member may leave; the last owner stays; a member cannot remove others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_member_loses_the_orgs_sessions_and_their_keys() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let alice = w.sign_up_and_in("alice@example.com").await;
    let (st, v) = w
        .call(
            &alice,
            reqwest::Method::POST,
            "/api/session/members",
            Some(json!({"email": "bob@example.com"})),
        )
        .await;
    assert_eq!(st, 201, "{v}");
    let bob_cookie = w.sign_in_by_mail("bob@example.com", 0).await;
    let bob = w.member(&bob_cookie, None).await;
    let (st, k) = w
        .call(
            &bob,
            reqwest::Method::POST,
            "/api/session/keys",
            Some(json!({"name": "bob's"})),
        )
        .await;
    assert_eq!(st, 201, "{k}");
    let bob_key = k["api_key"].as_str().unwrap().to_string();
    assert_eq!(w.s.get("/v1/models", Some(&bob_key)).await.0, 200);
    let del = |who: &str| format!("/api/session/members/{who}");
    // A member removes nobody else; the last owner cannot go.
    let (st, v) = w
        .call(&bob, reqwest::Method::DELETE, &del(&alice.user_id), None)
        .await;
    assert_error(st, &v, 403, "invalid_request");
    let (st, v) = w
        .call(&alice, reqwest::Method::DELETE, &del(&alice.user_id), None)
        .await;
    assert_error(st, &v, 400, "invalid_request");
    // The owner removes bob: his session and his key end at once.
    let (st, _) = w
        .call(&alice, reqwest::Method::DELETE, &del(&bob.user_id), None)
        .await;
    assert_eq!(st, 204);
    let (st, v) = w.session(&bob.cookie).await;
    assert_error(st, &v, 401, "session_required");
    let (st, v) = w.s.get("/v1/models", Some(&bob_key)).await;
    assert_error(st, &v, 401, "invalid_key");
    // Alice's own key and session are untouched; bob's next sign-in finds no org.
    assert_eq!(w.session(&alice.cookie).await.0, 200);
    let (st, v) = w
        .call(&alice, reqwest::Method::DELETE, &del(&bob.user_id), None)
        .await;
    assert_error(st, &v, 404, "not_found");
}
