//! Running sluice at the edge: TLS on the gateway and web listeners, the catalog
//! reloaded on SIGHUP without dropping a request in flight, the admin token read
//! from a file, and two instances of one service where one is killed mid-stream:
//! the other keeps serving and the usage totals stay whole.

mod harness;

use harness::{command, repo_path, sql_rows, Backend, Opts, Sluice, ADMIN_TOKEN};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use std::process::Command;
use std::time::Duration;

fn opts(mock: &Mock) -> Opts {
    let base = mock.base_url();
    Opts::default()
        .catalog(repo_path("tests/fixtures/ops.toml"))
        .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
        .env("SLUICE_PROVIDERS__AZURE__BASE_URL", &base)
        .env("SLUICE_PROVIDERS__ANTHROPIC__BASE_URL", &base)
        .env("OPENAI_API_KEY", "sk-platform-openai")
        .env("AZURE_OPENAI_API_KEY", "az-platform")
        .env("ANTHROPIC_API_KEY", "sk-ant-platform")
}

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "Say hello"}]})
}

/// A self-signed certificate for 127.0.0.1 and localhost; (cert, key) paths.
fn certificate(dir: &std::path::Path) -> (String, String) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (scripts/test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert.display().to_string(), key.display().to_string())
}

/// `curl` over TLS trusting only `ca`: (HTTP status, body); status 0 when no
/// TLS session could be made.
fn curl(ca: &str, url: &str, args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "--cacert",
            ca,
            "-w",
            "\n%{http_code}",
        ])
        .args(args)
        .arg(url)
        .output()
        .expect("curl (scripts/test installs it)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_and_web_listeners_speak_tls() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key_file) = certificate(dir.path());
    let s = Sluice::start(
        &b,
        opts(&mock)
            .env("SLUICE_SERVER__TLS_CERT", &cert)
            .env("SLUICE_SERVER__TLS_KEY", &key_file),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    let gateway = s.gateway.replace("http://", "https://");
    let web = s.web.replace("http://", "https://");
    let auth = format!("Authorization: Bearer {key}");
    let (st, body) = curl(&cert, &format!("{gateway}/v1/models"), &["-H", &auth]);
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("ops-chat"), "{body}");
    let payload = chat("ops-chat", true).to_string();
    let (st, body) = curl(
        &cert,
        &format!("{gateway}/v1/chat/completions"),
        &[
            "-H",
            &auth,
            "-H",
            "content-type: application/json",
            "-d",
            &payload,
        ],
    );
    assert_eq!(st, 200, "{body}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    // The web listener answers over TLS too (whatever its page is).
    let (st, _) = curl(&cert, &format!("{web}/"), &[]);
    assert_ne!(st, 0, "no TLS session with the web listener");
    // Plain HTTP is not spoken on the TLS port.
    let plain = reqwest::Client::new()
        .get(format!("{}/v1/models", s.gateway))
        .bearer_auth(&key)
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    assert!(plain.map_or(true, |r| r.status() != 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_catalog_without_dropping_a_request() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.toml");
    let original = std::fs::read_to_string(repo_path("tests/fixtures/ops.toml")).unwrap();
    std::fs::write(&catalog, &original).unwrap();
    let s = Sluice::start(&b, opts(&mock).catalog(catalog.display())).await;
    let (_, _, key) = s.org_and_key().await;

    // A stream in flight across the reload: about two seconds of slow chunks.
    mock.script(
        "o1",
        vec![Step::SlowChunks {
            n: 20,
            every: Duration::from_millis(100),
        }],
    );
    let streaming = {
        let http = s.http.clone();
        let url = format!("{}/v1/chat/completions", s.gateway);
        let key = key.clone();
        tokio::spawn(async move {
            let mut r = http
                .post(url)
                .bearer_auth(key)
                .json(&chat("ops-chat", true))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let mut text = String::new();
            while let Ok(Some(c)) = r.chunk().await {
                text.push_str(&String::from_utf8_lossy(&c));
            }
            (status, text)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    const ADDED: &str = r#"
[[model]]
slug = "ops-added"
display_name = "ops-added"
kind = "chat"
owned_by = "openai"
context_window = 128000
max_input_tokens = 128000
supported_params = ["temperature"]
price = { input = 1000000, cached_input = 500000, output = 2000000 }
category = "general"
max_output_tokens = 4096

[[model.rung]]
provider = "openai"
provider_model_id = "added1"
zdr = true
caps = ["sampling"]
"#;
    std::fs::write(&catalog, format!("{original}{ADDED}")).unwrap();
    hup(&s);
    let mut listed = false;
    for _ in 0..200 {
        let (st, v) = s.get("/v1/models", Some(&key)).await;
        assert_eq!(st, 200);
        if v["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "ops-added")
        {
            listed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(listed, "the reloaded catalog lists the new model");
    let (status, text) = streaming.await.unwrap();
    assert_eq!(status, 200);
    assert!(
        text.trim_end().ends_with("data: [DONE]"),
        "the stream in flight finished whole: {text}"
    );
    let content = text.matches("\"content\":\"").count();
    assert!(content >= 20, "{content} chunks: {text}");
    let a = s
        .call(&key, "/v1/chat/completions", &chat("ops-added", false))
        .await;
    assert_eq!(a.status, 200, "{}", a.json);

    // A file that does not load leaves the catalog served as it was.
    std::fs::write(&catalog, "[[model]]\nslug = 3\n").unwrap();
    hup(&s);
    let mut failed = 0.0;
    for _ in 0..200 {
        let text = s.metrics().await;
        failed = text
            .lines()
            .find(|l| l.starts_with("sluice_catalog_reloads_total{result=\"failed\"}"))
            .and_then(|l| l.rsplit_once(' '))
            .map_or(0.0, |(_, v)| v.parse().unwrap());
        if failed > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(failed, 1.0);
    let a = s
        .call(&key, "/v1/chat/completions", &chat("ops-added", false))
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
}

fn hup(s: &Sluice) {
    let ok = Command::new("kill")
        .args(["-HUP", &s.pid().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_can_come_from_a_mounted_file() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin-token");
    std::fs::write(&file, format!("{ADMIN_TOKEN}\n")).unwrap();
    let s = Sluice::start(
        &b,
        opts(&mock)
            .env("SLUICE_ADMIN__TOKEN", "")
            .env("SLUICE_ADMIN__TOKEN_FILE", file.display()),
    )
    .await;
    // The harness's admin calls present the token the file holds.
    let (org, _, _) = s.org_and_key().await;
    let r = s
        .http
        .get(format!("{}/admin/orgs/{org}", s.ops))
        .bearer_auth("not-the-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // Both set is refused at start, naming the keys.
    let out = command(
        &b,
        &opts(&mock).env("SLUICE_ADMIN__TOKEN_FILE", file.display()),
    )
    .arg("migrate")
    .output()
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("admin.token_file"));
}

/// A first start on a fresh SQLite file (the README's first command) logs no
/// error: its pools open every connection at once, and two of them switching the
/// new file to WAL together had one refused ("database is locked", logged as an
/// error before sqlx opened another) in about one start in five.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_starts_on_a_fresh_database_log_no_error() {
    let mock = Mock::start().await;
    for start in 0..10 {
        let b = Backend::fresh().await;
        let log = tempfile::NamedTempFile::new().unwrap();
        let s = Sluice::spawn_with_stderr(
            command(&b, &opts(&mock)),
            &b.database_url,
            log.reopen().unwrap().into(),
        )
        .await;
        drop(s);
        let text = std::fs::read_to_string(log.path()).unwrap();
        assert!(
            !text.contains("ERROR") && !text.contains("locked"),
            "start {start} logged an error:\n{text}"
        );
    }
}

/// The org's usage as the database holds it: (events, their cost, the balance),
/// in micro-USD.
async fn ledger(database_url: &str, org: &str) -> (i64, i64, i64) {
    let rows = sql_rows(
        database_url,
        &format!(
            "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(cost_micro_usd), 0) AS BIGINT) AS c FROM usage_events WHERE org_id = '{org}'"
        ),
    )
    .await;
    let bal = sql_rows(
        database_url,
        &format!("SELECT balance_micro_usd AS b FROM orgs WHERE id = '{org}'"),
    )
    .await;
    (
        rows[0]["n"].as_i64().unwrap(),
        rows[0]["c"].as_i64().unwrap(),
        bal[0]["b"].as_i64().unwrap(),
    )
}

/// Waits until the database holds `n` usage events of the org.
async fn events(database_url: &str, org: &str, n: i64) -> (i64, i64, i64) {
    for _ in 0..400 {
        let l = ledger(database_url, org).await;
        if l.0 >= n {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the usage events never reached {n}: {:?}",
        ledger(database_url, org).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_mid_stream_leaves_the_other_serving_and_the_totals_whole() {
    let mock = Mock::start().await;
    // The README's multi-instance setup: every instance on the same database and
    // Redis (on the SQLite pass, the same file: the ledger is shared either way).
    let b = Backend::fresh().await;
    let a = Sluice::start(&b, opts(&mock)).await;
    let other = Sluice::start(&b, opts(&mock)).await;
    let (org, _, key) = a.org_and_key().await;
    other.wait_for_key(&key).await;
    let start_balance = ledger(&b.database_url, &org).await.2;

    for s in [&a, &other] {
        for stream in [false, true] {
            for _ in 0..3 {
                let r = s
                    .call(&key, "/v1/chat/completions", &chat("ops-chat", stream))
                    .await;
                assert_eq!(r.status, 200, "{}", r.json);
            }
        }
    }
    let before = events(&b.database_url, &org, 12).await;
    assert_eq!(before.0, 12);

    // A long stream on the first instance, which dies under it.
    mock.script(
        "o1",
        vec![Step::SlowChunks {
            n: 50,
            every: Duration::from_millis(100),
        }],
    );
    let mut r = a
        .http
        .post(format!("{}/v1/chat/completions", a.gateway))
        .bearer_auth(&key)
        .json(&chat("ops-chat", true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut got = String::new();
    while !got.contains("\"content\":\"") {
        let c = r.chunk().await.unwrap().expect("a first chunk");
        got.push_str(&String::from_utf8_lossy(&c));
    }
    let killed = Command::new("kill")
        .args(["-KILL", &a.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut rest = String::new();
    let cut = loop {
        match r.chunk().await {
            Ok(Some(c)) => rest.push_str(&String::from_utf8_lossy(&c)),
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert!(
        cut || !rest.contains("[DONE]"),
        "the stream was cut: {rest}"
    );

    // The other instance serves the retry, and everything after it.
    let retry = other
        .call(&key, "/v1/chat/completions", &chat("ops-chat", true))
        .await;
    assert_eq!(retry.status, 200);
    assert!(retry.frames.last().is_some_and(|(_, d)| d == "[DONE]"));
    for _ in 0..3 {
        let r = other
            .call(&key, "/v1/chat/completions", &chat("ops-chat", false))
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    let (st, _) = other.get("/v1/models", Some(&key)).await;
    assert_eq!(st, 200);

    // The totals: every finished request is in the ledger once, charged once;
    // the killed stream left neither an event nor a charge.
    let (n, cost, balance) = events(&b.database_url, &org, 16).await;
    assert_eq!(n, 16);
    assert!(cost > 0);
    assert_eq!(
        balance,
        start_balance - cost,
        "balance = credits - the events' cost"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        ledger(&b.database_url, &org).await,
        (n, cost, balance),
        "nothing more arrives"
    );
}

/// The block of a ConfigMap's `key: |` entry, unindented.
fn config_map_entry(yaml: &str, key: &str) -> String {
    let start = yaml
        .find(&format!("  {key}: |\n"))
        .unwrap_or_else(|| panic!("no {key} in the ConfigMap"));
    yaml[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| l.strip_prefix("    ").unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The number after `key:` on the first line that has it.
fn number_after(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} number"))
}

#[test]
fn the_deployment_files_agree_with_the_service() {
    let read = |p: &str| std::fs::read_to_string(repo_path(p)).unwrap();
    // Kubernetes: the config the ConfigMap holds loads, and its drain fits the
    // pod's grace with the preStop pause.
    let dir = tempfile::tempdir().unwrap();
    // As secret.example.yaml makes it (`openssl rand -hex 32`): a short one is
    // refused on the cluster-wide ops listener.
    std::fs::write(dir.path().join("admin-token"), "ab".repeat(32)).unwrap();
    let toml = config_map_entry(&read("deploy/kubernetes/configmap.yaml"), "sluice.toml").replace(
        "/etc/sluice/secrets/admin-token",
        &dir.path().join("admin-token").display().to_string(),
    );
    let file = dir.path().join("sluice.toml");
    std::fs::write(&file, &toml).unwrap();
    let c = sluice::config::Config::load(Some(&file)).unwrap();
    assert!(c.storage.database_url.starts_with("postgres://"));
    assert!(
        !c.storage.redis_url.is_empty(),
        "several instances share Redis"
    );
    assert_eq!(c.observability.log_format, "json");
    let deployment = read("deploy/kubernetes/deployment.yaml");
    let grace = number_after(&deployment, "terminationGracePeriodSeconds:");
    let pre_stop = number_after(&deployment, "seconds:");
    assert!(
        pre_stop + c.server.grace_period_seconds + 5 <= grace,
        "preStop {pre_stop} + drain {} + margin must fit terminationGracePeriodSeconds {grace}",
        c.server.grace_period_seconds
    );
    assert!(deployment.contains("httpGet: {path: /readyz, port: ops}"));
    assert!(deployment.contains("runAsNonRoot: true"));
    for (port, listen) in [
        (8080, &c.server.listen),
        (8081, &c.server.web_listen),
        (9090, &c.server.ops_listen),
    ] {
        assert!(listen.ends_with(&format!(":{port}")), "{listen}");
        assert!(
            deployment.contains(&format!("containerPort: {port}")),
            "{port}"
        );
    }
    assert!(c.catalog.path.starts_with("/etc/sluice/catalog/"));
    assert!(deployment.contains("mountPath: /etc/sluice/catalog"));
    // The catalog ConfigMap is a catalog the service loads.
    let catalog = config_map_entry(
        &read("deploy/kubernetes/catalog-configmap.yaml"),
        "catalog.toml",
    );
    let cat_file = dir.path().join("catalog.toml");
    std::fs::write(&cat_file, catalog).unwrap();
    let models = sluice::catalog::load_file(&cat_file).unwrap();
    assert!(models.len() >= 3);
    for f in [
        "pdb.yaml",
        "service.yaml",
        "kustomization.yaml",
        "networkpolicy.yaml",
    ] {
        assert!(read(&format!("deploy/kubernetes/{f}")).contains("sluice"));
    }
    // The ops port (the admin API) is not open to every pod of the cluster.
    let policy = read("deploy/kubernetes/networkpolicy.yaml");
    assert!(policy.contains("kind: NetworkPolicy") && policy.contains("{port: ops}"));
    assert!(read("deploy/kubernetes/kustomization.yaml").contains("networkpolicy.yaml"));
    assert!(read("deploy/kubernetes/pdb.yaml").contains("kind: PodDisruptionBudget"));
    // The image: multi-stage, run as a user of its own.
    let image = read("deploy/Containerfile");
    assert_eq!(image.lines().filter(|l| l.starts_with("FROM ")).count(), 2);
    assert!(image.contains("USER 10001"));
    // systemd: reload is SIGHUP, the stop timeout covers the default drain.
    let unit = read("deploy/systemd/sluice.service");
    assert!(unit.contains("ExecReload=/bin/kill -HUP $MAINPID"));
    let stop = number_after(&unit, "TimeoutStopSec=");
    assert!(
        stop > sluice::config::Config::default()
            .server
            .grace_period_seconds
    );
}

/// L10 of the 2026-12-01 security review: guessing the admin token is slowed.
/// An address that presented ten wrong tokens in a minute is refused (429, with
/// Retry-After) until the minute ends, the right token included.
#[tokio::test]
async fn an_address_guessing_the_admin_token_is_held_off() {
    let b = harness::Backend::fresh().await;
    let s = harness::Sluice::start(&b, harness::Opts::default()).await;
    let admin = |token: &str| {
        let (s, token) = (&s, token.to_string());
        async move {
            let r = s
                .http
                .get(format!("{}/admin/orgs/org_none", s.ops))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.headers().get("retry-after").cloned())
        }
    };
    for i in 0..10 {
        assert_eq!(admin(&format!("guess-{i}")).await.0, 401);
    }
    let (st, after) = admin(harness::ADMIN_TOKEN).await;
    assert_eq!(st, 429);
    assert_eq!(after.unwrap(), "60");
}
