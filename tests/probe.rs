//! `sluice probe`: capabilities learned from the provider override the declared
//! ones for routing, on every instance; an unreachable rung keeps its declared
//! capabilities.

mod harness;

use harness::{assert_error, command, repo_path, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};

fn caps(model: &Value) -> Vec<String> {
    let mut c: Vec<String> = model["providers"][0]["caps"]
        .as_array()
        .unwrap_or_else(|| panic!("no caps in {model}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    c.sort();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probed_capabilities_replace_declared_ones_for_routing() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let opts = Opts::default()
        .catalog(repo_path("tests/fixtures/probe.toml"))
        .env(
            "SLUICE_PROVIDERS__OPENAI__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        .env("OPENAI_API_KEY", "sk-platform-openai");
    let s = Sluice::start(&b, opts.clone()).await;
    let (_, _, key) = s.org_and_key().await;
    let (_, before) = s.get("/api/models/probe-b", None).await;
    assert_eq!(
        caps(&before),
        ["json_object", "json_schema", "sampling", "tools"]
    );

    // p1 accepts everything; p2 refuses json_schema; p3 is down.
    // Order per rung: the plain baseline, then json_object, json_schema, tools, sampling.
    mock.script(
        "p2",
        vec![Step::Ok, Step::Ok, Step::Status(400), Step::Ok, Step::Ok],
    );
    mock.set_default("p3", Step::Status(503));
    let mut cmd = command(&b, &opts);
    cmd.arg("probe");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("json_schema=no"), "{printed}");
    assert_eq!(mock.count("p1"), 5);
    assert_eq!(
        mock.count("p3"),
        1,
        "a rung whose baseline fails is not probed further"
    );
    let sent = mock.requests_for("p2")[2].json().unwrap();
    assert_eq!(sent["response_format"]["type"], "json_schema");

    // The running instance picks the verdicts up from the database.
    let mut after = Value::Null;
    for _ in 0..40 {
        after = s.get("/api/models/probe-b", None).await.1;
        if !caps(&after).contains(&"json_schema".to_string()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(caps(&after), ["json_object", "sampling", "tools"]);
    let (_, a) = s.get("/api/models/probe-a", None).await;
    assert_eq!(
        caps(&a),
        ["json_object", "json_schema", "sampling", "tools"]
    );
    let (_, d) = s.get("/api/models/probe-down", None).await;
    assert_eq!(
        caps(&d),
        ["json_schema"],
        "inconclusive probes keep the declared caps"
    );

    // Routing follows: a schema request on probe-b is refused before any call.
    let n = mock.count("p2");
    let (status, body) = s
        .post(
            "/v1/chat/completions",
            Some(&key),
            &json!({"model": "probe-b", "messages": [{"role": "user", "content": "hi"}],
                    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}),
        )
        .await;
    assert_error(status, &body, 400, "unsupported_capability");
    assert_eq!(body["error"]["param"], "response_format");
    assert_eq!(mock.count("p2"), n);
}
