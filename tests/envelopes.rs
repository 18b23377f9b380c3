//! Routing and the error envelopes: the inference routes check the body, the model
//! slug and access; twins, not-found, the body cap; one connection serves request
//! after request, a broken head gets a 400, an idle one is closed.

mod harness;

use harness::{assert_error, repo_path, Backend, Opts, Sluice};
use serde_json::{json, Value};
use std::time::Duration;

fn fixture() -> Opts {
    Opts::default().catalog(repo_path("tests/fixtures/catalog.toml"))
}

#[tokio::test]
async fn inference_routes_check_json_model_slug_and_access() {
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        fixture().env("SLUICE_SERVER__CLIENT_COUNTRY_HEADER", "cf-ipcountry"),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    let k = Some(key.as_str());
    let (st, v) = s.post_raw("/v1/chat/completions", k, "{\"model\": ").await;
    assert_error(st, &v, 400, "invalid_json");
    let (st, v) = s.post_raw("/v1/chat/completions", k, "[1,2]").await;
    assert_error(st, &v, 400, "invalid_request");
    let (st, v) = s
        .post("/v1/chat/completions", k, &json!({"messages": []}))
        .await;
    assert_error(st, &v, 400, "invalid_request");
    assert_eq!(v["error"]["param"], "model");
    // Dashed wire ids, dated ids and unknown names are not slugs.
    for name in [
        "alpha-1-0",
        "alpha-a",
        "alpha-1.0-2025-04-14",
        "nope",
        "secret-1",
    ] {
        let (st, v) = s
            .post(
                "/v1/chat/completions",
                k,
                &json!({"model": name, "messages": []}),
            )
            .await;
        assert_error(st, &v, 403, "model_not_granted");
    }
    // Suffixes are split off before the check: these pass it (and reach the engine).
    for name in ["alpha-1.0:online", "alpha-1.0[1m]"] {
        let (st, v) = s
            .post(
                "/v1/chat/completions",
                k,
                &json!({"model": name, "messages": []}),
            )
            .await;
        assert_ne!(st, 403, "{name}: {v}");
        assert_ne!(v["error"]["code"], "model_not_granted");
    }
    // Kind mismatch.
    let (st, v) = s
        .post(
            "/v1/embeddings",
            k,
            &json!({"model": "alpha-1.0", "input": "x"}),
        )
        .await;
    assert_error(st, &v, 400, "unsupported_capability");
    // Location: beta-2.5 serves US and DE only; unknown location is unverifiable.
    let send = |country: Option<&'static str>| {
        let mut req = s
            .http
            .post(format!("{}/v1/chat/completions", s.gateway))
            .bearer_auth(&key)
            .json(&json!({"model": "beta-2.5", "messages": []}));
        if let Some(c) = country {
            req = req.header("cf-ipcountry", c);
        }
        req.send()
    };
    for c in [None, Some("FR")] {
        let r = send(c).await.unwrap();
        assert_eq!(r.status(), 403);
        assert_eq!(
            r.json::<Value>().await.unwrap()["error"]["code"],
            "model_location_not_supported"
        );
    }
    let r = send(Some("de")).await.unwrap();
    assert_ne!(r.status(), 403);
}

