//! The platform gates per request: one admission (key guardrails, org tier
//! windows, the live credit balance, in one atomic counters step) and its
//! settlement, timed one request at a time, in-process and against Redis.
//! `cargo bench --bench gate`; Redis runs when `SLUICE_BENCH_REDIS_URL` is set
//! (benches/load starts one). Prints p50 / p99 / mean per request.

use sluice::accounts::keys::KeyRecord;
use sluice::accounts::orgs::OrgRecord;
use sluice::billing::gate::{self, Ask, Used};
use sluice::catalog::model::ModelSpec;
use sluice::config::BillingConfig;
use sluice::store::counters::{Counters, MemoryCounters, RedisCounters};
use std::time::{Duration, Instant};

const MODEL: &str = r#"
slug = "bench-model"
display_name = "bench"
kind = "chat"
context_window = 128000
max_input_tokens = 128000
price = { input = 400000, cached_input = 100000, output = 1600000 }
max_output_tokens = 4096
[[rung]]
provider = "openai"
provider_model_id = "m"
"#;

fn records(n: &str) -> (KeyRecord, OrgRecord) {
    let key = KeyRecord {
        id: format!("key_{n}"),
        org_id: format!("org_{n}"),
        name: None,
        hint: String::new(),
        hash: String::new(),
        daily_spend_cap_micro_usd: Some(1_000_000_000),
        rpm: Some(1_000_000_000),
        tpm: Some(1_000_000_000_000),
        expires_at: None,
        revoked_at: None,
        created_at: 0,
        user_id: None,
    };
    let org = OrgRecord {
        id: format!("org_{n}"),
        name: "bench".into(),
        email: None,
        email_verified: true,
        card_on_file: true,
        settled: true,
        tier: 2,
        balance_micro_usd: 1_000_000_000_000,
        purchased_micro_usd: 0,
        credited_micro_usd: 1_000_000_000_000,
        under_review: false,
        review_reason: None,
        review_for_payment: false,
        credits_overflow: false,
        require_zdr: false,
        prompt_capture: None,
        grants: Default::default(),
        created_at: 0,
    };
    (key, org)
}

async fn run(name: &str, counters: &dyn Counters, n: usize) {
    let model: ModelSpec = toml::from_str(MODEL).expect("model");
    let mut billing = BillingConfig::default();
    // Every window on, none ever reached: the full check, never a refusal.
    let huge = Some(i64::MAX / 4);
    billing.tiers[2] = sluice::config::TierConfig {
        requests_per_minute: huge,
        tokens_per_minute: huge,
        tokens_per_hour: huge,
        tokens_per_day: huge,
    };
    let (key, org) = records(&format!("{name}{}", rand::random::<u32>()));
    // The service seeds balances from the ledger (SeededCounters); here, at once.
    counters
        .seed_balance(
            &format!("bal:{}", org.id),
            org.balance_micro_usd,
            org.credited_micro_usd,
        )
        .await
        .expect("seeded");
    let worst = gate::worst_case(&model.price, 400, 256);
    let ask = Ask {
        key: &key,
        org: &org,
        model: &model,
        worst,
        platform: true,
    };
    let used = Used {
        billed_micro_usd: 150,
        list_micro_usd: 150,
        tokens: 180,
        platform: true,
    };
    let mut admit = Vec::with_capacity(n);
    let mut settle = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let t = Instant::now();
        let a = gate::admit(counters, &billing, &ask)
            .await
            .expect("admitted");
        let admitted = t.elapsed();
        gate::settle(counters, a.hold, used).await;
        if i >= n / 10 {
            admit.push(admitted);
            settle.push(t.elapsed() - admitted);
        }
    }
    report(name, "admit (before the request is sent)", admit);
    report(name, "settle (after the answer is out)", settle);
}

fn report(name: &str, what: &str, mut times: Vec<Duration>) {
    times.sort();
    let pct = |p: f64| times[((times.len() as f64 * p) as usize).min(times.len() - 1)];
    let mean = times.iter().sum::<Duration>() / times.len() as u32;
    println!(
        "gate/{name:<10} p50 {:>8.1?}  p99 {:>8.1?}  mean {:>8.1?}  {what}, {} requests",
        pct(0.50),
        pct(0.99),
        mean,
        times.len()
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        run("in-process", &MemoryCounters::new(), 200_000).await;
        match std::env::var("SLUICE_BENCH_REDIS_URL") {
            Ok(url) if !url.is_empty() => {
                let r = RedisCounters::connect(&url, Duration::from_secs(1))
                    .await
                    .expect("Redis");
                run("redis", &r, 20_000).await;
            }
            _ => println!("gate/redis: set SLUICE_BENCH_REDIS_URL to measure against Redis"),
        }
    });
}
