//! Telemetry trace intake end to end, as a client sees it: upload tickets, the
//! signed PUT (single-use, path-bound, capped, never multipart), finalize and the
//! worker's verdict, the list, the filesystem and S3 object stores, two instances
//! finalizing at once, a crashed projection retried, and pulls from the five
//! HTTP vendors (fakes speaking their APIs) and from a real PostgreSQL table, with
//! the credential looked for afterwards in the database, the log and the store.

mod harness;

use harness::{assert_error, command, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sluice_mock::traces::{TraceVendor, Vendor, TRACES};
use std::path::Path;
use std::time::{Duration, Instant};

const SECRET: &str = "test-signing-secret-0123456789";

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/telemetry/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

struct Env {
    s: Sluice,
    org: String,
    key: String,
    objects: tempfile::TempDir,
    _backend: Backend,
}

fn base_opts(objects: &Path) -> Opts {
    Opts::default().env("GATEWAY_SIGNING_SECRET", SECRET).env(
        "SLUICE_STORAGE__OBJECTS",
        format!("file://{}", objects.display()),
    )
}

async fn start_with(opts: Opts) -> Env {
    let backend = Backend::fresh().await;
    let objects = tempfile::tempdir().unwrap();
    let mut o = base_opts(objects.path());
    o.env.extend(opts.env);
    let s = Sluice::start(&backend, o).await;
    let (org, _, key) = s.org_and_key().await;
    Env {
        s,
        org,
        key,
        objects,
        _backend: backend,
    }
}

impl Env {
    fn path(&self, rest: &str) -> String {
        format!("/api/orgs/{}/telemetry/traces{rest}", self.org)
    }

    async fn ticket(&self, kind: &str) -> Value {
        let (st, v) = self
            .s
            .post(
                &self.path("/upload"),
                Some(&self.key),
                &json!({"source_kind": kind, "source_label": "prod export"}),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        v
    }

    async fn finalize(&self, id: &str) -> (u16, Value) {
        self.s
            .post(
                &self.path(&format!("/{id}/finalize")),
                Some(&self.key),
                &json!({}),
            )
            .await
    }

    /// Waits for the worker to end the ingest; returns its list entry.
    async fn settled(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (st, v) = self
                .s
                .get(&self.path(&format!("/{id}")), Some(&self.key))
                .await;
            assert_eq!(st, 200, "{v}");
            if v["status"] == "done" || v["status"] == "error" {
                return v;
            }
            assert!(Instant::now() < deadline, "the ingest never settled: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Files under the object store (staging files included).
    fn stored_files(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![self.objects.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    stack.push(e.path());
                } else {
                    out.push(e.path().display().to_string());
                }
            }
        }
        out
    }
}

async fn put(
    s: &Sluice,
    url: &str,
    content_type: &str,
    body: impl Into<reqwest::Body>,
) -> (u16, Value) {
    let r = s
        .http
        .put(url)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("PUT");
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn an_upload_is_ticketed_put_once_finalized_and_projected() {
    let e = start_with(Opts::default()).await;
    let bytes = fixture("otel-genai.json");
    let t = e.ticket("otel-genai").await;
    assert_eq!(t["method"], "PUT");
    assert_eq!(t["expires_in"], 7200);
    let url = t["signed_url"].as_str().unwrap();
    let id = t["ingest_id"].as_str().unwrap();
    assert!(
        url.starts_with("http://127.0.0.1:8080/api/telemetry/uploads/"),
        "on public_base_url: {url}"
    );
    assert!(
        url.contains(id) && url.contains(t["token"].as_str().unwrap()),
        "{t}"
    );
    // The ticket URL is built on public_base_url; the test reaches the listener.
    let local = format!("{}{}", e.s.gateway, &url[url.find("/api/").unwrap()..]);

    let (st, v) = put(&e.s, &local, "application/octet-stream", bytes.clone()).await;
    assert_eq!(st, 200, "{v}");
    let sha = hex::encode(Sha256::digest(&bytes));
    assert_eq!(v["sha256"], sha);
    assert_eq!(v["byte_size"], bytes.len());
    // Single-use: a second PUT is refused and changes nothing.
    let (st, v) = put(&e.s, &local, "application/octet-stream", b"{}".to_vec()).await;
    assert_error(st, &v, 409, "invalid_request");

    let (st, v) = e.finalize(id).await;
    assert_eq!(st, 202, "{v}");
    let (st, _) = e.finalize(id).await;
    assert_eq!(st, 202, "finalize is idempotent");
    let done = e.settled(id).await;
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["trace_count"], 2);
    assert_eq!(done["span_count"], 4);
    assert_eq!(done["byte_size"], bytes.len());
    assert_eq!(done["sha256"], sha);
    let chat = done["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736")
        .expect("the agent trace");
    assert_eq!(chat["model"], "gemini-2.0-flash-001");
    assert_eq!(chat["input_tokens"], 97);
    assert_eq!(chat["spans"].as_array().unwrap().len(), 3);
    // Finalizing again after done is still 202 and counts nothing twice.
    let (st, v) = e.finalize(id).await;
    assert_eq!((st, v["status"].as_str()), (202, Some("done")));
    // After finalize the URL takes nothing.
    let (st, _) = put(&e.s, &local, "application/octet-stream", bytes.clone()).await;
    assert_eq!(st, 409);

    // A second ingest, and the list with its totals and pages.
    let t2 = e.ticket("chat-json").await;
    let id2 = t2["ingest_id"].as_str().unwrap();
    let url2 = t2["signed_url"].as_str().unwrap();
    let local2 = format!("{}{}", e.s.gateway, &url2[url2.find("/api/").unwrap()..]);
    assert_eq!(
        put(
            &e.s,
            &local2,
            "application/octet-stream",
            fixture("chat-json.jsonl")
        )
        .await
        .0,
        200
    );
    assert_eq!(e.finalize(id2).await.0, 202);
    assert_eq!(e.settled(id2).await["trace_count"], 3);
    let (st, list) = e.s.get(&e.path(""), Some(&e.key)).await;
    assert_eq!(st, 200, "{list}");
    assert_eq!(list["total_ingests"], 2);
    assert_eq!(list["total_traces"], 5);
    assert_eq!(list["traces"].as_array().unwrap().len(), 2);
    assert_eq!(list["traces"][0]["ingest_id"], id2, "newest first");
    let (_, page) = e.s.get(&e.path("?limit=1&offset=1"), Some(&e.key)).await;
    assert_eq!(page["traces"].as_array().unwrap().len(), 1);
    assert_eq!(page["traces"][0]["ingest_id"], id);
    assert_eq!(page["has_more"], false);
    let (st, v) = e.s.get(&e.path("?limit=-1"), Some(&e.key)).await;
    assert_error(st, &v, 400, "invalid_parameter");

    // Another org's id is 404; no key is 401.
    let (other, _, other_key) = e.s.org_and_key().await;
    let (st, v) = e.s.get(&e.path(""), Some(&other_key)).await;
    assert_error(st, &v, 404, "not_found");
    let (st, v) =
        e.s.post(
            &e.path(&format!("/{id}/finalize")),
            Some(&other_key),
            &json!({}),
        )
        .await;
    assert_error(st, &v, 404, "not_found");
    let (st, v) =
        e.s.get(
            &format!("/api/orgs/{other}/telemetry/traces/{id}"),
            Some(&other_key),
        )
        .await;
    assert_error(st, &v, 404, "not_found");
    let (st, v) = e.s.get(&e.path(""), None).await;
    assert_error(st, &v, 401, "invalid_key");
}

#[tokio::test]
async fn bad_tickets_and_bad_puts_are_refused_and_leave_nothing() {
    let e = start_with(Opts::default().env("SLUICE_TELEMETRY__MAX_UPLOAD_BYTES", 4096)).await;
    let up = e.path("/upload");
    for (label, status) in [
        ("", 422),
        ("  ", 422),
        ("bad\u{0007}label", 422),
        ("line\nbreak", 422),
    ] {
        let (st, v) =
            e.s.post(
                &up,
                Some(&e.key),
                &json!({"source_kind": "otlp", "source_label": label}),
            )
            .await;
        assert_error(st, &v, status, "invalid_parameter");
        assert_eq!(v["error"]["param"], "source_label");
    }
    let long = "x".repeat(201);
    let (st, v) =
        e.s.post(
            &up,
            Some(&e.key),
            &json!({"source_kind": "otlp", "source_label": long}),
        )
        .await;
    assert_error(st, &v, 422, "invalid_parameter");
    let (st, v) =
        e.s.post(
            &up,
            Some(&e.key),
            &json!({"source_kind": "csv", "source_label": "a"}),
        )
        .await;
    assert_error(st, &v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], "source_kind");
    let (st, v) =
        e.s.post(&up, Some(&e.key), &json!({"source_kind": "otlp"}))
            .await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = e.s.post_raw(&up, Some(&e.key), "{nope").await;
    assert_error(st, &v, 400, "invalid_json");

    let t = e.ticket("chat-json").await;
    let id = t["ingest_id"].as_str().unwrap().to_string();
    let url = t["signed_url"].as_str().unwrap();
    let local = format!("{}{}", e.s.gateway, &url[url.find("/api/").unwrap()..]);
    let good = fixture("chat-json.jsonl");
    // Tampered: another signature, another expiry, another ingest's path.
    let sig_at = local.find("token=").unwrap() + 6;
    let mut tampered = local.clone().into_bytes();
    tampered[sig_at] = if tampered[sig_at] == b'a' { b'b' } else { b'a' };
    let tampered = String::from_utf8(tampered).unwrap();
    let (st, v) = put(&e.s, &tampered, "application/octet-stream", good.clone()).await;
    assert_error(st, &v, 403, "invalid_request");
    let later = local.replace("expires=", "expires=9");
    assert_eq!(
        put(&e.s, &later, "application/octet-stream", good.clone())
            .await
            .0,
        403
    );
    let t_other = e.ticket("chat-json").await;
    let other_id = t_other["ingest_id"].as_str().unwrap();
    let moved = local.replace(&id, other_id);
    assert_eq!(
        put(&e.s, &moved, "application/octet-stream", good.clone())
            .await
            .0,
        403
    );
    let unsigned = local.split('?').next().unwrap().to_string();
    assert_eq!(
        put(&e.s, &unsigned, "application/octet-stream", good.clone())
            .await
            .0,
        403
    );
    // Multipart, by its type or by its bytes.
    let form = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n\r\n{}\r\n--XyZ--\r\n".to_vec();
    let (st, v) = put(
        &e.s,
        &local,
        "multipart/form-data; boundary=XyZ",
        form.clone(),
    )
    .await;
    assert_error(st, &v, 415, "invalid_request");
    let (st, v) = put(&e.s, &local, "application/octet-stream", form).await;
    assert_error(st, &v, 415, "invalid_request");
    // Oversize: declared, and streamed without a length.
    let big = vec![b' '; 5000];
    let (st, v) = put(&e.s, &local, "application/octet-stream", big.clone()).await;
    assert_error(st, &v, 413, "invalid_request");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![b' '; 1000])).collect();
    let streamed = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let (st, _) = put(&e.s, &local, "application/octet-stream", streamed).await;
    assert_eq!(st, 413);
    assert!(
        e.stored_files().is_empty(),
        "nothing left behind: {:?}",
        e.stored_files()
    );
    // Refused PUTs used nothing up: the right one still goes in.
    let (st, v) = put(&e.s, &local, "application/octet-stream", good.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(e.stored_files().len(), 1);

    // The worker's verdicts: nothing uploaded, not UTF-8, not this tool's file,
    // and a stored file that changed after its upload.
    let verdict = |kind: &'static str, body: Option<Vec<u8>>, tamper: Option<&'static [u8]>| {
        let e = &e;
        async move {
            let t = e.ticket(kind).await;
            let id = t["ingest_id"].as_str().unwrap().to_string();
            if let Some(b) = body {
                let url = t["signed_url"].as_str().unwrap();
                let local = format!("{}{}", e.s.gateway, &url[url.find("/api/").unwrap()..]);
                assert_eq!(
                    put(&e.s, &local, "application/octet-stream", b).await.0,
                    200
                );
            }
            if let Some(new) = tamper {
                let f = e
                    .stored_files()
                    .into_iter()
                    .find(|f| f.ends_with(&id))
                    .unwrap();
                std::fs::write(f, new).unwrap();
            }
            assert_eq!(e.finalize(&id).await.0, 202);
            let v = e.settled(&id).await;
            assert_eq!(v["status"], "error", "{v}");
            v["error"].as_str().unwrap().to_string()
        }
    };
    assert!(verdict("otlp", None, None)
        .await
        .contains("no file was uploaded"));
    assert!(
        verdict("chat-json", Some(vec![0xff, 0xfe, b'{', b'}']), None)
            .await
            .contains("UTF-8")
    );
    assert!(verdict("braintrust", Some(fixture("otlp.json")), None)
        .await
        .contains("Braintrust"));
    assert!(verdict(
        "chat-json",
        Some(b"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}".to_vec()),
        Some(b"{\"messages\":[{\"role\":\"user\",\"content\":\"b\"}]}")
    )
    .await
    .contains("SHA-256"));
    assert!(verdict(
        "chat-json",
        Some(b"{\"messages\":[]}".to_vec()),
        Some(b"{}")
    )
    .await
    .contains("size"));
    // The good one above was never finalized: still uploaded, not counted.
    let (_, list) = e.s.get(&e.path(""), Some(&e.key)).await;
    assert_eq!(list["total_traces"], 0, "{list}");
    let _ = id;
}

