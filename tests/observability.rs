//! What an operator watching sluice sees, against the mock provider: `/metrics`
//! after a varied run answers every question of the dashboard (each family there,
//! its series bounded however many keys, conversations and paths clients bring);
//! the dashboard and the alert rules read only metrics a live `/metrics` exposes
//! (and `promtool` accepts them where it is installed); traces reach an OTLP/HTTP
//! receiver, one span per request and one per attempt with the GenAI conventions,
//! joined to the client's `traceparent` and passed on to providers; JSON logs
//! carry one access line per request under its `x-request-id`; and no log line
//! and no metric holds a key, a provider credential or a BYOK secret.

mod harness;

use harness::{repo_path, wait_for, Backend, Opts, Sluice, ADMIN_TOKEN};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The platform credentials the mock provider is reached with.
const OPENAI_CREDENTIAL: &str = "sk-platform-openai-c7f3a9";
const AZURE_CREDENTIAL: &str = "az-platform-credential-51e2";
const ANTHROPIC_CREDENTIAL: &str = "sk-ant-platform-credential-88d1";

/// Every metric family the dashboard and the alerts are built on.
const FAMILIES: [&str; 43] = [
    "sluice_requests_total",
    "sluice_request_duration_seconds",
    "sluice_time_to_first_token_seconds",
    "sluice_gateway_overhead_seconds",
    "sluice_upstream_seconds",
    "sluice_in_flight_requests",
    "sluice_open_streams",
    "sluice_upstream_attempts_total",
    "sluice_failovers_total",
    "sluice_breaker_open",
    "sluice_breaker_opens_total",
    "sluice_tokens_total",
    "sluice_cost_micro_usd_total",
    "sluice_gate_refusals_total",
    "sluice_guardrail_hits_total",
    "sluice_idempotency_requests_total",
    "sluice_usage_queue_depth",
    "sluice_usage_spool_events",
    "sluice_usage_spool_bytes",
    "sluice_usage_write_seconds",
    "sluice_usage_write_lag_seconds",
    "sluice_usage_events_total",
    "sluice_db_call_seconds",
    "sluice_db_errors_total",
    "sluice_redis_call_seconds",
    "sluice_redis_errors_total",
    "sluice_catalog_reloads_total",
    "sluice_trace_spans_total",
    "sluice_search_rounds_total",
    "sluice_search_fees_micro_usd_total",
    "sluice_search_drops_total",
    "sluice_batch_queue_depth",
    "sluice_telemetry_queue_depth",
    "sluice_ready",
    "sluice_change_feed_up",
    "sluice_build_info",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_threads",
    "process_cpu_seconds_total",
    "process_start_time_seconds",
];

fn opts(mock: &Mock) -> Opts {
    let base = mock.base_url();
    let mut o = Opts::default()
        .catalog(repo_path("tests/fixtures/ops.toml"))
        .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
        .env("SLUICE_PROVIDERS__AZURE__BASE_URL", &base)
        .env("SLUICE_PROVIDERS__ANTHROPIC__BASE_URL", &base)
        .env("OPENAI_API_KEY", OPENAI_CREDENTIAL)
        .env("AZURE_OPENAI_API_KEY", AZURE_CREDENTIAL)
        .env("ANTHROPIC_API_KEY", ANTHROPIC_CREDENTIAL)
        .env("SLUICE_BREAKER__FAILURE_THRESHOLD", 2)
        .env("SLUICE_BREAKER__COOLDOWN_MS", 600_000)
        .env("SLUICE_NETWORK__ALLOW_PRIVATE_UPSTREAMS", "true");
    for p in ["OPENAI", "AZURE", "ANTHROPIC"] {
        o = o.env(&format!("SLUICE_PROVIDERS__{p}__HEADER_TIMEOUT_MS"), 5000);
    }
    o
}

async fn scrape(s: &Sluice) -> String {
    s.metrics().await
}

/// The families a scrape exposes (`# TYPE name kind`), with their kind.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, k)| (n.to_string(), k.to_string()))
        .collect()
}

/// Every series of a scrape: the sample's name and labels.
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_string()))
        .collect()
}

/// The sum of the samples of `name` whose labels include every pair.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(s, _)| {
            let (n, rest) = s.split_once('{').unwrap_or((s, ""));
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| v.parse::<f64>().unwrap_or(0.0))
        .sum()
}

