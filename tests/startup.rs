//! Starting and stopping: the ops endpoints and metrics, SIGTERM drains, a bad
//! configuration fails fast, orchestrator variables are ignored, the contract's
//! sections load, the quickstart works from any folder, relative paths resolve
//! against the config file.

mod harness;

use harness::{admin_cli, model_list, repo_path, slugs, Backend, Opts, Sluice};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn fixture() -> Opts {
    Opts::default().catalog(repo_path("tests/fixtures/catalog.toml"))
}

#[tokio::test]
async fn ops_endpoints_and_metrics() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let r = s
        .http
        .get(format!("{}/healthz", s.ops))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = s
        .http
        .get(format!("{}/readyz", s.ops))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, _, key) = s.org_and_key().await;
    s.get("/v1/models", Some(&key)).await;
    s.get("/v1/nope", Some(&key)).await;
    // Requests are counted in the logging phase, just after the answer went out.
    let deadline = Instant::now() + Duration::from_secs(3);
    let text = loop {
        let text = s.metrics().await;
        if text.contains("route=\"not_found\",status=\"404\"} 1") || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        text.contains(
            "sluice_requests_total{code=\"ok\",lane=\"none\",model=\"none\",route=\"models\",status=\"200\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("sluice_requests_total{code=\"not_found\",lane=\"none\",model=\"none\",route=\"not_found\",status=\"404\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("sluice_request_duration_seconds_bucket{provider=\"none\",route=\"models\""),
        "{text}"
    );
    assert!(
        !text.contains("org_") && !text.contains("key_"),
        "no ids as labels"
    );
    let page = s
        .http
        .get(&s.web)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("alpha-1.0") && page.contains("<table"));
}

#[tokio::test]
async fn sigterm_drains() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture().env("SLUICE_SERVER__GRACE_PERIOD_SECONDS", 3)).await;
    let (_, _, key) = s.org_and_key().await;
    // A kept-alive connection opened before the signal.
    assert_eq!(s.get("/v1/models", Some(&key)).await.0, 200);
    s.terminate();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let r = s
            .http
            .get(format!("{}/readyz", s.ops))
            .send()
            .await
            .unwrap();
        if r.status() == 503 {
            assert_eq!(r.json::<Value>().await.unwrap()["draining"], true);
            break;
        }
        assert!(Instant::now() < deadline, "readyz never turned 503");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // New requests are refused with gateway_draining (or the connection is refused).
    match s
        .http
        .get(format!("{}/v1/models", s.gateway))
        .bearer_auth(&key)
        .send()
        .await
    {
        Ok(r) => {
            assert_eq!(r.status(), 503);
            assert_eq!(
                r.json::<Value>().await.unwrap()["error"]["code"],
                "gateway_draining"
            );
        }
        Err(e) => assert!(e.is_connect() || e.is_request(), "{e}"),
    }
    let mut s = s;
    let started = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "process did not exit after the grace period"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let _ = status;
}

#[tokio::test]
async fn bad_configuration_fails_fast_with_a_message() {
    let b = Backend::fresh().await;
    let out = harness::command(
        &b,
        &fixture().env("SLUICE_SERVER__LISTEN", "not-an-address"),
    )
    .arg("serve")
    .output()
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("server.listen"), "{err}");
    let out = harness::command(&b, &fixture())
        .arg("migrate")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn orchestrator_variables_are_ignored_and_a_bad_value_names_its_key() {
    let b = Backend::fresh().await;
    // What a Kubernetes Service named sluice injects, the test scripts' own
    // variables, and the hosted provider's credential as once documented.
    let injected = [
        ("SLUICE_SERVICE_HOST", "10.0.0.1"),
        ("SLUICE_SERVICE_PORT", "8080"),
        ("SLUICE_PORT", "tcp://10.0.0.1:8080"),
        ("SLUICE_PORT_8080_TCP_ADDR", "10.0.0.1"),
        ("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:1/"),
        ("SLUICE_HOSTED_API_KEY", "hosted-secret-value"),
    ];
    let mut opts = fixture();
    for (k, v) in injected {
        opts = opts.env(k, v);
    }
    let out = harness::command(&b, &opts).arg("migrate").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("SLUICE_")).collect();
    assert_eq!(warnings.len(), 1, "one warning line: {err}");
    for (k, _) in injected {
        assert!(warnings[0].contains(k), "{k} named: {err}");
    }
    assert!(
        !err.contains("hosted-secret-value"),
        "no value is logged: {err}"
    );

    // A known key with a bad value still refuses to start, naming the key.
    let out = harness::command(&b, &fixture().env("SLUICE_SERVER__THREADS", "many"))
        .arg("migrate")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(err.contains("server.threads"), "{err}");
}

