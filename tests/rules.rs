//! Rules a client can see that had no test of their own (issue 54, item 10): the
//! 00:00 UTC start of a key's daily cap, BYOK traffic outside the org's tier
//! windows, each free allowance window with its limit and reset, the empty
//! completion of a stream whose header already went out, several dropped fields in
//! one disclosure, Idempotency-Key not honoured on embeddings, an org's own cloud
//! deployments for embeddings, and the platform's `hosted` collection.
//!
//! Time is not moved: nothing in the service reads a clock a test can set. The UTC
//! boundaries are seen where the service itself reads them from stored times: an
//! instance on in-process counters starts with today's key spend and the open free
//! allowance windows rebuilt from the usage ledger, so a usage row dated just before
//! or at a boundary tells which side of it the service counts.

mod harness;

use harness::{assert_error, repo_path, sql_rows, wait_for, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use std::time::Duration;

const PLATFORM_OPENAI: &str = "sk-platform-openai";
const PLATFORM_HOSTED: &str = "hk-platform-hosted";
const DAY_MS: i64 = 86_400_000;
const HOUR_MS: i64 = 3_600_000;

fn opts(mock: &Mock) -> Opts {
    let base = mock.base_url();
    Opts::default()
        .catalog(repo_path("tests/fixtures/rules.toml"))
        .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
        .env("SLUICE_PROVIDERS__MISTRAL__BASE_URL", format!("{base}/v1"))
        .env("SLUICE_PROVIDERS__AZURE__BASE_URL", &base)
        .env("SLUICE_PROVIDERS__ANTHROPIC__BASE_URL", &base)
        .env("SLUICE_PROVIDERS__HOSTED__BASE_URL", format!("{base}/v1"))
        .env("OPENAI_API_KEY", PLATFORM_OPENAI)
        .env("MISTRAL_API_KEY", "sk-platform-mistral")
        .env("AZURE_OPENAI_API_KEY", "az-platform")
        .env("ANTHROPIC_API_KEY", "sk-ant-platform")
        .env("HOSTED_API_KEY", PLATFORM_HOSTED)
        // The org's own accounts point at the mock on loopback.
        .env("SLUICE_NETWORK__ALLOW_PRIVATE_UPSTREAMS", "true")
}

async fn chat(s: &Sluice, key: &str, model: &str, max_tokens: u64, content: &str) -> (u16, Value) {
    s.post(
        "/v1/chat/completions",
        Some(key),
        &json!({"model": model, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": content}]}),
    )
    .await
}

/// Asserts a 429 `insufficient_quota` whose message starts with `prefix` and
/// whose `reason` is the same; returns the message.
#[track_caller]
fn assert_quota(st: u16, v: &Value, prefix: &str) -> String {
    assert_error(st, v, 429, "insufficient_quota");
    let msg = v["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.starts_with(&format!("{prefix}:")), "{v}");
    assert_eq!(v["error"]["reason"], prefix, "{v}");
    msg
}

/// A new org with credits (and its card verified) at `tier`; returns (org, key).
async fn org(s: &Sluice, name: &str, tier: i64) -> (String, String) {
    s.org_with(
        json!({"name": name, "email_verified": true, "card_verified": true,
                      "credits_usd": 5, "tier": tier}),
    )
    .await
}

async fn api(
    s: &Sluice,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Value,
) -> (u16, Value) {
    let r = s
        .http
        .request(method, format!("{}{path}", s.gateway))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

/// Connects one of the org's own accounts; returns its rung id (`byok:<id>`).
async fn connect(
    s: &Sluice,
    org: &str,
    key: &str,
    provider: &str,
    alias: &str,
    secret: &str,
    config: Value,
) -> String {
    let (st, v) = api(
        s,
        reqwest::Method::POST,
        &format!("/api/orgs/{org}/provider-connections/{provider}"),
        key,
        json!({"setup_alias": alias, "secret": secret, "config": config}),
    )
    .await;
    assert_eq!(st, 201, "{v}");
    format!("byok:{}", v["id"].as_str().unwrap())
}

async fn set_chain(s: &Sluice, key: &str, model: &str, chain: Value) {
    let (st, v) = api(
        s,
        reqwest::Method::PUT,
        &format!("/api/models/{model}/waterfall"),
        key,
        json!({"model_provider_ids": chain}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
}

/// Runs statements on the test's database from outside the service.
async fn exec_sql(database_url: &str, statements: &[String]) {
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

/// Waits until the org has `n` usage rows stored with status 200.
async fn served_rows(b: &Backend, org: &str, n: usize) {
    let q = format!("SELECT id FROM usage_events WHERE org_id = '{org}' AND status = 200");
    wait_for(&format!("{n} served usage rows of {org}"), async || {
        sql_rows(&b.database_url, &q).await.len() >= n
    })
    .await;
}

/// Dates every usage row of the org at `at_ms` (Unix milliseconds).
async fn date_usage(b: &Backend, org: &str, at_ms: i64) {
    exec_sql(
        &b.database_url,
        &[format!(
            "UPDATE usage_events SET created_at = {at_ms} WHERE org_id = '{org}'"
        )],
    )
    .await;
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The UTC windows open now: the hour's, the day's and the month's first
/// millisecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Starts {
    hour: i64,
    day: i64,
    month: i64,
}

fn starts() -> Starts {
    use chrono::Datelike;
    let now = now_ms();
    let day = now.div_euclid(DAY_MS) * DAY_MS;
    let date = chrono::DateTime::from_timestamp_millis(now).unwrap();
    Starts {
        hour: now.div_euclid(HOUR_MS) * HOUR_MS,
        day,
        month: day - i64::from(date.day() - 1) * DAY_MS,
    }
}

/// A back end whose instances keep their counters in-process (on either database):
/// each start rebuilds the money windows from the ledger.
async fn in_process_backend() -> Backend {
    let mut b = Backend::fresh().await;
    b.redis_url = None;
    b
}

// ---------------------------------------------------------------------------
// 1. the 00:00 UTC start of a key's daily cap

/// SPEC Limits: a key's daily spend cap resets at 00:00 UTC. Spend dated exactly
/// 00:00:00.000 UTC today counts against today's cap; spend a millisecond earlier
/// (yesterday) does not; the refusal says when the cap resets. (The org's daily
/// tier window lives in the counters alone, named by the UTC day, and is not
/// rebuilt from the ledger: its turn cannot be seen without a clock to move, so
/// only its refusal's "resets at 00:00 UTC" is, in tests/gates.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_daily_cap_counts_the_spend_since_0000_utc_only() {
    let mock = Mock::start().await;
    // 1,000 output tokens an answer: about 0.005 USD.
    mock.set_default("o1", Step::Text("x".repeat(4_000)));
    let b = in_process_backend().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org_id, _) = org(&s, "daycap", 3).await;
    let (st, k) = s
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org_id}/keys"),
            Some(json!({"name": "capped", "daily_spend_cap_usd": 0.008})),
        )
        .await;
    assert_eq!(st, 201, "{k}");
    let key = k["api_key"].as_str().unwrap().to_string();
    // A 1,100-token budget (about 0.0055 USD of worst case) fits once.
    let (st, v) = chat(&s, &key, "r-std", 1_100, "one").await;
    assert_eq!(st, 200, "{v}");
    let cost = v["usage"]["cost"].as_f64().unwrap();
    assert!(cost > 0.005, "{v}");
    let spent = format!("{cost:.6} USD spent or held today");
    let (st, v) = chat(&s, &key, "r-std", 1_100, "two").await;
    let msg = assert_quota(st, &v, "key_daily_cap");
    assert!(msg.contains(&spent), "{msg}");
    assert!(msg.contains("resets at 00:00 UTC"), "{msg}");
    served_rows(&b, &org_id, 1).await;
    s.stop();

    // Spent at 00:00:00.000 UTC today: today's spend.
    let day = starts().day;
    date_usage(&b, &org_id, day).await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (st, v) = chat(&s, &key, "r-std", 1_100, "three").await;
    if starts().day != day {
        eprintln!("the UTC day turned during the test: its last steps prove nothing");
        return;
    }
    let msg = assert_quota(st, &v, "key_daily_cap");
    assert!(msg.contains(&spent), "{msg}");
    s.stop();

    // A millisecond earlier: yesterday's, and today's cap is whole again.
    date_usage(&b, &org_id, day - 1).await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (st, v) = chat(&s, &key, "r-std", 1_100, "four").await;
    if starts().day != day {
        eprintln!("the UTC day turned during the test: its last step proves nothing");
        return;
    }
    assert_eq!(st, 200, "{v}");
}

// ---------------------------------------------------------------------------
// 2. BYOK traffic and the org's tier windows

/// SPEC Lanes and Limits: traffic on the org's own keys is never counted against
/// the org's platform rate limits (requests per minute; tokens per minute, hour
/// and day) and is never throttled by them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byok_traffic_is_never_counted_against_or_throttled_by_org_tier_windows() {
    let mock = Mock::start().await;
    // 600 output tokens an answer, whoever's key pays.
    mock.set_default("o1", Step::Text("x".repeat(2_400)));
    let b = Backend::fresh().await;
    // Tier 0: two platform requests a minute, 1,600 platform tokens a minute, an
    // hour and a day.
    let tiers = "[{requests_per_minute=2, tokens_per_minute=1600, tokens_per_hour=1600, tokens_per_day=1600}, {}]";
    let s = Sluice::start(&b, opts(&mock).env("SLUICE_BILLING__TIERS", tiers)).await;
    let (org_id, key) = org(&s, "tiered", 0).await;
    let base = mock.base_url();
    let own = connect(
        &s,
        &org_id,
        &key,
        "openai",
        "own",
        "sk-org-own",
        json!({"base_url": format!("{base}/v1")}),
    )
    .await;
    let auth_of_last = || {
        mock.requests_for("o1")
            .pop()
            .and_then(|r| r.header("authorization").map(str::to_string))
            .unwrap_or_default()
    };

    // Four calls on the org's own key: past every tier window, were they counted
    // (four requests, about 2,500 tokens).
    set_chain(&s, &key, "r-shared", json!([own])).await;
    for i in 0..4 {
        let (st, v) = chat(&s, &key, "r-shared", 700, &format!("own {i}")).await;
        assert_eq!(st, 200, "own call {i}: {v}");
        assert_eq!(v["provider"], json!(own), "{v}");
        assert_eq!(v["usage"]["cost"], 0.0, "{v}");
        assert_eq!(auth_of_last(), "Bearer sk-org-own");
    }
    // The platform windows are untouched: two platform calls fit (two requests,
    // about 1,250 tokens), and a third does not.
    for i in 0..2 {
        let (st, v) = chat(&s, &key, "r-std", 700, &format!("platform {i}")).await;
        assert_eq!(
            st, 200,
            "platform call {i} after the org's own traffic: {v}"
        );
        assert_eq!(v["provider"], "openai:o1", "{v}");
        assert_eq!(auth_of_last(), format!("Bearer {PLATFORM_OPENAI}"));
    }
    let (st, v) = chat(&s, &key, "r-std", 700, "platform 2").await;
    assert_error(st, &v, 429, "insufficient_quota");
    let reason = v["error"]["reason"].as_str().unwrap_or_default();
    assert!(
        [
            "org_rate_limit",
            "org_token_rate_limit",
            "org_token_rate_limit_hour",
            "org_token_rate_limit_day"
        ]
        .contains(&reason),
        "{v}"
    );
    let sent = mock.count("o1");

    // With the windows full, the org's own key still serves: alone on the chain,
    // and after the platform rung the windows refuse.
    let (st, v) = chat(&s, &key, "r-shared", 700, "own after").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], json!(own), "{v}");
    set_chain(&s, &key, "r-shared", json!(["openai:o1", own])).await;
    let (st, v) = chat(&s, &key, "r-shared", 700, "platform first").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], json!(own), "{v}");
    assert_eq!(v["usage"]["cost"], 0.0, "{v}");
    assert_eq!(
        mock.count("o1"),
        sent + 2,
        "the refused platform rung was not sent"
    );
    assert_eq!(auth_of_last(), "Bearer sk-org-own");
}