#[tokio::test]
async fn routing_twins_not_found_body_cap_and_envelopes() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture().env("SLUICE_LIMITS__MAX_REQUEST_BYTES", 4096)).await;
    let (_, _, key) = s.org_and_key().await;
    let k = Some(key.as_str());
    for p in [
        "/v1/nope",
        "/v1/completions",
        "/completions",
        "/v2/models",
        "/",
    ] {
        let (st, v) = s.get(p, k).await;
        assert_error(st, &v, 404, "not_found");
        assert_eq!(v["error"]["type"], "not_found_error");
    }
    for p in [
        "/chat/completions",
        "/v1/chat/completions",
        "/responses",
        "/embeddings",
        "/api/v1/embeddings",
    ] {
        let (st, v) = s.post(p, k, &json!({"model": "nope"})).await;
        assert_error(st, &v, 403, "model_not_granted");
    }
    // Over the cap: 400 invalid_request naming the limit.
    let big = format!(
        "{{\"model\":\"alpha-1.0\",\"pad\":\"{}\"}}",
        "x".repeat(5000)
    );
    let (st, v) = s.post_raw("/v1/chat/completions", k, big).await;
    assert_error(st, &v, 400, "invalid_request");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("4096"),
        "{v}"
    );
    // The messages route answers in its own envelope.
    let r = s
        .http
        .post(format!("{}/v1/messages", s.gateway))
        .bearer_auth(&key)
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let r = s
        .http
        .post(format!("{}/v1/messages/count_tokens", s.gateway))
        .bearer_auth(&key)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["type"],
        "not_found_error"
    );
    let r = s
        .http
        .post(format!("{}/v1/messages", s.gateway))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["type"].as_str(), v["error"]["type"].as_str()),
        (Some("error"), Some("authentication_error"))
    );
    // Wrong method.
    let r = s
        .http
        .get(format!("{}/v1/chat/completions", s.gateway))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
}

/// One raw HTTP/1.1 exchange on `conn`: writes `request`, reads one answer (its
/// head, and a body of the length the head gives), returns the head and body.
async fn exchange(conn: &mut tokio::net::TcpStream, request: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= len || n == 0 {
                return (head.to_string(), body.to_string());
            }
        }
        assert!(n > 0, "the connection closed mid-answer: {text}");
    }
}

#[tokio::test]
async fn a_connection_serves_request_after_request_and_a_broken_head_gets_a_400() {
    use tokio::io::AsyncReadExt;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let (_, _, key) = s.org_and_key().await;
    let addr = s.gateway.trim_start_matches("http://").to_string();
    let get = format!("GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\r\n");

    // Three requests on one connection, each answered in full with its own id.
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (head, body) = exchange(&mut conn, &get).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(body.contains("\"object\":\"list\""), "{body}");
        let id = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("x-request-id: ")
                    .map(str::to_string)
            })
            .expect("x-request-id on every answer");
        ids.push(id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 3, "each request has an id of its own");
    // A client's own id is kept.
    let (head, _) = exchange(
        &mut conn,
        &format!("GET /v1/models HTTP/1.1\r\nhost: x\r\nx-request-id: mine-1\r\nauthorization: Bearer {key}\r\n\r\n"),
    )
    .await;
    assert!(
        head.to_ascii_lowercase().contains("x-request-id: mine-1"),
        "{head}"
    );

    // A head that is not HTTP: a 400, and the connection is closed.
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (head, _) = exchange(&mut conn, "NOT HTTP AT ALL\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest))
        .await
        .expect("closed after the 400")
        .unwrap_or(0);
    assert_eq!(n, 0);

    // CONNECT is not served: a 405.
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (head, _) = exchange(
        &mut conn,
        "CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_configured_keepalive() {
    // 1 s: the answer keeps the connection, which is closed once idle past a
    // second (the default would wait 60 s).
    let (head, idle_then_closed) = answer_then_wait("1").await;
    assert!(head.contains("connection: keep-alive"), "{head}");
    assert!(idle_then_closed, "the idle connection is closed");
    // 0: each answer says the connection closes, and it does.
    let (head, closed) = answer_then_wait("0").await;
    assert!(head.contains("connection: close"), "{head}");
    assert!(closed, "closed after the answer");
}

/// One request on a fresh connection to a sluice with `server.keepalive_seconds`
/// = `keepalive`: the answer's head (lowercased), and whether the server closed
/// the connection within 10 s of it.
async fn answer_then_wait(keepalive: &str) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        fixture().env("SLUICE_SERVER__KEEPALIVE_SECONDS", keepalive),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    let addr = s.gateway.trim_start_matches("http://").to_string();
    let get = format!("GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\r\n");
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (head, _) = exchange(&mut conn, &get).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut rest)).await;
    let closed = matches!(read, Ok(Ok(0)) | Ok(Err(_)));
    (head.to_ascii_lowercase(), closed)
}
