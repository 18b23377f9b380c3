//! Telemetry intake speed (issue 25): the memory a 50 MB signed upload holds in the
//! gateway, and the time to project a 50 MB OTLP export.
//!
//! `cargo bench --bench telemetry` (the bench profile; `CARGO_PROFILE_BENCH_LTO=false`
//! builds it much faster with the same code generation per crate). The upload part
//! starts a real `sluice serve` (SQLite, objects on disk), reads its resident set
//! when idle (after a warm-up upload), resets the peak (`/proc/PID/clear_refs`),
//! streams 50 MB to a signed URL and reads the peak again: the figure is the peak
//! above idle. Then, on the same gateway, a 50 MB OTLP export is uploaded and
//! finalized, and the time until the worker reports it done (verify, project,
//! store) is printed. The projection alone is a criterion bench of
//! `sources::project(otlp, 50 MB)` on one thread, as the worker runs it.

use criterion::Criterion;
use serde_json::{json, Value};
use sluice::telemetry::model::SourceKind;
use sluice::telemetry::sources;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MB: usize = 1024 * 1024;

/// A realistic OTLP/JSON export (one `ExportTraceServiceRequest` per line, as the
/// collector's file exporter writes): agent traces of a root and two GenAI chat
/// spans with messages, tokens and models, to at least `size` bytes.
fn otlp_export(size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size + MB);
    let mut t = 0u64;
    while out.len() < size {
        let mut spans = Vec::new();
        for _ in 0..50 {
            t += 1;
            let trace = format!("{t:032x}");
            let root = format!("{:016x}", t * 3);
            let start = 1_730_000_000_000_000_000u64 + t * 1_000_000_000;
            spans.push(json!({"traceId": trace, "spanId": root, "name": "invoke_agent support",
                "kind": 1, "startTimeUnixNano": start.to_string(), "endTimeUnixNano": (start + 900_000_000).to_string(),
                "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}}]}));
            for k in 1..=2u64 {
                spans.push(json!({"traceId": trace, "spanId": format!("{:016x}", t * 3 + k), "parentSpanId": root,
                    "name": "chat gpt-4o-mini", "kind": 3,
                    "startTimeUnixNano": (start + k * 100_000_000).to_string(), "endTimeUnixNano": (start + k * 400_000_000).to_string(),
                    "attributes": [
                        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                        {"key": "gen_ai.provider.name", "value": {"stringValue": "openai"}},
                        {"key": "gen_ai.request.model", "value": {"stringValue": "gpt-4o-mini"}},
                        {"key": "gen_ai.response.model", "value": {"stringValue": "gpt-4o-mini-2024-07-18"}},
                        {"key": "gen_ai.usage.input_tokens", "value": {"intValue": (100 + t % 50).to_string()}},
                        {"key": "gen_ai.usage.output_tokens", "value": {"intValue": "42"}},
                        {"key": "gen_ai.input.messages", "value": {"stringValue": json!([
                            {"role": "system", "parts": [{"type": "text", "content": "You are a helpful support agent for an online store. Answer in two sentences."}]},
                            {"role": "user", "parts": [{"type": "text", "content": format!("Where is my order #{t}? It was due on Monday and the tracking page shows nothing.")}]}
                        ]).to_string()}},
                        {"key": "gen_ai.output.messages", "value": {"stringValue": json!([
                            {"role": "assistant", "parts": [{"type": "text", "content": "Sorry for the wait: the carrier scanned it this morning. It should arrive within two days."}], "finish_reason": "stop"}
                        ]).to_string()}}
                    ]}));
            }
        }
        let doc = json!({"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "support-bot"}}]},
            "scopeSpans": [{"scope": {"name": "opentelemetry.instrumentation.openai_v2"}, "spans": spans}]}]});
        serde_json::to_writer(&mut out, &doc).unwrap();
        out.push(b'\n');
    }
    out
}

fn projection(c: &mut Criterion) {
    let bytes = otlp_export(50 * MB);
    let t0 = Instant::now();
    let traces = sources::project(SourceKind::Otlp, &bytes).unwrap();
    println!(
        "projection of {:.1} MB OTLP/JSON: {} traces, {} spans, first run {:.2} s",
        bytes.len() as f64 / MB as f64,
        traces.len(),
        traces.iter().map(|t| t.spans.len()).sum::<usize>(),
        t0.elapsed().as_secs_f64()
    );
    let mut g = c.benchmark_group("telemetry");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    g.bench_function("project_otlp_50mb", |b| {
        b.iter(|| {
            sources::project(SourceKind::Otlp, std::hint::black_box(&bytes))
                .unwrap()
                .len()
        })
    });
    g.finish();
}