/// A scrape once the run has settled: the usage writer caught up, and every
/// request ended (a request's gauge falls after its last byte is written, so a
/// client can hold its answer a moment before the instance counts it ended).
async fn flushed(s: &Sluice) -> String {
    let mut text = String::new();
    for _ in 0..200 {
        text = scrape(s).await;
        if value(&text, "sluice_usage_queue_depth", &[]) == 0.0
            && value(&text, "sluice_in_flight_requests", &[]) == 0.0
            && value(&text, "sluice_open_streams", &[]) == 0.0
        {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the usage writer never caught up, or a request never ended:\n{text}");
}

fn chat(model: &str, stream: bool, cache_key: &str) -> Value {
    json!({"model": model, "stream": stream, "prompt_cache_key": cache_key, "user": cache_key,
           "messages": [{"role": "user", "content": "Say hello"}]})
}

fn messages(stream: bool) -> Value {
    json!({"model": "ops-claude", "stream": stream, "max_tokens": 50,
           "messages": [{"role": "user", "content": "Say hello"}]})
}

/// One client's traffic of every shape that does not change the service's state:
/// chat, responses and messages, whole and streamed, an unknown model, a path
/// that does not exist and a key that does not either.
async fn traffic(s: &Sluice, key: &str, tag: &str) {
    let rid = format!("rid-{tag}");
    let tp = format!(
        "00-{:032x}-{:016x}-01",
        rand::random::<u128>() | 1,
        rand::random::<u64>() | 1
    );
    let headers = [("x-request-id", rid.as_str()), ("traceparent", tp.as_str())];
    for stream in [false, true] {
        let a = s
            .call_with(
                key,
                "/v1/chat/completions",
                &chat("ops-chat", stream, tag),
                &headers,
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.json);
        let body = json!({"model": "ops-chat", "stream": stream, "input": "Say hello",
                          "prompt_cache_key": tag});
        let a = s.call_with(key, "/v1/responses", &body, &headers).await;
        assert_eq!(a.status, 200, "{}", a.json);
        let a = s
            .call_with(key, "/v1/messages", &messages(stream), &headers)
            .await;
        assert_eq!(a.status, 200, "{}", a.json);
    }
    let a = s
        .call(
            key,
            "/v1/chat/completions",
            &chat(&format!("nosuch-{tag}"), false, tag),
        )
        .await;
    assert_eq!(a.json["error"]["code"], "model_not_granted", "{}", a.json);
    let (st, _) = s.get(&format!("/v1/nowhere-{tag}"), Some(key)).await;
    assert_eq!(st, 404);
    let a = s
        .call(
            &format!("sk-bogus-{tag}"),
            "/v1/chat/completions",
            &chat("ops-chat", false, tag),
        )
        .await;
    assert_eq!(a.status, 401);
    // A well-formed key no snapshot holds is looked up in the database once
    // (a key works the moment it is minted): a directory call an operator sees.
    let unknown = format!("xpl_{:0>40}", tag.len());
    let a = s
        .call(
            &unknown,
            "/v1/chat/completions",
            &chat("ops-chat", false, tag),
        )
        .await;
    assert_eq!(a.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_varied_run_answers_every_question_with_bounded_series() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (org, key_id, key) = s.org_and_key().await;

    traffic(&s, &key, "first").await;
    // A fail-over: the first rung answers 500, the second serves.
    mock.script("o1", vec![Step::Status(500)]);
    let a = s
        .call(&key, "/v1/chat/completions", &chat("ops-chat", false, "fo"))
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.header("x-gateway-attempts"), "openai:500,azure:ok");
    // A breaker opening: two failures on the only rung, then it is skipped.
    mock.script("solo1", vec![Step::Status(503), Step::Status(503)]);
    for want in [502, 502, 503] {
        let a = s
            .call(&key, "/v1/chat/completions", &chat("ops-solo", false, "b"))
            .await;
        assert_eq!(a.status, want, "{}", a.json);
    }
    // Refusals by the gates: a key's rate guardrail, a grant, credits.
    let (_, k) = s
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org}/keys"),
            Some(json!({"rpm": 1})),
        )
        .await;
    let slow = k["api_key"].as_str().unwrap().to_string();
    let statuses = [
        s.call(&slow, "/v1/chat/completions", &chat("ops-chat", false, "r"))
            .await
            .status,
        s.call(&slow, "/v1/chat/completions", &chat("ops-chat", false, "r"))
            .await
            .status,
    ];
    assert_eq!(statuses, [200, 429]);
    let a = s
        .call(
            &key,
            "/v1/chat/completions",
            &chat("ops-restricted", false, "g"),
        )
        .await;
    assert_eq!(a.json["error"]["code"], "model_not_granted", "{}", a.json);
    let (_, poor) = s
        .org_with(json!({"name": "poor", "credits_usd": 0, "card_verified": true, "tier": 3}))
        .await;
    let a = s
        .call(&poor, "/v1/chat/completions", &chat("ops-chat", false, "p"))
        .await;
    assert_eq!(
        a.json["error"]["reason"], "insufficient_credits",
        "{}",
        a.json
    );
    // Idempotency: the second call is a replay.
    for _ in 0..2 {
        let a = s
            .call_with(
                &key,
                "/v1/chat/completions",
                &chat("ops-chat", false, "i"),
                &[("idempotency-key", "idem-1")],
            )
            .await;
        assert_eq!(a.status, 200);
    }

    let text = flushed(&s).await;
    let live = families(&text);
    for f in FAMILIES {
        assert!(
            live.contains_key(f),
            "family {f} missing from /metrics:\n{text}"
        );
    }
    let v = |name: &str, labels: &[(&str, &str)]| value(&text, name, labels);
    // Traffic by route, model, lane and code.
    assert!(
        v(
            "sluice_requests_total",
            &[
                ("route", "chat"),
                ("model", "ops-chat"),
                ("lane", "platform_funded"),
                ("status", "200"),
                ("code", "ok")
            ]
        ) >= 5.0
    );
    assert!(
        v(
            "sluice_requests_total",
            &[
                ("route", "messages"),
                ("model", "ops-claude"),
                ("status", "200")
            ]
        ) >= 2.0
    );
    assert!(
        v(
            "sluice_requests_total",
            &[("route", "responses"), ("status", "200")]
        ) >= 2.0
    );
    assert_eq!(
        v(
            "sluice_requests_total",
            &[("code", "invalid_key"), ("model", "none")]
        ),
        2.0,
        "a malformed key and a well-formed unknown one"
    );
    assert_eq!(
        v(
            "sluice_requests_total",
            &[("model", "ops-solo"), ("code", "all_routes_failed")]
        ),
        2.0
    );
    assert_eq!(
        v(
            "sluice_requests_total",
            &[("model", "ops-solo"), ("code", "unavailable_route")]
        ),
        1.0
    );
    // Providers: attempts by outcome, the fail-over and why, the breaker.
    assert!(
        v(
            "sluice_upstream_attempts_total",
            &[
                ("provider", "openai"),
                ("rung", "openai:o1"),
                ("outcome", "http_5xx")
            ]
        ) >= 1.0
    );
    assert!(
        v(
            "sluice_upstream_attempts_total",
            &[
                ("provider", "azure"),
                ("rung", "azure:o2"),
                ("outcome", "ok")
            ]
        ) >= 1.0
    );
    assert!(
        v(
            "sluice_upstream_attempts_total",
            &[("provider", "anthropic"), ("outcome", "ok")]
        ) >= 2.0
    );
    assert_eq!(
        v(
            "sluice_failovers_total",
            &[
                ("route", "chat"),
                ("provider", "openai"),
                ("reason", "http_5xx")
            ]
        ),
        1.0
    );
    assert_eq!(
        v(
            "sluice_breaker_opens_total",
            &[("provider", "openai"), ("rung", "openai:solo1")]
        ),
        1.0
    );
    assert_eq!(
        v(
            "sluice_breaker_open",
            &[("provider", "openai"), ("rung", "openai:solo1")]
        ),
        1.0
    );
    // Time: first token of streams, overhead, upstream, totals, by route and provider.
    assert!(
        v(
            "sluice_time_to_first_token_seconds_count",
            &[("route", "chat"), ("provider", "openai")]
        ) >= 2.0
    );
    assert!(
        v(
            "sluice_gateway_overhead_seconds_count",
            &[("route", "messages"), ("provider", "anthropic")]
        ) >= 2.0
    );
    assert!(
        v(
            "sluice_upstream_seconds_count",
            &[("route", "chat"), ("provider", "azure")]
        ) >= 1.0
    );
    assert!(
        v(
            "sluice_request_duration_seconds_count",
            &[("route", "responses")]
        ) >= 2.0
    );
    // Tokens and spend by model and lane.
    assert!(
        v(
            "sluice_tokens_total",
            &[
                ("model", "ops-chat"),
                ("lane", "platform_funded"),
                ("kind", "input")
            ]
        ) > 0.0
    );
    assert!(
        v(
            "sluice_tokens_total",
            &[("model", "ops-claude"), ("kind", "output")]
        ) > 0.0
    );
    assert!(
        v(
            "sluice_cost_micro_usd_total",
            &[("model", "ops-chat"), ("lane", "platform_funded")]
        ) > 0.0
    );
    // Gates.
    assert_eq!(
        v(
            "sluice_gate_refusals_total",
            &[("reason", "key_rate_limit")]
        ),
        1.0
    );
    assert_eq!(v("sluice_guardrail_hits_total", &[("limit", "rpm")]), 1.0);
    assert_eq!(
        v(
            "sluice_gate_refusals_total",
            &[("reason", "model_not_granted")]
        ),
        2.0,
        "the restricted model, and the unknown one (the same answer by design)"
    );
    assert_eq!(
        v(
            "sluice_gate_refusals_total",
            &[("reason", "insufficient_credits")]
        ),
        1.0
    );
    assert_eq!(
        v("sluice_idempotency_requests_total", &[("result", "fresh")]),
        1.0
    );
    assert_eq!(
        v("sluice_idempotency_requests_total", &[("result", "replay")]),
        1.0
    );
    // The usage writer wrote everything; the stores were called.
    assert!(v("sluice_usage_events_total", &[("result", "written")]) >= 10.0);
    assert_eq!(
        v("sluice_usage_events_total", &[("result", "spooled")]),
        0.0
    );
    assert!(v("sluice_usage_write_seconds_count", &[]) >= 1.0);
    assert!(v("sluice_db_call_seconds_count", &[("op", "directory")]) >= 1.0);
    if b.redis_url.is_some() {
        // Leased: one take buys a block of admissions, so fewer takes than requests.
        assert!(v("sluice_redis_call_seconds_count", &[("op", "take")]) >= 1.0);
    }
    assert_eq!(v("sluice_in_flight_requests", &[]), 0.0);
    assert_eq!(v("sluice_open_streams", &[]), 0.0);
    assert_eq!(v("sluice_ready", &[]), 1.0);
    assert_eq!(v("sluice_change_feed_up", &[]), 1.0);
    assert!(v("process_resident_memory_bytes", &[]) > 1e6);

    // Bounded: twelve more orgs with new keys, conversations, users, request
    // ids, traces, unknown models and paths add no series.
    let before = series(&text);
    let mut seen = vec![
        key.clone(),
        key_id.clone(),
        org.clone(),
        slow.clone(),
        poor.clone(),
    ];
    for i in 0..12 {
        let (o, k) = s
            .org_with(json!({"name": format!("org-{i}"), "credits_usd": 5, "card_verified": true, "tier": 3}))
            .await;
        let tag = format!("conv-{i}-{:x}", rand::random::<u32>());
        traffic(&s, &k, &tag).await;
        seen.extend([o, k, tag]);
    }
    let text = flushed(&s).await;
    let after = series(&text);
    let grown: Vec<_> = after.difference(&before).collect();
    assert!(
        grown.is_empty(),
        "series grew with clients' values: {grown:#?}"
    );
    for secret in seen.iter().map(String::as_str).chain([
        OPENAI_CREDENTIAL,
        AZURE_CREDENTIAL,
        ANTHROPIC_CREDENTIAL,
        ADMIN_TOKEN,
        "nowhere",
        "nosuch",
        "sk-bogus",
        "rid-",
    ]) {
        assert!(!text.contains(secret), "{secret} in /metrics");
    }

    dashboard_and_alerts_read_live_metrics(&live);
}

