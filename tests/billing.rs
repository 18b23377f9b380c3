//! Money on every answer: `usage.cost` is the catalog price of the reported tokens
//! (cached input at the cached rate), in every format and on embeddings; a served
//! call draws exactly that from the org's balance, once; failed and empty attempts
//! cost nothing.

mod harness;

use harness::{repo_path, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use std::time::Duration;

/// The formats fixture's price: $1 in, $0.10 cached, $5 out per million tokens.
fn expected_cost(input: u64, cached: u64, output: u64) -> f64 {
    let micro = ((input - cached) * 1_000_000 + cached * 100_000 + output * 5_000_000 + 500_000)
        / 1_000_000;
    micro as f64 / 1e6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_its_cost_and_the_balance_pays_it_exactly_once() {
    let mock = Mock::start().await;
    let base = mock.base_url();
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        Opts::default()
            .catalog(repo_path("tests/fixtures/formats.toml"))
            .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
            .env("SLUICE_PROVIDERS__ANTHROPIC__BASE_URL", &base)
            .env("OPENAI_API_KEY", "sk-openai")
            .env("ANTHROPIC_API_KEY", "sk-ant"),
    )
    .await;
    let (org, _, key) = s.org_and_key().await;
    let start = s.balance_usd(&org).await;
    let mut spent = 0.0;
    let post = |path: &'static str, body: Value| {
        let req = s
            .http
            .post(format!("{}{path}", s.gateway))
            .bearer_auth(&key)
            .json(&body);
        async move {
            let r = req.send().await.unwrap();
            let st = r.status().as_u16();
            (st, r.text().await.unwrap())
        }
    };

    // Chat, native (OpenAI wire, the upstream's usage object priced in place).
    let (st, text) = post(
        "/v1/chat/completions",
        json!({"model": "fmt-gpt", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(st, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let u = &v["usage"];
    let cost = expected_cost(
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert!(cost > 0.0);
    assert_eq!(u["cost"].as_f64().unwrap(), cost, "{u}");
    spent += cost;

    // Chat stream with usage asked for: the usage chunk carries the cost.
    let (_, text) = post("/v1/chat/completions", json!({"model": "fmt-gpt", "stream": true,
        "stream_options": {"include_usage": true}, "messages": [{"role": "user", "content": "hi"}]})).await;
    let usage_chunk: Value = text
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .find(|c| c["usage"].is_object())
        .expect("a usage chunk");
    let u = &usage_chunk["usage"];
    let cost = expected_cost(
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert_eq!(u["cost"].as_f64().unwrap(), cost, "{u}");
    spent += cost;

    // Messages on Anthropic: its input_tokens exclude cache reads.
    let (_, text) = post(
        "/v1/messages",
        json!({"model": "fmt-claude", "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    let v: Value = serde_json::from_str(&text).unwrap();
    let u = &v["usage"];
    let cached = u["cache_read_input_tokens"].as_u64().unwrap_or(0);
    let cost = expected_cost(
        u["input_tokens"].as_u64().unwrap() + cached,
        cached,
        u["output_tokens"].as_u64().unwrap(),
    );
    assert_eq!(u["cost"].as_f64().unwrap(), cost, "{u}");
    spent += cost;

    // Responses on Anthropic (translated).
    let (_, text) = post(
        "/v1/responses",
        json!({"model": "fmt-claude", "input": "hi"}),
    )
    .await;
    let v: Value = serde_json::from_str(&text).unwrap();
    let u = &v["usage"];
    let cost = expected_cost(
        u["input_tokens"].as_u64().unwrap(),
        u["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        u["output_tokens"].as_u64().unwrap(),
    );
    assert_eq!(u["cost"].as_f64().unwrap(), cost, "{u}");
    spent += cost;

    // A failed request and an empty completion cost nothing.
    mock.script("o1", vec![Step::Status(500)]);
    let (st, _) = post(
        "/v1/chat/completions",
        json!({"model": "fmt-gpt", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(st, 502);
    mock.script("o1", vec![Step::Empty]);
    let (st, text) = post(
        "/v1/chat/completions",
        json!({"model": "fmt-gpt", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["usage"]["cost"].as_f64(), Some(0.0), "{v}");

    // The balance drops by exactly what the answers said, once (the usage writer
    // settles every 50 ms).
    let want = ((start - spent) * 1e6).round() / 1e6;
    let mut now = 0.0;
    for _ in 0..50 {
        now = s.balance_usd(&org).await;
        if (now - want).abs() < 1e-9 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        (now - want).abs() < 1e-9,
        "balance {now}, want {want} (start {start}, spent {spent})"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        (s.balance_usd(&org).await - want).abs() < 1e-9,
        "charged twice"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_org_reads_back_its_usage_and_nobody_elses() {
    let mock = Mock::start().await;
    let base = mock.base_url();
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        Opts::default()
            .catalog(repo_path("tests/fixtures/formats.toml"))
            .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
            .env("OPENAI_API_KEY", "sk-openai"),
    )
    .await;
    let (org, key_id, key) = s.org_and_key().await;
    let (other_org, other_key_id, other_key) = s.org_and_key().await;
    let mut costs = 0.0;
    for i in 0..5 {
        let model = if i % 2 == 0 { "fmt-gpt" } else { "fmt-nojson" };
        let (st, v) = s
            .post(
                "/v1/chat/completions",
                Some(&key),
                &json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        costs += v["usage"]["cost"].as_f64().unwrap();
    }
    s.post(
        "/v1/chat/completions",
        Some(&other_key),
        &json!({"model": "fmt-gpt", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    // Events land within the writer's interval: wait for all five.
    for _ in 0..50 {
        let all = s
            .get("/api/gateway/usage/events?limit=10", Some(&key))
            .await
            .1;
        if all["data"].as_array().is_some_and(|d| d.len() == 5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let events = s
        .get("/api/gateway/usage/events?limit=2", Some(&key))
        .await
        .1;
    // Cursor pagination, newest first, every event of this org and only those.
    let mut seen = Vec::new();
    let mut page = events;
    loop {
        for e in page["data"].as_array().unwrap() {
            assert_eq!(e["api_key_id"], key_id.as_str());
            seen.push((
                e["id"].as_str().unwrap().to_string(),
                e["cost_usd"].as_f64().unwrap(),
            ));
        }
        match page["next_cursor"].as_str() {
            Some(c) => {
                page = s
                    .get(
                        &format!("/api/gateway/usage/events?limit=2&cursor={c}"),
                        Some(&key),
                    )
                    .await
                    .1
            }
            None => break,
        }
    }
    assert_eq!(seen.len(), 5);
    assert!(seen.windows(2).all(|w| w[0].0 > w[1].0), "newest first");
    let total: f64 = seen.iter().map(|(_, c)| c).sum();
    assert!((total - costs).abs() < 1e-9);
    // Daily rollups by day, model and member.
    let (st, by_model) = s
        .get("/api/gateway/usage/daily?group_by=model", Some(&key))
        .await;
    assert_eq!(st, 200, "{by_model}");
    let rows = by_model["data"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows.iter()
            .map(|r| r["requests"].as_i64().unwrap())
            .sum::<i64>(),
        5
    );
    let (_, by_day) = s.get("/api/gateway/usage/daily", Some(&key)).await;
    assert_eq!(by_day["data"][0]["requests"], 5);
    assert!(by_day["data"][0]["day"].as_str().unwrap().starts_with("20"));
    let (_, by_member) = s
        .get("/api/gateway/usage/daily?group_by=member", Some(&key))
        .await;
    assert_eq!(by_member["data"][0]["member"], key_id.as_str());
    // Another org's id is 404; scope=self needs a session.
    let (st, v) = s
        .get(
            &format!("/api/gateway/usage/events?org_id={other_org}"),
            Some(&key),
        )
        .await;
    harness::assert_error(st, &v, 404, "not_found");
    let (st, v) = s
        .get(
            &format!("/api/gateway/usage/daily?org_id={org}&scope=self"),
            Some(&key),
        )
        .await;
    harness::assert_error(st, &v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], "scope");
    // Key limits: own key readable, another org's key 404.
    let (st, v) = s
        .get(&format!("/api/gateway/keys/{key_id}/limits"), Some(&key))
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(v["daily_spend_cap_usd"].is_null() && v["requests_per_minute"].is_null());
    let (st, v) = s
        .get(
            &format!("/api/gateway/keys/{other_key_id}/limits"),
            Some(&key),
        )
        .await;
    harness::assert_error(st, &v, 404, "not_found");
    // The catalog as the org resolves it, with lanes.
    let (st, v) = s.get("/api/gateway/catalog", Some(&key)).await;
    assert_eq!(st, 200, "{v}");
    let gpt = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["alias"] == "fmt-gpt")
        .unwrap();
    assert_eq!(gpt["lane"], "platform_funded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_daily_cap_refuses_a_worst_case_that_would_pass_it() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        Opts::default()
            .catalog(repo_path("tests/fixtures/formats.toml"))
            .env(
                "SLUICE_PROVIDERS__OPENAI__BASE_URL",
                format!("{}/v1", mock.base_url()),
            )
            .env("OPENAI_API_KEY", "sk-openai"),
    )
    .await;
    let (org, _, _) = s.org_and_key().await;
    let (st, k) = s
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org}/keys"),
            Some(json!({"name": "capped", "daily_spend_cap_usd": 0.0012})),
        )
        .await;
    assert_eq!(st, 201, "{k}");
    let key = k["api_key"].as_str().unwrap().to_string();
    // No max_tokens: the worst case is the model's whole output budget (8,192
    // tokens at $5/M = $0.041), past the $0.0012 cap.
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            Some(&key),
            &json!({"model": "fmt-gpt", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    harness::assert_error(st, &v, 429, "insufficient_quota");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("key_daily_cap"),
        "{v}"
    );
    assert_eq!(v["error"]["reason"], "key_daily_cap");
    assert_eq!(mock.count("o1"), 0, "nothing was sent");
    // A 200-token budget ($0.001 worst case) fits; each answer costs far less, and
    // the hold is corrected to the real cost, so three in a row all fit.
    for i in 0..3 {
        let (st, v) = s
            .post(
                "/v1/chat/completions",
                Some(&key),
                &json!({"model": "fmt-gpt", "max_tokens": 200,
                "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(st, 200, "request {i}: {v}");
    }
    assert_eq!(mock.count("o1"), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_org_under_review_is_refused_on_every_route_until_released() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        Opts::default()
            .catalog(repo_path("tests/fixtures/formats.toml"))
            .env(
                "SLUICE_PROVIDERS__OPENAI__BASE_URL",
                format!("{}/v1", mock.base_url()),
            )
            .env("OPENAI_API_KEY", "sk-openai"),
    )
    .await;
    let (org, _, key) = s.org_and_key().await;
    let chat = json!({"model": "fmt-gpt", "messages": [{"role": "user", "content": "hi"}]});
    let (st, _) = s
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org}/review"),
            Some(json!({"under_review": true, "reason": "Unusual traffic: 5231 requests in 3 minutes. We will reach out."})),
        )
        .await;
    assert_eq!(st, 200);
    let mut refused = Value::Null;
    for _ in 0..40 {
        let (st, v) = s.post("/v1/chat/completions", Some(&key), &chat).await;
        if st == 429 {
            refused = v;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refused["error"]["code"], "org_under_review", "{refused}");
    let msg = refused["error"]["message"].as_str().unwrap();
    assert!(!msg.chars().any(|c| c.is_ascii_digit()), "no counts: {msg}");
    assert_eq!(msg.matches('.').count(), 1, "one sentence: {msg}");
    let (st, v) = s
        .post(
            "/v1/embeddings",
            Some(&key),
            &json!({"model": "fmt-gpt", "input": "x"}),
        )
        .await;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (429, Some("org_under_review"))
    );
    let before = mock.count("o1");
    s.admin(
        reqwest::Method::POST,
        &format!("/admin/orgs/{org}/review"),
        Some(json!({"under_review": false})),
    )
    .await;
    let mut ok = false;
    for _ in 0..40 {
        if s.post("/v1/chat/completions", Some(&key), &chat).await.0 == 200 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "released");
    assert_eq!(mock.count("o1"), before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unverified_email_refuses_credit_drawing_calls() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        Opts::default()
            .catalog(repo_path("tests/fixtures/formats.toml"))
            .env(
                "SLUICE_PROVIDERS__OPENAI__BASE_URL",
                format!("{}/v1", mock.base_url()),
            )
            .env("OPENAI_API_KEY", "sk-openai"),
    )
    .await;
    let (st, org) = s
        .admin(
            reqwest::Method::POST,
            "/admin/orgs",
            Some(json!({"name": "new", "email": "new@acme.test", "credits_usd": 5})),
        )
        .await;
    assert_eq!(st, 201);
    let org_id = org["org_id"].as_str().unwrap();
    let (_, k) = s
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org_id}/keys"),
            Some(json!({})),
        )
        .await;
    let key = k["api_key"].as_str().unwrap();
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            Some(key),
            &json!({"model": "fmt-gpt", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    harness::assert_error(st, &v, 429, "insufficient_quota");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("email_unverified"),
        "{v}"
    );
    assert_eq!(v["error"]["reason"], "email_unverified");
    assert_eq!(mock.count("o1"), 0);
    // Catalog reads still work.
    assert_eq!(s.get("/v1/models", Some(key)).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_request_and_token_rates_are_guarded_per_minute() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        Opts::default()
            .catalog(repo_path("tests/fixtures/formats.toml"))
            .env(
                "SLUICE_PROVIDERS__OPENAI__BASE_URL",
                format!("{}/v1", mock.base_url()),
            )
            .env("OPENAI_API_KEY", "sk-openai"),
    )
    .await;
    let (org, _, _) = s.org_and_key().await;
    let key = |body: Value| {
        let s = &s;
        let org = org.clone();
        async move {
            let (_, k) = s
                .admin(
                    reqwest::Method::POST,
                    &format!("/admin/orgs/{org}/keys"),
                    Some(body),
                )
                .await;
            k["api_key"].as_str().unwrap().to_string()
        }
    };
    let rpm_key = key(json!({"name": "rpm", "rpm": 2})).await;
    let tpm_key = key(json!({"name": "tpm", "tpm": 400})).await;
    // Stay clear of a minute boundary.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if secs % 60 > 55 {
        tokio::time::sleep(Duration::from_secs(61 - secs % 60)).await;
    }
    let chat = |max: u64| json!({"model": "fmt-gpt", "max_tokens": max, "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..2 {
        assert_eq!(
            s.post("/v1/chat/completions", Some(&rpm_key), &chat(50))
                .await
                .0,
            200
        );
    }
    let (st, v) = s
        .post("/v1/chat/completions", Some(&rpm_key), &chat(50))
        .await;
    harness::assert_error(st, &v, 429, "insufficient_quota");
    assert_eq!(v["error"]["reason"], "key_rate_limit", "{v}");
    // A 1,000-token budget cannot fit 400 tokens a minute; 100-token budgets do,
    // repeatedly, because each hold is corrected to the tokens really used.
    let (st, v) = s
        .post("/v1/chat/completions", Some(&tpm_key), &chat(1000))
        .await;
    harness::assert_error(st, &v, 429, "insufficient_quota");
    assert_eq!(v["error"]["reason"], "key_token_rate_limit", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("key_token_rate_limit"));
    for i in 0..4 {
        let (st, v) = s
            .post("/v1/chat/completions", Some(&tpm_key), &chat(100))
            .await;
        assert_eq!(st, 200, "request {i}: {v}");
    }
}

/// The formats fixture's Claude price with cache writes at $1.25 per million.
fn expected_cost_with_writes(fresh: u64, read: u64, written: u64, output: u64) -> u64 {
    (fresh * 1_000_000 + read * 100_000 + written * 1_250_000 + output * 5_000_000 + 500_000)
        / 1_000_000
}

/// The usage event of this org, once the writer stored `n` of them.
async fn events(s: &Sluice, key: &str, n: usize) -> Vec<Value> {
    for _ in 0..50 {
        let v = s
            .get("/api/gateway/usage/events?limit=20", Some(key))
            .await
            .1;
        if let Some(d) = v["data"].as_array().filter(|d| d.len() >= n) {
            return d.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{n} usage events never arrived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_cache_writes_are_billed_at_the_write_price() {
    let mock = Mock::start().await;
    let base = mock.base_url();
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        Opts::default()
            .catalog(repo_path("tests/fixtures/formats.toml"))
            .env("SLUICE_PROVIDERS__ANTHROPIC__BASE_URL", &base)
            .env("ANTHROPIC_API_KEY", "sk-ant")
            .env("SLUICE_PROVIDERS__BEDROCK__BASE_URL", &base)
            .env("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
            .env(
                "AWS_SECRET_ACCESS_KEY",
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            ),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    let system = json!([{"type": "text", "text": "A long shared preamble worth caching.",
        "cache_control": {"type": "ephemeral"}}]);

    // The model rows show the write price.
    let (_, models) = s.get("/v1/models", Some(&key)).await;
    let claude = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "fmt-claude")
        .unwrap()
        .clone();
    assert_eq!(
        claude["pricing"]["cache_write_input_micro_usd_per_million"],
        1_250_000
    );

    // Messages on Anthropic (native): the provider's cache creation is priced
    // at the write rate, not as fresh input.
    let (st, v) = s
        .post(
            "/v1/messages",
            Some(&key),
            &json!({"model": "fmt-claude", "max_tokens": 64, "system": system,
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let u = &v["usage"];
    let written = u["cache_creation_input_tokens"].as_u64().unwrap();
    assert!(written > 0, "{u}");
    let fresh = u["input_tokens"].as_u64().unwrap();
    let out = u["output_tokens"].as_u64().unwrap();
    let native_cost = expected_cost_with_writes(fresh, 0, written, out);
    assert_ne!(
        native_cost,
        expected_cost_with_writes(fresh + written, 0, 0, out),
        "the test must tell the write price from the input price"
    );
    assert_eq!(u["cost"].as_f64().unwrap(), native_cost as f64 / 1e6, "{u}");

    // Messages on Bedrock (translated): cache_control becomes a cachePoint, the
    // provider's cacheWriteInputTokens come back as cache_creation_input_tokens.
    let (st, v) = s
        .post(
            "/v1/messages",
            Some(&key),
            &json!({"model": "fmt-bedrock", "max_tokens": 64, "system": system,
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let u = &v["usage"];
    let b_written = u["cache_creation_input_tokens"].as_u64().unwrap();
    assert!(b_written > 0, "{u}");
    let b_cost = expected_cost_with_writes(
        u["input_tokens"].as_u64().unwrap(),
        u["cache_read_input_tokens"].as_u64().unwrap(),
        b_written,
        u["output_tokens"].as_u64().unwrap(),
    );
    assert_eq!(u["cost"].as_f64().unwrap(), b_cost as f64 / 1e6, "{u}");

    // A native stream is billed from its message_start usage the same way.
    let r = s
        .http
        .post(format!("{}/v1/messages", s.gateway))
        .bearer_auth(&key)
        .json(
            &json!({"model": "fmt-claude", "max_tokens": 64, "stream": true,
            "system": system, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("\"cache_creation_input_tokens\":"), "{text}");

    // The ledger: cache writes recorded, part of the input, cost as answered.
    let evs = events(&s, &key, 3).await;
    let bedrock = evs
        .iter()
        .find(|e| e["model"] == "fmt-bedrock")
        .expect("the bedrock event");
    assert_eq!(bedrock["cache_write_tokens"], b_written);
    assert_eq!(bedrock["cost_usd"].as_f64().unwrap(), b_cost as f64 / 1e6);
    let claude: Vec<&Value> = evs.iter().filter(|e| e["model"] == "fmt-claude").collect();
    assert_eq!(claude.len(), 2, "{evs:?}");
    for e in &claude {
        let w = e["cache_write_tokens"].as_u64().unwrap();
        assert!(w > 0, "{e}");
        let input = e["input_tokens"].as_u64().unwrap();
        let out = e["output_tokens"].as_u64().unwrap();
        let cost = expected_cost_with_writes(input - w, 0, w, out);
        assert_eq!(e["cost_usd"].as_f64().unwrap(), cost as f64 / 1e6, "{e}");
    }
    assert!(
        claude.iter().any(|e| e["cache_write_tokens"] == written
            && e["input_tokens"] == fresh + written
            && e["cost_usd"].as_f64() == Some(native_cost as f64 / 1e6)),
        "{claude:?}"
    );
}