#[tokio::test]
async fn an_expired_ticket_is_refused() {
    let e = start_with(Opts::default().env("SLUICE_TELEMETRY__TICKET_TTL", "1s")).await;
    let t = e.ticket("chat-json").await;
    assert_eq!(t["expires_in"], 1);
    let url = t["signed_url"].as_str().unwrap();
    let local = format!("{}{}", e.s.gateway, &url[url.find("/api/").unwrap()..]);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (st, v) = put(
        &e.s,
        &local,
        "application/octet-stream",
        fixture("chat-json.jsonl"),
    )
    .await;
    assert_error(st, &v, 403, "invalid_request");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("expired"),
        "{v}"
    );
    assert!(e.stored_files().is_empty());
}

/// Both instances serve the same org on one database (PostgreSQL in the PG pass,
/// one SQLite file otherwise) and are told to finalize the same ingests at once.
#[tokio::test]
async fn two_instances_finalizing_at_once_count_every_trace_once() {
    let backend = Backend::fresh().await;
    let objects = tempfile::tempdir().unwrap();
    let a = Sluice::start(&backend, base_opts(objects.path())).await;
    let b = Sluice::start(&backend, base_opts(objects.path())).await;
    let (org, _, key) = a.org_and_key().await;
    b.wait_for_key(&key).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        let (st, t) = a
            .post(
                &format!("/api/orgs/{org}/telemetry/traces/upload"),
                Some(&key),
                &json!({"source_kind": "langsmith", "source_label": "runs"}),
            )
            .await;
        assert_eq!(st, 201);
        let url = t["signed_url"].as_str().unwrap();
        let local = format!("{}{}", b.gateway, &url[url.find("/api/").unwrap()..]);
        assert_eq!(
            put(
                &b,
                &local,
                "application/octet-stream",
                fixture("langsmith.jsonl")
            )
            .await
            .0,
            200
        );
        ids.push(t["ingest_id"].as_str().unwrap().to_string());
    }
    let mut calls = Vec::new();
    let key = &key;
    for id in &ids {
        for s in [&a, &b, &a, &b] {
            let path = format!("/api/orgs/{org}/telemetry/traces/{id}/finalize");
            calls.push(async move { s.post(&path, Some(key), &json!({})).await.0 });
        }
    }
    for st in futures_util::future::join_all(calls).await {
        assert_eq!(st, 202);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, list) = b
            .get(&format!("/api/orgs/{org}/telemetry/traces"), Some(key))
            .await;
        let all_done = list["traces"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["status"] == "done");
        if all_done {
            assert_eq!(list["total_traces"], 12, "{list}");
            break;
        }
        assert!(Instant::now() < deadline, "{list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rows = count_traces(&backend.database_url).await;
    assert_eq!(rows, 12, "each trace stored once");
}