/// PromQL's own words: functions, aggregations, keywords.
const PROMQL_WORDS: [&str; 40] = [
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "count_values",
    "topk",
    "bottomk",
    "quantile",
    "stddev",
    "rate",
    "irate",
    "increase",
    "delta",
    "deriv",
    "histogram_quantile",
    "clamp_min",
    "clamp_max",
    "abs",
    "absent",
    "round",
    "ceil",
    "floor",
    "sort",
    "sort_desc",
    "time",
    "vector",
    "scalar",
    "label_replace",
    "by",
    "without",
    "and",
    "or",
    "unless",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
];

/// The metric names an expression reads: what is left once strings, label
/// matchers, ranges, groupings, numbers and PromQL's own words are set aside.
fn metric_names(expr: &str) -> Vec<String> {
    let c: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    let mut last_word = String::new();
    while i < c.len() {
        let ch = c[i];
        let skip_to = |close: char, from: usize| {
            let mut j = from + 1;
            let mut quoted = false;
            while j < c.len() && (quoted || c[j] != close) {
                if c[j] == '"' {
                    quoted = !quoted;
                }
                j += 1;
            }
            j + 1
        };
        if ch == '"' {
            i = skip_to('"', i);
        } else if ch == '{' {
            i = skip_to('}', i);
        } else if ch == '[' {
            i = skip_to(']', i);
        } else if ch == '('
            && matches!(
                last_word.as_str(),
                "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
            )
        {
            i = skip_to(')', i);
            last_word.clear();
        } else if ch.is_ascii_digit()
            || (ch == '.' && c.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.') {
                i += 1;
            }
        } else if ch.is_ascii_alphabetic() || ch == '_' || ch == ':' {
            let start = i;
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_' || c[i] == ':') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            if !PROMQL_WORDS.contains(&word.as_str()) {
                names.push(word.clone());
            }
            last_word = word;
        } else {
            if !ch.is_whitespace() {
                last_word.clear();
            }
            i += 1;
        }
    }
    names
}