// ---------------------------------------------------------------------------
// 3. the free allowance's windows

/// SPEC Limits and insufficient_quota prefixes: a model's free allowance is an
/// hourly or daily token window, a recurring (monthly) dollar cap, or a lifetime
/// cap. Each serves free until spent, then refuses with free_limit_reached naming
/// the limit and its reset; each reopens at its own UTC boundary (the top of the
/// hour, 00:00 UTC, the 1st of the month), and the lifetime cap never does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_allowance_windows_name_their_limit_and_reopen_at_their_utc_boundary() {
    let mock = Mock::start().await;
    // Token windows (400 tokens): 200 output tokens an answer. Dollar caps
    // (0.01 USD): 1,000 output tokens, about 0.005 USD at list price.
    mock.set_default("fh", Step::Text("x".repeat(800)));
    mock.set_default("fd", Step::Text("x".repeat(800)));
    mock.set_default("fm", Step::Text("x".repeat(4_000)));
    mock.set_default("fl", Step::Text("x".repeat(4_000)));
    // (model, budget, the limit and reset its refusal names)
    let models = [
        (
            "r-free-hour",
            300,
            "400 tokens per hour; it resets at the top of the hour (UTC)",
        ),
        (
            "r-free-day",
            300,
            "400 tokens per day; it resets at 00:00 UTC",
        ),
        (
            "r-free-month",
            1_100,
            "0.01 USD per month; it resets on the 1st of the month at 00:00 UTC",
        ),
        ("r-free-life", 1_100, "0.01 USD lifetime; it does not reset"),
    ];
    let b = in_process_backend().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org_id, key) = org(&s, "free", 3).await;
    let balance = s.balance_usd(&org_id).await;
    for (model, budget, limit) in models {
        let (st, v) = chat(&s, &key, model, budget, "first").await;
        assert_eq!(st, 200, "{model}: {v}");
        assert_eq!(v["usage"]["cost"], 0.0, "{model} is served free: {v}");
        let (st, v) = chat(&s, &key, model, budget, "second").await;
        let msg = assert_quota(st, &v, "free_limit_reached");
        assert!(msg.contains(model) && msg.contains(limit), "{msg}");
    }
    let mut served = models.len();
    served_rows(&b, &org_id, served).await;
    assert_eq!(s.balance_usd(&org_id).await, balance, "nothing was billed");
    s.stop();

    // (dated at, which models serve again): 00:00 UTC today is in the hour open
    // now only during the day's first hour; a millisecond before the month began
    // is in no open window, and still in the lifetime.
    for phase in ["today 00:00 UTC", "before this month"] {
        let at = starts();
        let dated = match phase {
            "today 00:00 UTC" => at.day,
            _ => at.month - 1,
        };
        date_usage(&b, &org_id, dated).await;
        let s = Sluice::start(&b, opts(&mock)).await;
        for (model, budget, limit) in models {
            let open = match model {
                "r-free-hour" => dated < at.hour,
                "r-free-day" => dated < at.day,
                "r-free-month" => dated < at.month,
                _ => false,
            };
            let (st, v) = chat(&s, &key, model, budget, phase).await;
            if starts() != at {
                eprintln!("a UTC window turned during the test: its last steps prove nothing");
                return;
            }
            if open {
                assert_eq!(st, 200, "{model}, spent {phase}: {v}");
                assert_eq!(v["usage"]["cost"], 0.0, "{v}");
                served += 1;
            } else {
                let msg = assert_quota(st, &v, "free_limit_reached");
                assert!(msg.contains(limit), "{model}, spent {phase}: {msg}");
            }
        }
        served_rows(&b, &org_id, served).await;
        s.stop();
    }
}

