//! Batch speed (issue 26): a batch of N chat lines against the mock provider.
//!
//! `cargo bench --bench batches` (`CARGO_PROFILE_BENCH_LTO=false` builds it much
//! faster with the same code generation per crate). Knobs: `BATCH_BENCH_N` (lines,
//! default 10000), `BATCH_BENCH_C` (concurrency of the live run and
//! `[batches] concurrency`, default 8), `BATCH_BENCH_DELAY_MS` (the mock's delay
//! before each answer, default 0), `BATCH_BENCH_PROBE_GAP_MS` (the pause between
//! two requests of the c=1 latency probe, default 0: back to back, as a c=1 load
//! generator sends them), `BATCH_BENCH_ROUNDS` (default 3: each round measures
//! the idle latency, the live run and the batch; the medians are printed), `BATCH_BENCH_PIN` (default 1: the gateway on core 0,
//! this process, the mock and the clients on core 1, as benches/load pins them;
//! 0 lets the scheduler place them), `SLUICE_BIN` (another build of the binary,
//! for comparing two builds run after run).
//!
//! Prints: the throughput of N live requests sent at concurrency C, the batch's
//! throughput (create to completed), and the live c=1 p50 added latency (the
//! client's time minus the mock's delay) idle and while the batch runs. Targets:
//! batch throughput within 2x of live; p50 during the batch within 1.5x of idle.

use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn chat(text: &str) -> Value {
    json!({"model": "g-std", "max_tokens": 20, "messages": [{"role": "user", "content": text}]})
}

async fn live_once(http: &reqwest::Client, gw: &str, key: &str) -> Duration {
    live_keyed(http, gw, key, None).await
}

/// One live request, with an Idempotency-Key when given (as each batch line has).
async fn live_keyed(http: &reqwest::Client, gw: &str, key: &str, idem: Option<String>) -> Duration {
    let t = Instant::now();
    let mut req = http
        .post(format!("{gw}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&chat("live"));
    if let Some(k) = idem {
        req = req.header("idempotency-key", k);
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    t.elapsed()
}

/// CPU time (µs) the process has used so far, by thread name.
fn cpu_by_thread(pid: u32) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    let tick = 1e6 / 100.0; // USER_HZ
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let p = t.path();
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(p.join("comm")),
            std::fs::read_to_string(p.join("stat")),
        ) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f.get(11).and_then(|u| u.parse().ok()).unwrap_or(0.0)
            + f.get(12).and_then(|s| s.parse().ok()).unwrap_or(0.0);
        *out.entry(comm.trim().to_string()).or_insert(0.0) += ticks * tick;
    }
    out
}

