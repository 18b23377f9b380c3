//! Files and batches (issue 26) as a client sees them: `/v1/files` stores, lists,
//! reads and deletes per org under a size cap; `/v1/batches` checks its input,
//! serves each line like a live request (same prices, usage marked batch), puts
//! failed lines in the error file, cancels, expires, survives a restart without
//! billing a line twice, and on PostgreSQL shares one batch between instances.

mod harness;

use harness::{assert_error, repo_path, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use std::time::{Duration, Instant};

fn opts(mock: &Mock) -> Opts {
    Opts::default()
        .catalog(repo_path("tests/fixtures/gates.toml"))
        .env(
            "SLUICE_PROVIDERS__OPENAI__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        .env("OPENAI_API_KEY", "sk-openai")
        .env("SLUICE_BATCHES__POLL_MS", "50")
}

/// Opts with the object store in `dir`.
fn opts_in(mock: &Mock, dir: &std::path::Path) -> Opts {
    opts(mock).env(
        "SLUICE_STORAGE__OBJECTS",
        format!("file://{}", dir.join("objects").display()),
    )
}

const BOUNDARY: &str = "----sluice-test-boundary-7f3a";

fn form(purpose: Option<&str>, filename: &str, content: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    if let Some(p) = purpose {
        body.extend_from_slice(
            format!(
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{p}\r\n"
            )
            .as_bytes(),
        );
    }
    body.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
             Content-Type: application/jsonl\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    body
}

async fn upload_to(
    s: &Sluice,
    path: &str,
    key: &str,
    purpose: Option<&str>,
    content: &[u8],
) -> (u16, Value) {
    let r = s
        .http
        .post(format!("{}{path}", s.gateway))
        .bearer_auth(key)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(form(purpose, "input.jsonl", content))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn upload(s: &Sluice, key: &str, content: &[u8]) -> String {
    let (st, f) = upload_to(s, "/v1/files", key, Some("batch"), content).await;
    assert_eq!(st, 200, "{f}");
    f["id"].as_str().unwrap().to_string()
}

async fn content(s: &Sluice, key: &str, id: &str) -> (u16, Vec<u8>) {
    let r = s
        .http
        .get(format!("{}/v1/files/{id}/content", s.gateway))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
}

async fn delete(s: &Sluice, key: &str, path: &str) -> (u16, Value) {
    let r = s
        .http
        .delete(format!("{}{path}", s.gateway))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

fn chat_line(id: &str, model: &str, text: &str) -> String {
    json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": model, "max_tokens": 20,
                    "messages": [{"role": "user", "content": text}]}})
    .to_string()
}

fn jsonl(lines: &[String]) -> Vec<u8> {
    let mut s = lines.join("\n");
    s.push('\n');
    s.into_bytes()
}

async fn create_batch(s: &Sluice, key: &str, file: &str) -> Value {
    let (st, b) = s
        .post(
            "/v1/batches",
            Some(key),
            &json!({"input_file_id": file, "endpoint": "/v1/chat/completions",
                    "completion_window": "24h", "metadata": {"job": "t"}}),
        )
        .await;
    assert_eq!(st, 200, "{b}");
    b
}

async fn wait_status(s: &Sluice, key: &str, id: &str, want: &[&str], within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let (st, b) = s.get(&format!("/v1/batches/{id}"), Some(key)).await;
        assert_eq!(st, 200, "{b}");
        if want.contains(&b["status"].as_str().unwrap_or("")) {
            return b;
        }
        assert!(
            Instant::now() < deadline,
            "batch never reached {want:?}: {b}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lines of a file, parsed.
async fn lines_of(s: &Sluice, key: &str, file: &Value) -> Vec<Value> {
    let Some(id) = file.as_str() else {
        return Vec::new();
    };
    let (st, bytes) = content(s, key, id).await;
    assert_eq!(st, 200);
    String::from_utf8(bytes)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn db(s: &Sluice) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    sqlx::AnyPool::connect(&s.database_url).await.unwrap()
}

/// (batch, cost) of every usage event with status 200, once the writer stored
/// `want` batch events.
async fn billed(s: &Sluice, want_batch: usize) -> Vec<(i64, i64)> {
    let pool = db(s).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT batch, cost_micro_usd FROM usage_events WHERE status = 200 ORDER BY created_at",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        if rows.iter().filter(|r| r.0 == 1).count() >= want_batch {
            return rows;
        }
        assert!(Instant::now() < deadline, "usage events: {rows:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_stored_listed_read_and_deleted_per_org_under_a_cap() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let s = Sluice::start(
        &b,
        opts_in(&mock, dir.path()).env("SLUICE_BATCHES__MAX_FILE_BYTES", 4096),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    let (_, _, other) = s.org_and_key().await;

    let data = jsonl(&[chat_line("a", "g-std", "hi")]);
    let (st, f) = upload_to(&s, "/v1/files", &key, Some("batch"), &data).await;
    assert_eq!(st, 200, "{f}");
    assert_eq!(f["object"], "file");
    assert_eq!(f["purpose"], "batch");
    assert_eq!(f["filename"], "input.jsonl");
    assert_eq!(f["bytes"], data.len());
    let id = f["id"].as_str().unwrap().to_string();
    // The unprefixed twin stores too.
    let (st, g) = upload_to(&s, "/files", &key, Some("user_data"), b"opaque bytes").await;
    assert_eq!(st, 200, "{g}");

    let (st, one) = s.get(&format!("/v1/files/{id}"), Some(&key)).await;
    assert_eq!((st, &one["id"]), (200, &f["id"]));
    assert_eq!(content(&s, &key, &id).await, (200, data.clone()));
    let (st, all) = s.get("/v1/files", Some(&key)).await;
    assert_eq!(st, 200);
    assert_eq!(all["object"], "list");
    assert_eq!(all["data"].as_array().unwrap().len(), 2);
    assert_eq!(all["data"][0]["id"], g["id"], "newest first");
    let (_, batch_only) = s.get("/v1/files?purpose=batch", Some(&key)).await;
    assert_eq!(batch_only["data"].as_array().unwrap().len(), 1);
    let (_, first) = s.get("/v1/files?limit=1", Some(&key)).await;
    assert_eq!(first["has_more"], true);
    let after = first["last_id"].as_str().unwrap();
    let (_, next) = s
        .get(&format!("/v1/files?limit=1&after={after}"), Some(&key))
        .await;
    assert_eq!(next["data"][0]["id"], f["id"]);
    assert_eq!(next["has_more"], false);

    // Another org sees none of it.
    let (st, e) = s.get(&format!("/v1/files/{id}"), Some(&other)).await;
    assert_error(st, &e, 404, "not_found");
    assert_eq!(content(&s, &other, &id).await.0, 404);
    let (st, e) = delete(&s, &other, &format!("/v1/files/{id}")).await;
    assert_error(st, &e, 404, "not_found");
    let (_, theirs) = s.get("/v1/files", Some(&other)).await;
    assert_eq!(theirs["data"].as_array().unwrap().len(), 0);
    // No key: 401.
    let (st, e) = s.get("/v1/files", None).await;
    assert_error(st, &e, 401, "invalid_key");

    // A bad purpose, a missing file part, an oversize file.
    let (st, e) = upload_to(&s, "/v1/files", &key, Some("homework"), b"x").await;
    assert_error(st, &e, 400, "invalid_parameter");
    assert_eq!(e["error"]["param"], "purpose");
    let (st, e) = upload_to(&s, "/v1/files", &key, None, b"x").await;
    assert_error(st, &e, 400, "invalid_request");
    assert_eq!(e["error"]["param"], "purpose");
    let big = vec![b'x'; 5000];
    let (st, e) = upload_to(&s, "/v1/files", &key, Some("batch"), &big).await;
    assert_eq!(st, 413, "{e}");
    assert_eq!(e["error"]["param"], "file");
    let (_, all) = s.get("/v1/files", Some(&key)).await;
    assert_eq!(
        all["data"].as_array().unwrap().len(),
        2,
        "nothing of refused uploads"
    );

    let (st, d) = delete(&s, &key, &format!("/v1/files/{id}")).await;
    assert_eq!(st, 200, "{d}");
    assert_eq!(d, json!({"id": id, "object": "file", "deleted": true}));
    let (st, _) = s.get(&format!("/v1/files/{id}"), Some(&key)).await;
    assert_eq!(st, 404);
    let left = walk(&dir.path().join("objects"));
    assert_eq!(left.len(), 1, "the deleted file's bytes are gone: {left:?}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_checked_at_creation_as_openai_does() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let s = Sluice::start(&b, opts_in(&mock, dir.path())).await;
    let (_, _, key) = s.org_and_key().await;
    let (_, _, other) = s.org_and_key().await;
    let good = upload(&s, &key, &jsonl(&[chat_line("a", "g-std", "hi")])).await;

    let body = |file: &str, endpoint: &str, window: &str| json!({"input_file_id": file, "endpoint": endpoint, "completion_window": window});
    let (st, e) = s
        .post("/v1/batches", Some(&key), &body(&good, "/v1/images", "24h"))
        .await;
    assert_error(st, &e, 400, "invalid_parameter");
    assert_eq!(e["error"]["param"], "endpoint");
    let (st, e) = s
        .post(
            "/v1/batches",
            Some(&key),
            &body(&good, "/v1/chat/completions", "1h"),
        )
        .await;
    assert_error(st, &e, 400, "invalid_parameter");
    assert_eq!(e["error"]["param"], "completion_window");
    let (st, e) = s
        .post(
            "/v1/batches",
            Some(&other),
            &body(&good, "/v1/chat/completions", "24h"),
        )
        .await;
    assert_error(st, &e, 404, "not_found");
    assert_eq!(e["error"]["param"], "input_file_id");
    let (st, e) = s
        .post(
            "/v1/batches",
            Some(&key),
            &json!({"endpoint": "/v1/chat/completions", "completion_window": "24h"}),
        )
        .await;
    assert_error(st, &e, 400, "invalid_request");
    assert_eq!(e["error"]["param"], "input_file_id");

    // Duplicate custom_ids, and a line for another url: the batch fails with the
    // line named in errors.data, as OpenAI's do.
    let dup = upload(
        &s,
        &key,
        &jsonl(&[chat_line("a", "g-std", "1"), chat_line("a", "g-std", "2")]),
    )
    .await;
    let (st, failed) = s
        .post(
            "/v1/batches",
            Some(&key),
            &body(&dup, "/v1/chat/completions", "24h"),
        )
        .await;
    assert_eq!(st, 200, "{failed}");
    assert_eq!(failed["status"], "failed");
    assert!(failed["failed_at"].is_i64());
    assert_eq!(failed["errors"]["data"][0]["code"], "duplicate_custom_id");
    assert_eq!(failed["errors"]["data"][0]["line"], 2);
    let (st, mismatched) = s
        .post(
            "/v1/batches",
            Some(&key),
            &body(&good, "/v1/embeddings", "24h"),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(mismatched["status"], "failed");
    assert_eq!(
        mismatched["errors"]["data"][0]["code"],
        "mismatched_endpoint"
    );
    assert_eq!(mismatched["errors"]["data"][0]["param"], "url");
    // Another org cannot read it.
    let id = failed["id"].as_str().unwrap();
    let (st, e) = s.get(&format!("/v1/batches/{id}"), Some(&other)).await;
    assert_error(st, &e, 404, "not_found");
    // A failed batch cannot be cancelled.
    let (st, _) = s
        .post(&format!("/v1/batches/{id}/cancel"), Some(&key), &json!({}))
        .await;
    assert_eq!(st, 409);
    assert_eq!(
        mock.count("o1") as usize,
        0,
        "nothing was sent for refused batches"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_chat_lines_completes_billed_as_live_and_marked_batch() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let s = Sluice::start(&b, opts_in(&mock, dir.path())).await;
    let (org, _, key) = s.org_and_key().await;

    // One live request first, for its price.
    let (st, live) = s
        .post(
            "/v1/chat/completions",
            Some(&key),
            &json!({"model": "g-std", "max_tokens": 20,
                    "messages": [{"role": "user", "content": "same"}]}),
        )
        .await;
    assert_eq!(st, 200, "{live}");
    // The live charge is in the ledger before the balance is read.
    let deadline = Instant::now() + Duration::from_secs(5);
    while billed(&s, 0).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the live request was never recorded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = s.balance_usd(&org).await;

    let mut lines: Vec<String> = (0..6)
        .map(|i| chat_line(&format!("req-{i}"), "g-std", "same"))
        .collect();
    // Two lines fail as a live request would: an unknown model, a bad body.
    lines.push(chat_line("unknown-model", "no-such-model", "x"));
    lines.push(
        json!({"custom_id": "no-messages", "method": "POST", "url": "/v1/chat/completions",
               "body": {"model": "g-std"}})
        .to_string(),
    );
    let file = upload(&s, &key, &jsonl(&lines)).await;
    let created = create_batch(&s, &key, &file).await;
    assert_eq!(created["object"], "batch");
    assert_eq!(created["endpoint"], "/v1/chat/completions");
    assert_eq!(created["completion_window"], "24h");
    assert_eq!(created["metadata"], json!({"job": "t"}));
    assert_eq!(created["request_counts"]["total"], 8);
    assert!(
        created["expires_at"].as_i64().unwrap() >= created["created_at"].as_i64().unwrap() + 86_000
    );
    let id = created["id"].as_str().unwrap();

    let done = wait_status(&s, &key, id, &["completed"], Duration::from_secs(20)).await;
    assert_eq!(
        done["request_counts"],
        json!({"total": 8, "completed": 6, "failed": 2})
    );
    for k in ["in_progress_at", "finalizing_at", "completed_at"] {
        assert!(done[k].is_i64(), "{k}: {done}");
    }
    let out = lines_of(&s, &key, &done["output_file_id"]).await;
    let mut ids: Vec<&str> = out
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(ids, (0..6).map(|i| format!("req-{i}")).collect::<Vec<_>>());
    for l in &out {
        assert!(l["id"].as_str().unwrap().starts_with("batch_req_"));
        assert_eq!(l["response"]["status_code"], 200);
        assert!(l["response"]["request_id"].is_string(), "{l}");
        assert_eq!(l["response"]["body"]["object"], "chat.completion");
        assert_eq!(l["error"], Value::Null);
    }
    let errs = lines_of(&s, &key, &done["error_file_id"]).await;
    assert_eq!(errs.len(), 2);
    let by_id = |c: &str| errs.iter().find(|l| l["custom_id"] == c).unwrap().clone();
    // Each failed line got what the same live request gets.
    let (st, e) = s
        .post(
            "/v1/chat/completions",
            Some(&key),
            &json!({"model": "no-such-model", "max_tokens": 20,
                    "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    let unknown = by_id("unknown-model");
    assert_eq!(unknown["response"]["status_code"], st);
    assert_eq!(
        unknown["response"]["body"]["error"]["code"],
        e["error"]["code"]
    );
    assert_eq!(by_id("no-messages")["response"]["status_code"], 400);
    assert!(by_id("no-messages")["response"]["body"]["error"]["code"].is_string());

    // The output files are the org's, purpose batch_output.
    let out_id = done["output_file_id"].as_str().unwrap();
    let (_, f) = s.get(&format!("/v1/files/{out_id}"), Some(&key)).await;
    assert_eq!(f["purpose"], "batch_output");

    // Billed at the live price, once per served line, marked batch.
    let rows = billed(&s, 6).await;
    let live_cost = rows.iter().find(|r| r.0 == 0).unwrap().1;
    assert!(live_cost > 0);
    let batch: Vec<i64> = rows.iter().filter(|r| r.0 == 1).map(|r| r.1).collect();
    assert_eq!(batch, vec![live_cost; 6]);
    let after = s.balance_usd(&org).await;
    let charged = ((before - after) * 1e6).round() as i64;
    assert_eq!(charged, 6 * live_cost, "the balance paid six lines");
    // The org's usage reads say which events were batch lines.
    let (st, ev) = s
        .get("/api/gateway/usage/events?limit=50", Some(&key))
        .await;
    assert_eq!(st, 200, "{ev}");
    let marked = ev["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["batch"] == true && e["status"] == 200)
        .count();
    assert_eq!(marked, 6, "{ev}");

    // Listed, newest first.
    let (_, list) = s.get("/v1/batches?limit=1", Some(&key)).await;
    assert_eq!(list["data"][0]["id"], id);
    let (_, twin) = s.get(&format!("/batches/{id}"), Some(&key)).await;
    assert_eq!(twin["id"], id);

    // An hour after its finalization the batch's lines are deleted; the batch and
    // its files still read the same.
    let pool = db(&s).await;
    let lines = || async {
        sqlx::query_as::<_, (i64,)>("SELECT COUNT(*) FROM batch_lines WHERE batch_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
            .0
    };
    assert!(lines().await > 0, "kept within the hour");
    sqlx::query("UPDATE batches SET finalizing_at = finalizing_at - 3700000 WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lines().await > 0 {
        assert!(Instant::now() < deadline, "the lines were not purged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, again) = s.get(&format!("/v1/batches/{id}"), Some(&key)).await;
    assert_eq!(again["request_counts"], done["request_counts"]);
    let (st, _) = content(&s, &key, out_id).await;
    assert_eq!(st, 200);
}

/// A batch of `n` chat lines on one instance serving one line at a time, each
/// answer 300 ms slow, some 700 ms into its run.
struct SlowBatch {
    mock: Mock,
    _b: Backend,
    _dir: tempfile::TempDir,
    s: Sluice,
    key: String,
    id: String,
}

impl SlowBatch {
    async fn start(prefix: &str, n: usize) -> SlowBatch {
        Self::start_with(prefix, n, 1, None).await
    }

    /// `concurrency` slots, and the runner's poll when given.
    async fn start_with(
        prefix: &str,
        n: usize,
        concurrency: usize,
        poll_ms: Option<u64>,
    ) -> SlowBatch {
        let mock = Mock::start().await;
        mock.set_default("o1", Step::DelayHeaders(Duration::from_millis(300)));
        let b = Backend::fresh().await;
        let dir = tempfile::tempdir().unwrap();
        let mut opts = opts_in(&mock, dir.path()).env("SLUICE_BATCHES__CONCURRENCY", concurrency);
        if let Some(ms) = poll_ms {
            opts = opts.env("SLUICE_BATCHES__POLL_MS", ms);
        }
        let s = Sluice::start(&b, opts).await;
        let (_, _, key) = s.org_and_key().await;
        let lines: Vec<String> = (0..n)
            .map(|i| chat_line(&format!("{prefix}-{i}"), "g-std", "x"))
            .collect();
        let file = upload(&s, &key, &jsonl(&lines)).await;
        let created = create_batch(&s, &key, &file).await;
        let id = created["id"].as_str().unwrap().to_string();
        tokio::time::sleep(Duration::from_millis(700)).await;
        SlowBatch {
            mock,
            _b: b,
            _dir: dir,
            s,
            key,
            id,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_starts_and_finishes_at_once_not_at_the_next_poll_and_long_lines_flow() {
    // With a poll of a minute, a batch that waited for the runner's poll to start
    // or to be finalized would take that long; opening it and recording its last
    // line wake the runner.
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let s = Sluice::start(
        &b,
        opts_in(&mock, dir.path()).env("SLUICE_BATCHES__POLL_MS", "60000"),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    // The runner's first look (at its start) has passed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut lines: Vec<String> = (0..3)
        .map(|i| chat_line(&format!("r-{i}"), "g-std", "hi"))
        .collect();
    // A line far longer than the runner's in-memory pipe holds at once (64 KiB)
    // flows through it.
    lines.push(chat_line("long", "g-std", &"long history ".repeat(40_000)));
    let file = upload(&s, &key, &jsonl(&lines)).await;
    let batch = create_batch(&s, &key, &file).await;
    let id = batch["id"].as_str().unwrap();
    let done = wait_status(&s, &key, id, &["completed"], Duration::from_secs(10)).await;
    assert_eq!(done["request_counts"]["completed"], 4, "{done}");
    let out = lines_of(&s, &key, &done["output_file_id"]).await;
    assert_eq!(out.len(), 4);
    assert!(out
        .iter()
        .all(|l| l["response"]["status_code"] == 200 && l["error"].is_null()));
}

/// Cancels batch `id`, which must be answered 200; its answer.
async fn cancel(s: &Sluice, key: &str, id: &str) -> Value {
    let (st, c) = s
        .post(&format!("/v1/batches/{id}/cancel"), Some(key), &json!({}))
        .await;
    assert_eq!(st, 200, "{c}");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_new_lines_and_finalizes_with_what_is_done() {
    // Held whole: the backend's folder lives to the end.
    let slow = SlowBatch::start("c", 20).await;
    let (mock, s, key, id) = (&slow.mock, &slow.s, slow.key.as_str(), slow.id.as_str());
    let c = cancel(s, key, id).await;
    assert!(
        matches!(c["status"].as_str(), Some("cancelling" | "cancelled")),
        "{c}"
    );
    let sent_at_cancel = mock.count("o1") as usize;
    let done = wait_status(s, key, id, &["cancelled"], Duration::from_secs(10)).await;
    assert!(done["cancelling_at"].is_i64() && done["cancelled_at"].is_i64());
    let served = done["request_counts"]["completed"].as_i64().unwrap();
    assert!((1..20).contains(&served), "{done}");
    assert!(
        mock.count("o1") as usize <= sent_at_cancel + 1,
        "at most the line in flight ends"
    );
    let out = lines_of(s, key, &done["output_file_id"]).await;
    assert_eq!(out.len() as i64, served);
    assert_eq!(done["error_file_id"], Value::Null);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        mock.count("o1") as usize,
        served as usize,
        "no line after the cancel"
    );
}

/// The runner claims lines ahead of its slots (64 with four); a cancel drops
/// them at once. With a one-minute poll only the cancel (or the runner's look at
/// the open batches while lines wait) tells the runner, and otherwise the queued
/// lines would start one after another as slots free up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_drops_the_lines_claimed_ahead_at_once() {
    let slow = SlowBatch::start_with("q", 100, 4, Some(60_000)).await;
    let mock = &slow.mock;
    let sent = mock.count("o1") as usize;
    assert!(
        (1..=12).contains(&sent),
        "{sent} lines started in the first 700 ms"
    );
    cancel(&slow.s, &slow.key, &slow.id).await;
    let sent_at_cancel = mock.count("o1") as usize;
    // Four 300 ms rounds of the slots: the queue would have started 16 more.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let after = mock.count("o1") as usize - sent_at_cancel;
    assert!(
        after <= 1,
        "{after} lines reached the provider after the cancel"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_past_the_window_expires_into_the_error_file() {
    let slow = SlowBatch::start("e", 10).await;
    let (s, key, id) = (&slow.s, slow.key.as_str(), slow.id.as_str());
    // The window ends now (24 hours are not waited for in a test).
    let pool = db(s).await;
    sqlx::query("UPDATE batches SET expires_at = $1 WHERE id = $2")
        .bind(now_ms())
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let done = wait_status(s, key, id, &["expired"], Duration::from_secs(10)).await;
    assert!(done["expired_at"].is_i64());
    let served = done["request_counts"]["completed"].as_i64().unwrap();
    assert!((1..10).contains(&served), "{done}");
    assert_eq!(
        done["request_counts"]["failed"].as_i64().unwrap(),
        10 - served
    );
    let errs = lines_of(s, key, &done["error_file_id"]).await;
    assert_eq!(errs.len() as i64, 10 - served);
    for e in &errs {
        assert_eq!(e["error"]["code"], "batch_expired", "{e}");
        assert_eq!(e["response"], Value::Null);
    }
    let out = lines_of(s, key, &done["output_file_id"]).await;
    assert_eq!(out.len() as i64, served);
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_loses_no_line_and_bills_none_twice() {
    let mock = Mock::start().await;
    mock.set_default("o1", Step::DelayHeaders(Duration::from_millis(150)));
    let b = Backend::fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let o = opts_in(&mock, dir.path()).env("SLUICE_BATCHES__CONCURRENCY", 3);
    let mut s = Sluice::start(&b, o.clone()).await;
    let (_, _, key) = s.org_and_key().await;
    let n = 30;
    let lines: Vec<String> = (0..n)
        .map(|i| chat_line(&format!("r-{i}"), "g-std", "x"))
        .collect();
    let file = upload(&s, &key, &jsonl(&lines)).await;
    let created = create_batch(&s, &key, &file).await;
    let id = created["id"].as_str().unwrap().to_string();
    // Kill the process (no drain) while lines are in flight.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, b) = s.get(&format!("/v1/batches/{id}"), Some(&key)).await;
        if b["request_counts"]["completed"].as_i64().unwrap_or(0) >= 5 {
            break;
        }
        assert!(Instant::now() < deadline, "{b}");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    drop(s);
    let s = Sluice::start(&b, o).await;
    let done = wait_status(&s, &key, &id, &["completed"], Duration::from_secs(40)).await;
    let out = lines_of(&s, &key, &done["output_file_id"]).await;
    let errs = lines_of(&s, &key, &done["error_file_id"]).await;
    let mut seen: Vec<String> = out
        .iter()
        .chain(errs.iter())
        .map(|l| l["custom_id"].as_str().unwrap().to_string())
        .collect();
    seen.sort();
    let mut want: Vec<String> = (0..n).map(|i| format!("r-{i}")).collect();
    want.sort();
    assert_eq!(seen, want, "every line once, none lost");
    // A line the killed process left without a record runs again: all are served.
    assert!(errs.is_empty(), "{errs:?}");
    // Each line served is billed exactly once, those that ran twice included.
    let rows = billed(&s, out.len()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rows_later = billed(&s, out.len()).await;
    assert_eq!(rows.len(), rows_later.len());
    let batch_billed = rows_later.iter().filter(|r| r.0 == 1).count();
    assert_eq!(batch_billed, out.len(), "one charge per served line");
    assert_eq!(out.len(), n);
    // The lines in flight at the kill ran twice, and are billed once (above).
    assert!(
        mock.requests().len() > n,
        "{} provider calls",
        mock.requests().len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_one_batch_on_postgres() {
    let b = Backend::fresh().await;
    if !b.is_postgres() {
        return;
    }
    let mock = Mock::start().await;
    mock.set_default("o1", Step::DelayHeaders(Duration::from_millis(100)));
    let dir = tempfile::tempdir().unwrap();
    let o = opts_in(&mock, dir.path()).env("SLUICE_BATCHES__CONCURRENCY", 2);
    let s1 = Sluice::start(&b, o.clone()).await;
    let s2 = Sluice::start(&b, o).await;
    let (_, _, key) = s1.org_and_key().await;
    s2.wait_for_key(&key).await;
    let n = 40;
    let lines: Vec<String> = (0..n)
        .map(|i| chat_line(&format!("p-{i}"), "g-std", "x"))
        .collect();
    let file = upload(&s1, &key, &jsonl(&lines)).await;
    let created = create_batch(&s1, &key, &file).await;
    let id = created["id"].as_str().unwrap();
    let done = wait_status(&s2, &key, id, &["completed"], Duration::from_secs(30)).await;
    assert_eq!(done["request_counts"]["completed"], n);
    let out = lines_of(&s2, &key, &done["output_file_id"]).await;
    assert_eq!(out.len(), n);
    assert_eq!(mock.count("o1") as usize, n, "each line sent once");
    let pool = db(&s1).await;
    let servers: Vec<(String,)> =
        sqlx::query_as("SELECT DISTINCT claimed_by FROM batch_lines WHERE batch_id = $1")
            .bind(id)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(servers.len(), 2, "both instances served lines");
    assert_eq!(billed(&s1, n).await.iter().filter(|r| r.0 == 1).count(), n);
}

/// On the S3-compatible store (moto, named by SLUICE_TEST_S3_ENDPOINT): a file of
/// several multipart parts is stored and read back whole, and a batch's output
/// files land there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_batch_outputs_live_on_an_s3_compatible_store() {
    let Some(endpoint) = std::env::var("SLUICE_TEST_S3_ENDPOINT")
        .ok()
        .filter(|s| !s.is_empty())
    else {
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
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        opts(&mock)
            .env("SLUICE_STORAGE__OBJECTS", format!("s3://{bucket}/gw"))
            .env("SLUICE_STORAGE__S3_ENDPOINT", &endpoint)
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1"),
    )
    .await;
    let (org, _, key) = s.org_and_key().await;
    // 12 MB of opaque bytes: three S3 parts.
    let big: Vec<u8> = (0..12 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    let (st, f) = upload_to(&s, "/v1/files", &key, Some("user_data"), &big).await;
    assert_eq!(st, 200, "{f}");
    let id = f["id"].as_str().unwrap();
    let (st, got) = content(&s, &key, id).await;
    assert_eq!(st, 200);
    assert!(got == big, "the file reads back whole");
    let object = http
        .get(format!("{endpoint}/{bucket}/gw/files/{org}/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(object.status(), 200);

    let file = upload(&s, &key, &jsonl(&[chat_line("s3-0", "g-std", "hi")])).await;
    let created = create_batch(&s, &key, &file).await;
    let done = wait_status(
        &s,
        &key,
        created["id"].as_str().unwrap(),
        &["completed"],
        Duration::from_secs(20),
    )
    .await;
    let out = lines_of(&s, &key, &done["output_file_id"]).await;
    assert_eq!(out[0]["custom_id"], "s3-0");
    let (st, _) = delete(&s, &key, &format!("/v1/files/{id}")).await;
    assert_eq!(st, 200);
    let gone = http
        .get(format!("{endpoint}/{bucket}/gw/files/{org}/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runners_credential_cannot_be_presented_by_a_client() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (_, _, key) = s.org_and_key().await;
    let hash = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(key.as_bytes()))
    };
    for presented in [
        format!("guess {hash}"),
        format!("bt_0 {hash}"),
        hash.clone(),
    ] {
        let r = s
            .http
            .post(format!("{}/v1/chat/completions", s.gateway))
            .header("x-sluice-batch", presented)
            .json(&json!({"model": "g-std", "messages": [{"role": "user", "content": "x"}]}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        assert_error(status, &body, 401, "invalid_key");
    }
    assert_eq!(mock.count("o1"), 0);
}