// ---------------------------------------------------------------------------
// 4. an empty completion after the stream's header went out

async fn stream_raw(s: &Sluice, key: &str, path: &str, body: &Value) -> (u16, String) {
    let mut r = s
        .http
        .post(format!("{}{path}", s.gateway))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let mut raw = Vec::new();
    while let Ok(Some(c)) = r.chunk().await {
        raw.extend_from_slice(&c);
    }
    (status, String::from_utf8(raw).unwrap())
}

/// The (event name, JSON data) of each SSE frame that has JSON data.
fn frames(text: &str) -> Vec<(Option<String>, Value)> {
    text.split("\n\n")
        .filter(|f| !f.trim().is_empty() && !f.starts_with(':'))
        .filter_map(|f| {
            let name = f
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .map(str::to_string);
            let data: Vec<&str> = f.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
            serde_json::from_str(&data.join("\n"))
                .ok()
                .map(|d| (name, d))
        })
        .collect()
}

/// SPEC Events and Empty completion: when a stream already sent its 200 header
/// (keep-alives while the first content was slow) and every reachable rung then
/// ends its turn empty, the terminal frames carry the empty-completion shape of
/// the format: chat finish_reason stop with no content, responses completed with
/// empty output, messages end_turn with no content block. The ledger records an
/// empty_completion attempt at zero cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_completion_after_the_streams_header_ends_in_its_formats_terminal_frames() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        opts(&mock)
            // The header and keep-alives go out after 100 ms without content; the
            // OpenAI rung gives up on its first token after a second.
            .env("SLUICE_LIMITS__EARLY_HEADER_MS", "100")
            .env("SLUICE_PROVIDERS__OPENAI__FIRST_TOKEN_TIMEOUT_MS", "1000")
            .env("SLUICE_BREAKER__FAILURE_THRESHOLD", "100"),
    )
    .await;
    let (_, key) = org(&s, "empty", 3).await;
    let slow_then_empty = || {
        mock.script(
            "p1",
            vec![Step::DelayFirstToken(Duration::from_millis(8_000))],
        );
        mock.script("p2", vec![Step::Empty]);
    };
    let attempts = "openai:first_token_timeout,azure:empty_completion";

    // Chat.
    slow_then_empty();
    let body = json!({"model": "r-pair", "stream": true,
                      "messages": [{"role": "user", "content": "chat, slow then empty"}]});
    let (st, text) = stream_raw(&s, &key, "/v1/chat/completions", &body).await;
    assert_eq!(st, 200);
    assert!(
        text.starts_with(": keep-alive"),
        "the header went early: {text}"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let chunks: Vec<Value> = frames(&text).into_iter().map(|(_, d)| d).collect();
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop", "{text}");
    assert!(
        chunks.iter().all(|c| c["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap_or("")
            .is_empty()),
        "no content: {text}"
    );
    assert!(text.contains(attempts), "{text}");

    // Responses.
    slow_then_empty();
    let body = json!({"model": "r-pair", "stream": true, "input": "responses, slow then empty"});
    let (st, text) = stream_raw(&s, &key, "/v1/responses", &body).await;
    assert_eq!(st, 200);
    assert!(text.starts_with(": keep-alive"), "{text}");
    let f = frames(&text);
    let (name, done) = f.last().unwrap();
    assert_eq!(name.as_deref(), Some("response.completed"), "{text}");
    assert_eq!(done["response"]["status"], "completed", "{done}");
    assert_eq!(done["response"]["output"], json!([]), "{done}");
    assert!(
        f.iter()
            .all(|(n, _)| n.as_deref() != Some("response.output_text.delta")),
        "{text}"
    );

    // Messages.
    slow_then_empty();
    let body = json!({"model": "r-pair", "stream": true, "max_tokens": 256,
                      "messages": [{"role": "user", "content": "messages, slow then empty"}]});
    let (st, text) = stream_raw(&s, &key, "/v1/messages", &body).await;
    assert_eq!(st, 200);
    assert!(text.starts_with(": keep-alive"), "{text}");
    let f = frames(&text);
    let names: Vec<&str> = f.iter().filter_map(|(n, _)| n.as_deref()).collect();
    assert_eq!(names.last(), Some(&"message_stop"), "{text}");
    assert!(!names.contains(&"content_block_start"), "{text}");
    let delta = &f
        .iter()
        .find(|(n, _)| n.as_deref() == Some("message_delta"))
        .unwrap()
        .1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn", "{delta}");
    let start = &f
        .iter()
        .find(|(n, _)| n.as_deref() == Some("message_start"))
        .unwrap()
        .1;
    assert_eq!(start["message"]["content"], json!([]), "{start}");

    // The ledger: three answers, each with its empty attempt, at no cost.
    let events = s.usage_events(&key, 3).await;
    assert_eq!(events.len(), 3, "{events:?}");
    for e in &events {
        assert_eq!(e["attempts"], attempts, "{e}");
        assert_eq!(e["empty_attempts"], 1, "{e}");
        assert_eq!(e["cost_usd"], 0.0, "{e}");
    }
}

// ---------------------------------------------------------------------------
// 5. several dropped fields in one disclosure

/// SPEC "How request fields are handled" and docs/decisions.md "Parameter
/// policy": every field the serving rung does not receive is named in
/// `x-service-ignored-parameters`, comma-separated in first-seen order without
/// repeats; on a stream the same value travels in the frame that carries the
/// finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_dropped_fields_are_disclosed_comma_separated_in_first_seen_order() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (_, key) = org(&s, "drops", 3).await;
    const HEADER: &str = "x-service-ignored-parameters";

    // A chat client on a Claude rung that does not sample: the sampling fields and
    // OpenAI's verbosity.
    let mut body = json!({"model": "r-claude-nosample", "max_tokens": 50,
        "temperature": 0.5, "top_p": 0.9, "verbosity": "low",
        "messages": [{"role": "user", "content": "hi"}]});
    let want = "temperature,top_p,verbosity";
    let a = s.call(&key, "/v1/chat/completions", &body).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.header(HEADER), want);
    body["stream"] = json!(true);
    let a = s.call(&key, "/v1/chat/completions", &body).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header(HEADER), want);
    let finish = a
        .data()
        .into_iter()
        .find(|c| c["choices"][0]["finish_reason"].is_string())
        .unwrap();
    assert_eq!(finish[HEADER], want, "{finish}");

    // A responses client: the sampling fields, then the fields of another maker.
    let mut body = json!({"model": "r-claude-nosample", "max_output_tokens": 50,
        "temperature": 0.5, "top_p": 0.9, "text": {"verbosity": "low"},
        "client_metadata": {"run": "7"}, "input": "hi"});
    let want = "temperature,top_p,text.verbosity,client_metadata";
    let a = s.call(&key, "/v1/responses", &body).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.header(HEADER), want);
    body["stream"] = json!(true);
    let a = s.call(&key, "/v1/responses", &body).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header(HEADER), want);
    let done = a.last_event("response.completed").unwrap();
    let carried = if done[HEADER].is_null() {
        &done["response"][HEADER]
    } else {
        &done[HEADER]
    };
    assert_eq!(carried, want, "{done}");
}

