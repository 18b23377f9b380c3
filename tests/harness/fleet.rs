//! Several instances over one PostgreSQL and one Redis, with faults: this test's
//! own Redis server (emptied as a restart without persistence empties it), TCP
//! proxies in front of both stores (`FaultProxy`: a cut resets every connection
//! and refuses new ones, as a killed server does), instances killed and started
//! again on their own disks; and the ledger reads that reconcile a run.

use super::{command, repo_path, sql_rows, Backend, Opts, Sluice};
use sluice_mock::Mock;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer(pub Child, pub u16);

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn start_redis(dir: &std::path::Path) -> RedisServer {
    let port = free_port();
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server (the test command installs it)");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return RedisServer(child, port);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("redis-server did not start");
}

/// Empties the test's Redis, as a restart without persistence does.
pub fn flush_redis(port: u16) {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "FLUSHALL"])
        .output()
        .unwrap();
    assert!(out.status.success());
}

/// `postgres://user@host:port/db` with host:port replaced.
pub fn via(url: &str, addr: std::net::SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (auth_host, path) = rest.split_once('/').unwrap();
    let auth = auth_host
        .rsplit_once('@')
        .map_or(String::new(), |(a, _)| format!("{a}@"));
    format!("{scheme}://{auth}{addr}/{path}")
}

pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    let host = rest.split('/').next().unwrap();
    host.rsplit_once('@').map_or(host, |(_, h)| h).to_string()
}

/// The instances and their stores' addresses (through the proxies).
pub struct Fleet {
    pub backend: Backend,
    pub db_url: String,
    pub redis_url: String,
    pub mock: Mock,
    pub dirs: Vec<tempfile::TempDir>,
    pub instances: Vec<Option<Sluice>>,
}

impl Fleet {
    pub fn opts(&self, i: usize) -> Opts {
        let base = self.mock.base_url();
        Opts::default()
            .catalog(repo_path("tests/fixtures/ops.toml"))
            .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
            .env("SLUICE_PROVIDERS__AZURE__BASE_URL", &base)
            .env("OPENAI_API_KEY", "sk-platform-openai")
            .env("AZURE_OPENAI_API_KEY", "az-platform")
            .env("SLUICE_STORAGE__DATABASE_URL", &self.db_url)
            .env("SLUICE_STORAGE__REDIS_URL", &self.redis_url)
            // Short store timeouts, as production's, with room for a loaded CI box.
            .env("SLUICE_STORAGE__REDIS_TIMEOUT_MS", "250")
            .env("SLUICE_STORAGE__DATABASE_TIMEOUT_MS", "1000")
            // Each instance its own disk: spool and journal.
            .env(
                "SLUICE_STORAGE__USAGE_SPOOL",
                self.dirs[i].path().join("usage-spool.jsonl").display(),
            )
    }

    pub async fn start(&mut self, i: usize) {
        let cmd = command(&self.backend, &self.opts(i));
        let s = Sluice::spawn(cmd, &self.db_url).await;
        self.instances[i] = Some(s);
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(s) = self.instances[i].take() {
            let ok = Command::new("kill")
                .args(["-KILL", &s.pid().to_string()])
                .status()
                .unwrap();
            assert!(ok.success());
            drop(s);
        }
    }

    pub fn live(&self) -> Vec<&Sluice> {
        self.instances.iter().flatten().collect()
    }

    /// Every live instance's `/readyz`: status, body, and how long it took.
    pub async fn readiness(&self) -> Vec<(u16, serde_json::Value, Duration)> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let mut out = Vec::new();
        for s in self.live() {
            let t = Instant::now();
            let r = http.get(format!("{}/readyz", s.ops)).send().await;
            let took = t.elapsed();
            match r {
                Ok(r) => {
                    let st = r.status().as_u16();
                    out.push((st, r.json().await.unwrap_or_default(), took));
                }
                Err(_) => out.push((0, serde_json::Value::Null, took)),
            }
        }
        out
    }

    /// Seconds until every live instance answers `/readyz` 200 (panics past 10 s).
    pub async fn ready_within(&self, what: &str) -> f64 {
        let t = Instant::now();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        for s in self.live() {
            loop {
                let probe = Instant::now();
                let r = http.get(format!("{}/readyz", s.ops)).send().await;
                assert!(
                    probe.elapsed() < Duration::from_millis(1500),
                    "/readyz answers within a second ({what})"
                );
                let (status, body) = match r {
                    Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
                    Err(e) => (0, e.to_string()),
                };
                if status == 200 {
                    break;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "an instance was not ready 10 s after {what}: {status} {body}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        t.elapsed().as_secs_f64()
    }
}

/// The one number a query returns (its column `n`).
pub async fn sql_number(db: &str, sql: &str) -> i64 {
    sql_rows(db, sql).await[0]["n"].as_i64().unwrap()
}

pub async fn org_balance(db: &str, org: &str) -> i64 {
    let sql = format!("SELECT balance_micro_usd AS n FROM orgs WHERE id = '{org}'");
    sql_number(db, &sql).await
}

/// What the usage events that `filter` picks cost, in micro-dollars.
pub async fn cost_of(db: &str, filter: &str) -> i64 {
    let sql = format!(
        "SELECT CAST(COALESCE(SUM(cost_micro_usd), 0) AS BIGINT) AS n FROM usage_events WHERE {filter}"
    );
    sql_number(db, &sql).await
}

pub async fn org_cost(db: &str, org: &str) -> i64 {
    cost_of(db, &format!("org_id = '{org}'")).await
}

pub async fn key_cost(db: &str, key: &str) -> i64 {
    cost_of(db, &format!("key_id = '{key}'")).await
}

pub async fn event_count(db: &str) -> i64 {
    sql_number(db, "SELECT COUNT(*) AS n FROM usage_events").await
}

/// Served (200) events of a key for a model.
pub async fn ok_events(db: &str, key: &str, model: &str) -> i64 {
    let sql = format!(
        "SELECT COUNT(*) AS n FROM usage_events WHERE key_id = '{key}' AND model = '{model}' AND status = 200 AND incomplete = 0"
    );
    sql_number(db, &sql).await
}

pub async fn only_key(db: &str, org: &str) -> String {
    let r = sql_rows(
        db,
        &format!("SELECT id FROM api_keys WHERE org_id = '{org}'"),
    )
    .await;
    r[0]["id"].as_str().unwrap().to_string()
}