/// Every metric name of every expression of the dashboard and the alert rules
/// exists on the live scrape (`up` is Prometheus's own); `promtool` checks the
/// rules, and the dashboard's expressions as recording rules, where installed.
fn dashboard_and_alerts_read_live_metrics(live: &BTreeMap<String, String>) {
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_path("deploy/grafana/sluice.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 30, "{}", exprs.len());
    let alerts = std::fs::read_to_string(repo_path("deploy/prometheus/alerts.yml")).unwrap();
    let mut rules = 0;
    let mut lines = alerts.lines().peekable();
    while let Some(l) = lines.next() {
        let Some(rest) = l.trim_start().strip_prefix("expr:") else {
            continue;
        };
        rules += 1;
        let indent = l.len() - l.trim_start().len();
        let mut e = rest.trim().trim_start_matches('|').to_string();
        while lines
            .peek()
            .is_some_and(|n| n.len() - n.trim_start().len() > indent && !n.trim().is_empty())
        {
            e.push(' ');
            e.push_str(lines.next().unwrap().trim());
        }
        exprs.push(e);
    }
    assert!(rules >= 8, "{rules} alert rules");
    let mut read = BTreeSet::new();
    for e in &exprs {
        let names = metric_names(e);
        assert!(!names.is_empty(), "no metric in {e}");
        for n in names {
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| {
                    n.strip_suffix(s)
                        .filter(|f| live.get(*f).is_some_and(|k| k == "histogram"))
                })
                .unwrap_or(&n)
                .to_string();
            assert!(
                family == "up" || live.contains_key(&family),
                "{n} (in {e}) is not on /metrics"
            );
            read.insert(family);
        }
    }
    // The dashboard answers every question: every family is read somewhere.
    for f in FAMILIES {
        assert!(read.contains(f), "no panel or rule reads {f}");
    }
    let promtool = std::process::Command::new("promtool")
        .arg("--version")
        .output();
    if promtool.is_err() {
        eprintln!(
            "promtool not installed: rule syntax not checked here (scripts/test installs it)"
        );
        return;
    }
    let check = |path: &str| {
        let out = std::process::Command::new("promtool")
            .args(["check", "rules", path])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool check rules {path}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    check(&repo_path("deploy/prometheus/alerts.yml"));
    // The dashboard's expressions, each as a recording rule, so promtool parses
    // them too ($__rate_interval is Grafana's; any range parses).
    let dir = tempfile::tempdir().unwrap();
    let mut rec = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e.replace("$__rate_interval", "5m");
        rec.push_str(&format!(
            "      - record: dashboard:panel{i}\n        expr: {}\n",
            serde_json::to_string(&e).unwrap()
        ));
    }
    let path = dir.path().join("dashboard.yml");
    std::fs::write(&path, rec).unwrap();
    check(path.to_str().unwrap());
}