async fn count_traces(url: &str) -> i64 {
    use sqlx::Row;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(url).await.unwrap();
    let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM telemetry_traces")
        .fetch_one(&pool)
        .await
        .unwrap()
        .get("n");
    pool.close().await;
    n
}

/// An instance that died mid-projection left its claim; once the lease lapses
/// another takes the ingest over and counts its traces once.
#[tokio::test]
async fn a_projection_whose_instance_died_is_retried_and_counted_once() {
    let e = start_with(Opts::default()).await;
    let t = e.ticket("braintrust").await;
    let id = t["ingest_id"].as_str().unwrap().to_string();
    let url = t["signed_url"].as_str().unwrap();
    let local = format!("{}{}", e.s.gateway, &url[url.find("/api/").unwrap()..]);
    assert_eq!(
        put(
            &e.s,
            &local,
            "application/octet-stream",
            fixture("braintrust.jsonl")
        )
        .await
        .0,
        200
    );
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&e.s.database_url).await.unwrap();
    // What a claim by a process that then died looks like: accepted, held by it,
    // its lease run out.
    let past = 1_000_i64;
    sqlx::query("UPDATE telemetry_ingests SET status = 'accepted', claimed_by = 'inst_dead-telemetry', claim_until = $1, attempts = 1 WHERE id = $2")
        .bind(past)
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let v = e.settled(&id).await;
    assert_eq!(v["status"], "done", "{v}");
    assert_eq!(v["trace_count"], 2);
    assert_eq!(count_traces(&e.s.database_url).await, 2);
    // A late finalize changes nothing.
    assert_eq!(e.finalize(&id).await.0, 202);
    assert_eq!(count_traces(&e.s.database_url).await, 2);
}