/// CONTRACT.md's second-wave sections, as it prints them.
const CONTRACT_SECOND_WAVE: &str = r#"
[search]                                  # service-run web search
backend = "none"                          # none | searxng | brave  ("none": every search drops as search_unavailable)
url = ""                                  # searxng: its base URL (GET {url}/search?q=…&format=json); brave: its API base
api_key_env = ""                          # variable holding the vendor key (brave)
timeout_ms = 3000                         # past it the turn is served without results
results = 5                               # results given to the model
fee_usd = 0.007                           # per service-run search, platform lanes only

[tool_search]
max_rounds = 3                            # search rounds per request
max_results = 5                           # tools one search loads when the declaration sets none

[responses]
retention = "30d"
prompt_capture_default = true             # an org's prompt capture until it changes it

[storage]
objects = "file://data/objects"           # telemetry uploads, files, batch outputs; or s3://bucket/prefix
s3_endpoint = ""                          # an S3-compatible endpoint; empty: the AWS default chain
signing_secret_env = "GATEWAY_SIGNING_SECRET"  # variable holding the HMAC key of signed URLs; unset: a random per-process key and a warning (one instance only)

[telemetry]
max_upload_bytes = 52428800
ticket_ttl = "2h"
braintrust_url = "https://api.braintrust.dev"    # pull sources; a pull's config may name a self-hosted base URL instead
langsmith_url = "https://api.smith.langchain.com"
langfuse_url = "https://cloud.langfuse.com"
posthog_url = "https://us.posthog.com"
mastra_url = ""                                  # no public default: the pull's config must carry base_url

[email]
smtp_url = ""                             # smtp://host:port or smtps://user:pass@host:port; empty: mails are written to data/outbox/ as .eml files
from = "sluice <no-reply@localhost>"

[signup]
enabled = true                            # false: 403 signup_disabled
credits_usd = 0.0                         # granted at signup (credits_granted)
per_origin_per_hour = 5                   # 429 rate_limited past it (origin = client IP, or the trusted edge header)

[web]
session_ttl = "30d"
cookie_secure = false                     # true behind TLS

[payments]
provider = "none"                         # none | stripe
api_base = "https://api.stripe.com"       # fakes point here
secret_key_env = "STRIPE_SECRET_KEY"
webhook_secret_env = "STRIPE_WEBHOOK_SECRET"

[network]
allow_private_upstreams = false           # org-supplied base URLs (custom models, BYOK config, pull sources) may not reach loopback, private, link-local or metadata addresses unless true

[observability]
log_format = "text"                       # text | json
otlp_endpoint = ""                        # OTLP/HTTP traces endpoint; empty: no export
"#;

#[tokio::test]
async fn the_contracts_second_wave_sections_load_as_written() {
    let b = Backend::fresh().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    std::fs::write(&file, CONTRACT_SECOND_WAVE).unwrap();
    let out = harness::command(&b, &fixture())
        .arg("migrate")
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Every section is built: none is named as doing nothing.
    assert!(!err.contains("no effect"), "{err}");
}

#[tokio::test]
async fn operator_orgs_are_email_verified_unless_an_address_awaits_verification() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let verified = |body: Value| {
        let s = &s;
        async move {
            let (st, o) = s.admin(Method::POST, "/admin/orgs", Some(body)).await;
            assert_eq!(st, 201, "{o}");
            let id = o["org_id"].as_str().unwrap().to_string();
            let (_, o) = s
                .admin(Method::GET, &format!("/admin/orgs/{id}"), None)
                .await;
            o["email_verified"].clone()
        }
    };
    assert_eq!(verified(json!({"name": "a"})).await, true);
    assert_eq!(
        verified(json!({"name": "b", "email": "b@x.test"})).await,
        false
    );
    assert_eq!(
        verified(json!({"name": "c", "email_verified": false})).await,
        false
    );
    let body = json!({"name": "d", "email": "d@x.test", "email_verified": true});
    assert_eq!(verified(body).await, true);
    // The CLI follows the same rule.
    let (ok, o) = admin_cli(&b, &["create-org", "--name", "e"]);
    assert!(ok, "{o}");
    let (_, shown) = admin_cli(&b, &["show-org", o["org_id"].as_str().unwrap()]);
    assert_eq!(shown["email_verified"], true);
    let (ok, o) = admin_cli(&b, &["create-org", "--name", "f", "--email", "f@x.test"]);
    assert!(ok, "{o}");
    let (_, shown) = admin_cli(&b, &["show-org", o["org_id"].as_str().unwrap()]);
    assert_eq!(shown["email_verified"], false);
    let (ok, o) = admin_cli(
        &b,
        &["create-org", "--name", "g", "--email-verified", "false"],
    );
    assert!(ok, "{o}");
    let (_, shown) = admin_cli(&b, &["show-org", o["org_id"].as_str().unwrap()]);
    assert_eq!(shown["email_verified"], false);
}