/// A fake OTLP/HTTP collector: it decodes what arrives (JSON; protobuf is
/// refused, as sluice never sends it) and keeps every span with its resource.
struct Collector {
    addr: std::net::SocketAddr,
    spans: Arc<Mutex<Vec<(Value, Value)>>>,
}

impl Collector {
    async fn start() -> Collector {
        use axum::http::{HeaderMap, StatusCode};
        let spans: Arc<Mutex<Vec<(Value, Value)>>> = Arc::default();
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    let ct = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    if ct != "application/json" {
                        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, "json only".to_string());
                    }
                    let Ok(req) = serde_json::from_slice::<Value>(&body) else {
                        return (
                            StatusCode::BAD_REQUEST,
                            "not an ExportTraceServiceRequest".into(),
                        );
                    };
                    for rs in req["resourceSpans"].as_array().into_iter().flatten() {
                        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                            for sp in ss["spans"].as_array().into_iter().flatten() {
                                kept.lock()
                                    .unwrap()
                                    .push((rs["resource"].clone(), sp.clone()));
                            }
                        }
                    }
                    (StatusCode::OK, "{}".to_string())
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        Collector { addr, spans }
    }

    /// Waits for the spans of a trace until `n` have arrived.
    async fn trace(&self, trace_id: &str, n: usize) -> Vec<Value> {
        for _ in 0..400 {
            let found: Vec<Value> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, s)| s["traceId"] == trace_id)
                .map(|(_, s)| s.clone())
                .collect();
            if found.len() >= n {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the spans of trace {trace_id} never arrived");
    }
}

