//! `POST /v1/embeddings` through the gateway against the mock provider: every
//! validation rule with its code and param, float and base64 answers, reduced
//! dimensions, the OpenAI, Azure, Mistral, Gemini and Vertex wires, a batch split
//! at the provider's limit and merged in order, fail-over, and `user` never sent
//! upstream.

mod harness;

use harness::{assert_error, repo_path, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};

struct Env {
    mock: Mock,
    s: Sluice,
    key: String,
    _b: Backend,
}

async fn start() -> Env {
    let mock = Mock::start().await;
    let base = mock.base_url();
    let b = Backend::fresh().await;
    let sa = std::fs::read_to_string(repo_path("tests/fixtures/vertex-test-sa.json")).unwrap();
    let mut sa: Value = serde_json::from_str(&sa).unwrap();
    sa["token_uri"] = json!(format!("{base}/token"));
    let s = Sluice::start(
        &b,
        Opts::default()
            .catalog(repo_path("tests/fixtures/embeddings.toml"))
            .env("SLUICE_PROVIDERS__OPENAI__BASE_URL", format!("{base}/v1"))
            .env("SLUICE_PROVIDERS__AZURE__BASE_URL", &base)
            .env("SLUICE_PROVIDERS__MISTRAL__BASE_URL", format!("{base}/v1"))
            .env("SLUICE_PROVIDERS__GOOGLE__BASE_URL", &base)
            .env("SLUICE_PROVIDERS__VERTEX__BASE_URL", &base)
            .env("OPENAI_API_KEY", "sk-openai")
            .env("AZURE_OPENAI_API_KEY", "az-key")
            .env("MISTRAL_API_KEY", "mi-key")
            .env("GEMINI_API_KEY", "gm-key")
            .env("GOOGLE_APPLICATION_CREDENTIALS", sa.to_string())
            .env("SLUICE_PROVIDERS__BEDROCK__BASE_URL", &base)
            .env("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
            .env("AWS_SECRET_ACCESS_KEY", "secret-example"),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    Env {
        mock,
        s,
        key,
        _b: b,
    }
}

async fn embed(e: &Env, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let r =
        e.s.http
            .post(format!("{}/v1/embeddings", e.s.gateway))
            .bearer_auth(&e.key)
            .json(body)
            .send()
            .await
            .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.json().await.unwrap_or(Value::Null))
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn b64_floats(s: &str) -> Vec<f32> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let t: Vec<u32> = s
        .trim_end_matches('=')
        .bytes()
        .map(|c| A.iter().position(|a| *a == c).unwrap() as u32)
        .collect();
    let mut bytes = Vec::new();
    for c in t.chunks(4) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, v)| n | v << (18 - 6 * i));
        bytes.push((n >> 16) as u8);
        if c.len() > 2 {
            bytes.push((n >> 8) as u8);
        }
        if c.len() > 3 {
            bytes.push(n as u8);
        }
    }
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_validation_rule_answers_its_code_and_param() {
    let e = start().await;
    let cases = vec![
        (
            json!({"model": "emb-3", "input": ""}),
            "invalid_parameter",
            "input",
        ),
        (
            json!({"model": "emb-3", "input": []}),
            "invalid_parameter",
            "input",
        ),
        (
            json!({"model": "emb-3", "input": ["a", ""]}),
            "invalid_parameter",
            "input",
        ),
        (
            json!({"model": "emb-3", "input": ["a", 1]}),
            "invalid_parameter",
            "input",
        ),
        (
            json!({"model": "emb-3", "input": [1, -1]}),
            "invalid_parameter",
            "input",
        ),
        (
            json!({"model": "emb-3", "input": [1, 2.5]}),
            "invalid_parameter",
            "input",
        ),
        (
            json!({"model": "emb-3", "input": [true]}),
            "invalid_parameter",
            "input",
        ),
        (
            json!({"model": "emb-3", "input": [[1], []]}),
            "invalid_parameter",
            "input",
        ),
        (
            json!({"model": "emb-3", "input": "a", "dimensions": 0}),
            "invalid_parameter",
            "dimensions",
        ),
        (
            json!({"model": "emb-old", "input": "a", "dimensions": 256}),
            "invalid_parameter",
            "dimensions",
        ),
        (
            json!({"model": "emb-3", "input": "a", "encoding_format": "int8"}),
            "invalid_parameter",
            "encoding_format",
        ),
        (
            json!({"model": "emb-3", "input": "a", "stream": true}),
            "unsupported_parameter",
            "stream",
        ),
        (
            json!({"model": "emb-3", "input": "a", "stream": 1}),
            "invalid_parameter",
            "stream",
        ),
        (
            json!({"model": "emb-3", "input": "a", "user": "u".repeat(1025)}),
            "invalid_parameter",
            "user",
        ),
        (
            json!({"model": "emb-3", "input": "a", "temperature": 0.2}),
            "unsupported_parameter",
            "temperature",
        ),
        (
            json!({"model": "emb-gemini", "input": [1, 2, 3]}),
            "invalid_parameter",
            "input",
        ),
        (
            json!({"model": "chat-x", "input": "a"}),
            "unsupported_capability",
            "model",
        ),
    ];
    for (body, code, param) in cases {
        let (st, _, v) = embed(&e, &body).await;
        assert_error(st, &v, 400, code);
        assert_eq!(v["error"]["param"], param, "{body}");
    }
    // A body that is not JSON by its content type.
    let r =
        e.s.http
            .post(format!("{}/v1/embeddings", e.s.gateway))
            .bearer_auth(&e.key)
            .header("content-type", "text/plain")
            .body(r#"{"model":"emb-3","input":"a"}"#)
            .send()
            .await
            .unwrap();
    let st = r.status().as_u16();
    assert_error(st, &r.json().await.unwrap(), 400, "invalid_request");
    assert_eq!(e.mock.requests().len(), 0, "nothing reached a provider");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floats_and_base64_carry_the_same_vectors_in_input_order() {
    let e = start().await;
    let body = json!({"model": "emb-3", "input": ["alpha", "beta", "gamma"], "user": "end-user-7"});
    let (st, h, v) = embed(&e, &body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"].as_array().unwrap().len(), 3);
    for (i, d) in v["data"].as_array().unwrap().iter().enumerate() {
        assert_eq!(d["index"], i);
        assert_eq!(d["object"], "embedding");
    }
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(v["usage"]["prompt_tokens"], v["usage"]["total_tokens"]);
    // Billed on input tokens at the input rate ($0.02 per million here).
    let tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let micro = (tokens * 20_000 + 500_000) / 1_000_000;
    assert_eq!(v["usage"]["cost"].as_f64().unwrap(), micro as f64 / 1e6);
    assert_eq!(h.get("x-gateway-attempts").unwrap(), "openai:ok");
    let sent = e.mock.requests_for("e1")[0].json().unwrap();
    assert!(
        sent.get("user").is_none(),
        "user is attribution only: {sent}"
    );
    let mut b = body.clone();
    b["encoding_format"] = json!("base64");
    let (_, _, v64) = embed(&e, &b).await;
    for i in 0..3 {
        assert_eq!(
            b64_floats(v64["data"][i]["embedding"].as_str().unwrap()),
            floats(&v["data"][i]["embedding"]),
            "vector {i}"
        );
    }
    // The same input embedded alone gives the same vector (order is kept).
    let (_, _, one) = embed(&e, &json!({"model": "emb-3", "input": "gamma"})).await;
    assert_eq!(
        floats(&one["data"][0]["embedding"]),
        floats(&v["data"][2]["embedding"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dimensions_token_ids_and_every_wire() {
    let e = start().await;
    let (st, _, v) = embed(
        &e,
        &json!({"model": "emb-3", "input": "a", "dimensions": 5}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), 5);
    assert_eq!(
        e.mock.requests_for("e1")[0].json().unwrap()["dimensions"],
        5
    );
    let (st, _, v) = embed(&e, &json!({"model": "emb-3", "input": [[1, 2], [3]]})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    for (model, rung) in [
        ("emb-gemini", "ge1"),
        ("emb-vertex", "ve1"),
        ("emb-mistral", "me1"),
    ] {
        let (st, _, v) = embed(&e, &json!({"model": model, "input": ["x", "y"]})).await;
        assert_eq!(st, 200, "{model}: {v}");
        assert_eq!(v["data"].as_array().unwrap().len(), 2, "{model}");
        assert!(v["usage"]["total_tokens"].as_u64().unwrap() > 0, "{model}");
        assert_eq!(e.mock.count(rung), 1, "{model}");
    }
    let vertex = &e.mock.requests_for("ve1")[0];
    assert!(
        vertex
            .path
            .ends_with("/publishers/google/models/ve1:predict"),
        "{}",
        vertex.path
    );
    assert!(vertex
        .header("authorization")
        .unwrap()
        .starts_with("Bearer mock-token-"));
    let gemini = &e.mock.requests_for("ge1")[0];
    assert!(
        gemini.path.ends_with("/models/ge1:batchEmbedContents"),
        "{}",
        gemini.path
    );
    assert_eq!(gemini.header("x-goog-api-key"), Some("gm-key"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_the_provider_limit_is_split_and_merged_in_order() {
    let e = start().await;
    let inputs: Vec<String> = (0..250).map(|i| format!("text number {i}")).collect();
    let (st, _, v) = embed(&e, &json!({"model": "emb-gemini", "input": inputs})).await;
    assert_eq!(st, 200, "{v}");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 250);
    let calls = e.mock.requests_for("ge1");
    assert_eq!(calls.len(), 3, "100 + 100 + 50");
    let sizes: Vec<usize> = calls
        .iter()
        .map(|c| c.json().unwrap()["requests"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, [100, 100, 50]);
    // Input 137 (in the second upstream call) is where it belongs.
    let (_, _, one) = embed(
        &e,
        &json!({"model": "emb-gemini", "input": "text number 137"}),
    )
    .await;
    assert_eq!(
        floats(&one["data"][0]["embedding"]),
        floats(&data[137]["embedding"])
    );
    assert_eq!(data[137]["index"], 137);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_rung_fails_over_and_every_rung_failing_is_502() {
    let e = start().await;
    e.mock.script("e1", vec![Step::Status(500)]);
    let (st, h, v) = embed(&e, &json!({"model": "emb-3", "input": "a"})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(h.get("x-gateway-attempts").unwrap(), "openai:500,azure:ok");
    assert_eq!(v["provider"], "azure:e2");
    let az = &e.mock.requests_for("e2")[0];
    assert!(
        az.path.contains("/openai/deployments/e2/embeddings"),
        "{}",
        az.path
    );
    assert_eq!(az.header("api-key"), Some("az-key"));
    e.mock.script("e1", vec![Step::Status(429)]);
    e.mock.script("e2", vec![Step::Status(503)]);
    let (st, _, v) = embed(&e, &json!({"model": "emb-3", "input": "a"})).await;
    assert_error(st, &v, 502, "all_routes_failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_titan_and_cohere_embed_through_signed_invoke_calls() {
    let e = start().await;
    let (st, _, v) = embed(
        &e,
        &json!({"model": "emb-titan", "input": ["one", "two", "three"], "dimensions": 4}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"].as_array().unwrap().len(), 3);
    assert_eq!(v["data"][2]["embedding"].as_array().unwrap().len(), 4);
    let calls = e.mock.requests_for("amazon.titan-embed-text-v2:0");
    assert_eq!(calls.len(), 3, "Titan embeds one text a call");
    assert!(
        calls[0].path.ends_with("/invoke") && calls[0].path.contains("%3A"),
        "{}",
        calls[0].path
    );
    assert!(calls[0]
        .header("authorization")
        .unwrap()
        .starts_with("AWS4-HMAC-SHA256 "));
    assert_eq!(calls[1].json().unwrap()["inputText"], "two");
    let inputs: Vec<String> = (0..100).map(|i| format!("doc {i}")).collect();
    let (st, _, v) = embed(&e, &json!({"model": "emb-cohere", "input": inputs})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"].as_array().unwrap().len(), 100);
    assert_eq!(e.mock.count("cohere.embed-english-v3"), 2, "96 + 4");
}