/// The S3-compatible store (moto's server, started by scripts/test and named by
/// SLUICE_TEST_S3_ENDPOINT): the same upload path, the object where it belongs,
/// and a refused multipart upload aborted.
#[tokio::test]
async fn uploads_go_to_an_s3_compatible_store() {
    let Some(endpoint) = std::env::var("SLUICE_TEST_S3_ENDPOINT")
        .ok()
        .filter(|s| !s.is_empty())
    else {
        assert!(
            std::env::var("CI").is_err(),
            "CI runs the S3 test: scripts/test starts moto and sets SLUICE_TEST_S3_ENDPOINT"
        );
        eprintln!("SLUICE_TEST_S3_ENDPOINT unset: S3 test skipped (scripts/test runs it)");
        return;
    };
    // moto takes any signature, but reads a request without one as anonymous.
    let mut h = reqwest::header::HeaderMap::new();
    h.insert(
        "authorization",
        "AWS4-HMAC-SHA256 Credential=test/20250101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0"
            .parse()
            .unwrap(),
    );
    let http = reqwest::Client::builder()
        .default_headers(h)
        .build()
        .unwrap();
    let bucket = format!("sluice-{:08x}", rand::random::<u32>());
    assert!(http
        .put(format!("{endpoint}/{bucket}"))
        .send()
        .await
        .unwrap()
        .status()
        .is_success());
    let cap = 6 * 1024 * 1024;
    let e = start_with(
        Opts::default()
            .env("SLUICE_STORAGE__OBJECTS", format!("s3://{bucket}/exports"))
            .env("SLUICE_STORAGE__S3_ENDPOINT", &endpoint)
            .env("SLUICE_TELEMETRY__MAX_UPLOAD_BYTES", cap)
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1"),
    )
    .await;
    let t = e.ticket("phoenix").await;
    let id = t["ingest_id"].as_str().unwrap().to_string();
    let url = t["signed_url"].as_str().unwrap();
    let local = format!("{}{}", e.s.gateway, &url[url.find("/api/").unwrap()..]);
    let bytes = fixture("phoenix.json");
    assert_eq!(
        put(&e.s, &local, "application/octet-stream", bytes.clone())
            .await
            .0,
        200
    );
    let key = format!("exports/telemetry/{}/{id}", e.org);
    let got = http
        .get(format!("{endpoint}/{bucket}/{key}"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().to_vec(), bytes);
    assert_eq!(e.finalize(&id).await.0, 202);
    let v = e.settled(&id).await;
    assert_eq!(
        (v["status"].as_str(), v["trace_count"].as_i64()),
        (Some("done"), Some(2)),
        "{v}"
    );

    // Past the cap after a 5 MiB part went up: refused, and the multipart
    // upload aborted (no object, no upload left open).
    let t = e.ticket("chat-json").await;
    let id2 = t["ingest_id"].as_str().unwrap().to_string();
    let url = t["signed_url"].as_str().unwrap();
    let local = format!("{}{}", e.s.gateway, &url[url.find("/api/").unwrap()..]);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..7).map(|_| Ok(vec![b' '; 1024 * 1024])).collect();
    let (st, _) = put(
        &e.s,
        &local,
        "application/octet-stream",
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)),
    )
    .await;
    assert_eq!(st, 413);
    let listing = http
        .get(format!("{endpoint}/{bucket}?list-type=2&prefix=exports/"))
        .send()
        .await
        .unwrap();
    assert_eq!(listing.status(), 200);
    let listing = listing.text().await.unwrap();
    assert!(
        listing.contains(&id) && !listing.contains(&id2),
        "{listing}"
    );
    let uploads = http
        .get(format!("{endpoint}/{bucket}?uploads"))
        .send()
        .await
        .unwrap();
    assert_eq!(uploads.status(), 200);
    let uploads = uploads.text().await.unwrap();
    assert!(
        uploads.contains("ListMultipartUploadsResult") && !uploads.contains("<UploadId>"),
        "{uploads}"
    );
    // A big upload in parts completes.
    let t = e.ticket("chat-json").await;
    let id3 = t["ingest_id"].as_str().unwrap().to_string();
    let url = t["signed_url"].as_str().unwrap();
    let local = format!("{}{}", e.s.gateway, &url[url.find("/api/").unwrap()..]);
    let line = b"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]}\n";
    let mut big = Vec::new();
    while big.len() < 5_600_000 {
        big.extend_from_slice(line);
    }
    let (st, v) = put(&e.s, &local, "application/octet-stream", big.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["sha256"], hex::encode(Sha256::digest(&big)));
    assert_eq!(e.finalize(&id3).await.0, 202);
    assert_eq!(e.settled(&id3).await["trace_count"], big.len() / line.len());
}

