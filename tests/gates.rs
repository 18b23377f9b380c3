//! The platform gates a client can run into before anything is sent: the credit
//! balance (shared by every instance), org tier windows, free allowances, payment
//! requirements, credits overflow, the platform's default key guardrails, and how
//! payments move tiers and lift payment reviews.

mod harness;

use harness::{assert_error, repo_path, wait_for, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use std::time::Duration;

fn opts(mock: &Mock) -> Opts {
    Opts::default()
        .catalog(repo_path("tests/fixtures/gates.toml"))
        .env(
            "SLUICE_PROVIDERS__OPENAI__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        .env("OPENAI_API_KEY", "sk-openai")
}

async fn chat(s: &Sluice, key: &str, model: &str, max_tokens: Option<u64>) -> (u16, Value) {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    if let Some(n) = max_tokens {
        body["max_tokens"] = json!(n);
    }
    s.post("/v1/chat/completions", Some(key), &body).await
}

/// Asserts a 429 `insufficient_quota` whose message starts with `prefix` and whose
/// `reason` is `reason`.
fn assert_quota(st: u16, v: &Value, prefix: &str, reason: &str) {
    assert_error(st, v, 429, "insufficient_quota");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with(&format!("{prefix}:")), "{v}");
    assert_eq!(v["error"]["reason"], reason, "{v}");
}

async fn admin_org(s: &Sluice, org: &str) -> Value {
    s.admin(reqwest::Method::GET, &format!("/admin/orgs/{org}"), None)
        .await
        .1
}

async fn admin_post(s: &Sluice, path: String, body: Value) -> Value {
    let (st, v) = s.admin(reqwest::Method::POST, &path, Some(body)).await;
    assert_eq!(st, 200, "{path}: {v}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balance_must_cover_the_worst_case_and_grants_reach_it_at_once() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org_id, key) = s
        .org_with(json!({"name": "thin", "email_verified": true, "credits_usd": 0.01, "tier": 3}))
        .await;
    // No max_tokens: 8,192 tokens at $5/M is $0.041 of worst case, past $0.01.
    let (st, v) = chat(&s, &key, "g-std", None).await;
    assert_quota(st, &v, "insufficient_credits", "insufficient_credits");
    assert_eq!(mock.count("o1"), 0, "nothing was sent");
    // A 100-token budget fits, and is billed its real cost only.
    let (st, v) = chat(&s, &key, "g-std", Some(100)).await;
    assert_eq!(st, 200, "{v}");
    assert!(v["usage"]["cost"].as_f64().unwrap() > 0.0);
    // A grant reaches the live balance on the next request.
    admin_post(
        &s,
        format!("/admin/orgs/{org_id}/credits"),
        json!({"amount_usd": 1}),
    )
    .await;
    let (st, v) = chat(&s, &key, "g-std", None).await;
    assert_eq!(st, 200, "{v}");
}

/// Sums the org's recorded costs (micro-USD) once `served` events are stored.
async fn recorded_costs(s: &Sluice, key: &str, served: usize) -> i64 {
    for _ in 0..100 {
        let mut total = 0;
        let mut ok = 0;
        let mut cursor = String::new();
        loop {
            let path = format!("/api/gateway/usage/events?limit=500{cursor}");
            let (st, v) = s.get(&path, Some(key)).await;
            assert_eq!(st, 200, "{v}");
            for e in v["data"].as_array().unwrap() {
                if e["status"] == 200 {
                    ok += 1;
                }
                total += (e["cost_usd"].as_f64().unwrap() * 1e6).round() as i64;
            }
            match v["next_cursor"].as_str() {
                Some(c) if v["has_more"] == true => cursor = format!("&cursor={c}"),
                _ => break,
            }
        }
        if ok == served {
            return total;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the usage events of {served} served requests never all arrived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_every_instance_never_overdraw_the_balance() {
    let mock = Mock::start().await;
    // Each answer is 2,000 characters (500 output tokens, $0.0025).
    mock.set_default("o1", Step::Text("x".repeat(2_000)));
    let b = Backend::fresh().await;
    let first = Sluice::start(&b, opts(&mock)).await;
    // With Redis the instances share one balance; without it, one instance serves.
    let second = match b.redis_url {
        Some(_) => Some(Sluice::start(&b, opts(&mock)).await),
        None => None,
    };
    let grant = 0.05;
    let (org_id, key) = first
        .org_with(
            json!({"name": "hammer", "email_verified": true, "credits_usd": grant, "tier": 3}),
        )
        .await;
    if let Some(second) = &second {
        second.wait_for_key(&key).await;
    }
    // A 600-token budget: about $0.003 of worst case per request, so roughly 17
    // requests fit in $0.05; send 60 at once.
    let worst_micro = 3_100;
    let mut tasks = Vec::new();
    for i in 0..60 {
        let target = match (&second, i % 2) {
            (Some(s2), 1) => s2.gateway.clone(),
            _ => first.gateway.clone(),
        };
        let http = first.http.clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let r = http
                .post(format!("{target}/v1/chat/completions"))
                .bearer_auth(&key)
                .json(&json!({"model": "g-std", "max_tokens": 600,
                    "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .unwrap();
            let st = r.status().as_u16();
            (st, r.json::<Value>().await.unwrap())
        }));
    }
    let mut served = 0;
    let mut refused = 0;
    for t in tasks {
        let (st, v) = t.await.unwrap();
        match st {
            200 => served += 1,
            _ => {
                assert_quota(st, &v, "insufficient_credits", "insufficient_credits");
                refused += 1;
            }
        }
    }
    assert!(
        served > 5 && refused > 5,
        "{served} served, {refused} refused"
    );
    let costs = recorded_costs(&first, &key, served).await;
    let balance = (first.balance_usd(&org_id).await * 1e6).round() as i64;
    assert!(balance >= -worst_micro, "overdrawn: {balance} micro-USD");
    assert_eq!(
        balance,
        (grant * 1e6) as i64 - costs,
        "the balance is the grant less what was recorded"
    );
    assert_eq!(
        mock.count("o1"),
        served as u64,
        "refused requests were not sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn org_tier_windows_count_platform_requests_and_tokens_across_keys() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let tiers = "[{requests_per_minute=2}, {tokens_per_minute=1000}, {tokens_per_hour=1000}, {tokens_per_day=1000}, {}]";
    let s = Sluice::start(&b, opts(&mock).env("SLUICE_BILLING__TIERS", tiers)).await;
    let (org_id, key) = s
        .org_with(json!({"name": "t0", "email_verified": true, "credits_usd": 5, "tier": 0}))
        .await;
    let (_, k2) = s
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org_id}/keys"),
            Some(json!({})),
        )
        .await;
    let key2 = k2["api_key"].as_str().unwrap().to_string();
    assert_eq!(chat(&s, &key, "g-std", Some(10)).await.0, 200);
    assert_eq!(chat(&s, &key2, "g-std", Some(10)).await.0, 200);
    // The third request of the minute, from either key, is over tier 0's two.
    let (st, v) = chat(&s, &key, "g-std", Some(10)).await;
    assert_quota(st, &v, "org_rate_limit", "org_rate_limit");
    // Another org is not affected.
    let (_, other) = s
        .org_with(json!({"name": "t0b", "email_verified": true, "credits_usd": 5, "tier": 0}))
        .await;
    assert_eq!(chat(&s, &other, "g-std", Some(10)).await.0, 200);
    // Token windows per minute, hour and day: a 2,000-token budget is past 1,000.
    for (tier, prefix) in [
        (1, "org_token_rate_limit"),
        (2, "org_token_rate_limit_hour"),
        (3, "org_token_rate_limit_day"),
    ] {
        admin_post(
            &s,
            format!("/admin/orgs/{org_id}/tier"),
            json!({"tier": tier}),
        )
        .await;
        let (st, v) = chat(&s, &key, "g-std", Some(2_000)).await;
        assert_quota(st, &v, prefix, prefix);
        if tier == 3 {
            assert!(v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("00:00 UTC"));
        }
        assert_eq!(
            chat(&s, &key2, "g-std", Some(10)).await.0,
            200,
            "tier {tier}"
        );
    }
    // The top tier is uncapped.
    admin_post(&s, format!("/admin/orgs/{org_id}/tier"), json!({"tier": 4})).await;
    assert_eq!(chat(&s, &key, "g-std", Some(2_000)).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_allowance_serves_free_then_refuses_or_overflows_to_credits() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    // g-free: 400 tokens an hour, card on file needed.
    let (_, no_card) = s
        .org_with(json!({"name": "nocard", "email_verified": true, "credits_usd": 5, "tier": 3}))
        .await;
    let (st, v) = chat(&s, &no_card, "g-free", Some(50)).await;
    assert_quota(st, &v, "free_tier_requires_payment", "card_required");
    assert!(v["error"]["message"].as_str().unwrap().contains("card"));

    let (org_id, key) = s
        .org_with(
            json!({"name": "card", "email_verified": true, "card_verified": true,
               "credits_usd": 5, "tier": 3}),
        )
        .await;
    let before = s.balance_usd(&org_id).await;
    let (st, v) = chat(&s, &key, "g-free", Some(50)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["cost"].as_f64(), Some(0.0), "{v}");
    // A budget the allowance cannot cover, overflow off.
    let (st, v) = chat(&s, &key, "g-free", Some(1_000)).await;
    assert_quota(st, &v, "free_limit_reached", "free_limit_reached");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("400 tokens per hour") && msg.contains("top of the hour"),
        "{msg}"
    );
    // With overflow on, credits pay for it.
    let (st, v) = s
        .post("/api/credits-overflow", Some(&key), &json!({}))
        .await;
    assert_eq!((st, &v["credits_overflow"]), (200, &json!(true)), "{v}");
    let (st, v) = chat(&s, &key, "g-free", Some(1_000)).await;
    assert_eq!(st, 200, "{v}");
    let cost = v["usage"]["cost"].as_f64().unwrap();
    assert!(cost > 0.0, "{v}");
    for _ in 0..50 {
        let now = s.balance_usd(&org_id).await;
        if (before - now - cost).abs() < 1e-9 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = s.balance_usd(&org_id).await;
    assert!(
        (before - now - cost).abs() < 1e-9,
        "only the overflow call was billed"
    );

    // Overflow on, but no credits to cover the rest: promo_byok_only.
    let (broke_id, broke) = s
        .org_with(
            json!({"name": "broke", "email_verified": true, "card_verified": true, "tier": 3}),
        )
        .await;
    let (st, _) = s
        .post("/api/credits-overflow", Some(&broke), &json!({}))
        .await;
    assert_eq!(st, 200);
    let (st, v) = chat(&s, &broke, "g-free", Some(1_000)).await;
    assert_quota(st, &v, "promo_byok_only", "promo_byok_only");
    assert_eq!(admin_org(&s, &broke_id).await["credits_overflow"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credits_overflow_needs_a_verified_org() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org_id, key) = s
        .org_with(json!({"name": "u", "email_verified": true}))
        .await;
    let (st, v) = s
        .post("/api/credits-overflow", Some(&key), &json!({}))
        .await;
    assert_error(st, &v, 402, "verification_required");
    admin_post(
        &s,
        format!("/admin/orgs/{org_id}/verification"),
        json!({"card_on_file": true, "settled": true}),
    )
    .await;
    let (st, v) = s
        .post("/api/credits-overflow", Some(&key), &json!({}))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(admin_org(&s, &org_id).await["credits_overflow"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_requirements_purchases_tiers_and_payment_reviews() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org_id, key) = s
        .org_with(json!({"name": "p", "email_verified": true, "credits_usd": 5, "tier": 0}))
        .await;
    let (st, v) = chat(&s, &key, "g-pay", Some(10)).await;
    assert_quota(st, &v, "model_requires_payment", "model_requires_payment");
    let (st, v) = chat(&s, &key, "g-buy", Some(10)).await;
    assert_quota(st, &v, "model_requires_purchase", "model_requires_purchase");
    // The settled 1 USD verification is a completed top-up, not a purchase.
    let o = admin_post(
        &s,
        format!("/admin/orgs/{org_id}/verification"),
        json!({"card_on_file": true, "settled": true}),
    )
    .await;
    assert_eq!(o["balance_usd"], 6.0, "the verification is credited back");
    assert_eq!(chat(&s, &key, "g-pay", Some(10)).await.0, 200);
    let (st, v) = chat(&s, &key, "g-buy", Some(10)).await;
    assert_quota(st, &v, "model_requires_purchase", "model_requires_purchase");
    // A purchase under 5 USD unlocks the model but keeps the tier; 5 USD or more
    // moves the org up one.
    admin_post(
        &s,
        format!("/admin/orgs/{org_id}/credits"),
        json!({"amount_usd": 2, "kind": "purchase"}),
    )
    .await;
    assert_eq!(admin_org(&s, &org_id).await["tier"], 0);
    assert_eq!(chat(&s, &key, "g-buy", Some(10)).await.0, 200);
    admin_post(
        &s,
        format!("/admin/orgs/{org_id}/credits"),
        json!({"amount_usd": 5, "kind": "purchase"}),
    )
    .await;
    assert_eq!(admin_org(&s, &org_id).await["tier"], 1);

    // A review for a payment reason is lifted by a settled payment; another is not.
    admin_post(
        &s,
        format!("/admin/orgs/{org_id}/review"),
        json!({"under_review": true, "reason": "Card payment failed."}),
    )
    .await;
    let (st, v) = chat(&s, &key, "g-std", Some(10)).await;
    assert_error(st, &v, 429, "org_under_review");
    admin_post(
        &s,
        format!("/admin/orgs/{org_id}/credits"),
        json!({"amount_usd": 1, "kind": "purchase"}),
    )
    .await;
    assert_eq!(admin_org(&s, &org_id).await["under_review"], false);
    assert_eq!(chat(&s, &key, "g-std", Some(10)).await.0, 200);
    admin_post(
        &s,
        format!("/admin/orgs/{org_id}/review"),
        json!({"under_review": true, "reason": "Unusual traffic."}),
    )
    .await;
    admin_post(
        &s,
        format!("/admin/orgs/{org_id}/credits"),
        json!({"amount_usd": 1, "kind": "purchase"}),
    )
    .await;
    assert_eq!(admin_org(&s, &org_id).await["under_review"], true);
    let (st, v) = chat(&s, &key, "g-std", Some(10)).await;
    assert_error(st, &v, 429, "org_under_review");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn platform_default_guardrails_apply_to_keys_that_set_none() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock).env("SLUICE_BILLING__KEY_DEFAULTS__RPM", 2)).await;
    let (org_id, key) = s
        .org_with(json!({"name": "d", "email_verified": true, "credits_usd": 5, "tier": 3}))
        .await;
    let (_, own) = s
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org_id}/keys"),
            Some(json!({"rpm": 5})),
        )
        .await;
    let own_key = own["api_key"].as_str().unwrap().to_string();
    for _ in 0..2 {
        assert_eq!(chat(&s, &key, "g-std", Some(10)).await.0, 200);
    }
    let (st, v) = chat(&s, &key, "g-std", Some(10)).await;
    assert_quota(st, &v, "key_rate_limit", "key_rate_limit");
    // A key with its own value keeps it.
    for _ in 0..3 {
        assert_eq!(chat(&s, &own_key, "g-std", Some(10)).await.0, 200);
    }
    // The limits read shows what is in force and where it came from.
    let (_, keys) = s.get("/api/keys", Some(&key)).await;
    let id = keys["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["limits"]["rpm"].is_null())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (st, v) = s
        .get(&format!("/api/gateway/keys/{id}/limits"), Some(&key))
        .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["requests_per_minute"], 2);
    assert_eq!(v["platform_defaults"]["requests_per_minute"], 2);
    assert_eq!(v["daily_spend_cap_usd"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_max_tokens_is_held_at_the_models_output_maximum() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org, _) = s
        .org_with(
            json!({"name": "huge", "email_verified": true, "card_verified": true,
                         "credits_usd": 5, "tier": 3}),
        )
        .await;
    // 10,000 tokens a minute: room for the model's 8,192-token output maximum
    // plus the prompt, not for anything larger.
    let (st, k) = s
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org}/keys"),
            Some(json!({"name": "tpm", "tpm": 10_000})),
        )
        .await;
    assert_eq!(st, 201, "{k}");
    let key = k["api_key"].as_str().unwrap().to_string();
    s.wait_for_key(&key).await;
    // u64::MAX output tokens: held at 8,192 (not wrapped to a tiny figure, not
    // refused as endless), so it fits the window and is served.
    let (st, v) = chat(&s, &key, "g-std", Some(u64::MAX)).await;
    assert_eq!(st, 200, "{v}");
    // On the free allowance (400 tokens an hour), the same budget is the model's
    // maximum, which the allowance cannot cover: refused, not served free.
    let (st, v) = chat(&s, &key, "g-free", Some(u64::MAX)).await;
    assert_quota(st, &v, "free_limit_reached", "free_limit_reached");
    let (st, v) = chat(&s, &key, "g-free", Some(u64::MAX - 1)).await;
    assert_quota(st, &v, "free_limit_reached", "free_limit_reached");
}

/// Runs statements on the test's database from outside the service.
async fn exec_sql(database_url: &str, statements: &[&str]) {
    use sqlx::Connection;
    if database_url.starts_with("postgres") {
        let mut c = sqlx::PgConnection::connect(database_url).await.unwrap();
        for s in statements {
            sqlx::query(s).execute(&mut c).await.unwrap();
        }
    } else {
        let mut c = sqlx::SqliteConnection::connect(database_url).await.unwrap();
        for s in statements {
            sqlx::query(s).execute(&mut c).await.unwrap();
        }
    }
}

/// Makes the database refuse usage rows (the rest of it keeps answering), or
/// take them again.
async fn refuse_usage_rows(b: &Backend, refuse: bool) {
    let pg = b.is_postgres();
    let statements: &[&str] = match (refuse, pg) {
        (true, true) => &[
            "CREATE OR REPLACE FUNCTION refuse_usage() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'usage refused'; END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER refuse_usage BEFORE INSERT ON usage_events FOR EACH ROW EXECUTE FUNCTION refuse_usage()",
        ],
        (true, false) => &[
            "CREATE TRIGGER refuse_usage BEFORE INSERT ON usage_events BEGIN SELECT RAISE(ABORT, 'usage refused'); END",
        ],
        (false, true) => &["DROP TRIGGER IF EXISTS refuse_usage ON usage_events"],
        (false, false) => &["DROP TRIGGER IF EXISTS refuse_usage"],
    };
    exec_sql(&b.database_url, statements).await;
}

/// The live balance the gate sees, in micro-USD: a request whose worst case no
/// balance here covers is refused with the available figure in its message.
async fn live_balance_micro(s: &Sluice, key: &str) -> i64 {
    let (st, v) = chat(s, key, "g-std", None).await;
    assert_quota(st, &v, "insufficient_credits", "insufficient_credits");
    let msg = v["error"]["message"].as_str().unwrap();
    let usd = msg
        .split_once("balance (")
        .and_then(|(_, rest)| rest.split_once(" USD available"))
        .map(|(n, _)| n.parse::<f64>().unwrap())
        .unwrap_or_else(|| panic!("{msg}"));
    (usd * 1e6).round() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_balances_and_free_allowances_where_the_ledger_says() {
    let mock = Mock::start().await;
    // 800 characters: 200 output tokens an answer.
    mock.set_default("o1", Step::Text("x".repeat(800)));
    let b = Backend::fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("usage-spool.jsonl");
    let o = opts(&mock).env("SLUICE_STORAGE__USAGE_SPOOL", spool.display());
    let s = Sluice::start(&b, o.clone()).await;
    let credits = 10_000; // 0.01 USD
    let (org, key) = s
        .org_with(
            json!({"name": "restart", "email_verified": true, "card_verified": true,
                         "credits_usd": 0.01, "tier": 3}),
        )
        .await;
    // g-free allows 400 tokens an hour: one 300-token budget fits, and once about
    // 210 are used, a second does not.
    let (st, v) = chat(&s, &key, "g-free", Some(300)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["cost"], 0.0, "{v}");
    let (st, v) = chat(&s, &key, "g-free", Some(300)).await;
    assert_quota(st, &v, "free_limit_reached", "free_limit_reached");
    wait_for("the free call is stored", async || {
        let (_, v) = s.get("/api/gateway/usage/events?limit=5", Some(&key)).await;
        v["data"].as_array().is_some_and(|d| d.len() == 1)
    })
    .await;

    // The database stops taking usage rows: a paid call's event is spooled.
    refuse_usage_rows(&b, true).await;
    let (st, v) = chat(&s, &key, "g-std", Some(300)).await;
    assert_eq!(st, 200, "{v}");
    let cost = (v["usage"]["cost"].as_f64().unwrap() * 1e6).round() as i64;
    assert!(cost > 1_000, "{v}");
    wait_for("the paid call is spooled", async || spool.exists()).await;
    assert_eq!(live_balance_micro(&s, &key).await, credits - cost);

    // Restart while the database still refuses usage rows: the ledger (rows and
    // spool) says the free hour is spent and the call was paid for. (Stopped as an
    // operator stops it: what it leased of the shared balance goes back.)
    s.stop();
    let s = Sluice::start(&b, o.clone()).await;
    let (st, v) = chat(&s, &key, "g-free", Some(300)).await;
    assert_quota(st, &v, "free_limit_reached", "free_limit_reached");
    assert_eq!(live_balance_micro(&s, &key).await, credits - cost);
    assert!(
        (s.balance_usd(&org).await - 0.01).abs() < 1e-9,
        "not stored yet"
    );

    // The database takes rows again: the spool goes in once, and the live
    // balance does not move.
    refuse_usage_rows(&b, false).await;
    let want = (credits - cost) as f64 / 1e6;
    wait_for("the spool is replayed", async || {
        (s.balance_usd(&org).await - want).abs() < 1e-9
    })
    .await;
    assert_eq!(live_balance_micro(&s, &key).await, credits - cost);

    // And once more, from a clean ledger.
    s.stop();
    let s = Sluice::start(&b, o).await;
    let (st, v) = chat(&s, &key, "g-free", Some(300)).await;
    assert_quota(st, &v, "free_limit_reached", "free_limit_reached");
    assert_eq!(live_balance_micro(&s, &key).await, credits - cost);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_balance_redis_lost_is_reseeded_from_the_ledger_not_a_snapshot() {
    let mock = Mock::start().await;
    mock.set_default("o1", Step::Text("x".repeat(800)));
    let b = Backend::fresh().await;
    let Some(redis_url) = b.redis_url.clone() else {
        eprintln!("SLUICE_TEST_REDIS_URL unset: this runs in the Redis pass");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("usage-spool.jsonl");
    let s = Sluice::start(
        &b,
        opts(&mock).env("SLUICE_STORAGE__USAGE_SPOOL", spool.display()),
    )
    .await;
    let credits = 10_000;
    let (org, key) = s
        .org_with(json!({"name": "lost", "email_verified": true, "credits_usd": 0.01, "tier": 3}))
        .await;
    // One paid call stored, one spooled.
    let mut spent = 0;
    for refuse in [false, true] {
        refuse_usage_rows(&b, refuse).await;
        let (st, v) = chat(&s, &key, "g-std", Some(300)).await;
        assert_eq!(st, 200, "{v}");
        spent += (v["usage"]["cost"].as_f64().unwrap() * 1e6).round() as i64;
        if !refuse {
            let want = (credits - spent) as f64 / 1e6;
            wait_for("the call is stored", async || {
                (s.balance_usd(&org).await - want).abs() < 1e-9
            })
            .await;
        }
    }
    wait_for("the second call is spooled", async || spool.exists()).await;
    assert_eq!(live_balance_micro(&s, &key).await, credits - spent);

    // Redis loses the balance and its mark.
    let client = redis::Client::open(redis_url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let bal = format!("sluice:bal:{org}");
    let _: () = redis::cmd("DEL")
        .arg(&bal)
        .arg(format!("{bal}:credited"))
        .query_async(&mut conn)
        .await
        .unwrap();
    // Reseeded: the database (one call charged) less the spooled call.
    assert_eq!(live_balance_micro(&s, &key).await, credits - spent);
    refuse_usage_rows(&b, false).await;
    let want = (credits - spent) as f64 / 1e6;
    wait_for("the spool is replayed", async || {
        (s.balance_usd(&org).await - want).abs() < 1e-9
    })
    .await;
    assert_eq!(live_balance_micro(&s, &key).await, credits - spent);
}
