//! The client libraries people use every day, pinned (tests/clients/VERSIONS.md),
//! each pointed at the gateway by base URL and key only, over second turns: the
//! openai SDK's append-the-message tool loop, LangChain's ChatOpenAI on the chat
//! and responses APIs (a reasoning summary replayed, `use_previous_response_id`),
//! openai-agents (a tool loop, `previous_response_id`), pydantic-ai, and the Vercel
//! AI SDK's default OpenAI provider (`item_reference` items). Every case checks
//! what reached the mock provider on the second turn, not only that an answer
//! came back. A recording tap (tests/clients/tap.rs) sits between the libraries
//! and the gateway, and every OpenAI-format body and stream event it saw is
//! validated against OpenAI's pinned OpenAPI document (tests/clients/validate.py).
//!
//! The test command installs the libraries (tests/clients/requirements.txt in
//! tests/clients/.venv, tests/clients/package-lock.json) and sets
//! `SLUICE_TEST_SDK=1`; then these tests must pass. Without it (a bare
//! `cargo test` on a machine without them) they say so and return.

mod harness;
#[path = "clients/tap.rs"]
mod tap;

use harness::{repo_path, Backend, Opts, Sluice};
use sluice_mock::Mock;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tap::Tap;

/// What a case known to fail shows today, and which point of issue 28 it waits
/// for.
struct Known {
    point: &'static str,
    /// Texts of its failure lines (a script's `FAIL` line, a validator's `SCHEMA`
    /// line).
    shows: &'static [&'static str],
}

/// Cases known to fail, with what they show (none now: issue 28's fixes landed).
/// A known-failing case passes only while it fails exactly so: every failure line
/// must contain one of its texts, and each text must still appear. When a fix
/// lands the case says which text is gone: remove it (and a `Known` once empty),
/// so that the case must pass from then on.
const KNOWN_FAILING: &[(&str, &[Known])] = &[];

fn required() -> bool {
    if std::env::var("SLUICE_TEST_SDK").is_ok_and(|v| v == "1") {
        return true;
    }
    eprintln!("SLUICE_TEST_SDK unset: the client-library tests run under ./scripts/test");
    false
}

/// The Python with the pinned libraries: the test command's virtualenv, or
/// `SLUICE_CLIENTS_PYTHON`.
fn python() -> String {
    if let Ok(p) = std::env::var("SLUICE_CLIENTS_PYTHON") {
        return p;
    }
    let venv = repo_path("tests/clients/.venv/bin/python");
    assert!(
        std::path::Path::new(&venv).exists(),
        "{venv} is missing: ./scripts/test installs tests/clients/requirements.txt there"
    );
    venv
}

