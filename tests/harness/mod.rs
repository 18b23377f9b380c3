//! Starts real `sluice` processes for integration tests, on the back end the test
//! command chose: SQLite + in-process counters by default, PostgreSQL + Redis when
//! `SLUICE_TEST_DATABASE_URL` (a server URL; each test gets a fresh database) and
//! `SLUICE_TEST_REDIS_URL` are set. When they are set and unreachable, tests fail.

#![allow(dead_code)]

pub mod fleet;
pub mod web;

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ADMIN_TOKEN: &str = "test-admin-token-of-thirty-two-chars";

/// Where one test's state lives.
pub struct Backend {
    pub database_url: String,
    pub redis_url: Option<String>,
    _dir: tempfile::TempDir,
}

impl Backend {
    pub async fn fresh() -> Backend {
        let dir = tempfile::tempdir().expect("tempdir");
        let redis_url = std::env::var("SLUICE_TEST_REDIS_URL")
            .ok()
            .filter(|s| !s.is_empty());
        let database_url = match std::env::var("SLUICE_TEST_DATABASE_URL") {
            Ok(server) if !server.is_empty() => create_pg_database(&server).await,
            _ => format!("sqlite://{}/sluice.db", dir.path().display()),
        };
        Backend {
            database_url,
            redis_url,
            _dir: dir,
        }
    }

    pub fn is_postgres(&self) -> bool {
        self.database_url.starts_with("postgres")
    }
}

async fn create_pg_database(server: &str) -> String {
    use sqlx::Connection;
    let name = format!("sluice_t_{:016x}", rand::random::<u64>());
    let mut conn = sqlx::PgConnection::connect(server)
        .await
        .expect("SLUICE_TEST_DATABASE_URL is set, so PostgreSQL must be reachable");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .expect("create test database");
    let base = server.rsplit_once('/').map_or(server, |(b, _)| b);
    format!("{base}/{name}")
}

/// Options for one process.
#[derive(Clone, Default)]
pub struct Opts {
    /// Extra `SLUICE_…` environment overrides.
    pub env: Vec<(String, String)>,
    /// A catalog file; default: the repository's conf/catalog.toml.
    pub catalog: Option<String>,
}

impl Opts {
    pub fn env(mut self, k: &str, v: impl ToString) -> Self {
        self.env.push((k.to_string(), v.to_string()));
        self
    }

    pub fn catalog(mut self, path: impl ToString) -> Self {
        self.catalog = Some(path.to_string());
        self
    }
}

/// A provider a test's gateway sends to the mock, with the platform credentials
/// the tests expect upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    OpenAi,
    Anthropic,
    Google,
    Bedrock,
    Vertex,
    Azure,
    Mistral,
    OpenRouter,
}

impl Provider {
    /// The provider's name in `SLUICE_PROVIDERS__<NAME>__…`.
    pub fn env_name(self) -> &'static str {
        match self {
            Provider::OpenAi => "OPENAI",
            Provider::Anthropic => "ANTHROPIC",
            Provider::Google => "GOOGLE",
            Provider::Bedrock => "BEDROCK",
            Provider::Vertex => "VERTEX",
            Provider::Azure => "AZURE",
            Provider::Mistral => "MISTRAL",
            Provider::OpenRouter => "OPENROUTER",
        }
    }
}

/// A Vertex service account whose token endpoint is the mock's.
pub fn vertex_account(base: &str) -> String {
    let text = std::fs::read_to_string(repo_path("tests/fixtures/vertex-test-sa.json")).unwrap();
    let mut sa: Value = serde_json::from_str(&text).unwrap();
    sa["token_uri"] = json!(format!("{base}/token"));
    sa.to_string()
}

