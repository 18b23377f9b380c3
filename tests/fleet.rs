//! Shared state under faults (issue 29), as an operator runs it: three instances on
//! one PostgreSQL and one Redis under a steady, bounded load (chat whole and
//! streamed; a key with a daily spend cap; a low-balance org; Idempotency-Key
//! retries sent to another instance), with one fault at a time: Redis killed and
//! back empty, PostgreSQL away, an instance killed mid-stream, and PostgreSQL away
//! with an instance killed during it. Then the reconciliation: every whole 200
//! answer billed exactly once, no request open past its bound, every error in
//! SPEC.md's envelope, the capped key and the low-balance org within the bounds
//! docs/decisions.md states, the ledger and the balances agreeing, every instance
//! ready again within seconds of each heal.
//!
//! The faults are played by TCP proxies in front of the stores (`FaultProxy`: a
//! cut resets every connection and refuses new ones, as a killed server does) and
//! by this test's own Redis server, emptied while it is cut off. Runs on the
//! PostgreSQL + Redis pass (`SLUICE_TEST_DATABASE_URL`, `SLUICE_TEST_REDIS_URL`).

mod harness;

use harness::fleet::{
    event_count, flush_redis, host_port, key_cost, ok_events, only_key, org_balance, org_cost,
    start_redis, via, Fleet,
};
use harness::{repo_path, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sluice_mock::fault_proxy::FaultProxy;
use sluice_mock::{Mock, Step};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A client gives up on a request after this; none may come near it.
const CLIENT_BOUND: Duration = Duration::from_secs(20);
/// The daily cap of the capped key, and the credits of the low-balance org.
const CAP_MICRO: i64 = 3_000;
const LOW_CREDITS_MICRO: i64 = 3_000;
/// The worst case one request reserves (`max_tokens` 100 at the fixture's prices,
/// plus the prompt): the unit of the stated bounds.
const MAX_TOKENS: u64 = 100;

/// The load's phases: steady, then one fault at a time (with its heal and a
/// little after).
const PHASES: [&str; 5] = [
    "steady",
    "redis killed, back empty",
    "postgres away 5 s",
    "instance killed mid-stream",
    "postgres away, instance killed",
];

/// What one request got.
#[derive(Debug, Clone)]
struct Outcome {
    /// The fault phase the request started in (see `PHASES`), and when.
    phase: usize,
    at: Duration,
    key: usize,
    idem: Option<String>,
    status: u16,
    whole: bool,
    code: Option<String>,
    took: Duration,
    timed_out: bool,
}

fn chat(stream: bool) -> Value {
    json!({"model": "ops-chat", "stream": stream, "max_tokens": MAX_TOKENS,
           "messages": [{"role": "user", "content": "Say hello"}]})
}

/// One request: the whole answer read, its shape judged.
async fn send(
    http: &reqwest::Client,
    gw: &str,
    key: &str,
    idem: Option<&str>,
    stream: bool,
) -> (u16, bool, Option<String>, bool) {
    let mut rb = http
        .post(format!("http://{gw}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat(stream));
    if let Some(k) = idem {
        rb = rb.header("Idempotency-Key", k);
    }
    let r = match tokio::time::timeout(CLIENT_BOUND, rb.send()).await {
        Err(_) => return (0, false, None, true),
        Ok(Err(_)) => return (0, false, None, false),
        Ok(Ok(r)) => r,
    };
    let status = r.status().as_u16();
    let body = match tokio::time::timeout(CLIENT_BOUND, r.bytes()).await {
        Err(_) => return (status, false, None, true),
        Ok(Err(_)) => return (status, false, None, false),
        Ok(Ok(b)) => String::from_utf8_lossy(&b).to_string(),
    };
    if status != 200 {
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let code = v["error"]["code"].as_str().map(str::to_string);
        assert!(
            code.is_some(),
            "an error answer in SPEC.md's envelope: {status} {body}"
        );
        return (status, false, code, false);
    }
    let whole = if stream {
        body.trim_end().ends_with("data: [DONE]") && !body.contains("\"error\"")
    } else {
        serde_json::from_str::<Value>(&body).is_ok_and(|v| v["choices"][0]["message"].is_object())
    };
    (status, whole, None, false)
}

/// The two tests of this file run one at a time: each runs three instances, and
/// beside the other's store outages a burst on a 2-core machine saw its calls
/// time out (`unavailable_route`), which is not what either test measures.
static ONE_FLEET: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_ride_out_store_faults_and_bill_every_answer_once() {
    let _one = ONE_FLEET.lock().await;
    let (Ok(pg), Ok(_)) = (
        std::env::var("SLUICE_TEST_DATABASE_URL"),
        std::env::var("SLUICE_TEST_REDIS_URL"),
    ) else {
        eprintln!("fleet fault test: runs on the PostgreSQL + Redis pass only");
        return;
    };
    let _ = pg;
    let redis_dir = tempfile::tempdir().unwrap();
    let redis = start_redis(redis_dir.path());
    let redis_proxy = FaultProxy::start(&format!("127.0.0.1:{}", redis.1)).await;
    let backend = Backend::fresh().await;
    let pg_proxy = FaultProxy::start(&host_port(&backend.database_url)).await;
    let mut fleet = Fleet {
        db_url: via(&backend.database_url, pg_proxy.addr()),
        redis_url: format!("redis://{}/", redis_proxy.addr()),
        backend,
        mock: Mock::start().await,
        dirs: (0..3).map(|_| tempfile::tempdir().unwrap()).collect(),
        instances: vec![None, None, None],
    };
    for i in 0..3 {
        fleet.start(i).await;
    }
    let a = fleet.instances[0].as_ref().unwrap();
    let (org, plain_id, plain_key) = a.org_and_key().await;
    let (st, k) = a
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org}/keys"),
            Some(json!({"name": "capped", "daily_spend_cap_usd": CAP_MICRO as f64 / 1e6})),
        )
        .await;
    assert_eq!(st, 201, "{k}");
    let capped_key = k["api_key"].as_str().unwrap().to_string();
    let capped_id = k["api_key_id"].as_str().unwrap().to_string();
    let (low_org, low_key) = a
        .org_with(
            json!({"name": "low", "email_verified": true, "card_verified": true,
                          "credits_usd": LOW_CREDITS_MICRO as f64 / 1e6, "tier": 3}),
        )
        .await;
    let keys = [plain_key.clone(), capped_key.clone(), low_key.clone()];
    for s in fleet.live() {
        for k in &keys {
            s.wait_for_key(k).await;
        }
    }
    let start_balance = org_balance(&fleet.backend.database_url, &org).await;

    // The load: four workers, round robin over the live instances; the plain key's
    // requests carry an Idempotency-Key and are sent again to the next instance.
    let gateways: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(
        fleet
            .live()
            .iter()
            .map(|s| s.gateway.replace("http://", ""))
            .collect(),
    ));
    let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let seq = Arc::new(AtomicUsize::new(0));
    let phase = Arc::new(AtomicUsize::new(0));
    let began = Instant::now();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut workers = Vec::new();
    for w in 0..4usize {
        let (gateways, outcomes, stop, seq, http, keys, phase) = (
            gateways.clone(),
            outcomes.clone(),
            stop.clone(),
            seq.clone(),
            http.clone(),
            keys.clone(),
            phase.clone(),
        );
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let n = seq.fetch_add(1, Ordering::SeqCst);
                let key = n % 3;
                let stream = (n / 3 + w) % 2 == 0;
                let gws = gateways.lock().unwrap().clone();
                let idem = (key == 0).then(|| format!("fleet-{n}"));
                let mut tries = vec![gws[n % gws.len()].clone()];
                if idem.is_some() {
                    tries.push(gws[(n + 1) % gws.len()].clone());
                }
                for gw in tries {
                    let t = Instant::now();
                    let (at, p) = (began.elapsed(), phase.load(Ordering::SeqCst));
                    let (status, whole, code, timed_out) =
                        send(&http, &gw, &keys[key], idem.as_deref(), stream).await;
                    outcomes.lock().unwrap().push(Outcome {
                        phase: p,
                        at,
                        key,
                        idem: idem.clone(),
                        status,
                        whole,
                        code,
                        took: t.elapsed(),
                        timed_out,
                    });
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    let set_gateways = |fleet: &Fleet| {
        *gateways.lock().unwrap() = fleet
            .live()
            .iter()
            .map(|s| s.gateway.replace("http://", ""))
            .collect();
    };
    let mut figures: BTreeMap<&str, String> = BTreeMap::new();

    // Steady.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 1. Redis killed and back empty after 3 s.
    phase.store(1, Ordering::SeqCst);
    redis_proxy.cut();
    flush_redis(redis.1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    redis_proxy.heal();
    let t = fleet.ready_within("Redis came back").await;
    figures.insert("redis: ready after heal (s)", format!("{t:.2}"));
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 2. PostgreSQL away for 5 s.
    phase.store(2, Ordering::SeqCst);
    pg_proxy.cut();
    tokio::time::sleep(Duration::from_secs(5)).await;
    pg_proxy.heal();
    let t = fleet.ready_within("PostgreSQL came back").await;
    figures.insert("postgres: ready after heal (s)", format!("{t:.2}"));
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 3. An instance killed mid-stream, then started again on its own disk.
    phase.store(3, Ordering::SeqCst);
    fleet.mock.script(
        "solo1",
        vec![Step::SlowChunks {
            n: 40,
            every: Duration::from_millis(100),
        }],
    );
    let victim = fleet.instances[2].as_ref().unwrap();
    let mut r = victim
        .http
        .post(format!("{}/v1/chat/completions", victim.gateway))
        .bearer_auth(&plain_key)
        .json(
            &json!({"model": "ops-solo", "stream": true, "max_tokens": MAX_TOKENS,
                      "messages": [{"role": "user", "content": "long"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut got = String::new();
    while !got.contains("\"content\":\"") {
        let c = r.chunk().await.unwrap().expect("a first chunk");
        got.push_str(&String::from_utf8_lossy(&c));
    }
    fleet.kill(2);
    set_gateways(&fleet);
    let cut = loop {
        match r.chunk().await {
            Ok(Some(c)) => got.push_str(&String::from_utf8_lossy(&c)),
            Ok(None) => break !got.contains("[DONE]"),
            Err(_) => break true,
        }
    };
    assert!(cut, "the killed instance's stream did not finish");
    fleet.start(2).await;
    set_gateways(&fleet);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 4. PostgreSQL away, and an instance killed during it.
    phase.store(4, Ordering::SeqCst);
    pg_proxy.cut();
    tokio::time::sleep(Duration::from_secs(2)).await;
    fleet.kill(1);
    set_gateways(&fleet);
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg_proxy.heal();
    fleet.start(1).await;
    set_gateways(&fleet);
    let t = fleet
        .ready_within("PostgreSQL came back with an instance restarted")
        .await;
    figures.insert("postgres+kill: ready after heal (s)", format!("{t:.2}"));
    tokio::time::sleep(Duration::from_secs(2)).await;

    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    let outcomes = outcomes.lock().unwrap().clone();

    // No request came near the client's bound; every error used the envelope
    // (checked as they came) and a documented status.
    let slowest = outcomes.iter().map(|o| o.took).max().unwrap();
    figures.insert("requests", outcomes.len().to_string());
    figures.insert(
        "slowest request (s)",
        format!("{:.2}", slowest.as_secs_f64()),
    );
    assert!(outcomes.iter().all(|o| !o.timed_out), "a request hung");
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| o.status != 200) {
        *errors
            .entry(format!(
                "{} {}",
                o.status,
                o.code.clone().unwrap_or_default()
            ))
            .or_default() += 1;
    }
    figures.insert("error answers", format!("{errors:?}"));
    for o in &outcomes {
        assert_ne!(o.status, 500, "no internal_error: {o:?}");
    }
    // Per fault: the requests that got no answer from the service (503, or a
    // connection cut by a kill), and the span from the first to the last of them.
    for (i, name) in PHASES.iter().enumerate() {
        let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.phase == i).collect();
        let failed: Vec<&Outcome> = of
            .iter()
            .copied()
            .filter(|o| o.status == 0 || o.status == 503)
            .collect();
        let span = match (failed.first(), failed.last()) {
            (Some(a), Some(b)) => (b.at + b.took).saturating_sub(a.at).as_secs_f64(),
            _ => 0.0,
        };
        figures.insert(
            name,
            format!(
                "{} requests, {} unanswered (503 or cut) over {span:.2} s",
                of.len(),
                failed.len()
            ),
        );
    }

    // The usage reaches the ledger: wait until it stops changing.
    let db = &fleet.backend.database_url;
    let mut last = (-1, -1);
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = (event_count(db).await, org_balance(db, &org).await);
        if now == last {
            break;
        }
        last = now;
    }

    // Every whole 200 answer is billed exactly once: per idempotency key one event
    // however many instances answered it, and per other key one event per answer.
    let whole_idem: HashSet<&str> = outcomes
        .iter()
        .filter(|o| o.key == 0 && o.whole)
        .filter_map(|o| o.idem.as_deref())
        .collect();
    let served = |k: usize| outcomes.iter().filter(|o| o.key == k && o.whole).count() as i64;
    let billed_plain = ok_events(db, &plain_id, "ops-chat").await;
    let billed_capped = ok_events(db, &capped_id, "ops-chat").await;
    let low_id = only_key(db, &low_org).await;
    let billed_low = ok_events(db, &low_id, "ops-chat").await;
    figures.insert(
        "whole answers / billed (idempotent, capped, low)",
        format!(
            "{}/{billed_plain}, {}/{billed_capped}, {}/{billed_low}",
            whole_idem.len(),
            served(1),
            served(2)
        ),
    );
    assert_eq!(billed_plain, whole_idem.len() as i64, "{figures:#?}");
    assert_eq!(billed_capped, served(1), "{figures:#?}");
    assert_eq!(billed_low, served(2), "{figures:#?}");

    // The ledger and the balances agree, to the micro-dollar.
    for (o, credits) in [(&org, start_balance), (&low_org, LOW_CREDITS_MICRO)] {
        let spent = org_cost(db, o).await;
        let balance = org_balance(db, o).await;
        assert_eq!(balance, credits - spent, "balance = credits - cost ({o})");
    }

    // The capped key and the low-balance org within the stated bounds: one
    // request's worst case per instance past the line.
    let worst = worst_case_micro();
    let capped_spent = key_cost(db, &capped_id).await;
    let low_balance = org_balance(db, &low_org).await;
    figures.insert(
        "capped key: spent / cap (micro-USD)",
        format!("{capped_spent} / {CAP_MICRO}"),
    );
    figures.insert(
        "low-balance org: balance (micro-USD)",
        low_balance.to_string(),
    );
    eprintln!("fleet figures: {figures:#?}");
    assert!(capped_spent <= CAP_MICRO + 3 * worst, "{figures:#?}");
    assert!(low_balance >= -3 * worst, "{figures:#?}");
    assert!(
        served(1) > 0 && served(2) > 0,
        "the capped and low keys were served"
    );
    drop(redis);
}

/// One request's worst-case reservation at the fixture's prices: `max_tokens` of
/// output at 2 USD per million, and a prompt of at most 100 tokens at 1.
fn worst_case_micro() -> i64 {
    (MAX_TOKENS as i64) * 2 + 100
}

/// Issue 22's bound, on three instances over one Redis: leases are taken inside
/// each limit, so however the requests spread, a key's requests per minute and its
/// daily spend never pass the limit; and once a key is at its limit every
/// instance refuses it within one lease period (`leased::IDLE`, 1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leased_limits_hold_across_three_instances() {
    let _one = ONE_FLEET.lock().await;
    if std::env::var("SLUICE_TEST_REDIS_URL").is_err() {
        eprintln!("leased limits: runs on the PostgreSQL + Redis pass only");
        return;
    }
    let backend = Backend::fresh().await;
    let mock = Mock::start().await;
    let base = mock.base_url();
    let opts = Opts::default()
        .catalog(repo_path("tests/fixtures/ops.toml"))
        .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
        .env("SLUICE_PROVIDERS__AZURE__BASE_URL", &base)
        .env("OPENAI_API_KEY", "sk-platform-openai")
        .env("AZURE_OPENAI_API_KEY", "az-platform")
        // The bursts below send 3 x RPM requests at once, past the key's default
        // of 64 in flight: on a loaded machine enough of them could overlap to get a
        // 429 key_concurrency, which this test does not measure.
        .env("SLUICE_BILLING__KEY_DEFAULTS__CONCURRENCY", 0);
    let mut fleet = Vec::new();
    for _ in 0..3 {
        fleet.push(Sluice::start(&backend, opts.clone()).await);
    }
    let (org, _, _) = fleet[0].org_and_key().await;
    let mut key = |body: Value| {
        let s = &fleet[0];
        let org = org.clone();
        async move {
            let (st, k) = s
                .admin(
                    reqwest::Method::POST,
                    &format!("/admin/orgs/{org}/keys"),
                    Some(body),
                )
                .await;
            assert_eq!(st, 201, "{k}");
            (
                k["api_key"].as_str().unwrap().to_string(),
                k["api_key_id"].as_str().unwrap().to_string(),
            )
        }
    };
    const RPM: usize = 40;
    let (rpm_key, _) = key(json!({"name": "rpm", "rpm": RPM})).await;
    let (cap_key, cap_id) =
        key(json!({"name": "cap", "daily_spend_cap_usd": CAP_MICRO as f64 / 1e6})).await;
    let _ = &mut key;
    for s in &fleet {
        s.wait_for_key(&rpm_key).await;
        s.wait_for_key(&cap_key).await;
    }
    // One minute window for the whole burst: start early in a minute.
    let into_minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 60;
    if into_minute > 40 {
        tokio::time::sleep(Duration::from_secs(61 - into_minute)).await;
    }
    let http = reqwest::Client::new();
    let burst = |key: String, n: usize| {
        let gws: Vec<String> = fleet
            .iter()
            .map(|s| s.gateway.replace("http://", ""))
            .collect();
        let http = http.clone();
        async move {
            let mut tasks = Vec::new();
            for i in 0..n {
                let (http, gw, key) = (http.clone(), gws[i % 3].clone(), key.clone());
                tasks.push(tokio::spawn(async move {
                    send(&http, &gw, &key, None, i % 2 == 0).await
                }));
            }
            let mut statuses = Vec::new();
            for t in tasks {
                let (status, _, code, _) = t.await.unwrap();
                statuses.push((status, code));
            }
            statuses
        }
    };
    // Bursts from three instances at once until the minute's requests are spent
    // (a block another instance holds unused goes back within a lease period).
    let mut admitted = 0;
    for _ in 0..8 {
        let got = burst(rpm_key.clone(), 3 * RPM).await;
        let codes: HashSet<(u16, Option<String>)> = got.iter().cloned().collect();
        assert!(
            got.iter().all(
                |(s, c)| *s == 200 || (*s == 429 && c.as_deref() == Some("insufficient_quota"))
            ),
            "{codes:?}"
        );
        admitted += got.iter().filter(|(s, _)| *s == 200).count();
        assert!(admitted <= RPM, "{admitted} admitted past an rpm of {RPM}");
        if admitted == RPM {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1_100)).await;
    }
    assert_eq!(
        admitted, RPM,
        "the minute's requests were never all admitted"
    );
    // At the limit, every instance refuses.
    let more = burst(rpm_key.clone(), 6).await;
    assert!(more.iter().all(|(s, _)| *s == 429), "{more:?}");

    // The daily spend cap, spent from three instances at once.
    let mut spent_out = false;
    for _ in 0..20 {
        let got = burst(cap_key.clone(), 24).await;
        if got.iter().all(|(s, _)| *s == 429) {
            spent_out = true;
            break;
        }
    }
    assert!(spent_out, "the capped key was never refused everywhere");
    let db = &backend.database_url;
    let mut spent = 0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        spent = key_cost(db, &cap_id).await;
    }
    eprintln!("leased limits: {admitted}/{RPM} rpm admitted, {spent}/{CAP_MICRO} micro-USD spent");
    assert!(
        spent <= CAP_MICRO,
        "{spent} spent past a cap of {CAP_MICRO}"
    );
    assert!(spent > CAP_MICRO / 2, "{spent} of {CAP_MICRO}");
}

/// What one paced request got.
#[derive(Debug, Clone)]
struct Paced {
    window: usize,
    key: usize,
    status: u16,
    code: Option<String>,
    whole: bool,
}

/// The windows of the outage run: each outage with the minute after its heal.
const OUTAGES: [(&str, u64); 3] = [
    ("redis away 10 s, back empty", 10),
    ("postgres away 15 s", 15),
    ("postgres away 25 s", 25),
];
/// How long each heal is watched.
const AFTER_HEAL: Duration = Duration::from_secs(60);
/// The paced load, and the requests it may have open at once.
const RATE: u64 = 150;
const SLOTS: usize = 64;
/// The capped key's daily cap and the low org's credits: each is reached during
/// the first outage (a quarter of the load at about 20 micro-USD a request).
const CAP2_MICRO: i64 = 6_000;

/// Issue 52: what clients see while a store is away. Three instances at 150
/// requests a second (a quarter of them on a capped key, a quarter on an org with
/// little credit) through Redis away 10 s and back empty, PostgreSQL away 15 s
/// and 25 s: at most 2% of requests fail in each outage and the minute after its
/// heal (a cap or the credit refusing, 429 `insufficient_quota`, is no failure),
/// nothing piles up (the load never waits for a free slot), every whole answer is
/// billed once, and the cap and the credit are overspent by at most 10%.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_serve_through_store_outages_at_150_requests_a_second() {
    let _one = ONE_FLEET.lock().await;
    if std::env::var("SLUICE_TEST_DATABASE_URL").is_err()
        || std::env::var("SLUICE_TEST_REDIS_URL").is_err()
    {
        eprintln!("outage run: runs on the PostgreSQL + Redis pass only");
        return;
    }
    let redis_dir = tempfile::tempdir().unwrap();
    let redis = start_redis(redis_dir.path());
    let redis_proxy = FaultProxy::start(&format!("127.0.0.1:{}", redis.1)).await;
    let backend = Backend::fresh().await;
    let pg_proxy = FaultProxy::start(&host_port(&backend.database_url)).await;
    let mut fleet = Fleet {
        db_url: via(&backend.database_url, pg_proxy.addr()),
        redis_url: format!("redis://{}/", redis_proxy.addr()),
        backend,
        mock: Mock::start().await,
        dirs: (0..3).map(|_| tempfile::tempdir().unwrap()).collect(),
        instances: vec![None, None, None],
    };
    for i in 0..3 {
        fleet.start(i).await;
    }
    let a = fleet.instances[0].as_ref().unwrap();
    let (org, plain_id, plain_key) = a.org_and_key().await;
    let (st, k) = a
        .admin(
            reqwest::Method::POST,
            &format!("/admin/orgs/{org}/keys"),
            Some(json!({"name": "capped", "daily_spend_cap_usd": CAP2_MICRO as f64 / 1e6})),
        )
        .await;
    assert_eq!(st, 201, "{k}");
    let capped_key = k["api_key"].as_str().unwrap().to_string();
    let capped_id = k["api_key_id"].as_str().unwrap().to_string();
    let (low_org, low_key) = a
        .org_with(
            json!({"name": "low", "email_verified": true, "card_verified": true,
                          "credits_usd": CAP2_MICRO as f64 / 1e6, "tier": 3}),
        )
        .await;
    // Half the load on the plain key, a quarter each on the capped and low ones.
    let keys = [
        plain_key.clone(),
        plain_key.clone(),
        capped_key.clone(),
        low_key.clone(),
    ];
    for s in fleet.live() {
        for k in &keys {
            s.wait_for_key(k).await;
        }
    }
    let gateways: Vec<String> = fleet
        .live()
        .iter()
        .map(|s| s.gateway.replace("http://", ""))
        .collect();
    let outcomes: Arc<Mutex<Vec<Paced>>> = Arc::default();
    let window = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let no_slot = Arc::new(AtomicUsize::new(0));
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    let pacer = {
        let (outcomes, window, stop, no_slot) = (
            outcomes.clone(),
            window.clone(),
            stop.clone(),
            no_slot.clone(),
        );
        let keys = keys.clone();
        tokio::spawn(async move {
            let slots = Arc::new(tokio::sync::Semaphore::new(SLOTS));
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut running = Vec::new();
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    no_slot.fetch_add(1, Ordering::SeqCst);
                    continue;
                };
                let (key, gw) = (n % keys.len(), gateways[n % gateways.len()].clone());
                let stream = (n / keys.len()).is_multiple_of(2);
                let (http, keys, outcomes, w) = (
                    http.clone(),
                    keys.clone(),
                    outcomes.clone(),
                    window.load(Ordering::SeqCst),
                );
                n += 1;
                running.push(tokio::spawn(async move {
                    let (status, whole, code, _) = send(&http, &gw, &keys[key], None, stream).await;
                    drop(slot);
                    outcomes.lock().unwrap().push(Paced {
                        window: w,
                        key,
                        status,
                        code,
                        whole,
                    });
                }));
            }
            for r in running {
                let _ = r.await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut figures: BTreeMap<String, String> = BTreeMap::new();
    for (i, (name, secs)) in OUTAGES.iter().enumerate() {
        window.store(i + 1, Ordering::SeqCst);
        if i == 0 {
            redis_proxy.cut();
            flush_redis(redis.1);
        } else {
            pg_proxy.cut();
        }
        // Readiness tells the truth: every instance serves, so it is ready, and its
        // body names the store that does not answer; it answers within a second.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let store = if i == 0 { "counters" } else { "database" };
        for (st, body, took) in fleet.readiness().await {
            assert_eq!(st, 200, "{name}: {body}");
            assert_eq!(body[store], false, "{name}: {body}");
            assert!(
                took < Duration::from_secs(1),
                "{name}: /readyz took {took:?}"
            );
        }
        tokio::time::sleep(Duration::from_secs(*secs - 3)).await;
        redis_proxy.heal();
        pg_proxy.heal();
        let t = fleet.ready_within(name).await;
        figures.insert(format!("{name}: ready after heal (s)"), format!("{t:.2}"));
        tokio::time::sleep(AFTER_HEAL).await;
    }
    stop.store(true, Ordering::SeqCst);
    pacer.await.unwrap();
    let outcomes = outcomes.lock().unwrap().clone();

    // A failure: no answer, a 5xx, or a refusal other than a cap or the credit
    // doing their job.
    let failed = |o: &Paced| {
        let refused_by_money = o.status == 429 && o.code.as_deref() == Some("insufficient_quota");
        let served = o.status == 200 && o.whole;
        !(served || refused_by_money)
    };
    let mut shares = Vec::new();
    for (i, (name, _)) in OUTAGES.iter().enumerate() {
        let of: Vec<&Paced> = outcomes.iter().filter(|o| o.window == i + 1).collect();
        let bad: Vec<&Paced> = of.iter().copied().filter(|o| failed(o)).collect();
        let mut codes: BTreeMap<String, usize> = BTreeMap::new();
        for o in &bad {
            *codes
                .entry(format!(
                    "{} {}",
                    o.status,
                    o.code.clone().unwrap_or_default()
                ))
                .or_default() += 1;
        }
        let share = bad.len() as f64 / of.len().max(1) as f64;
        figures.insert(
            format!("{name} and the minute after"),
            format!(
                "{} requests, {} failed ({:.2}%): {codes:?}",
                of.len(),
                bad.len(),
                share * 100.0
            ),
        );
        shares.push(share);
    }
    let waited = no_slot.load(Ordering::SeqCst);
    figures.insert("no free slot (of 64)".into(), waited.to_string());

    // The usage reaches the ledger.
    let db = &fleet.backend.database_url;
    let mut last = (-1, -1);
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = (event_count(db).await, org_balance(db, &org).await);
        if now == last {
            break;
        }
        last = now;
    }
    let served = |ks: &[usize]| {
        outcomes
            .iter()
            .filter(|o| ks.contains(&o.key) && o.status == 200 && o.whole)
            .count() as i64
    };
    let low_id = only_key(db, &low_org).await;
    let billed = (
        ok_events(db, &plain_id, "ops-chat").await,
        ok_events(db, &capped_id, "ops-chat").await,
        ok_events(db, &low_id, "ops-chat").await,
    );
    figures.insert(
        "whole answers / billed (plain, capped, low)".into(),
        format!(
            "{}/{}, {}/{}, {}/{}",
            served(&[0, 1]),
            billed.0,
            served(&[2]),
            billed.1,
            served(&[3]),
            billed.2
        ),
    );
    let capped_spent = key_cost(db, &capped_id).await;
    let low_balance = org_balance(db, &low_org).await;
    figures.insert(
        "capped key: spent / cap (micro-USD)".into(),
        format!("{capped_spent} / {CAP2_MICRO}"),
    );
    figures.insert(
        "low org: balance of its credits (micro-USD)".into(),
        format!("{low_balance} of {CAP2_MICRO}"),
    );
    eprintln!("outage figures: {figures:#?}");
    for s in &shares {
        assert!(*s <= 0.02, "{figures:#?}");
    }
    assert_eq!(waited, 0, "requests piled up: {figures:#?}");
    assert_eq!(billed.0, served(&[0, 1]), "{figures:#?}");
    assert_eq!(billed.1, served(&[2]), "{figures:#?}");
    assert_eq!(billed.2, served(&[3]), "{figures:#?}");
    assert!(capped_spent * 10 <= CAP2_MICRO * 11, "{figures:#?}");
    assert!(low_balance * 10 >= -CAP2_MICRO, "{figures:#?}");
    assert!(
        capped_spent * 10 >= CAP2_MICRO * 9,
        "the cap was reached: {figures:#?}"
    );
    // Every org's ledger and balance agree.
    for o in [&org, &low_org] {
        let spent = org_cost(db, o).await;
        let balance = org_balance(db, o).await;
        let credits = if o == &low_org {
            CAP2_MICRO
        } else {
            balance + spent
        };
        assert_eq!(balance, credits - spent, "{o}");
    }
    drop(redis);
}