/// A generous bound on one script, so a library that hangs fails the test
/// instead of holding the suite.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs `program args` in tests/clients with `env`; (success, stdout + stderr).
fn run(program: &str, args: &[&str], env: &[(&str, String)]) -> (bool, String) {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(repo_path("tests/clients"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("run {program}: {e}"));
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let outs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if started.elapsed() > SCRIPT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = format!(
        "{}{}",
        outs.join().unwrap_or_default(),
        errs.join().unwrap_or_default()
    );
    match status {
        Some(s) => (s.success(), text),
        None => (
            false,
            format!("FAIL {program} {args:?}: timed out after {SCRIPT_TIMEOUT:?}\n{text}"),
        ),
    }
}

/// One library case: a fresh mock, gateway and tap; the script; then the schema
/// check of everything the tap saw; then the verdict.
async fn case(name: &str, program: &str, script: &str) {
    if !required() {
        return;
    }
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let base = mock.base_url();
    let s = Sluice::start(
        &b,
        Opts::default()
            .catalog(repo_path("tests/clients/catalog.toml"))
            .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
            .env("SLUICE_PROVIDERS__ANTHROPIC__BASE_URL", &base)
            .env("SLUICE_PROVIDERS__GOOGLE__BASE_URL", &base)
            .env("OPENAI_API_KEY", "sk-platform-openai")
            .env("ANTHROPIC_API_KEY", "sk-ant-platform")
            .env("GEMINI_API_KEY", "gm-platform"),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    let tap = Tap::start(&s.gateway).await;
    let program = if program == "python" {
        python()
    } else {
        program.to_string()
    };
    let env = vec![
        ("SLUICE_BASE_URL", tap.url.clone()),
        ("SLUICE_KEY", key),
        ("SLUICE_MOCK_URL", base),
        // No library may reach out on its own (tracing exporters, telemetry).
        ("OPENAI_AGENTS_DISABLE_TRACING", "1".to_string()),
        ("LANGSMITH_TRACING", "false".to_string()),
        ("PYTHONUNBUFFERED", "1".to_string()),
    ];
    let script_name = script.to_string();
    let (script_ok, script_out) = tokio::task::spawn_blocking({
        let (program, env) = (program.clone(), env.clone());
        move || run(&program, &[&script_name], &env)
    })
    .await
    .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("capture.json");
    std::fs::write(
        &capture,
        serde_json::to_vec_pretty(&tap.exchanges()).unwrap(),
    )
    .unwrap();
    // For a look at what the libraries got: SLUICE_CLIENTS_KEEP=<dir>.
    if let Ok(keep) = std::env::var("SLUICE_CLIENTS_KEEP") {
        let _ = std::fs::create_dir_all(&keep);
        let _ = std::fs::copy(&capture, format!("{keep}/{name}.json"));
    }
    let capture = capture.display().to_string();
    let (schema_ok, schema_out) =
        tokio::task::spawn_blocking(move || run(&python(), &["validate.py", &capture], &[]))
            .await
            .unwrap();
    verdict(name, script_ok, &script_out, schema_ok, &schema_out);
}

fn verdict(name: &str, script_ok: bool, script_out: &str, schema_ok: bool, schema_out: &str) {
    let output = format!(
        "--- {name}: the libraries\n{script_out}\n--- {name}: the schema check\n{schema_out}"
    );
    let known = KNOWN_FAILING
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, k)| *k);
    match judge(name, known, script_ok, script_out, schema_ok, schema_out) {
        Ok(None) => eprintln!("{output}"),
        Ok(Some(why)) => eprintln!("KNOWN FAILING {name} ({why}):\n{output}"),
        Err(verdict) => panic!("{verdict}\n{output}"),
    }
}

/// The verdict on one case: `Ok(None)` when it passed, `Ok(Some(why))` when it
/// failed exactly as `known` says, `Err` otherwise.
fn judge(
    name: &str,
    known: Option<&[Known]>,
    script_ok: bool,
    script_out: &str,
    schema_ok: bool,
    schema_out: &str,
) -> Result<Option<String>, String> {
    let mut failures: Vec<&str> = script_out
        .lines()
        .chain(schema_out.lines())
        .filter(|l| l.starts_with("FAIL ") || l.starts_with("SCHEMA "))
        .collect();
    if !script_ok && !script_out.lines().any(|l| l.starts_with("FAIL ")) {
        failures.push("FAIL the script stopped before its cases finished");
    }
    if !schema_ok && !schema_out.lines().any(|l| l.starts_with("SCHEMA ")) {
        failures.push("FAIL the schema check did not run");
    }
    let Some(known) = known else {
        return if failures.is_empty() {
            Ok(None)
        } else {
            Err(format!("{name} failed:\n{}", failures.join("\n")))
        };
    };
    let why = known
        .iter()
        .map(|k| format!("issue 28 point {}", k.point))
        .collect::<Vec<_>>()
        .join("; ");
    if failures.is_empty() {
        return Err(format!(
            "{name} now passes: take it off KNOWN_FAILING in tests/clients.rs ({why})"
        ));
    }
    let shows = || known.iter().flat_map(|k| k.shows.iter());
    let unexplained: Vec<&str> = failures
        .iter()
        .copied()
        .filter(|l| !shows().any(|s| l.contains(s)))
        .collect();
    if !unexplained.is_empty() {
        return Err(format!(
            "{name} is known to fail ({why}), but also fails otherwise:\n{}",
            unexplained.join("\n")
        ));
    }
    let gone: Vec<&str> = shows()
        .copied()
        .filter(|s| !failures.iter().any(|l| l.contains(s)))
        .collect();
    if !gone.is_empty() {
        return Err(format!(
            "{name} no longer fails with {gone:?}: remove that from KNOWN_FAILING in tests/clients.rs"
        ));
    }
    Ok(Some(why))
}

