//! Payments through a fake Stripe that speaks Stripe's API and signs its webhooks
//! the real way: Checkout Sessions created form-encoded, credits moved only by
//! webhook events whose signature checks out, each event applied once, refunds
//! and disputes taking credit back (from the ledger and the live balance), the
//! 1 USD card verification, and the operator's path kept.

mod harness;

use harness::web::{Member, Web};
use harness::{assert_error, Backend, Opts};
use reqwest::Method;
use serde_json::{json, Value};
use sluice_mock::stripe::{self, FakeStripe};

fn with_stripe(fake: &FakeStripe) -> impl FnOnce(Opts) -> Opts + '_ {
    move |o: Opts| {
        o.env("SLUICE_PAYMENTS__PROVIDER", "stripe")
            .env("SLUICE_PAYMENTS__API_BASE", fake.api_base())
            .env("STRIPE_SECRET_KEY", stripe::SECRET_KEY)
            .env("STRIPE_WEBHOOK_SECRET", stripe::WEBHOOK_SECRET)
    }
}

async fn deliver(w: &Web, body: &str, signature: &str) -> (u16, Value) {
    let r = w
        .http
        .post(w.url("/webhooks/stripe"))
        .header("content-type", "application/json")
        .header("stripe-signature", signature)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

async fn send_event(w: &Web, event: &Value) -> (u16, Value) {
    let (body, sig) = FakeStripe::signed(event);
    deliver(w, &body, &sig).await
}

async fn org(w: &Web, m: &Member) -> Value {
    w.s.admin(Method::GET, &format!("/admin/orgs/{}", m.org_id), None)
        .await
        .1
}

async fn checkout(w: &Web, m: &Member, body: Value) -> (u16, Value) {
    w.call(m, Method::POST, "/api/session/checkout", Some(body))
        .await
}

fn near(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_payment_provider_a_checkout_is_400_and_operators_add_credits() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let m = w.sign_up_and_in("alice@example.com").await;
    let (st, v) = checkout(&w, &m, json!({"kind": "verification"})).await;
    assert_error(st, &v, 400, "invalid_request");
    // No provider: no webhook route either.
    let (st, _) = deliver(&w, "{}", "t=1,v1=00").await;
    assert_eq!(st, 404);
    // The manual operator path stays.
    let (st, v) =
        w.s.admin(
            Method::POST,
            &format!("/admin/orgs/{}/credits", m.org_id),
            Some(json!({"amount_usd": 7, "kind": "purchase"})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(near(v["balance_usd"].as_f64().unwrap(), 12.0), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_purchase_credits_once_and_refunds_and_disputes_take_it_back() {
    let b = Backend::fresh().await;
    let fake = FakeStripe::start().await;
    let w = Web::start(&b, with_stripe(&fake)).await;
    let m = w.sign_up_and_in("alice@example.com").await;

    // The checkout: Stripe's API, form-encoded, with the secret key.
    let (st, v) = checkout(&w, &m, json!({"kind": "purchase", "amount_usd": 12.5})).await;
    assert_eq!(st, 200, "{v}");
    let sid = v["checkout_session_id"].as_str().unwrap().to_string();
    assert!(v["checkout_url"]
        .as_str()
        .unwrap()
        .starts_with(&format!("{}/c/pay/", fake.api_base())));
    let sent = fake.received();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].authorization.as_deref(),
        Some(format!("Bearer {}", stripe::SECRET_KEY).as_str())
    );
    assert!(sent[0]
        .content_type
        .as_deref()
        .unwrap()
        .starts_with("application/x-www-form-urlencoded"));
    let session = fake.session(&sid).unwrap();
    for (field, want) in [
        ("mode", "payment"),
        ("client_reference_id", m.org_id.as_str()),
        ("metadata[kind]", "purchase"),
        ("line_items[0][price_data][unit_amount]", "1250"),
        ("line_items[0][price_data][currency]", "usd"),
    ] {
        assert_eq!(session.field(field), Some(want), "{field}");
    }
    assert!(session
        .field("success_url")
        .unwrap()
        .starts_with(harness::web::PUBLIC_WEB));

    // Bad checkouts.
    for (body, param) in [
        (json!({"kind": "purchase", "amount_usd": 0.5}), "amount_usd"),
        (json!({"kind": "purchase"}), "amount_usd"),
        (json!({"kind": "gift"}), "kind"),
    ] {
        let (st, v) = checkout(&w, &m, body).await;
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    let (st, v) = w
        .call_raw(
            Some(&m.cookie),
            None,
            Method::POST,
            "/api/session/checkout",
            Some(json!({"kind": "verification"})),
        )
        .await;
    assert_error(st, &v, 403, "csrf_failed");

    let before = org(&w, &m).await;
    let start = before["balance_usd"].as_f64().unwrap();
    let tier = before["tier"].as_i64().unwrap();
    let paid = fake.completed_event(&sid);
    let (body, good) = FakeStripe::signed(&paid);

    // Signatures that do not check out change nothing.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for bad in [
        FakeStripe::signature(&body, t, "whsec_someone_else"),
        FakeStripe::signature(&body, t - 600, stripe::WEBHOOK_SECRET),
        FakeStripe::signature(&format!("{body} "), t, stripe::WEBHOOK_SECRET),
        "t=abc,v1=zz".to_string(),
    ] {
        let (st, v) = deliver(&w, &body, &bad).await;
        assert_eq!(st, 400, "{bad}: {v}");
    }
    let r = w
        .http
        .post(w.url("/webhooks/stripe"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400, "no signature at all");
    assert!(near(
        org(&w, &m).await["balance_usd"].as_f64().unwrap(),
        start
    ));

    // The real one: a purchase, once.
    let (st, v) = deliver(&w, &body, &good).await;
    assert_eq!((st, v["result"].clone()), (200, json!("applied")), "{v}");
    let after = org(&w, &m).await;
    assert!(
        near(after["balance_usd"].as_f64().unwrap(), start + 12.5),
        "{after}"
    );
    assert!(
        near(after["purchased_usd"].as_f64().unwrap(), 12.5),
        "{after}"
    );
    assert_eq!(
        after["tier"].as_i64().unwrap(),
        tier + 1,
        "a purchase of 5 USD or more moves the tier"
    );
    let (st, v) = send_event(&w, &paid).await;
    assert_eq!((st, v["result"].clone()), (200, json!("duplicate")), "{v}");
    assert!(near(
        org(&w, &m).await["balance_usd"].as_f64().unwrap(),
        start + 12.5
    ));

    // Refunds report the charge's refunded total; each takes back the rest of it.
    let pi = fake.session(&sid).unwrap().payment_intent;
    let partial = fake.refund_event(&pi, 1250, 500);
    assert_eq!(send_event(&w, &partial).await.0, 200);
    assert_eq!(
        send_event(&w, &partial).await.1["result"],
        json!("duplicate")
    );
    let o = org(&w, &m).await;
    assert!(near(o["balance_usd"].as_f64().unwrap(), start + 7.5), "{o}");
    assert!(near(o["purchased_usd"].as_f64().unwrap(), 7.5), "{o}");
    assert_eq!(
        send_event(&w, &fake.refund_event(&pi, 1250, 1250)).await.0,
        200
    );
    assert!(near(
        org(&w, &m).await["balance_usd"].as_f64().unwrap(),
        start
    ));
    // Nothing is left of the payment for a dispute to take.
    let (st, v) = send_event(&w, &fake.dispute_event(&pi, 1250)).await;
    assert_eq!((st, v["result"].clone()), (200, json!("ignored")));
    assert!(near(
        org(&w, &m).await["balance_usd"].as_f64().unwrap(),
        start
    ));
    // Events of other types, and of unknown payments, are answered and ignored.
    let (st, v) = send_event(&w, &fake.other_event("customer.created")).await;
    assert_eq!((st, v["result"].clone()), (200, json!("ignored")));
    let (st, v) = send_event(&w, &fake.refund_event("pi_unknown", 100, 100)).await;
    assert_eq!((st, v["result"].clone()), (200, json!("ignored")));

    // The billing page lists the payment.
    let (st, page, _) = w.page(Some(&m), "/billing").await;
    assert_eq!(st, 200);
    assert!(
        page.contains("refunded") && page.contains("$12.50"),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_card_verification_settles_once_and_credits_the_dollar_back() {
    let b = Backend::fresh().await;
    let fake = FakeStripe::start().await;
    let w = Web::start(&b, with_stripe(&fake)).await;
    let m = w.sign_up_and_in("alice@example.com").await;
    let (st, v) = w
        .call(
            &m,
            Method::PUT,
            "/api/session/settings",
            Some(json!({"credits_overflow": true})),
        )
        .await;
    assert_error(st, &v, 402, "verification_required");

    let (st, v) = checkout(&w, &m, json!({"kind": "verification"})).await;
    assert_eq!(st, 200, "{v}");
    let sid = v["checkout_session_id"].as_str().unwrap().to_string();
    let s = fake.session(&sid).unwrap();
    assert_eq!(
        s.field("line_items[0][price_data][unit_amount]"),
        Some("100")
    );
    assert_eq!(s.field("metadata[kind]"), Some("verification"));
    assert_eq!(s.field("customer_creation"), Some("always"));

    let start = org(&w, &m).await["balance_usd"].as_f64().unwrap();
    let (st, _) = send_event(&w, &fake.completed_event(&sid)).await;
    assert_eq!(st, 200);
    let o = org(&w, &m).await;
    assert_eq!(o["card_verified"], json!(true), "{o}");
    assert!(near(o["balance_usd"].as_f64().unwrap(), start + 1.0), "{o}");
    assert!(
        near(o["purchased_usd"].as_f64().unwrap(), 0.0),
        "the verification is no purchase"
    );

    // A second verification settles nothing more.
    let (_, v) = checkout(&w, &m, json!({"kind": "verification"})).await;
    let again = v["checkout_session_id"].as_str().unwrap().to_string();
    assert_eq!(send_event(&w, &fake.completed_event(&again)).await.0, 200);
    assert!(near(
        org(&w, &m).await["balance_usd"].as_f64().unwrap(),
        start + 1.0
    ));

    // Verified: overflow may be turned on, through the API of the key too.
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
    let (st, _) =
        w.s.post("/api/credits-overflow", m.api_key.as_deref(), &json!({}))
            .await;
    assert_eq!(st, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_pays_on_the_checkout_page_and_a_dispute_draws_the_live_balance() {
    let b = Backend::fresh().await;
    let fake = FakeStripe::start().await;
    // No signup credits here: the balance is the purchase alone.
    let w = Web::start(&b, |o| {
        with_stripe(&fake)(o).env("SLUICE_SIGNUP__CREDITS_USD", "0")
    })
    .await;
    fake.set_webhook(&w.url("/webhooks/stripe"));
    let m = w.sign_up_and_in("alice@example.com").await;
    let key = m.api_key.clone().unwrap();
    let (st, v) = w.chat(&key, "b-shared").await;
    assert_error(st, &v, 429, "insufficient_quota");

    // The billing form sends the browser to the checkout page; paying there fires
    // the webhook and brings the browser back.
    let (st, _, h) = w
        .form(
            &m,
            "/billing/checkout",
            &[("kind", "purchase"), ("amount_usd", "10")],
            true,
        )
        .await;
    assert_eq!(st, 303);
    let pay_url = Web::location(&h);
    assert!(pay_url.starts_with(&fake.api_base()), "{pay_url}");
    let r = w.http.post(&pay_url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let back = r.headers()["location"].to_str().unwrap().to_string();
    assert!(
        back.starts_with(&format!(
            "{}/billing?checkout=success",
            harness::web::PUBLIC_WEB
        )),
        "{back}"
    );
    assert!(near(
        org(&w, &m).await["balance_usd"].as_f64().unwrap(),
        10.0
    ));

    // Spending seeds the live balance; a dispute of the whole payment takes the
    // rest back from it, so the next call is refused for credits.
    let (st, v) = w.chat(&key, "b-shared").await;
    assert_eq!(st, 200, "{v}");
    let sid = fake.sessions()[0].id.clone();
    let pi = fake.session(&sid).unwrap().payment_intent;
    let (st, v) = send_event(&w, &fake.dispute_event(&pi, 1000)).await;
    assert_eq!((st, v["result"].clone()), (200, json!("applied")), "{v}");
    let (st, v) = w.chat(&key, "b-shared").await;
    assert_error(st, &v, 429, "insufficient_quota");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("insufficient_credits"),
        "{v}"
    );
    let (st, page, _) = w.page(Some(&m), "/billing").await;
    assert_eq!(st, 200);
    assert!(page.contains("disputed"), "{page}");
}

/// M5 of the 2026-12-01 security review: reversing a payment takes back what it
/// unlocked. A refunded purchase gives back its tier step and reopens the payment
/// review it lifted; a disputed verification takes the card on file, the settled
/// charge and credits overflow with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reversing_a_payment_takes_back_what_it_unlocked() {
    let b = Backend::fresh().await;
    let fake = FakeStripe::start().await;
    let w = Web::start(&b, with_stripe(&fake)).await;
    let m = w.sign_up_and_in("alice@example.com").await;
    let (st, _) =
        w.s.admin(
            Method::POST,
            &format!("/admin/orgs/{}/review", m.org_id),
            Some(json!({"under_review": true, "reason": "card payment failed"})),
        )
        .await;
    assert_eq!(st, 200);
    let tier = org(&w, &m).await["tier"].as_i64().unwrap();

    // A purchase: a tier step, the payment review lifted.
    let (_, v) = checkout(&w, &m, json!({"kind": "purchase", "amount_usd": 10})).await;
    let sid = v["checkout_session_id"].as_str().unwrap().to_string();
    assert_eq!(send_event(&w, &fake.completed_event(&sid)).await.0, 200);
    let o = org(&w, &m).await;
    assert_eq!(o["tier"].as_i64().unwrap(), tier + 1, "{o}");
    assert_eq!(o["under_review"], json!(false), "{o}");
    // Half refunded: 5 USD stay, still a step's worth.
    let pi = fake.session(&sid).unwrap().payment_intent;
    assert_eq!(
        send_event(&w, &fake.refund_event(&pi, 1000, 500)).await.0,
        200
    );
    let o = org(&w, &m).await;
    assert_eq!(o["tier"].as_i64().unwrap(), tier + 1, "{o}");
    // All of it: the step goes, the review is back; a second refund event of the
    // same charge changes nothing more.
    assert_eq!(
        send_event(&w, &fake.refund_event(&pi, 1000, 1000)).await.0,
        200
    );
    let o = org(&w, &m).await;
    assert_eq!(o["tier"].as_i64().unwrap(), tier, "{o}");
    assert_eq!(o["under_review"], json!(true), "{o}");
    assert_eq!(
        send_event(&w, &fake.refund_event(&pi, 1000, 1000)).await.0,
        200
    );
    assert_eq!(org(&w, &m).await["tier"].as_i64().unwrap(), tier);

    // The verification: card, settled charge, credits overflow; a dispute of it
    // takes all three back.
    w.s.admin(
        Method::POST,
        &format!("/admin/orgs/{}/review", m.org_id),
        Some(json!({"under_review": false})),
    )
    .await;
    let (_, v) = checkout(&w, &m, json!({"kind": "verification"})).await;
    let vid = v["checkout_session_id"].as_str().unwrap().to_string();
    assert_eq!(send_event(&w, &fake.completed_event(&vid)).await.0, 200);
    let (st, v) = w
        .call(
            &m,
            Method::PUT,
            "/api/session/settings",
            Some(json!({"credits_overflow": true})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let vpi = fake.session(&vid).unwrap().payment_intent;
    assert_eq!(send_event(&w, &fake.dispute_event(&vpi, 100)).await.0, 200);
    let o = org(&w, &m).await;
    assert_eq!(o["card_verified"], json!(false), "{o}");
    assert_eq!(o["settled"], json!(false), "{o}");
    assert_eq!(o["credits_overflow"], json!(false), "{o}");
    let (st, v) = w
        .call(
            &m,
            Method::PUT,
            "/api/session/settings",
            Some(json!({"credits_overflow": true})),
        )
        .await;
    assert_error(st, &v, 402, "verification_required");
}

/// L4 and I1 of the 2026-12-01 security review: a checkout's two "paid" events
/// delivered at once credit it once; a paid session in another currency is not
/// credited as cents of USD; an absurd signature timestamp is refused, not a
/// panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_is_credited_once_in_usd_whatever_the_deliveries() {
    let b = Backend::fresh().await;
    let fake = FakeStripe::start().await;
    let w = Web::start(&b, with_stripe(&fake)).await;
    let m = w.sign_up_and_in("alice@example.com").await;
    let start = org(&w, &m).await["balance_usd"].as_f64().unwrap();
    for round in 0..4 {
        let (_, v) = checkout(&w, &m, json!({"kind": "purchase", "amount_usd": 7})).await;
        let sid = v["checkout_session_id"].as_str().unwrap().to_string();
        let completed = fake.completed_event(&sid);
        let mut succeeded = completed.clone();
        succeeded["id"] = json!(format!("evt_async_{round}_{sid}"));
        succeeded["type"] = json!("checkout.session.async_payment_succeeded");
        let (a, b2) = tokio::join!(send_event(&w, &completed), send_event(&w, &succeeded));
        assert_eq!((a.0, b2.0), (200, 200), "{a:?} {b2:?}");
        let results = [a.1["result"].clone(), b2.1["result"].clone()];
        assert!(results.contains(&json!("applied")), "{results:?}");
        assert!(results.contains(&json!("ignored")), "{results:?}");
        let bal = org(&w, &m).await["balance_usd"].as_f64().unwrap();
        assert!(
            near(bal, start + 7.0 * (round + 1) as f64),
            "round {round}: {bal}"
        );
    }
    let before = org(&w, &m).await["balance_usd"].as_f64().unwrap();
    // A session made in the dashboard, in yen.
    let mut yen = fake.other_event("checkout.session.completed");
    yen["data"]["object"] = json!({"id": "cs_dashboard_yen", "object": "checkout.session",
        "amount_total": 5000, "currency": "jpy", "client_reference_id": m.org_id,
        "metadata": {"kind": "purchase"}, "payment_intent": "pi_yen", "payment_status": "paid"});
    let (st, v) = send_event(&w, &yen).await;
    assert_eq!((st, v["result"].clone()), (200, json!("ignored")), "{v}");
    assert!(near(
        org(&w, &m).await["balance_usd"].as_f64().unwrap(),
        before
    ));
    // t far in the past: refused, the handler still there.
    let body = fake.other_event("customer.created").to_string();
    let (st, _) = deliver(&w, &body, &format!("t={},v1=00", i64::MIN)).await;
    assert_eq!(st, 400);
    let (st, _) = deliver(&w, &body, &format!("t={},v1=00", i64::MAX)).await;
    assert_eq!(st, 400);
}
