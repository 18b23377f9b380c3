//! The official SDKs (openai for Python and Node, anthropic for Python), non-streaming
//! and streaming, through the gateway against the mock provider, as a client would
//! use them: chat completions, responses and messages.
//!
//! The test command installs the SDKs and sets `SLUICE_TEST_SDK=1`; then these tests
//! must pass. Without it (a bare `cargo test` on a machine without the SDKs) they
//! say so and return.

mod harness;

use harness::{repo_path, Backend, Opts, Sluice};
use sluice_mock::Mock;
use std::process::Command;

fn required() -> bool {
    if std::env::var("SLUICE_TEST_SDK").is_ok_and(|v| v == "1") {
        return true;
    }
    eprintln!("SLUICE_TEST_SDK unset: the SDK tests run under ./scripts/test");
    false
}

async fn gateway(catalog: &str) -> (Mock, Sluice, String, Backend) {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let base = mock.base_url();
    let s = Sluice::start(
        &b,
        Opts::default()
            .catalog(repo_path(catalog))
            .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
            .env("SLUICE_PROVIDERS__ANTHROPIC__BASE_URL", &base)
            .env("SLUICE_PROVIDERS__GOOGLE__BASE_URL", &base)
            .env("OPENAI_API_KEY", "sk-platform-openai")
            .env("ANTHROPIC_API_KEY", "sk-ant-platform")
            .env("GEMINI_API_KEY", "gm-platform"),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    (mock, s, key, b)
}

async fn run(program: &str, script: &str, catalog: &str) {
    let (_mock, s, key, _b) = gateway(catalog).await;
    run_on(&s, key, program, script).await;
}

async fn run_on(s: &Sluice, key: String, program: &str, script: &str) {
    let dir = repo_path("tests/sdk");
    let out = tokio::task::spawn_blocking({
        let (program, script, gw) = (program.to_string(), script.to_string(), s.gateway.clone());
        move || {
            Command::new(program)
                .arg(script)
                .current_dir(dir)
                .env("SLUICE_BASE_URL", gw)
                .env("SLUICE_KEY", key)
                .output()
                .expect("run the SDK script")
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{program} {script} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_works_by_changing_only_base_url_and_key() {
    if required() {
        run("python3", "chat.py", "tests/fixtures/engine.toml").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_node_sdk_works_by_changing_only_base_url_and_key() {
    if required() {
        run("node", "chat.mjs", "tests/fixtures/engine.toml").await;
    }
}

/// Web search (against a fake SearXNG) and tool search with the openai and
/// anthropic SDKs, in each format, whole and streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_search_and_tool_search_work_with_the_official_sdks() {
    if !required() {
        return;
    }
    let searx = sluice_mock::search::SearchVendor::searxng().await;
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let base = mock.base_url();
    let s = Sluice::start(
        &b,
        Opts::default()
            .catalog(repo_path("tests/fixtures/search.toml"))
            .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
            .env("SLUICE_PROVIDERS__ANTHROPIC__BASE_URL", &base)
            .env("OPENAI_API_KEY", "sk-platform-openai")
            .env("ANTHROPIC_API_KEY", "sk-ant-platform")
            .env("SLUICE_SEARCH__BACKEND", "searxng")
            .env("SLUICE_SEARCH__URL", searx.base_url()),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    let dir = repo_path("tests/sdk");
    let gw = s.gateway.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg("search.py")
            .current_dir(dir)
            .env("SLUICE_BASE_URL", gw)
            .env("SLUICE_KEY", key)
            .env("SLUICE_MOCK_URL", base)
            .output()
            .expect("run the SDK script")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "python3 search.py failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The gateway searched once per web search call of the script.
    assert_eq!(searx.requests().len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_responses_and_anthropic_messages_sdks_work_against_rungs_of_another_maker() {
    if required() {
        run("python3", "formats.py", "tests/fixtures/formats.toml").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_continues_conversations_across_instances() {
    if !required() {
        return;
    }
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let opts = || {
        let base = mock.base_url();
        Opts::default()
            .catalog(repo_path("tests/fixtures/formats.toml"))
            .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
            .env("SLUICE_PROVIDERS__ANTHROPIC__BASE_URL", &base)
            .env("OPENAI_API_KEY", "sk-platform-openai")
            .env("ANTHROPIC_API_KEY", "sk-ant-platform")
    };
    // Several instances share one PostgreSQL; SQLite serves one alone.
    let mut instances = vec![Sluice::start(&b, opts()).await];
    if b.is_postgres() {
        instances.push(Sluice::start(&b, opts()).await);
    }
    let (_, _, key) = instances[0].org_and_key().await;
    for s in &instances {
        s.wait_for_key(&key).await;
    }
    let bases: Vec<String> = instances.iter().map(|s| s.gateway.clone()).collect();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg("continuation.py")
            .current_dir(repo_path("tests/sdk"))
            .env("SLUICE_BASE_URLS", bases.join(","))
            .env("SLUICE_KEY", key)
            .output()
            .expect("run the SDK script")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "continuation.py failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_files_and_batches() {
    if required() {
        let (mock, s, key, _b) = gateway("tests/fixtures/engine.toml").await;
        // Slow enough that a cancel lands before a batch of 40 is done.
        mock.set_default(
            "a1",
            sluice_mock::Step::DelayHeaders(std::time::Duration::from_millis(100)),
        );
        run_on(&s, key, "python3", "batches.py").await;
    }
}