/// SPEC "How request fields are handled": a dropped field is removed because the
/// serving rung cannot use it. A rung of another maker (the request translated
/// for its wire) must not receive a field the disclosure names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disclosed_field_is_not_sent_to_a_translated_rung() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (_, key) = org(&s, "drops-sent", 3).await;
    let mut leaked = Vec::new();
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "r-claude-nosample", "max_tokens": 50,
                   "temperature": 0.5, "top_p": 0.9,
                   "messages": [{"role": "user", "content": "chat"}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "r-claude-nosample", "max_output_tokens": 50,
                   "temperature": 0.5, "top_p": 0.9, "input": "responses"}),
        ),
    ] {
        let a = s.call(&key, path, &body).await;
        assert_eq!(a.status, 200, "{path}: {}", a.json);
        assert_eq!(
            a.header("x-service-ignored-parameters"),
            "temperature,top_p"
        );
        let sent = mock.requests_for("cn1").pop().unwrap().json().unwrap();
        for f in ["temperature", "top_p"] {
            if sent.get(f).is_some() {
                leaked.push(format!("{path}: {f} ({sent})"));
            }
        }
    }
    assert!(
        leaked.is_empty(),
        "disclosed as dropped, yet sent: {leaked:#?}"
    );
}

// ---------------------------------------------------------------------------
// 6. Idempotency-Key on embeddings