impl Opts {
    /// Points each of `providers` at the mock at `base`, with its platform
    /// credentials.
    pub fn providers(mut self, base: &str, providers: &[Provider]) -> Self {
        for p in providers {
            let url = match p {
                Provider::OpenAi | Provider::Mistral | Provider::OpenRouter => format!("{base}/v1"),
                _ => base.to_string(),
            };
            self = self.env(
                &format!("SLUICE_PROVIDERS__{}__BASE_URL", p.env_name()),
                url,
            );
            self = match p {
                Provider::OpenAi => self.env("OPENAI_API_KEY", "sk-platform-openai"),
                Provider::Anthropic => self.env("ANTHROPIC_API_KEY", "sk-ant-platform"),
                Provider::Google => self.env("GEMINI_API_KEY", "gm-platform"),
                Provider::Bedrock => self.env("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE").env(
                    "AWS_SECRET_ACCESS_KEY",
                    "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                ),
                Provider::Vertex => {
                    self.env("GOOGLE_APPLICATION_CREDENTIALS", vertex_account(base))
                }
                Provider::Azure => self.env("AZURE_OPENAI_API_KEY", "az-platform"),
                Provider::Mistral => self.env("MISTRAL_API_KEY", "mi-platform"),
                Provider::OpenRouter => self,
            };
        }
        self
    }

    /// The same `value` for `key` of each of `providers`
    /// (`SLUICE_PROVIDERS__<NAME>__<KEY>`).
    pub fn each(mut self, providers: &[Provider], key: &str, value: impl ToString) -> Self {
        let value = value.to_string();
        for p in providers {
            self = self.env(
                &format!("SLUICE_PROVIDERS__{}__{key}", p.env_name()),
                &value,
            );
        }
        self
    }
}

/// The set-up most tests share: the mock provider, a gateway over it on a fresh
/// back end, and an org with a key.
pub struct Env {
    pub mock: sluice_mock::Mock,
    pub s: Sluice,
    pub org: String,
    pub key: String,
    pub b: Backend,
}

impl Env {
    /// A gateway with the `fixture` catalog (a path under the repository),
    /// `providers` pointed at the mock, and whatever `more` adds.
    pub async fn start(
        fixture: &str,
        providers: &[Provider],
        more: impl FnOnce(Opts, &str) -> Opts,
    ) -> Env {
        let mock = sluice_mock::Mock::start().await;
        let base = mock.base_url();
        let b = Backend::fresh().await;
        let opts = Opts::default()
            .catalog(repo_path(fixture))
            .providers(&base, providers);
        let s = Sluice::start(&b, more(opts, &base)).await;
        let (org, _, key) = s.org_and_key().await;
        Env {
            mock,
            s,
            org,
            key,
            b,
        }
    }
}

/// `GET /api/models{query}` without a key: status and body.
pub async fn model_list(s: &Sluice, query: &str) -> (u16, Value) {
    let r = s
        .http
        .get(format!("{}/api/models{query}", s.gateway))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// The slugs of a model list, in order.
pub fn slugs(v: &Value) -> Vec<String> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["slug"].as_str().unwrap().to_string())
        .collect()
}

