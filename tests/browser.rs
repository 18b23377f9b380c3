//! The web app in headless Chromium (Debian's chromium, driven by playwright-core
//! from tests/sdk/browser.mjs): sign up, follow the mailed link, mint a key and
//! use it with the openai SDK, connect an own account, reorder a waterfall,
//! revoke the key; a screenshot of every page lands in target/browser-shots.
//!
//! The test command installs Chromium and the Node packages and sets
//! `SLUICE_TEST_BROWSER=1`; then this test must pass. Without it (a bare
//! `cargo test` on a machine without a browser) it says so and returns.

mod harness;

use harness::web::Web;
use harness::{repo_path, Backend};
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

fn required() -> bool {
    if std::env::var("SLUICE_TEST_BROWSER").is_ok_and(|v| v == "1") {
        return true;
    }
    eprintln!("SLUICE_TEST_BROWSER unset: the browser test runs under ./scripts/test");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_signs_up_mints_a_key_orders_a_waterfall_and_revokes_the_key_in_chromium() {
    if !required() {
        return;
    }
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o).await;
    let email = "newcomer@example.com";
    let shots = repo_path("target/browser-shots");
    let mut child = tokio::process::Command::new("node")
        .arg("browser.mjs")
        .current_dir(repo_path("tests/sdk"))
        .env("SLUICE_WEB", &w.s.web)
        .env("SLUICE_BASE_URL", &w.s.gateway)
        .env("MOCK_BASE", w.mock.base_url())
        .env("SHOTS", &shots)
        .env("EMAIL", email)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs tests/sdk/browser.mjs");
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut err = child.stderr.take().unwrap();
    let mut done = false;
    let talk = async {
        while let Some(line) = out.next_line().await.unwrap() {
            let Ok(msg) = serde_json::from_str::<Value>(&line) else {
                eprintln!("browser: {line}");
                continue;
            };
            if msg["need"] == "link" {
                let seen = msg["seen"].as_u64().unwrap() as usize;
                let mail = w.sink.wait_for(email, seen).await;
                let link = w.local(&mail.single_link());
                stdin
                    .write_all(format!("{link}\n").as_bytes())
                    .await
                    .unwrap();
                stdin.flush().await.unwrap();
            } else if msg["done"] == true {
                done = true;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(240), talk)
        .await
        .expect("the browser run finishes within 4 minutes");
    let status = child.wait().await.unwrap();
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut err, &mut stderr)
        .await
        .unwrap();
    assert!(
        status.success() && done,
        "the browser run failed:\n{stderr}"
    );
    for page in [
        "landing",
        "signup",
        "overview",
        "keys-minted",
        "playground",
        "connections",
        "model",
        "models",
        "usage",
        "billing",
        "settings",
        "keys-revoked",
    ] {
        let path = format!("{shots}/{page}.png");
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(size > 10_000, "{path} is a real screenshot ({size} bytes)");
    }
}