// --- Pulls ------------------------------------------------------------------

fn vendor_env(v: Vendor) -> &'static str {
    match v {
        Vendor::Braintrust => "SLUICE_TELEMETRY__BRAINTRUST_URL",
        Vendor::Langsmith => "SLUICE_TELEMETRY__LANGSMITH_URL",
        Vendor::Langfuse => "SLUICE_TELEMETRY__LANGFUSE_URL",
        Vendor::Posthog => "SLUICE_TELEMETRY__POSTHOG_URL",
        Vendor::Mastra => "SLUICE_TELEMETRY__MASTRA_URL",
    }
}

fn vendor_name(v: Vendor) -> &'static str {
    match v {
        Vendor::Braintrust => "braintrust",
        Vendor::Langsmith => "langsmith",
        Vendor::Langfuse => "langfuse",
        Vendor::Posthog => "posthog",
        Vendor::Mastra => "mastra",
    }
}

fn scope(v: Vendor) -> Value {
    match v {
        Vendor::Braintrust | Vendor::Langsmith => json!({"project_name": "support-bot"}),
        Vendor::Posthog => json!({"project_id": "12345"}),
        _ => json!({}),
    }
}

const VENDORS: [Vendor; 5] = [
    Vendor::Braintrust,
    Vendor::Langsmith,
    Vendor::Langfuse,
    Vendor::Posthog,
    Vendor::Mastra,
];

fn credential_for(v: Vendor, tag: &str) -> String {
    match v {
        Vendor::Langfuse => format!("pk-lf-{tag}:sk-lf-{tag}"),
        _ => format!("key-{}-{tag}", vendor_name(v)),
    }
}