pub fn repo_path(rel: &str) -> String {
    format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// A running `sluice serve`.
pub struct Sluice {
    pub child: Child,
    pub gateway: String,
    pub web: String,
    pub ops: String,
    pub http: reqwest::Client,
    pub database_url: String,
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn command(backend: &Backend, opts: &Opts) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn")
        .env("SLUICE_SERVER__LISTEN", "127.0.0.1:0")
        .env("SLUICE_SERVER__WEB_LISTEN", "127.0.0.1:0")
        .env("SLUICE_SERVER__OPS_LISTEN", "127.0.0.1:0")
        .env("SLUICE_SERVER__THREADS", "2")
        .env("SLUICE_SERVER__GRACE_PERIOD_SECONDS", "2")
        // A loaded test machine can pause a process longer than production's
        // tens of milliseconds; the outage tests set their own.
        .env("SLUICE_STORAGE__REDIS_TIMEOUT_MS", "2000")
        .env("SLUICE_ADMIN__TOKEN", ADMIN_TOKEN)
        .env("SLUICE_STORAGE__DATABASE_URL", &backend.database_url)
        .env(
            "SLUICE_SECRETS__KEY_FILE",
            backend._dir.path().join("secret.key").display().to_string(),
        )
        // The usage spool and journal of the backend's instances, not the repository's.
        .env(
            "SLUICE_STORAGE__USAGE_SPOOL",
            backend
                ._dir
                .path()
                .join("usage-spool.jsonl")
                .display()
                .to_string(),
        )
        .env(
            "SLUICE_CATALOG__PATH",
            opts.catalog
                .clone()
                .unwrap_or_else(|| repo_path("conf/catalog.toml")),
        );
    if let Some(r) = &backend.redis_url {
        cmd.env("SLUICE_STORAGE__REDIS_URL", r);
    }
    for (k, v) in &opts.env {
        cmd.env(k, v);
    }
    cmd
}

impl Sluice {
    pub async fn start(backend: &Backend, opts: Opts) -> Sluice {
        Sluice::spawn(command(backend, &opts), &backend.database_url).await
    }

    /// Starts `serve` from a prepared command (a test that changes the working
    /// directory or the config file).
    pub async fn spawn(cmd: Command, database_url: &str) -> Sluice {
        Sluice::spawn_with_stderr(cmd, database_url, Stdio::inherit()).await
    }

    /// Starts `serve` with its log (stderr) going to `stderr` (a test that reads
    /// the log).
    pub async fn spawn_with_stderr(mut cmd: Command, database_url: &str, stderr: Stdio) -> Sluice {
        let mut child = cmd
            .arg("serve")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn sluice");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut found = Vec::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("listening ") {
                    found.push(rest.to_string());
                    if found.len() == 3 {
                        let _ = tx.send(found.clone());
                    }
                }
            }
        });
        let lines = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("sluice printed its listeners");
        let addr = |name: &str| {
            let l = lines
                .iter()
                .find(|l| l.starts_with(&format!("{name} ")))
                .expect("listener line");
            format!("http://{}", l.split_once(' ').unwrap().1)
        };
        let s = Sluice {
            child,
            gateway: addr("gateway"),
            web: addr("web"),
            ops: addr("ops"),
            http: reqwest::Client::new(),
            database_url: database_url.to_string(),
        };
        s.wait_ready().await;
        s
    }

    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = self.http.get(format!("{}/readyz", self.ops)).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "sluice never became ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.ops))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.expect("admin request");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// A new org with credits and a key; returns (org_id, key_id, key).
    pub async fn org_and_key(&self) -> (String, String, String) {
        let (s, org) = self
            .admin(
                reqwest::Method::POST,
                "/admin/orgs",
                Some(json!({"name": "acme", "email": "ops@acme.test", "email_verified": true, "card_verified": true, "credits_usd": 10, "tier": 3})),
            )
            .await;
        assert_eq!(s, 201, "{org}");
        let org_id = org["org_id"].as_str().unwrap().to_string();
        let (s, key) = self
            .admin(
                reqwest::Method::POST,
                &format!("/admin/orgs/{org_id}/keys"),
                Some(json!({"name": "test"})),
            )
            .await;
        assert_eq!(s, 201, "{key}");
        (
            org_id,
            key["api_key_id"].as_str().unwrap().to_string(),
            key["api_key"].as_str().unwrap().to_string(),
        )
    }

    /// A new org from an admin `POST /admin/orgs` body, with one key; returns
    /// (org_id, key).
    pub async fn org_with(&self, body: Value) -> (String, String) {
        let (st, o) = self
            .admin(reqwest::Method::POST, "/admin/orgs", Some(body))
            .await;
        assert_eq!(st, 201, "{o}");
        let id = o["org_id"].as_str().unwrap().to_string();
        let (st, k) = self
            .admin(
                reqwest::Method::POST,
                &format!("/admin/orgs/{id}/keys"),
                Some(json!({})),
            )
            .await;
        assert_eq!(st, 201, "{k}");
        (id, k["api_key"].as_str().unwrap().to_string())
    }

    /// The org's balance as the admin API reads it, in USD.
    pub async fn balance_usd(&self, org: &str) -> f64 {
        let (_, v) = self
            .admin(reqwest::Method::GET, &format!("/admin/orgs/{org}"), None)
            .await;
        v["balance_usd"].as_f64().unwrap_or_else(|| panic!("{v}"))
    }

    /// Waits until this instance knows a key another instance minted (the
    /// directory syncs on an interval).
    pub async fn wait_for_key(&self, key: &str) {
        for _ in 0..50 {
            if self.get("/v1/models", Some(key)).await.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("this instance never learned the key");
    }

    /// The `/metrics` scrape of the ops listener (asserted 200).
    #[allow(dead_code)]
    pub async fn metrics(&self) -> String {
        let r = self
            .http
            .get(format!("{}/metrics", self.ops))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    }

    /// GET on the gateway with a key; returns status, headers and JSON body.
    pub async fn get(&self, path: &str, key: Option<&str>) -> (u16, Value) {
        let mut req = self.http.get(format!("{}{path}", self.gateway));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let r = req.send().await.expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// The key's org's usage events, newest first, once at least `want` are
    /// recorded (the writer records them after the answer; waits up to 10 s).
    pub async fn usage_events(&self, key: &str, want: usize) -> Vec<Value> {
        let mut events = Vec::new();
        for _ in 0..100 {
            let (_, v) = self
                .get("/api/gateway/usage/events?limit=100", Some(key))
                .await;
            events = v["data"].as_array().cloned().unwrap_or_default();
            if events.len() >= want {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        events
    }

    /// POST raw bytes on the gateway with a key.
    pub async fn post_raw(
        &self,
        path: &str,
        key: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.gateway))
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let r = req.send().await.expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn post(&self, path: &str, key: Option<&str>, body: &Value) -> (u16, Value) {
        self.post_raw(path, key, serde_json::to_vec(body).unwrap())
            .await
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
    }

    /// Stops the process as an operator does (SIGTERM: it drains, and gives back
    /// what it holds of the shared counters) and waits for it to exit.
    pub fn stop(mut self) {
        self.terminate();
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Runs `sluice admin …` against a back end; returns (exit ok, stdout JSON).
pub fn admin_cli(backend: &Backend, args: &[&str]) -> (bool, Value) {
    let out = command(backend, &Opts::default())
        .arg("admin")
        .args(args)
        .output()
        .expect("run sluice admin");
    let text = if out.status.success() {
        out.stdout
    } else {
        out.stderr
    };
    (
        out.status.success(),
        serde_json::from_slice(&text).unwrap_or(Value::Null),
    )
}

/// Waits until `ready` says so, looking every 100 ms for up to 10 s; panics
/// naming `what` when it never does.
pub async fn wait_for(what: &str, mut ready: impl AsyncFnMut() -> bool) {
    for _ in 0..100 {
        if ready().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("never happened: {what}");
}

/// The body a recording (tests/recordings/`name`) is replayed as: an `.sse` file is
/// the body the API sent, byte for byte; a `.chunks.txt` file (one event's JSON
/// per line) becomes the SSE its API sends, each line unchanged as a frame's data:
/// Anthropic names each frame by its type; an OpenAI-compatible server names none
/// and ends with `[DONE]`.
pub fn recorded_body(name: &str) -> String {
    let text = std::fs::read_to_string(repo_path(&format!("tests/recordings/{name}"))).unwrap();
    if name.ends_with(".sse") {
        return text;
    }
    let anthropic = name.contains("anthropic");
    let mut body = String::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if anthropic {
            let v: Value = serde_json::from_str(line).unwrap();
            body.push_str(&format!("event: {}\n", v["type"].as_str().unwrap()));
        }
        body.push_str(&format!("data: {line}\n\n"));
    }
    if !anthropic {
        body.push_str("data: [DONE]\n\n");
    }
    body
}

/// A recording (see [`recorded_body`]) as the mock's 200 answer.
pub fn recording(name: &str) -> sluice_mock::Step {
    sluice_mock::Step::Reply {
        status: 200,
        body: recorded_body(name),
        retry_after: None,
    }
}

/// Asserts an OpenAI-style error envelope with the code (and param, if given).
#[track_caller]
pub fn assert_error(status: u16, body: &Value, want_status: u16, code: &str) {
    assert_eq!(status, want_status, "body: {body}");
    assert_eq!(body["error"]["code"], code, "body: {body}");
    assert!(body["error"]["message"].is_string(), "body: {body}");
    assert!(body["error"]["type"].is_string(), "body: {body}");
    assert!(
        body["error"].get("param").is_some(),
        "param present (maybe null): {body}"
    );
}

/// An answer as a client read it: status, headers, the JSON body of a whole answer,
/// or a stream's frames (event name, data).
#[allow(dead_code)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub json: Value,
    pub frames: Vec<(Option<String>, String)>,
}

#[allow(dead_code)]
impl Answer {
    pub fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    }

    /// The data of every frame that is JSON.
    pub fn data(&self) -> Vec<Value> {
        self.frames
            .iter()
            .filter_map(|(_, d)| serde_json::from_str(d).ok())
            .collect()
    }

    /// The data of every frame named `event`.
    pub fn named(&self, event: &str) -> Vec<Value> {
        self.frames
            .iter()
            .filter(|(n, _)| n.as_deref() == Some(event))
            .filter_map(|(_, d)| serde_json::from_str(d).ok())
            .collect()
    }

    /// The data of the last frame named `event`.
    pub fn last_event(&self, event: &str) -> Option<Value> {
        self.frames
            .iter()
            .rev()
            .find(|(n, _)| n.as_deref() == Some(event))
            .and_then(|(_, d)| serde_json::from_str(d).ok())
    }
}

#[allow(dead_code)]
impl Sluice {
    /// POSTs a JSON body with a key and reads the whole answer, whole or streamed.
    pub async fn call(&self, key: &str, path: &str, body: &Value) -> Answer {
        self.call_with(key, path, body, &[]).await
    }

    /// As `call`, with extra request headers.
    pub async fn call_with(
        &self,
        key: &str,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut req = self
            .http
            .post(format!("{}{path}", self.gateway))
            .bearer_auth(key)
            .json(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let sse = headers
            .get("content-type")
            .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
        let mut raw = Vec::new();
        while let Ok(Some(c)) = r.chunk().await {
            raw.extend_from_slice(&c);
        }
        let text = String::from_utf8(raw).unwrap();
        let (json, frames) = if sse {
            let frames = text
                .split("\n\n")
                .filter(|f| !f.trim().is_empty() && !f.starts_with(':'))
                .map(|f| {
                    let name = f
                        .lines()
                        .find_map(|l| l.strip_prefix("event: "))
                        .map(str::to_string);
                    let data: Vec<&str> =
                        f.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                    (name, data.join("\n"))
                })
                .collect();
            (Value::Null, frames)
        } else {
            (
                serde_json::from_str(&text).unwrap_or(Value::Null),
                Vec::new(),
            )
        };
        Answer {
            status,
            headers,
            json,
            frames,
        }
    }
}

/// Runs one SQL query against a backend's database; the rows as JSON objects of
/// their integer and text columns (tests read what the service stored).
#[allow(dead_code)]
pub async fn sql_rows(database_url: &str, query: &str) -> Vec<serde_json::Map<String, Value>> {
    use sqlx::{Column, Row};
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(database_url).await.unwrap();
    let rows = sqlx::query(query).fetch_all(&pool).await.unwrap();
    rows.iter()
        .map(|r| {
            r.columns()
                .iter()
                .map(|c| {
                    let v = r
                        .try_get::<i64, _>(c.ordinal())
                        .map(Value::from)
                        .or_else(|_| r.try_get::<String, _>(c.ordinal()).map(Value::from))
                        .unwrap_or(Value::Null);
                    (c.name().to_string(), v)
                })
                .collect()
        })
        .collect()
}