#[test]
fn a_known_failure_passes_only_while_it_fails_exactly_as_listed() {
    const K: &[Known] = &[Known {
        point: "0: test",
        shows: &["refused `annotations`", "'tools' is a required property"],
    }];
    let both = "SCHEMA #1 Response: at (top): 'tools' is a required property";
    let fail = "FAIL a case: BadRequestError: refused `annotations`";
    // As listed: a known failure.
    assert!(judge("c", Some(K), false, fail, false, both)
        .unwrap()
        .is_some());
    // Fixed in part: the text that is gone must leave the list.
    let gone = judge("c", Some(K), true, "PASS a case", false, both).unwrap_err();
    assert!(
        gone.contains("no longer fails with [\"refused `annotations`\"]"),
        "{gone}"
    );
    // Fixed whole: the entry must go.
    let now = judge("c", Some(K), true, "PASS", true, "").unwrap_err();
    assert!(now.contains("now passes"), "{now}");
    // A new failure is never hidden by a known one.
    let more = format!("{both}\nSCHEMA #2 Response: at .usage: 'x' is a required property");
    let other = judge("c", Some(K), false, fail, false, &more).unwrap_err();
    assert!(
        other.contains("also fails otherwise") && other.contains("#2"),
        "{other}"
    );
    // A script that died before reporting, or a check that did not run, fails.
    assert!(judge("c", None, false, "Traceback", true, "").is_err());
    assert!(judge("c", None, true, "PASS", false, "ModuleNotFoundError").is_err());
    assert_eq!(
        judge("c", None, true, "PASS", true, "checked: 1 Response"),
        Ok(None)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_append_the_message_tool_loop_on_chat() {
    case("openai_tool_loop", "python", "openai_tool_loop.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langchain_chat_openai_on_chat_over_a_tool_call() {
    case("langchain_chat", "python", "langchain_chat.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langchain_chat_openai_on_responses_reasoning_replay_and_previous_response_id() {
    case("langchain_responses", "python", "langchain_responses.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_agents_tool_loop_and_previous_response_id() {
    case("agents_loop", "python", "agents_loop.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pydantic_ai_tool_loop_on_chat_and_responses() {
    case("pydantic_ai_loop", "python", "pydantic_ai_loop.py").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vercel_ai_sdk_default_provider_over_two_turns() {
    case("ai_sdk", "node", "ai_sdk.mjs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_shape_conforms_to_openais_schema() {
    case("shapes", "python", "shapes.py").await;
}

/// The schema check is not vacuous: a drifted shape of each kind fails it, and
/// the shapes OpenAI's own document shows (with the gateway's extension members)
/// pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_check_catches_drifted_shapes() {
    if !required() {
        return;
    }
    let x = |path: &str, request: serde_json::Value, ct: &str, body: String| {
        serde_json::json!({"method": "POST", "path": path, "request": request.to_string(),
                           "status": 200, "content_type": ct, "body": body})
    };
    let chat = serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
        "model": "m", "provider": "openai:m", "choices": [{"index": 0, "finish_reason": "stop",
        "logprobs": null, "message": {"role": "assistant", "content": "hi", "refusal": null,
        "annotations": []}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
        "total_tokens": 2, "cost": 0.1}});
    let mut no_created = chat.clone();
    no_created.as_object_mut().unwrap().remove("created");
    let response = serde_json::json!({"id": "resp_1", "object": "response", "created_at": 1,
        "status": "completed", "error": null, "incomplete_details": null, "instructions": null,
        "model": "m", "tools": [], "tool_choice": "auto", "parallel_tool_calls": true,
        "metadata": {}, "temperature": 1.0, "top_p": 1.0, "user": null, "provider": "openai:m",
        "output": [{"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}]}],
        "usage": {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0,
            "cache_write_tokens": 0}, "output_tokens": 1, "output_tokens_details":
            {"reasoning_tokens": 0}, "total_tokens": 2, "cost": 0.1}});
    let merged = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\
        \"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\
        \"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2,\"cost\":0.1}}\n\n\
        data: [DONE]\n\n";
    let capture = serde_json::json!([
        x(
            "/v1/chat/completions",
            serde_json::json!({}),
            "application/json",
            chat.to_string()
        ),
        x(
            "/v1/chat/completions",
            serde_json::json!({}),
            "application/json",
            no_created.to_string()
        ),
        x(
            "/v1/chat/completions",
            serde_json::json!({"stream": true, "stream_options": {"include_usage": true}}),
            "text/event-stream",
            merged.to_string()
        ),
        x(
            "/v1/responses",
            serde_json::json!({"stream": true}),
            "text/event-stream",
            "event: response.foo\ndata: {\"type\":\"response.foo\",\"sequence_number\":0}\n\n"
                .into()
        ),
        x(
            "/v1/responses",
            serde_json::json!({}),
            "application/json",
            response.to_string()
        ),
        serde_json::json!({"method": "POST", "path": "/v1/responses", "request": "{}",
            "status": 400, "content_type": "application/json",
            "body": "{\"error\":{\"message\":\"bad\",\"type\":\"invalid_request_error\"}}"}),
        x(
            "/v1/embeddings",
            serde_json::json!({"encoding_format": "base64"}),
            "application/json",
            serde_json::json!({"object": "list", "model": "e",
            "data": [{"object": "embedding", "index": 0, "embedding": "AAAA"}],
            "usage": {"prompt_tokens": 1, "total_tokens": 1}})
            .to_string()
        ),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("capture.json");
    std::fs::write(&path, capture.to_string()).unwrap();
    let path = path.display().to_string();
    let (ok, out) =
        tokio::task::spawn_blocking(move || run(&python(), &["validate.py", &path], &[]))
            .await
            .unwrap();
    assert!(!ok, "{out}");
    for want in [
        "#1 POST /v1/chat/completions 200: CreateChatCompletionResponse: at (top): 'created' is a required property",
        "#2 POST /v1/chat/completions 200: with include_usage the last chunk must carry the usage",
        "#3 POST /v1/responses 200 event 0 (response.foo): not a ResponseStreamEvent type",
        "#3 POST /v1/responses 200: the stream has no response.completed",
        "#5 POST /v1/responses 400: ErrorResponse: at .error: 'param' is a required property",
        "#5 POST /v1/responses 400: ErrorResponse: at .error: 'code' is a required property",
        "#6 POST /v1/embeddings 200: data[0].embedding is not base64 float32s",
    ] {
        assert!(out.contains(want), "the check missed {want:?}:\n{out}");
    }
    // What conforms passes: the whole answers #0 and #4 (extension members,
    // `user: null` as OpenAI's own examples show it).
    for fine in ["#0 ", "#4 "] {
        assert!(
            !out.lines()
                .any(|l| l.starts_with(&format!("SCHEMA {fine}"))),
            "{fine} conforms:\n{out}"
        );
    }
    assert_eq!(out.matches("SCHEMA ").count(), 7, "{out}");
}