fn kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn upload_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn")
        .env("GATEWAY_SIGNING_SECRET", "bench")
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
            "SLUICE_SECRETS__KEY_FILE",
            dir.path().join("k").display().to_string(),
        )
        .env(
            "SLUICE_CATALOG__PATH",
            format!("{}/conf/catalog.toml", env!("CARGO_MANIFEST_DIR")),
        )
        .arg("serve")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start sluice");
    let pid = child.id();
    // The gateway goes with the bench, even when an assertion fails.
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut addrs = std::collections::HashMap::new();
    let stdout = child.stdout.take().unwrap();
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
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let (gw, ops) = (&addrs["gateway"], &addrs["ops"]);
        for _ in 0..200 {
            if http.get(format!("{ops}/readyz")).send().await.is_ok_and(|r| r.status() == 200) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let org: Value = http.post(format!("{ops}/admin/orgs")).bearer_auth("bench-admin")
            .json(&json!({"name": "bench", "email_verified": true})).send().await.unwrap().json().await.unwrap();
        let org_id = org["org_id"].as_str().unwrap().to_string();
        let key: Value = http.post(format!("{ops}/admin/orgs/{org_id}/keys")).bearer_auth("bench-admin")
            .json(&json!({})).send().await.unwrap().json().await.unwrap();
        let key = key["api_key"].as_str().unwrap().to_string();
        let upload = |size: usize| {
            let (http, gw, org_id, key) = (http.clone(), gw.clone(), org_id.clone(), key.clone());
            async move {
                let t: Value = http.post(format!("{gw}/api/orgs/{org_id}/telemetry/traces/upload")).bearer_auth(&key)
                    .json(&json!({"source_kind": "otlp", "source_label": "bench"})).send().await.unwrap().json().await.unwrap();
                let url = t["signed_url"].as_str().unwrap();
                let local = format!("{gw}{}", &url[url.find("/api/").unwrap()..]);
                // 64 KiB pieces from one buffer: the client holds little, so the
                // resident figures are the gateway's alone.
                let piece = bytes::Bytes::from(vec![b' '; 64 * 1024]);
                let n = size / piece.len();
                let body = futures_util::stream::iter((0..n).map(move |_| Ok::<_, std::io::Error>(piece.clone())));
                let t0 = Instant::now();
                let r = http.put(local).header("content-type", "application/octet-stream")
                    .header("content-length", (n * 64 * 1024).to_string())
                    .body(reqwest::Body::wrap_stream(body)).send().await.unwrap();
                assert_eq!(r.status(), 200, "{:?}", r.text().await);
                t0.elapsed()
            }
        };
        upload(2 * MB).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let idle = kb(pid, "VmRSS:");
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset the peak RSS");
        let took = upload(50 * MB).await;
        let peak = kb(pid, "VmHWM:");
        println!(
            "upload of 50 MB to a signed URL: idle RSS {:.1} MB, peak {:.1} MB, held above idle {:.2} MB (limit 8 MB), {:.2} s",
            idle as f64 / 1024.0,
            peak as f64 / 1024.0,
            peak.saturating_sub(idle) as f64 / 1024.0,
            took.as_secs_f64()
        );

        // End to end on the same gateway: a 50 MB OTLP export uploaded, finalized,
        // and the time until the worker has verified, projected and stored it.
        // Just under the 50 MiB cap (the generator stops past its target).
        let export = otlp_export(49 * MB);
        let t: Value = http.post(format!("{gw}/api/orgs/{org_id}/telemetry/traces/upload")).bearer_auth(&key)
            .json(&json!({"source_kind": "otlp", "source_label": "bench"})).send().await.unwrap().json().await.unwrap();
        let id = t["ingest_id"].as_str().unwrap().to_string();
        let url = t["signed_url"].as_str().unwrap();
        let local = format!("{gw}{}", &url[url.find("/api/").unwrap()..]);
        let r = http.put(local).header("content-type", "application/octet-stream").body(export).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let t0 = Instant::now();
        let r = http.post(format!("{gw}/api/orgs/{org_id}/telemetry/traces/{id}/finalize")).bearer_auth(&key).send().await.unwrap();
        assert_eq!(r.status(), 202);
        let done = loop {
            let v: Value = http.get(format!("{gw}/api/orgs/{org_id}/telemetry/traces/{id}?limit=1")).bearer_auth(&key)
                .send().await.unwrap().json().await.unwrap();
            if v["status"] == "done" || v["status"] == "error" {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        println!(
            "finalize to done for a 50 MB OTLP export (verify, project, store {} traces in SQLite): {:.2} s",
            done["trace_count"],
            t0.elapsed().as_secs_f64()
        );
    });
}

fn main() {
    upload_memory();
    let mut c = Criterion::default().configure_from_args();
    projection(&mut c);
    c.final_summary();
}