/// Bytes the process has had written to storage so far (`write_bytes` of
/// /proc/PID/io: the database's log and file, the batch's files). It moves far
/// less than CPU time with the machine's noise (checkpoints fall where they fall).
fn written(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("write_bytes: "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// The CPU each thread group used between two readings, per `n` requests.
fn per_request(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
    n: usize,
) -> String {
    let mut parts: Vec<(String, f64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), (v - before.get(k).unwrap_or(&0.0)) / n as f64))
        .filter(|(_, v)| *v >= 0.5)
        .collect();
    parts.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = parts.iter().map(|p| p.1).sum();
    let each: Vec<String> = parts.iter().map(|(k, v)| format!("{k} {v:.0}")).collect();
    format!("{total:.0} µs ({})", each.join(", "))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn p50(mut v: Vec<Duration>, minus: Duration) -> f64 {
    v.sort();
    v[v.len() / 2].saturating_sub(minus).as_secs_f64() * 1000.0
}

fn main() {
    let n = env_num("BATCH_BENCH_N", 10_000) as usize;
    let c = env_num("BATCH_BENCH_C", 8) as usize;
    let delay = Duration::from_millis(env_num("BATCH_BENCH_DELAY_MS", 0));
    // One core for the instance (its runner, gateway and database threads), one
    // for the mock and the clients: the batch's own work is charged to the
    // instance, as it would be in production.
    let pin = env_num("BATCH_BENCH_PIN", 1) == 1
        && std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    if pin {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; the calls only read it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(1, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mock = rt.block_on(Mock::start());
    if !delay.is_zero() {
        mock.set_default("o1", Step::DelayHeaders(delay));
    }
    mock.set_recording(false);
    let dir = tempfile::tempdir().unwrap();
    // SLUICE_BIN: another build of the binary, to set two builds side by side.
    let bin = std::env::var("SLUICE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_sluice").into());
    let mut cmd = if pin {
        let mut c = Command::new("taskset");
        c.args(["-c", "0", &bin]);
        c
    } else {
        Command::new(&bin)
    };
    let mut child = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        // `BATCH_BENCH_LOG` sets the gateway's RUST_LOG (e.g. `sqlx::query=debug`).
        .env(
            "RUST_LOG",
            std::env::var("BATCH_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .env("SLUICE_SERVER__LISTEN", "127.0.0.1:0")
        .env("SLUICE_SERVER__WEB_LISTEN", "127.0.0.1:0")
        .env("SLUICE_SERVER__OPS_LISTEN", "127.0.0.1:0")
        .env("SLUICE_ADMIN__TOKEN", "bench-admin")
        .env(
            "SLUICE_STORAGE__DATABASE_URL",
            format!("sqlite://{}/s.db", dir.path().display()),
        )
        .env(
            "SLUICE_STORAGE__OBJECTS",
            format!("file://{}/objects", dir.path().display()),
        )
        .env(
            "SLUICE_STORAGE__USAGE_SPOOL",
            dir.path().join("spool.jsonl").display().to_string(),
        )
        .env(
            "SLUICE_SECRETS__KEY_FILE",
            dir.path().join("k").display().to_string(),
        )
        .env(
            "SLUICE_CATALOG__PATH",
            format!("{}/tests/fixtures/gates.toml", env!("CARGO_MANIFEST_DIR")),
        )
        .env(
            "SLUICE_PROVIDERS__OPENAI__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        .env("OPENAI_API_KEY", "sk-bench")
        .env("SLUICE_BATCHES__CONCURRENCY", c.to_string())
        // The rounds send far more than the default 60,000 a minute of one org.
        .env(
            "SLUICE_BILLING__ORG_REQUESTS_PER_MINUTE_ALL_LANES",
            "100000000",
        )
        .env("SLUICE_BATCHES__POLL_MS", "50")
        .arg("serve")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start sluice");
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut addrs = std::collections::HashMap::new();
    let stdout = child.stdout.take().unwrap();
    let pid = child.id();
    let _stop = Stop(child);
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix("listening ") {
            let (name, addr) = rest.split_once(' ').unwrap();
            addrs.insert(name.to_string(), format!("http://{addr}"));
            if addrs.len() == 3 {
                break;
            }
        }
    }
    rt.block_on(async {
        let http = reqwest::Client::new();
        let (gw, ops) = (addrs["gateway"].clone(), addrs["ops"].clone());
        for _ in 0..200 {
            if http.get(format!("{ops}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let org: Value = http.post(format!("{ops}/admin/orgs")).bearer_auth("bench-admin")
            .json(&json!({"name": "bench", "email": "b@bench.test", "email_verified": true,
                          "card_verified": true, "credits_usd": 100000, "tier": 3}))
            .send().await.unwrap().json().await.unwrap();
        let org_id = org["org_id"].as_str().unwrap().to_string();
        let key: Value = http.post(format!("{ops}/admin/orgs/{org_id}/keys")).bearer_auth("bench-admin")
            .json(&json!({})).send().await.unwrap().json().await.unwrap();
        let key = key["api_key"].as_str().unwrap().to_string();

        // Warm-up.
        for _ in 0..50 {
            live_once(&http, &gw, &key).await;
        }
        let gap = Duration::from_millis(env_num("BATCH_BENCH_PROBE_GAP_MS", 0));
        let probe = |http: reqwest::Client, gw: String, key: String| async move {
            let t = live_once(&http, &gw, &key).await;
            tokio::time::sleep(gap).await;
            t
        };

        // N live requests at concurrency C (each with an Idempotency-Key of its own
        // when `keyed`: what a line carried before it was billed by its usage
        // event instead).
        let live = |keyed: bool, round: usize| {
            let (http, gw, key) = (http.clone(), gw.clone(), key.clone());
            async move {
                let t0 = Instant::now();
                let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
                let mut tasks = Vec::new();
                for _ in 0..c {
                    let (http, gw, key, next) = (http.clone(), gw.clone(), key.clone(), next.clone());
                    tasks.push(tokio::spawn(async move {
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if i >= n {
                                break;
                            }
                            let idem = keyed.then(|| format!("bench-{round}-{i}"));
                            live_keyed(&http, &gw, &key, idem).await;
                        }
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
                n as f64 / t0.elapsed().as_secs_f64()
            }
        };
        let keyed_rps = live(true, 0).await;

        // The same requests as a batch file, uploaded once per round.
        let mut data = String::new();
        for i in 0..n {
            data.push_str(&json!({"custom_id": format!("b-{i}"), "method": "POST",
                "url": "/v1/chat/completions", "body": chat("batch")}).to_string());
            data.push('\n');
        }
        let boundary = "bench-boundary-42";
        let mut upload = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"b.jsonl\"\r\n\r\n").into_bytes();
        upload.extend_from_slice(data.as_bytes());
        upload.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());

        // Rounds of: the idle c=1 latency, N live at C, the batch with the c=1
        // probe running beside it. The machine's noise moves single runs by tens
        // of percent; the medians of the rounds are reported.
        let rounds = env_num("BATCH_BENCH_ROUNDS", 3).max(1) as usize;
        let (mut idles, mut lives, mut batches, mut durings, mut creates) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut probes = 0;
        for round in 1..=rounds {
            let mut idle = Vec::new();
            for _ in 0..300 {
                idle.push(probe(http.clone(), gw.clone(), key.clone()).await);
            }
            idles.push(p50(idle, delay));
            let (cpu0, w0) = (cpu_by_thread(pid), written(pid));
            lives.push(live(false, round).await);
            let live_cpu = per_request(&cpu0, &cpu_by_thread(pid), n);
            let live_kb = (written(pid) - w0) / n as f64 / 1024.0;
            let f: Value = http.post(format!("{gw}/v1/files")).bearer_auth(&key)
                .header("content-type", format!("multipart/form-data; boundary={boundary}"))
                .body(upload.clone()).send().await.unwrap().json().await.unwrap();
            let (cpu1, w1) = (cpu_by_thread(pid), written(pid));
            let t1 = Instant::now();
            let b: Value = http.post(format!("{gw}/v1/batches")).bearer_auth(&key)
                .json(&json!({"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}))
                .send().await.unwrap().json().await.unwrap();
            creates.push(t1.elapsed().as_secs_f64());
            assert_eq!(b["status"], "in_progress", "{b}");
            let id = b["id"].as_str().unwrap().to_string();
            let mut during = Vec::new();
            let done = loop {
                for _ in 0..20 {
                    during.push(probe(http.clone(), gw.clone(), key.clone()).await);
                }
                let v: Value = http.get(format!("{gw}/v1/batches/{id}")).bearer_auth(&key)
                    .send().await.unwrap().json().await.unwrap();
                if v["status"] != "in_progress" && v["status"] != "finalizing" {
                    break v;
                }
            };
            let took = t1.elapsed();
            let batch_cpu = per_request(&cpu1, &cpu_by_thread(pid), n);
            let batch_kb = (written(pid) - w1) / n as f64 / 1024.0;
            assert_eq!(done["status"], "completed", "{done}");
            assert_eq!(done["request_counts"]["completed"], n, "{done}");
            batches.push(n as f64 / took.as_secs_f64());
            probes += during.len();
            durings.push(p50(during, delay));
            eprintln!(
                "round {round}: live {:.0} req/s, batch {:.0} lines/s; c=1 p50 idle {:.3} ms, during {:.3} ms",
                lives[round - 1], batches[round - 1], idles[round - 1], durings[round - 1]
            );
            // The instance's CPU (its threads' user + system time): what a request
            // costs it live, and what a line costs it (the c=1 probe's requests
            // during the batch included).
            eprintln!("  instance CPU per live request: {live_cpu}");
            eprintln!("  instance CPU per batch line:   {batch_cpu}");
            eprintln!("  written to storage: {live_kb:.2} KB per live request, {batch_kb:.2} KB per batch line");
        }
        // Each round's own ratio: live and batch run back to back, so a slow spell
        // of the machine weighs on both alike.
        let paired = median(lives.iter().zip(&batches).map(|(l, b)| l / b).collect());
        let (idle_p50, live_rps, batch_rps, during_p50, created) = (
            median(idles),
            median(lives),
            median(batches),
            median(durings),
            median(creates),
        );
        println!(
            "batch of {n} chat lines, concurrency {c}, mock delay {} ms, medians of {rounds} rounds:",
            delay.as_millis()
        );
        println!("  live throughput at c={c}: {live_rps:.0} req/s");
        println!(
            "  live throughput at c={c}, each with an Idempotency-Key (one run): {keyed_rps:.0} req/s (batch: {:.2}x of it)",
            keyed_rps / batch_rps
        );
        println!(
            "  batch throughput (create {created:.2} s incl. checking and storing lines, to completed): {batch_rps:.0} lines/s ({:.2}x of live; target <= 2x)",
            live_rps / batch_rps
        );
        println!("  batch throughput, each round's live ÷ batch: median {paired:.2}x");
        println!(
            "  live c=1 p50 added latency: idle {idle_p50:.2} ms, during the batch {during_p50:.2} ms over {probes} requests ({:.2}x; target <= 1.5x)",
            during_p50 / idle_p50
        );
    });
}