/// `sluice` run the way a new user runs it: from a folder of their own, no config
/// file, the built-in defaults (SQLite under ./data, the built-in catalog).
fn bare(cwd: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "warn")
        .env("SLUICE_SERVER__LISTEN", "127.0.0.1:0")
        .env("SLUICE_SERVER__WEB_LISTEN", "127.0.0.1:0")
        .env("SLUICE_SERVER__OPS_LISTEN", "127.0.0.1:0");
    cmd
}

fn cli(cwd: &std::path::Path, args: &[&str]) -> Value {
    let out = bare(cwd).arg("admin").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn the_quickstart_answers_from_any_folder_with_the_mock_as_local_provider() {
    let mock = sluice_mock::Mock::start().await;
    let home = tempfile::tempdir().unwrap();
    let mut cmd = bare(home.path());
    // The README runs the mock on the local provider's default port; here any port.
    cmd.env(
        "SLUICE_PROVIDERS__LOCAL__BASE_URL",
        format!("{}/v1", mock.base_url()),
    );
    let db = format!("sqlite://{}/data/sluice.db", home.path().display());
    let s = Sluice::spawn(cmd, &db).await;
    // The README's commands, verbatim: an org with credits and no more, a key.
    let org = cli(
        home.path(),
        &["create-org", "--name", "acme", "--credits-usd", "10"],
    );
    let key = cli(
        home.path(),
        &["create-key", org["org_id"].as_str().unwrap()],
    );
    let key = key["api_key"].as_str().unwrap();
    // The key works at once: no wait for the directory's poll.
    let (st, models) = s.get("/v1/models", Some(key)).await;
    assert_eq!(st, 200, "{models}");
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            Some(key),
            &json!({"model": "llama-3.2-3b", "messages": [{"role": "user", "content": "Hello"}]}),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    // The built-in catalog is served, though no catalog file is anywhere near.
    let (_, all) = model_list(&s, "?limit=1000").await;
    assert!(slugs(&all).contains(&"gpt-4.1-mini".to_string()), "{all}");
    assert!(home.path().join("data/sluice.db").exists());
}

#[tokio::test]
async fn relative_paths_in_a_config_file_resolve_against_its_folder() {
    let home = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let conf = home.path().join("conf");
    std::fs::create_dir(&conf).unwrap();
    std::fs::copy(
        repo_path("tests/fixtures/catalog.toml"),
        conf.join("models.toml"),
    )
    .unwrap();
    std::fs::write(
        conf.join("sluice.toml"),
        "[catalog]\npath = \"models.toml\"\n\
         [storage]\ndatabase_url = \"sqlite://../state/sluice.db\"\n\
         usage_spool = \"../state/spool.jsonl\"\n\
         [secrets]\nkey_file = \"../state/secret.key\"\n",
    )
    .unwrap();
    let mut cmd = bare(elsewhere.path());
    cmd.arg("--config").arg(conf.join("sluice.toml"));
    let db = format!("sqlite://{}/state/sluice.db", home.path().display());
    let s = Sluice::spawn(cmd, &db).await;
    let (st, all) = model_list(&s, "?limit=1000").await;
    assert_eq!(st, 200, "{all}");
    let fixture = sluice::catalog::load_file(std::path::Path::new(&repo_path(
        "tests/fixtures/catalog.toml",
    )))
    .unwrap();
    let mut want: Vec<String> = fixture.iter().map(|m| m.slug.clone()).collect();
    want.sort();
    let mut got = slugs(&all);
    got.sort();
    assert_eq!(got, want, "the file's catalog, not the built-in one");
    assert!(home.path().join("state/sluice.db").exists());
    assert!(home.path().join("state/secret.key").exists());
    assert!(!elsewhere.path().join("data").exists());
    assert!(!elsewhere.path().join("state").exists());
}