/// SPEC Embeddings: Idempotency-Key is not honoured; a retry is a new billable
/// request (while the chat route replays the first answer under the same key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_is_not_honoured_on_embeddings() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (_, key) = org(&s, "idem", 3).await;
    // 1,000 tokens at 1 USD per million each time.
    let body = json!({"model": "r-embed", "input": "x".repeat(4_000)});
    let idem = [("Idempotency-Key", "emb-retry-1")];
    let first = s.call_with(&key, "/v1/embeddings", &body, &idem).await;
    assert_eq!(first.status, 200, "{}", first.json);
    let again = s.call_with(&key, "/v1/embeddings", &body, &idem).await;
    assert_eq!(again.status, 200, "{}", again.json);
    assert_eq!(again.header("idempotent-replayed"), "");
    assert_eq!(mock.count("te1"), 2, "each is sent to the provider");
    // Another body under the same key is no conflict either.
    let other = json!({"model": "r-embed", "input": "y".repeat(4_000)});
    let a = s.call_with(&key, "/v1/embeddings", &other, &idem).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(mock.count("te1"), 3);
    // Each was billed.
    let events = s.usage_events(&key, 3).await;
    assert_eq!(events.len(), 3, "{events:?}");
    for e in &events {
        assert!(e["cost_usd"].as_f64().unwrap() > 0.0, "{e}");
    }

    // The chat route under the same key replays (the key is honoured there).
    let chat = json!({"model": "r-std", "max_tokens": 20,
                      "messages": [{"role": "user", "content": "hi"}]});
    let chat_idem = [("Idempotency-Key", "chat-retry-1")];
    let a = s
        .call_with(&key, "/v1/chat/completions", &chat, &chat_idem)
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    let a = s
        .call_with(&key, "/v1/chat/completions", &chat, &chat_idem)
        .await;
    assert_eq!(a.header("idempotent-replayed"), "true");
    assert_eq!(mock.count("o1"), 1);
}