fn attr(span: &Value, key: &str) -> Value {
    let a = span["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["key"] == key)
        .unwrap_or_else(|| panic!("no {key} in {span}"));
    let v = &a["value"];
    v.get("stringValue")
        .cloned()
        .or_else(|| {
            v.get("intValue")
                .map(|i| Value::from(i.as_str().unwrap().parse::<i64>().unwrap()))
        })
        .or_else(|| v.get("boolValue").cloned())
        .unwrap()
}

/// Waits until `sluice_change_feed_up` reads `want`.
async fn change_feed_up(s: &Sluice, want: f64) {
    let reads = async || value(&scrape(s).await, "sluice_change_feed_up", &[]) == want;
    wait_for(&format!("sluice_change_feed_up reads {want}"), reads).await;
}

/// On PostgreSQL the gauge is 1 while the instance listens to the change feed,
/// 0 once its listening connection is cut (its snapshots poll), and 1 again
/// when it has subscribed anew. On SQLite, with no feed to lose, it is 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_change_feed_shows_on_its_gauge_until_it_is_back() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    change_feed_up(&s, 1.0).await;
    if !b.is_postgres() {
        return;
    }
    // The instance's listening connection, cut from the server's side (this
    // test's database only: other tests' instances keep theirs).
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&b.database_url).await.unwrap();
    let cut = sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND query LIKE 'LISTEN%' \
         AND pid <> pg_backend_pid()",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert_eq!(cut.len(), 1, "one listening connection");
    change_feed_up(&s, 0.0).await;
    change_feed_up(&s, 1.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_reach_an_otlp_collector_one_span_per_request_and_per_attempt() {
    let collector = Collector::start().await;
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        opts(&mock).env(
            "SLUICE_OBSERVABILITY__OTLP_ENDPOINT",
            format!("http://{}", collector.addr),
        ),
    )
    .await;
    let (org, key_id, key) = s.org_and_key().await;

    // The client's trace: our request span joins it, the attempts hang under ours.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    mock.script("o1", vec![Step::Status(500)]);
    let a = s
        .call_with(
            &key,
            "/v1/chat/completions",
            &chat("ops-chat", true, "t"),
            &[("traceparent", &format!("00-{trace_id}-{client_span}-01"))],
        )
        .await;
    assert_eq!(a.status, 200);
    let spans = collector.trace(trace_id, 3).await;
    assert_eq!(spans.len(), 3, "{spans:#?}");
    let server: Vec<&Value> = spans.iter().filter(|s| s["kind"] == 2).collect();
    let mut attempts: Vec<&Value> = spans.iter().filter(|s| s["kind"] == 3).collect();
    assert_eq!((server.len(), attempts.len()), (1, 2));
    let req = server[0];
    assert_eq!(req["parentSpanId"], client_span);
    assert_eq!(req["name"], "chat ops-chat");
    assert_eq!(attr(req, "gen_ai.operation.name"), "chat");
    assert_eq!(attr(req, "gen_ai.request.model"), "ops-chat");
    assert_eq!(attr(req, "gen_ai.response.model"), "o2");
    assert_eq!(attr(req, "gen_ai.provider.name"), "azure.ai.openai");
    assert!(attr(req, "gen_ai.usage.input_tokens").as_i64().unwrap() > 0);
    assert!(attr(req, "gen_ai.usage.output_tokens").as_i64().unwrap() > 0);
    assert_eq!(attr(req, "http.response.status_code"), 200);
    assert_eq!(attr(req, "client.address"), "127.0.0.1");
    assert!(attr(req, "client.port").as_i64().unwrap() > 0);
    assert_eq!(attr(req, "sluice.attempts"), "openai:500,azure:ok");
    assert_eq!(attr(req, "sluice.org_id"), org.as_str());
    assert_eq!(attr(req, "sluice.key_id"), key_id.as_str());
    assert_eq!(attr(req, "sluice.stream"), true);
    assert_eq!(req["status"]["code"], 1);
    let start = |s: &Value| {
        s["startTimeUnixNano"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let end = |s: &Value| {
        s["endTimeUnixNano"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    attempts.sort_by_key(|s| start(s));
    for (span, provider, model, outcome) in [
        (attempts[0], "openai", "o1", "http_5xx"),
        (attempts[1], "azure.ai.openai", "o2", "ok"),
    ] {
        assert_eq!(span["parentSpanId"], req["spanId"]);
        assert_eq!(span["name"], format!("chat {model}"));
        assert_eq!(attr(span, "gen_ai.provider.name"), provider);
        assert_eq!(attr(span, "gen_ai.request.model"), model);
        assert_eq!(attr(span, "sluice.attempt.outcome"), outcome);
        assert_eq!(attr(span, "server.address"), "127.0.0.1");
        assert!(start(req) <= start(span) && end(span) <= end(req));
    }
    assert_eq!(attempts[0]["status"]["code"], 2);
    assert_eq!(attempts[1]["status"]["code"], 1);
    // Each provider call carried the trace, with its attempt span as the parent.
    for (model, span) in [("o1", attempts[0]), ("o2", attempts[1])] {
        let sent = mock.requests_for(model).pop().unwrap();
        let want = format!("00-{trace_id}-{}-01", span["spanId"].as_str().unwrap());
        assert_eq!(sent.header("traceparent"), Some(want.as_str()));
    }
    let resource = collector.spans.lock().unwrap()[0].0.clone();
    assert!(
        resource.to_string().contains("\"service.name\""),
        "{resource}"
    );

    // Without a client trace a request starts one; a refusal is an error span.
    let a = s
        .call(
            &key,
            "/v1/chat/completions",
            &chat("ops-restricted", false, "x"),
        )
        .await;
    assert_eq!(a.status, 403, "{}", a.json);
    let a = s.call(&key, "/v1/messages", &messages(false)).await;
    assert_eq!(a.status, 200);
    let mut found = None;
    for _ in 0..400 {
        found = collector
            .spans
            .lock()
            .unwrap()
            .iter()
            .map(|(_, s)| s.clone())
            .find(|s| s["name"] == "chat ops-claude" && s["kind"] == 2);
        if found.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let msg = found.expect("the messages request's span");
    assert!(msg.get("parentSpanId").is_none(), "{msg}");
    let tid = msg["traceId"].as_str().unwrap();
    let all = collector.trace(tid, 2).await;
    let attempt = all.iter().find(|s| s["kind"] == 3).unwrap();
    assert_eq!(attr(attempt, "gen_ai.provider.name"), "anthropic");
    let refused = collector
        .spans
        .lock()
        .unwrap()
        .iter()
        .map(|(_, s)| s.clone())
        .find(|s| s["kind"] == 2 && s["status"]["code"] == 2)
        .expect("the refused request's span");
    assert_eq!(refused["name"], "chat", "no model was granted: {refused}");
    assert_eq!(refused["status"]["code"], 2);
    assert_eq!(attr(&refused, "error.type"), "model_not_granted");
    let text = scrape(&s).await;
    assert!(value(&text, "sluice_trace_spans_total", &[("result", "exported")]) >= 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_one_access_line_per_request_and_no_secret() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let logs = tempfile::NamedTempFile::new().unwrap();
    let o = opts(&mock)
        .env("SLUICE_OBSERVABILITY__LOG_FORMAT", "json")
        .env("SLUICE_SERVER__CLIENT_IP_HEADER", "x-real-ip")
        .env("RUST_LOG", "info");
    let s = Sluice::spawn_with_stderr(
        harness::command(&b, &o),
        &b.database_url,
        Stdio::from(logs.reopen().unwrap()),
    )
    .await;
    let (org, key_id, key) = s.org_and_key().await;

    // A scripted session: whole and streamed answers, a fail-over, a provider
    // refusing the request with its own message, a bad key, a BYOK connection
    // whose secret serves a request, an Idempotency-Key, a refusal by the gates.
    let byok_secret = "sk-byok-org-secret-9f8e7d6c";
    let mut ids = Vec::new();
    let a = s
        .call_with(
            &key,
            "/v1/chat/completions",
            &chat("ops-chat", false, "a"),
            &[
                ("x-request-id", "client-req-42"),
                ("x-real-ip", "203.0.113.7"),
            ],
        )
        .await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.header("x-request-id"),
        "client-req-42",
        "a client's id is kept"
    );
    ids.push(a.header("x-request-id"));
    let a = s
        .call(&key, "/v1/chat/completions", &chat("ops-chat", true, "b"))
        .await;
    assert_eq!(a.status, 200);
    let made = a.header("x-request-id");
    assert_eq!(made.len(), 32, "one is made: {made}");
    ids.push(made);
    let a = s
        .call_with(
            &key,
            "/v1/messages",
            &messages(false),
            &[("x-request-id", "has space{}")],
        )
        .await;
    assert_ne!(
        a.header("x-request-id"),
        "has space{}",
        "an odd id is replaced"
    );
    ids.push(a.header("x-request-id"));
    mock.script("o1", vec![Step::Status(503)]);
    let a = s
        .call(&key, "/v1/chat/completions", &chat("ops-chat", false, "c"))
        .await;
    assert_eq!(a.status, 200);
    ids.push(a.header("x-request-id"));
    mock.script(
        "solo1",
        vec![Step::Reply {
            status: 400,
            retry_after: None,
            body: format!(
                "{{\"error\":{{\"message\":\"Invalid request, key {OPENAI_CREDENTIAL} lacks access\",\"type\":\"invalid_request_error\",\"param\":\"messages\"}}}}"
            ),
        }],
    );
    let a = s
        .call(&key, "/v1/chat/completions", &chat("ops-solo", false, "d"))
        .await;
    assert_eq!(a.status, 400, "{}", a.json);
    assert!(!a.json.to_string().contains(OPENAI_CREDENTIAL));
    ids.push(a.header("x-request-id"));
    let a = s
        .call(
            "sk-not-a-real-key-123456",
            "/v1/chat/completions",
            &chat("ops-chat", false, "e"),
        )
        .await;
    assert_eq!(a.status, 401);
    ids.push(a.header("x-request-id"));
    let (st, c) = s
        .admin(reqwest::Method::GET, &format!("/admin/orgs/{org}"), None)
        .await;
    assert_eq!(st, 200, "{c}");
    let r = s
        .http
        .post(format!(
            "{}/api/orgs/{org}/provider-connections/openai",
            s.gateway
        ))
        .bearer_auth(&key)
        .json(&json!({"setup_alias": "own", "secret": byok_secret,
                      "config": {"base_url": format!("{}/v1", mock.base_url())}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    ids.push(r.headers()["x-request-id"].to_str().unwrap().to_string());
    let conn: Value = r.json().await.unwrap();
    let byok = format!("byok:{}", conn["id"].as_str().unwrap());
    let r = s
        .http
        .put(format!("{}/api/models/ops-chat/waterfall", s.gateway))
        .bearer_auth(&key)
        .json(&json!({"model_provider_ids": [byok, "openai:o1"]}))
        .send()
        .await
        .unwrap();
    ids.push(r.headers()["x-request-id"].to_str().unwrap().to_string());
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let a = s
        .call(&key, "/v1/chat/completions", &chat("ops-chat", false, "f"))
        .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json["provider"], json!(byok));
    assert_eq!(
        mock.requests_for("o1")
            .pop()
            .unwrap()
            .header("authorization"),
        Some(format!("Bearer {byok_secret}").as_str())
    );
    ids.push(a.header("x-request-id"));
    for _ in 0..2 {
        let a = s
            .call_with(
                &key,
                "/v1/chat/completions",
                &chat("ops-chat", false, "g"),
                &[("idempotency-key", "k1")],
            )
            .await;
        ids.push(a.header("x-request-id"));
    }
    let a = s
        .call(
            &key,
            "/v1/chat/completions",
            &chat("ops-restricted", false, "h"),
        )
        .await;
    assert_eq!(a.status, 403);
    ids.push(a.header("x-request-id"));
    let text = flushed(&s).await;
    let gateway_requests = ids.len();

    // The access lines are written when each request ends: wait for all of them.
    let mut lines = Vec::new();
    for _ in 0..200 {
        let all = std::fs::read_to_string(logs.path()).unwrap();
        lines = all.lines().map(str::to_string).collect();
        let access = lines
            .iter()
            .filter(|l| l.contains("\"sluice::access\""))
            .count();
        if access >= gateway_requests {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not a JSON line: {l}")))
        .collect();
    let access: Vec<&Value> = parsed
        .iter()
        .filter(|v| v["target"] == "sluice::access")
        .collect();
    assert_eq!(
        access.len(),
        gateway_requests,
        "one access line per gateway request"
    );
    for id in &ids {
        let line = access
            .iter()
            .find(|v| v["request_id"] == id.as_str())
            .unwrap_or_else(|| panic!("no access line for {id}"));
        for field in [
            "org_id",
            "key_id",
            "model",
            "rung",
            "attempts",
            "status",
            "code",
            "overhead_us",
            "input_tokens",
            "output_tokens",
            "cost_micro_usd",
            "duration_ms",
        ] {
            assert!(line.get(field).is_some(), "{field} in {line}");
        }
    }
    let first = access
        .iter()
        .find(|v| v["request_id"] == "client-req-42")
        .unwrap();
    assert_eq!(first["org_id"], org.as_str());
    assert_eq!(first["key_id"], key_id.as_str());
    assert_eq!(first["model"], "ops-chat");
    assert_eq!(first["rung"], "openai:o1");
    assert_eq!(first["attempts"], "openai:ok");
    assert_eq!(first["status"], 200);
    // The client: the trusted edge header's address when the request has it,
    // else the socket's peer (the test client is local).
    assert_eq!(first["client"], "203.0.113.7");
    assert!(first["input_tokens"].as_u64().unwrap() > 0);
    assert!(first["cost_micro_usd"].as_i64().unwrap() > 0);
    let failover = access
        .iter()
        .find(|v| v["attempts"] == "openai:503,azure:ok")
        .unwrap();
    assert_eq!(failover["rung"], "azure:o2");
    assert_eq!(failover["client"], "127.0.0.1");
    let bad = access.iter().find(|v| v["code"] == "invalid_key").unwrap();
    assert_eq!(
        (bad["status"].as_u64(), bad["key_id"].as_str()),
        (Some(401), Some(""))
    );

    let all = lines.join("\n");
    for secret in [
        key.as_str(),
        "sk-not-a-real-key-123456",
        byok_secret,
        OPENAI_CREDENTIAL,
        AZURE_CREDENTIAL,
        ANTHROPIC_CREDENTIAL,
        ADMIN_TOKEN,
    ] {
        assert!(!all.contains(secret), "{secret} in the logs");
        assert!(!text.contains(secret), "{secret} in /metrics");
    }
    // The key's visible hint is not the key.
    assert!(key.len() > 20);
    assert!(
        !all.contains(&key[key.len() - 12..]),
        "the key's tail in the logs"
    );
}