#[tokio::test]
async fn pulls_page_through_each_vendor_and_honour_its_limits() {
    let tag = format!("{:016x}", rand::random::<u64>());
    let mut fakes = Vec::new();
    let mut opts = Opts::default();
    for v in VENDORS {
        let f = TraceVendor::start(v, &credential_for(v, &tag)).await;
        opts = opts.env(vendor_env(v), f.base_url());
        fakes.push((v, f));
    }
    let e = start_with(opts).await;
    let pull = e.path("/pull");
    for (v, fake) in &fakes {
        let name = vendor_name(*v);
        let body = json!({"transport_kind": name, "source_kind": name, "source_label": format!("{name} pull"),
            "credential": credential_for(*v, &tag), "config": scope(*v)});
        let (st, r) = e.s.post(&pull, Some(&e.key), &body).await;
        assert_eq!(st, 201, "{name}: {r}");
        assert_eq!(r["status"], "done", "{name}: {r}");
        assert_eq!(r["trace_count"], TRACES, "{name}: {r}");
        assert!(r["byte_size"].as_i64().unwrap() > 0);
        assert_eq!(r["sha256"].as_str().unwrap().len(), 64);
        assert!(
            fake.requests() >= 3,
            "{name} paged: {} requests",
            fake.requests()
        );
        let id = r["ingest_id"].as_str().unwrap();
        let (_, one) = e.s.get(&e.path(&format!("/{id}")), Some(&e.key)).await;
        let first = &one["items"][0];
        assert_eq!(first["model"], "gpt-4o-mini", "{name}: {first}");
        assert!(
            first["spans"].as_array().unwrap().len() >= 2,
            "{name}: {first}"
        );
        assert!(
            first["input_tokens"].as_i64().unwrap() >= 10,
            "{name}: {first}"
        );
        // The stored export is the sources' records, one per line.
        let stored =
            std::fs::read(e.objects.path().join(format!("telemetry/{}/{id}", e.org))).unwrap();
        assert_eq!(
            hex::encode(Sha256::digest(&stored)),
            r["sha256"].as_str().unwrap()
        );

        // A wrong credential is the caller's 400, naming the credential.
        let mut bad = body.clone();
        bad["credential"] = json!(match v {
            Vendor::Langfuse => "pk-lf-wrong:sk-lf-wrong",
            _ => "wrong-key",
        });
        let (st, r) = e.s.post(&pull, Some(&e.key), &bad).await;
        assert_error(st, &r, 400, "invalid_parameter");
        assert_eq!(r["error"]["param"], "credential", "{name}: {r}");

        // The source's rate limit: a long Retry-After is the caller's 429 ...
        fake.throttle(1, 30);
        let (st, r) = e.s.post(&pull, Some(&e.key), &body).await;
        assert_error(st, &r, 429, "rate_limited");
        // ... a short one is waited out once.
        fake.throttle(1, 1);
        let (st, r) = e.s.post(&pull, Some(&e.key), &body).await;
        assert_eq!(st, 201, "{name}: {r}");
    }
    // The Retry-After reaches the caller.
    let (v, fake) = &fakes[0];
    fake.throttle(1, 45);
    let r = e
        .s
        .http
        .post(format!("{}{pull}", e.s.gateway))
        .bearer_auth(&e.key)
        .json(&json!({"transport_kind": vendor_name(*v), "source_kind": vendor_name(*v), "source_label": "x",
            "credential": credential_for(*v, &tag), "config": scope(*v)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "45");

    // Bounds and config.
    let (st, r) = e
        .s
        .post(&pull, Some(&e.key), &json!({"transport_kind": "braintrust", "source_kind": "braintrust", "source_label": "bounded",
            "credential": credential_for(Vendor::Braintrust, &tag), "config": {"project_name": "support-bot", "limit": 5}}))
        .await;
    assert_eq!(st, 201, "{r}");
    assert_eq!(r["truncated"], true);
    assert!(r["trace_count"].as_i64().unwrap() <= 5, "{r}");
    let bt_key = credential_for(Vendor::Braintrust, &tag);
    for (body, param) in [
        (
            json!({"transport_kind": "braintrust", "source_kind": "braintrust", "source_label": "x", "credential": bt_key, "config": {"project_name": "nope"}}),
            "config.project_name",
        ),
        (
            json!({"transport_kind": "braintrust", "source_kind": "braintrust", "source_label": "x", "credential": bt_key, "config": {"project_id": "proj-404"}}),
            "config",
        ),
        (
            json!({"transport_kind": "braintrust", "source_kind": "braintrust", "source_label": "x", "credential": "k"}),
            "config.project_id",
        ),
        (
            json!({"transport_kind": "posthog", "source_kind": "posthog", "source_label": "x", "credential": "k", "config": {"project_id": "1", "limit": 0}}),
            "config.limit",
        ),
        (
            json!({"transport_kind": "langsmith", "source_kind": "otlp", "source_label": "x", "credential": "k"}),
            "source_kind",
        ),
        (
            json!({"transport_kind": "datadog", "source_kind": "otlp", "source_label": "x", "credential": "k"}),
            "transport_kind",
        ),
        (
            json!({"transport_kind": "langfuse", "source_kind": "langfuse", "source_label": "x", "credential": "no-colon"}),
            "credential",
        ),
        (
            json!({"transport_kind": "mastra", "source_kind": "mastra", "source_label": "x", "credential": "k", "config": {"base_url": "http://127.0.0.1:9/"}}),
            "config.base_url",
        ),
    ] {
        let (st, r) = e.s.post(&pull, Some(&e.key), &body).await;
        assert_error(st, &r, 400, "invalid_parameter");
        assert_eq!(r["error"]["param"], param, "{body}: {r}");
    }
    let (st, r) = e.s.post(&pull, Some(&e.key), &json!({"transport_kind": "braintrust", "source_kind": "braintrust", "source_label": "\u{0}", "credential": "k"})).await;
    assert_error(st, &r, 422, "invalid_parameter");
    // The intake made no optimizer project or job: it only lists its ingests.
    let (_, list) = e.s.get(&e.path(""), Some(&e.key)).await;
    assert!(list["total_ingests"].as_i64().unwrap() >= 11);
}

/// Source URLs from a pull's config are the org's: without
/// `allow_private_upstreams` they may not reach loopback (or any private
/// address), in any spelling.
#[tokio::test]
async fn org_supplied_source_urls_may_not_reach_private_addresses() {
    let fake = TraceVendor::start(Vendor::Mastra, "tok").await;
    let e = start_with(Opts::default()).await;
    let port = fake.base_url().rsplit(':').next().unwrap().to_string();
    for base in [
        fake.base_url(),
        format!("https://127.0.0.1:{port}"),
        format!("https://2130706433:{port}"),
        format!("https://localhost:{port}"),
        "https://169.254.169.254/".to_string(),
        "https://[::1]/".to_string(),
    ] {
        let (st, r) =
            e.s.post(
                &e.path("/pull"),
                Some(&e.key),
                &json!({"transport_kind": "mastra", "source_kind": "mastra", "source_label": "x",
                "credential": "tok", "config": {"base_url": base}}),
            )
            .await;
        assert_error(st, &r, 400, "invalid_parameter");
        assert_eq!(r["error"]["param"], "config.base_url");
    }
    assert_eq!(fake.requests(), 0, "no request reached the private address");
    // The database URL of a postgres pull is the org's too.
    let (st, r) =
        e.s.post(
            &e.path("/pull"),
            Some(&e.key),
            &json!({"transport_kind": "postgres", "source_kind": "chat-json", "source_label": "x",
            "credential": "postgres://u:p@127.0.0.1:5432/db", "config": {"table": "t"}}),
        )
        .await;
    assert_error(st, &r, 400, "invalid_parameter");
}

/// A server URL for the postgres pull's own test database (scripts/test exports
/// it in both passes).
fn pull_pg_server() -> Option<String> {
    std::env::var("SLUICE_TEST_PULL_PG_URL")
        .ok()
        .or_else(|| std::env::var("SLUICE_TEST_DATABASE_URL").ok())
        .filter(|s| !s.is_empty())
}

async fn source_table(server: &str, password: &str) -> (String, String) {
    use sqlx::Connection;
    let name = format!("traces_src_{:016x}", rand::random::<u64>());
    let mut conn = sqlx::PgConnection::connect(server).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap();
    let base = server.rsplit_once('/').unwrap().0;
    let db_url = format!("{base}/{name}");
    let mut db = sqlx::PgConnection::connect(&db_url).await.unwrap();
    sqlx::query("CREATE TABLE chat_logs (id BIGSERIAL PRIMARY KEY, created_at TIMESTAMPTZ NOT NULL, conversation JSONB NOT NULL)")
        .execute(&mut db)
        .await
        .unwrap();
    for i in 0..4 {
        let rec = json!({"request": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": format!("q{i}")}]},
            "response": {"id": format!("chatcmpl-{i}"), "model": "gpt-4o-mini", "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("a{i}")}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2}}});
        sqlx::query(
            "INSERT INTO chat_logs (created_at, conversation) VALUES (to_timestamp($1), $2::jsonb)",
        )
        .bind(1_750_000_000.0 + i as f64 * 3600.0)
        .bind(rec.to_string())
        .execute(&mut db)
        .await
        .unwrap();
    }
    // The org's URL carries a password (the test server trusts loopback, so any
    // password connects; it is the string the leak check looks for).
    let authority = base.strip_prefix("postgres://").unwrap();
    let (user, host) = authority.split_once('@').unwrap();
    (format!("postgres://{user}:{password}@{host}/{name}"), name)
}

#[tokio::test]
async fn a_postgres_pull_reads_the_named_table() {
    let Some(server) = pull_pg_server() else {
        assert!(
            std::env::var("CI").is_err(),
            "CI runs the postgres pull: scripts/test sets SLUICE_TEST_PULL_PG_URL"
        );
        eprintln!("no PostgreSQL for the pull: skipped (scripts/test runs it)");
        return;
    };
    let (url, _) = source_table(&server, "pw-not-needed").await;
    let e =
        start_with(Opts::default().env("SLUICE_NETWORK__ALLOW_PRIVATE_UPSTREAMS", "true")).await;
    let pull = e.path("/pull");
    let body = |config: Value| json!({"transport_kind": "postgres", "source_kind": "chat-json", "source_label": "warehouse", "credential": url, "config": config});
    let (st, r) =
        e.s.post(
            &pull,
            Some(&e.key),
            &body(json!({"table": "chat_logs", "messages_column": "conversation"})),
        )
        .await;
    assert_eq!(st, 201, "{r}");
    assert_eq!(r["trace_count"], 4);
    let (_, one) =
        e.s.get(
            &e.path(&format!("/{}", r["ingest_id"].as_str().unwrap())),
            Some(&e.key),
        )
        .await;
    assert_eq!(one["items"][0]["trace_id"], "1");
    assert_eq!(one["items"][0]["spans"][0]["output"][0]["content"], "a0");
    let (st, r) = e
        .s
        .post(&pull, Some(&e.key), &body(json!({"table": "public.chat_logs", "messages_column": "conversation", "since": "2025-06-15T17:00:00Z"})))
        .await;
    assert_eq!(st, 201, "{r}");
    assert_eq!(r["trace_count"], 2, "rows at or after since: {r}");
    for (config, param) in [
        (
            json!({"table": "missing_table", "messages_column": "conversation"}),
            "config.table",
        ),
        (json!({"table": "chat_logs"}), "config.messages_column"),
        (json!({"table": "chat_logs; DROP TABLE x"}), "config.table"),
        (json!({}), "config.table"),
    ] {
        let (st, r) = e.s.post(&pull, Some(&e.key), &body(config.clone())).await;
        assert_error(st, &r, 400, "invalid_parameter");
        assert_eq!(r["error"]["param"], param, "{config}: {r}");
    }
    // An HTTP source that does not answer (private addresses allowed here).
    let (st, r) = e
        .s
        .post(&pull, Some(&e.key), &json!({"transport_kind": "braintrust", "source_kind": "braintrust", "source_label": "x",
            "credential": "k", "config": {"base_url": "http://127.0.0.1:1", "project_id": "p"}}))
        .await;
    assert_error(st, &r, 400, "invalid_parameter");
    assert_eq!(r["error"]["param"], "config.base_url", "{r}");
    let closed = url.replace(&url[url.rfind(':').unwrap()..url.rfind('/').unwrap()], ":1");
    let (st, r) = e
        .s
        .post(&pull, Some(&e.key), &json!({"transport_kind": "postgres", "source_kind": "chat-json", "source_label": "x", "credential": closed, "config": {"table": "chat_logs"}}))
        .await;
    assert_error(st, &r, 400, "invalid_parameter");
    let (st, r) = e
        .s
        .post(&pull, Some(&e.key), &json!({"transport_kind": "postgres", "source_kind": "chat-json", "source_label": "x", "credential": "mysql://x", "config": {"table": "chat_logs"}}))
        .await;
    assert_error(st, &r, 400, "invalid_parameter");
    assert_eq!(r["error"]["param"], "credential");
}

/// Every credential a pull was given, taken and refused, is looked for in the
/// database, the log (at debug) and the object store afterwards.
#[tokio::test]
async fn a_pull_credential_is_nowhere_afterwards() {
    let tag = format!("{:016x}", rand::random::<u64>());
    let mut fakes = Vec::new();
    let backend = Backend::fresh().await;
    let objects = tempfile::tempdir().unwrap();
    let mut opts = base_opts(objects.path()).env("SLUICE_NETWORK__ALLOW_PRIVATE_UPSTREAMS", "true");
    for v in VENDORS {
        let f = TraceVendor::start(v, &credential_for(v, &tag)).await;
        opts = opts.env(vendor_env(v), f.base_url());
        fakes.push((v, f));
    }
    let log_path = objects
        .path()
        .parent()
        .unwrap()
        .join(format!("sluice-log-{tag}.txt"));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut cmd = command(&backend, &opts);
    cmd.env("RUST_LOG", "debug");
    let s = Sluice::spawn_with_stderr(cmd, &backend.database_url, log.into()).await;
    let (org, _, key) = s.org_and_key().await;
    let pull = format!("/api/orgs/{org}/telemetry/traces/pull");
    let mut secrets = Vec::new();
    let mut answers = String::new();
    for (v, fake) in &fakes {
        let name = vendor_name(*v);
        let good = credential_for(*v, &tag);
        let wrong = match v {
            Vendor::Langfuse => format!("pk-lf-wrong{tag}:sk-lf-wrong{tag}"),
            _ => format!("wrong-{name}-{tag}"),
        };
        for cred in [&good, &wrong] {
            let (st, r) = s
                .post(&pull, Some(&key), &json!({"transport_kind": name, "source_kind": name, "source_label": "x", "credential": cred, "config": scope(*v)}))
                .await;
            assert!(st == 201 || st == 400, "{name}: {st} {r}");
            answers.push_str(&r.to_string());
        }
        fake.throttle(1, 30);
        let (st, r) = s
            .post(&pull, Some(&key), &json!({"transport_kind": name, "source_kind": name, "source_label": "x", "credential": good, "config": scope(*v)}))
            .await;
        assert_eq!(st, 429);
        answers.push_str(&r.to_string());
        // The fake did receive it: the credential was used.
        assert!(fake
            .seen()
            .iter()
            .any(|h| h.contains(&good) || name == "langfuse"));
        secrets.push(good);
        secrets.push(wrong);
    }
    // A postgres pull with a password in its URL, good and failing.
    if let Some(server) = pull_pg_server() {
        let password = format!("pgpw{tag}");
        let (url, _) = source_table(&server, &password).await;
        for config in [
            json!({"table": "chat_logs", "messages_column": "conversation"}),
            json!({"table": "nope"}),
        ] {
            let (st, r) = s
                .post(&pull, Some(&key), &json!({"transport_kind": "postgres", "source_kind": "chat-json", "source_label": "x", "credential": url, "config": config}))
                .await;
            assert!(st == 201 || st == 400, "{r}");
            answers.push_str(&r.to_string());
        }
        secrets.push(password);
        secrets.push(url);
    }
    // Langfuse's key pair also travels base64-encoded in Basic auth; its halves
    // are what must not appear.
    let parts: Vec<String> = secrets
        .iter()
        .flat_map(|s| s.split(':').map(str::to_string).collect::<Vec<_>>())
        .filter(|p| p.contains(&tag))
        .collect();
    drop(s); // the process ends; its log is complete
    let mut haystacks: Vec<(String, Vec<u8>)> = vec![
        ("answers".into(), answers.into_bytes()),
        ("log".into(), std::fs::read(&log_path).unwrap()),
    ];
    let mut stack = vec![objects.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for f in std::fs::read_dir(&d).unwrap().flatten() {
            if f.path().is_dir() {
                stack.push(f.path());
            } else {
                haystacks.push((
                    f.path().display().to_string(),
                    std::fs::read(f.path()).unwrap(),
                ));
            }
        }
    }
    haystacks.push((
        "database".into(),
        database_text(&backend.database_url).await,
    ));
    assert!(haystacks[1].1.len() > 1000, "the debug log was written");
    for (what, hay) in &haystacks {
        let text = String::from_utf8_lossy(hay);
        for p in &parts {
            assert!(
                !text.contains(p.as_str()),
                "a credential ({p}) is in {what}"
            );
        }
    }
    let _ = std::fs::remove_file(&log_path);
}

/// Every row of every table, as text.
async fn database_text(url: &str) -> Vec<u8> {
    use sqlx::Row;
    if let Some(path) = url.strip_prefix("sqlite://") {
        let mut all = Vec::new();
        for suffix in ["", "-wal", "-shm"] {
            all.extend(std::fs::read(format!("{path}{suffix}")).unwrap_or_default());
        }
        return all;
    }
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url)
        .await
        .unwrap();
    let tables: Vec<String> =
        sqlx::query("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<String, _>("tablename"))
            .collect();
    let mut all = Vec::new();
    for t in tables {
        for r in sqlx::query(&format!("SELECT t::text AS row FROM \"{t}\" t"))
            .fetch_all(&mut conn)
            .await
            .unwrap()
        {
            all.extend(r.get::<String, _>("row").into_bytes());
        }
    }
    all
}