// ---------------------------------------------------------------------------
// 7. an org's own cloud deployments for embeddings

/// SPEC Embeddings, "Own cloud deployments": each deployment resource is an
/// account under its provider mapping the model to a deployment name; the org
/// orders the accounts (its own maker key last); a request tries them in order,
/// fails over on a provider error or exhausted quota, and never falls through to
/// platform-funded credit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_cloud_embedding_deployments_go_in_order_and_never_reach_platform_credit() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org_id, key) = org(&s, "clouds", 3).await;
    let base = mock.base_url();
    let east = connect(
        &s,
        &org_id,
        &key,
        "azure",
        "east",
        "az-key-east",
        json!({"base_url": base, "models": {"r-embed": "emb-east"}}),
    )
    .await;
    let west = connect(
        &s,
        &org_id,
        &key,
        "azure",
        "west",
        "az-key-west",
        json!({"base_url": base, "models": {"r-embed": "emb-west"}}),
    )
    .await;
    let maker = connect(
        &s,
        &org_id,
        &key,
        "openai",
        "maker",
        "sk-maker",
        json!({"base_url": format!("{base}/v1")}),
    )
    .await;
    set_chain(&s, &key, "r-embed", json!([east, west, maker])).await;
    let balance = s.balance_usd(&org_id).await;
    let body = json!({"model": "r-embed", "input": ["one", "two"]});
    let embed = || s.post("/v1/embeddings", Some(&key), &body);

    let (st, v) = embed().await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], json!(east), "{v}");
    assert_eq!(v["usage"]["cost"], 0.0, "{v}");
    assert_eq!(v["data"].as_array().unwrap().len(), 2, "{v}");
    let sent = mock.requests_for("emb-east").pop().unwrap();
    assert!(
        sent.path
            .starts_with("/openai/deployments/emb-east/embeddings"),
        "{}",
        sent.path
    );
    assert_eq!(sent.header("api-key"), Some("az-key-east"));
    // An exhausted quota moves to the next account; a provider error too, to the
    // org's maker key last.
    mock.script("emb-east", vec![Step::Status(429)]);
    let (st, v) = embed().await;
    assert_eq!((st, v["provider"].clone()), (200, json!(west)), "{v}");
    assert_eq!(
        mock.requests_for("emb-west")
            .pop()
            .unwrap()
            .header("api-key"),
        Some("az-key-west")
    );
    mock.script("emb-east", vec![Step::Status(500)]);
    mock.script("emb-west", vec![Step::Status(503)]);
    let (st, v) = embed().await;
    assert_eq!((st, v["provider"].clone()), (200, json!(maker)), "{v}");
    assert_eq!(v["usage"]["cost"], 0.0, "{v}");
    let sent = mock.requests_for("te1").pop().unwrap();
    assert_eq!(sent.header("authorization"), Some("Bearer sk-maker"));
    // Every account failing: all_routes_failed, never the platform's credential.
    mock.script("emb-east", vec![Step::Status(500)]);
    mock.script("emb-west", vec![Step::Status(500)]);
    mock.script("te1", vec![Step::Status(500)]);
    let (st, v) = embed().await;
    assert_error(st, &v, 502, "all_routes_failed");
    let platform = format!("Bearer {PLATFORM_OPENAI}");
    assert!(
        mock.requests_for("te1")
            .iter()
            .all(|r| r.header("authorization") != Some(platform.as_str())),
        "the platform rung was never tried"
    );
    assert_eq!(s.balance_usd(&org_id).await, balance, "no credit was drawn");
}

// ---------------------------------------------------------------------------
// 8. the platform's hosted collection

/// SPEC Deployment: the platform-hosted collection is called with an org key on
/// the platform lane: the gateway reaches it with the platform's own credential
/// (never the org's key), names the rung, and draws the org's credits; orgs do not
/// connect their own credentials to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosted_collection_serves_org_keys_on_the_platform_lane() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org_id, key) = org(&s, "hosted", 3).await;
    let (st, v) = s.get("/v1/models", Some(&key)).await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "r-hosted"),
        "{v}"
    );

    let (st, v) = chat(&s, &key, "r-hosted", 50, "hi").await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["provider"], "hosted:h1", "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "Hello from mock h1.");
    let cost = v["usage"]["cost"].as_f64().unwrap();
    assert!(cost > 0.0, "{v}");
    let sent = mock.requests_for("h1").pop().unwrap();
    assert!(
        sent.path.starts_with("/v1/chat/completions"),
        "{}",
        sent.path
    );
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {PLATFORM_HOSTED}").as_str())
    );
    assert!(
        !sent.headers.iter().any(|(_, v)| v.contains(&key)),
        "the org's key never goes upstream"
    );
    assert_eq!(sent.json().unwrap()["model"], "h1");

    // Streamed, and from a client of another format.
    let a = s
        .call(
            &key,
            "/v1/chat/completions",
            &json!({"model": "r-hosted", "stream": true, "max_tokens": 50,
                    "messages": [{"role": "user", "content": "stream"}]}),
        )
        .await;
    assert_eq!(a.status, 200);
    let text: String = a
        .data()
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "Hello from mock h1.");
    let a = s
        .call(
            &key,
            "/v1/messages",
            &json!({"model": "r-hosted", "max_tokens": 50,
                    "messages": [{"role": "user", "content": "messages"}]}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["content"][0]["text"], "Hello from mock h1.");

    // On the platform lane: the catalog says so, and credits pay.
    let (st, v) = s
        .get(&format!("/api/gateway/catalog?org_id={org_id}"), Some(&key))
        .await;
    assert_eq!(st, 200, "{v}");
    let row = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["alias"] == "r-hosted")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(row["lane"], "platform_funded", "{v}");
    served_rows(&b, &org_id, 3).await;
    assert!(s.balance_usd(&org_id).await <= 5.0 - cost, "credits paid");
    let rows = sql_rows(
        &b.database_url,
        &format!("SELECT lane, rung FROM usage_events WHERE org_id = '{org_id}'"),
    )
    .await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(
        rows.iter()
            .all(|r| r["lane"] == "platform_funded" && r["rung"] == "hosted:h1"),
        "{rows:?}"
    );

    // No org connects its own credential to it.
    let (st, v) = api(
        &s,
        reqwest::Method::POST,
        &format!("/api/orgs/{org_id}/provider-connections/hosted"),
        &key,
        json!({"setup_alias": "mine", "secret": "hk-org", "config": {}}),
    )
    .await;
    assert!((400..500).contains(&st), "{st}: {v}");
}
