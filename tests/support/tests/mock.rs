//! End-to-end tests of the mock provider over real TCP, with a tiny HTTP/1.1
//! client written against `tokio::net::TcpStream`.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::TcpStream,
};

/// A response as read off the wire, up to EOF or a connection error.
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    /// Decoded body (de-chunked when chunked).
    body: Vec<u8>,
    /// The body ended properly (terminating chunk / full content-length).
    complete: bool,
    /// Raw bytes received, with the time each read returned them.
    reads: Vec<(Instant, usize)>,
    /// Offset of the body in the raw bytes.
    body_start: usize,
    raw: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// SSE frames of the body (split on blank lines, `\n\n` or `\r\n\r\n`).
    fn frames(&self) -> Vec<String> {
        self.text()
            .replace("\r\n", "\n")
            .split("\n\n")
            .filter(|f| !f.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// JSON of each `data:` line that is not `[DONE]`.
    fn data_json(&self) -> Vec<Value> {
        self.frames()
            .iter()
            .filter_map(|f| f.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    /// When the raw byte stream first contained `needle` at or after the body.
    fn arrival_of(&self, needle: &str, nth: usize) -> Instant {
        let hay = &self.raw[self.body_start..];
        let mut from = 0;
        let mut end = 0;
        for _ in 0..=nth {
            let pos = find(&hay[from..], needle.as_bytes()).expect("needle present") + from;
            end = self.body_start + pos + needle.len();
            from = pos + 1;
        }
        let mut seen = 0;
        for (t, n) in &self.reads {
            seen += n;
            if seen >= end {
                return *t;
            }
        }
        unreachable!()
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Sends one request with `Connection: close` and reads until the server
/// closes (or resets) the connection.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();

    let mut raw = Vec::new();
    let mut reads = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                reads.push((Instant::now(), n));
            }
        }
    }
    parse(raw, reads)
}

fn parse(raw: Vec<u8>, reads: Vec<(Instant, usize)>) -> Resp {
    let Some(head_end) = find(&raw, b"\r\n\r\n") else {
        return Resp {
            status: 0,
            headers: Vec::new(),
            body: Vec::new(),
            complete: false,
            reads,
            body_start: raw.len(),
            raw,
        };
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body_start = head_end + 4;
    let rest = &raw[body_start..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let (body, complete) = if chunked {
        dechunk(rest)
    } else {
        let len = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .map(|(_, v)| v.parse::<usize>().unwrap());
        (rest.to_vec(), len.is_none_or(|l| l == rest.len()))
    };
    Resp {
        status,
        headers,
        body,
        complete,
        reads,
        body_start,
        raw,
    }
}

fn dechunk(mut rest: &[u8]) -> (Vec<u8>, bool) {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find(rest, b"\r\n") else {
            return (body, false);
        };
        let size_line = String::from_utf8_lossy(&rest[..line_end]).into_owned();
        let size = usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16).unwrap();
        rest = &rest[line_end + 2..];
        if size == 0 {
            return (body, true);
        }
        if rest.len() < size + 2 {
            body.extend_from_slice(&rest[..size.min(rest.len())]);
            return (body, false);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

async fn post_json(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    send(
        addr,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .await
}

fn chat_body(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "stream": stream,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Say hello"}],
    })
}

#[tokio::test]
async fn chat_completion_non_stream() {
    let mock = Mock::start().await;
    let body = json!({"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": "hi"}]});
    let r = post_json(mock.addr(), "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200);
    assert!(r.complete);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "gpt-4.1-mini-2025-04-14");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(v["created"].as_u64().unwrap() > 1_700_000_000);
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(
        choice["message"]["content"],
        "Hello from mock gpt-4.1-mini."
    );
    assert_eq!(choice["message"]["refusal"], Value::Null);
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["logprobs"], Value::Null);
    let usage = &v["usage"];
    let prompt = body.to_string().len().div_ceil(4) as u64;
    assert_eq!(usage["prompt_tokens"], prompt);
    assert_eq!(usage["completion_tokens"], 8);
    assert_eq!(usage["total_tokens"], prompt + 8);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 0);
    assert!(v["system_fingerprint"].is_string());

    // Already dated models are kept; the unversioned path works too.
    let r = post_json(
        mock.addr(),
        "/chat/completions",
        &json!({"model": "gpt-4o-2024-08-06", "messages": []}),
    )
    .await;
    assert_eq!(r.json()["model"], "gpt-4o-2024-08-06");
}

#[tokio::test]
async fn chat_completion_stream_frames() {
    let mock = Mock::start().await;
    let r = post_json(
        mock.addr(),
        "/v1/chat/completions",
        &chat_body("gpt-4.1-mini", true),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.complete);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let frames = r.frames();
    assert!(frames.iter().all(|f| f.starts_with("data: ")));
    assert_eq!(frames.last().unwrap(), "data: [DONE]");
    let chunks = r.data_json();
    // role + 5 content + finish + usage
    assert_eq!(chunks.len(), 8, "{frames:?}");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert!(chunks
        .iter()
        .all(|c| c["model"] == "gpt-4.1-mini-2025-04-14"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["choices"][0]["delta"]["content"], "");
    let text: String = chunks[1..6]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Hello from mock gpt-4.1-mini.");
    assert_eq!(chunks[6]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[6]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[7]["choices"], json!([]));
    assert_eq!(chunks[7]["usage"]["completion_tokens"], 8);
    assert!(chunks[..7].iter().all(|c| c["usage"].is_null()));

    // Without include_usage: no usage chunk.
    mock.script("m", vec![Step::Chunks(3)]);
    let r = post_json(
        mock.addr(),
        "/v1/chat/completions",
        &json!({"model": "m", "stream": true}),
    )
    .await;
    let chunks = r.data_json();
    assert_eq!(chunks.len(), 5);
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert_eq!(r.frames().last().unwrap(), "data: [DONE]");
}

#[tokio::test]
async fn status_then_ok_from_queue() {
    let mock = Mock::start().await;
    mock.script(
        "gpt-4.1",
        vec![Step::Status(500), Step::Status(429), Step::Ok],
    );
    let body = chat_body("gpt-4.1", false);

    let r = post_json(mock.addr(), "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 500);
    let err = &r.json()["error"];
    assert_eq!(err["type"], "server_error");
    assert!(err["message"].is_string());
    assert!(err.get("param").is_some() && err.get("code").is_some());

    let r = post_json(mock.addr(), "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");

    let r = post_json(mock.addr(), "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200);
    let r = post_json(mock.addr(), "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "empty queue falls back to Ok");
    assert_eq!(mock.count("gpt-4.1"), 4);
    assert_eq!(mock.count("other"), 0);

    // A persistent default, and the queue taking precedence over it.
    mock.set_default("gpt-4.1", Step::Status(503));
    mock.script("gpt-4.1", vec![Step::Ok]);
    assert_eq!(
        post_json(mock.addr(), "/v1/chat/completions", &body)
            .await
            .status,
        200
    );
    assert_eq!(
        post_json(mock.addr(), "/v1/chat/completions", &body)
            .await
            .status,
        503
    );
    assert_eq!(
        post_json(mock.addr(), "/v1/chat/completions", &body)
            .await
            .status,
        503
    );
}

#[tokio::test]
async fn cut_after_two_chunks_truncates_stream() {
    let mock = Mock::start().await;
    mock.script("gpt-4.1-mini", vec![Step::CutAfter(2), Step::CutAfter(0)]);
    let r = post_json(
        mock.addr(),
        "/v1/chat/completions",
        &chat_body("gpt-4.1-mini", true),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(!r.complete, "stream must end without the terminating chunk");
    let chunks = r.data_json();
    assert_eq!(chunks.len(), 3, "role + 2 content chunks: {:?}", r.frames());
    assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "Hello");
    assert_eq!(chunks[2]["choices"][0]["delta"]["content"], " from");
    assert!(!r.text().contains("[DONE]"));
    assert!(!r.text().contains("finish_reason\":\"stop"));

    let r = post_json(
        mock.addr(),
        "/v1/chat/completions",
        &chat_body("gpt-4.1-mini", true),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(!r.complete);
    assert_eq!(r.data_json().len(), 1, "only the role chunk");

    // Non-streaming: headers and half a body.
    mock.script("gpt-4.1-mini", vec![Step::CutAfter(1)]);
    let r = post_json(
        mock.addr(),
        "/v1/chat/completions",
        &chat_body("gpt-4.1-mini", false),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(!r.complete);
    assert!(!r.body.is_empty());
    assert!(serde_json::from_slice::<Value>(&r.body).is_err());
}

#[tokio::test]
async fn close_connection_sends_nothing() {
    let mock = Mock::start().await;
    mock.script("m", vec![Step::CloseConnection]);
    let r = post_json(mock.addr(), "/v1/chat/completions", &chat_body("m", false)).await;
    assert!(
        r.raw.is_empty(),
        "got {:?}",
        String::from_utf8_lossy(&r.raw)
    );
    assert_eq!(mock.count("m"), 1);
}

#[tokio::test]
async fn records_body_and_headers() {
    let mock = Mock::start().await;
    let body = chat_body("rec-model", false).to_string();
    let r = send(
        mock.addr(),
        "POST",
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-upstream"),
            ("X-Trace", "abc123"),
        ],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200);
    let all = mock.requests();
    assert_eq!(all.len(), 1);
    let rec = &mock.requests_for("rec-model")[0];
    assert_eq!(rec.method, "POST");
    assert_eq!(rec.path, "/v1/chat/completions");
    assert_eq!(rec.model.as_deref(), Some("rec-model"));
    assert_eq!(rec.body, body.as_bytes());
    assert_eq!(rec.header("authorization"), Some("Bearer sk-upstream"));
    assert_eq!(rec.header("x-trace"), Some("abc123"));
    assert!(rec
        .headers
        .iter()
        .any(|(k, v)| k == "x-trace" && v == "abc123"));
    assert_eq!(rec.json().unwrap()["model"], "rec-model");
    assert!(mock.requests_for("nope").is_empty());

    // Unknown routes are recorded and answered 404 in the OpenAI envelope.
    let r = send(mock.addr(), "GET", "/v1/nothing?x=1", &[], b"").await;
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("/v1/nothing"));
    assert_eq!(mock.requests()[1].path, "/v1/nothing?x=1");

    mock.clear();
    assert!(mock.requests().is_empty());
    assert_eq!(mock.count("rec-model"), 0);
}

#[tokio::test]
async fn azure_deployment_path() {
    let mock = Mock::start().await;
    mock.script("my-deploy", vec![Step::Text("from azure".into())]);
    let r = post_json(
        mock.addr(),
        "/openai/deployments/my-deploy/chat/completions?api-version=2024-10-21",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["content"], "from azure");
    assert_eq!(v["model"], "my-deploy-2025-04-14");
    let rec = &mock.requests_for("my-deploy")[0];
    assert_eq!(
        rec.path,
        "/openai/deployments/my-deploy/chat/completions?api-version=2024-10-21"
    );
}

#[tokio::test]
async fn anthropic_stream_event_order() {
    let mock = Mock::start().await;
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "stream": true,
        "messages": [{"role": "user", "content": "hi"}],
    });
    let r = post_json(mock.addr(), "/v1/messages", &body).await;
    assert_eq!(r.status, 200);
    assert!(r.complete);
    let events: Vec<(String, Value)> = r
        .frames()
        .iter()
        .map(|f| {
            let mut lines = f.lines();
            let name = lines
                .next()
                .unwrap()
                .strip_prefix("event: ")
                .unwrap()
                .to_owned();
            let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
            (name, serde_json::from_str(data).unwrap())
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(["content_block_delta"; 5]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str());
    }
    let start = &events[0].1["message"];
    assert_eq!(start["model"], "claude-sonnet-4-5");
    assert_eq!(start["role"], "assistant");
    assert!(start["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let text: String = events[3..8]
        .iter()
        .map(|(_, d)| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, "Hello from mock claude-sonnet-4-5.");
    assert_eq!(events[9].1["delta"]["stop_reason"], "end_turn");
    assert_eq!(events[9].1["usage"]["output_tokens"], 9);

    // Errors: Anthropic envelope, and the in-band error event.
    mock.script(
        "claude-sonnet-4-5",
        vec![Step::Status(529), Step::ErrorEvent],
    );
    let r = post_json(mock.addr(), "/v1/messages", &body).await;
    assert_eq!(r.status, 529);
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "overloaded_error");
    let r = post_json(mock.addr(), "/v1/messages", &body).await;
    assert_eq!(r.status, 200);
    assert!(r.frames()[0].starts_with("event: error\ndata: "));
    assert_eq!(r.frames().len(), 1);
}

#[tokio::test]
async fn anthropic_non_stream_refusal_and_tool_use() {
    let mock = Mock::start().await;
    let body = json!({"model": "claude", "max_tokens": 64, "messages": []});
    mock.script(
        "claude",
        vec![
            Step::Ok,
            Step::Refusal("no".into()),
            Step::ToolCall {
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into(),
            },
        ],
    );
    let v = post_json(mock.addr(), "/v1/messages", &body).await.json();
    assert_eq!(v["type"], "message");
    assert_eq!(
        v["content"][0],
        json!({"type": "text", "text": "Hello from mock claude."})
    );
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Value::Null);
    for k in [
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ] {
        assert!(v["usage"][k].is_u64(), "{k}");
    }
    let v = post_json(mock.addr(), "/v1/messages", &body).await.json();
    assert_eq!(v["stop_reason"], "refusal");
    let mut with_tools = body.clone();
    with_tools["tools"] = json!([{"name": "get_weather", "input_schema": {"type": "object"}}]);
    let v = post_json(mock.addr(), "/v1/messages", &with_tools)
        .await
        .json();
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(v["content"][0]["type"], "tool_use");
    assert_eq!(v["content"][0]["input"], json!({"city": "Paris"}));
}

#[tokio::test]
async fn gemini_generate_content_shape() {
    let mock = Mock::start().await;
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let r = post_json(
        mock.addr(),
        "/v1beta/models/gemini-2.5-flash:generateContent",
        &body,
    )
    .await;
    assert_eq!(r.status, 200);
    let v = r.json();
    let cand = &v["candidates"][0];
    assert_eq!(cand["content"]["role"], "model");
    assert_eq!(
        cand["content"]["parts"][0]["text"],
        "Hello from mock gemini-2.5-flash."
    );
    assert_eq!(cand["finishReason"], "STOP");
    assert_eq!(cand["index"], 0);
    let u = &v["usageMetadata"];
    let prompt = u["promptTokenCount"].as_u64().unwrap();
    let out = u["candidatesTokenCount"].as_u64().unwrap();
    assert_eq!(u["totalTokenCount"].as_u64().unwrap(), prompt + out);
    assert_eq!(u["cachedContentTokenCount"], 0);
    assert_eq!(v["modelVersion"], "gemini-2.5-flash");
    assert_eq!(mock.count("gemini-2.5-flash"), 1);

    // Streaming with alt=sse: `data: ...\r\n\r\n` frames, finish last.
    let r = post_json(
        mock.addr(),
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
        &body,
    )
    .await;
    assert_eq!(r.status, 200);
    let text = r.text();
    assert!(text.starts_with("data: {"));
    assert!(text.ends_with("}\r\n\r\n"));
    let chunks = r.data_json();
    assert_eq!(chunks.len(), 6);
    let joined: String = chunks
        .iter()
        .map(|c| {
            c["candidates"][0]["content"]["parts"][0]["text"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(joined, "Hello from mock gemini-2.5-flash.");
    assert_eq!(chunks[5]["candidates"][0]["finishReason"], "STOP");

    // Without alt=sse: one JSON array.
    let r = post_json(
        mock.addr(),
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
        &body,
    )
    .await;
    assert_eq!(r.json().as_array().unwrap().len(), 6);

    // Errors in Google's envelope.
    mock.script("gemini-2.5-flash", vec![Step::Status(429)]);
    let r = post_json(
        mock.addr(),
        "/v1beta/models/gemini-2.5-flash:generateContent",
        &body,
    )
    .await;
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["error"]["status"], "RESOURCE_EXHAUSTED");
}

fn b64_decode_len(s: &str) -> usize {
    assert_eq!(s.len() % 4, 0);
    assert!(s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'='));
    s.len() / 4 * 3 - s.bytes().rev().take_while(|&b| b == b'=').count()
}

#[tokio::test]
async fn embeddings_float_and_base64() {
    let mock = Mock::start().await;
    let r = post_json(
        mock.addr(),
        "/v1/embeddings",
        &json!({"model": "text-embedding-3-small", "input": ["hello", "world!!!!!"]}),
    )
    .await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "text-embedding-3-small");
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert_eq!(v["data"][1]["index"], 1);
    assert_eq!(v["data"][0]["object"], "embedding");
    assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), 8);
    assert_eq!(v["usage"]["prompt_tokens"], 2 + 3);
    assert_eq!(v["usage"]["total_tokens"], 5);
    // Deterministic from the input.
    let again = post_json(
        mock.addr(),
        "/v1/embeddings",
        &json!({"model": "text-embedding-3-small", "input": "hello"}),
    )
    .await
    .json();
    assert_eq!(again["data"][0]["embedding"], v["data"][0]["embedding"]);

    for dims in [8usize, 3, 256] {
        let mut body = json!({"model": "e", "input": "hi", "encoding_format": "base64"});
        if dims != 8 {
            body["dimensions"] = json!(dims);
        }
        let v = post_json(mock.addr(), "/v1/embeddings", &body).await.json();
        let b64 = v["data"][0]["embedding"].as_str().unwrap();
        assert_eq!(b64_decode_len(b64), dims * 4);
    }

    mock.script("e", vec![Step::Embeddings { dims: 1536 }]);
    let v = post_json(
        mock.addr(),
        "/v1/embeddings",
        &json!({"model": "e", "input": [1, 2, 3]}),
    )
    .await
    .json();
    assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), 1536);
    assert_eq!(v["usage"]["prompt_tokens"], 3);

    // Gemini embeddings.
    let v = post_json(
        mock.addr(),
        "/v1beta/models/gemini-embedding-001:batchEmbedContents",
        &json!({"requests": [
            {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "a"}]}},
            {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "b"}]}, "outputDimensionality": 4},
        ]}),
    )
    .await
    .json();
    assert_eq!(v["embeddings"][0]["values"].as_array().unwrap().len(), 8);
    assert_eq!(v["embeddings"][1]["values"].as_array().unwrap().len(), 4);
    let v = post_json(
        mock.addr(),
        "/v1beta/models/gemini-embedding-001:embedContent",
        &json!({"content": {"parts": [{"text": "a"}]}}),
    )
    .await
    .json();
    assert_eq!(v["embedding"]["values"].as_array().unwrap().len(), 8);
}

#[tokio::test]
async fn responses_stream_events() {
    let mock = Mock::start().await;
    let r = post_json(
        mock.addr(),
        "/v1/responses",
        &json!({"model": "gpt-4.1-mini", "input": "hi", "stream": true}),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.complete);
    let frames = r.frames();
    let mut names = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let mut lines = f.lines();
        let name = lines.next().unwrap().strip_prefix("event: ").unwrap();
        let data: Value =
            serde_json::from_str(lines.next().unwrap().strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(data["type"], name);
        assert_eq!(data["sequence_number"], i);
        names.push(name.to_owned());
    }
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(["response.output_text.delta"; 5]);
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);
    let done = r.data_json().pop().unwrap();
    let resp = &done["response"];
    assert_eq!(resp["status"], "completed");
    assert_eq!(resp["model"], "gpt-4.1-mini-2025-04-14");
    assert_eq!(
        resp["output"][0]["content"][0]["text"],
        "Hello from mock gpt-4.1-mini."
    );
    let u = &resp["usage"];
    assert_eq!(u["output_tokens"], 8);
    assert_eq!(u["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["input_tokens"].as_u64().unwrap() + 8
    );

    let v = post_json(
        mock.addr(),
        "/v1/responses",
        &json!({"model": "gpt-4.1-mini", "input": "hi"}),
    )
    .await
    .json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["output"][0]["type"], "message");
}

#[tokio::test]
async fn responses_reasoning_summary_and_items_only_a_store_could_resolve() {
    let mock = Mock::start().await;
    let ask = json!({"model": "o4-mini", "input": "hi", "reasoning": {"effort": "low", "summary": "auto"},
                     "include": ["reasoning.encrypted_content"]});
    // A summary opens the output with a reasoning item, its encrypted content as asked.
    let v = post_json(mock.addr(), "/v1/responses", &ask).await.json();
    let rs = &v["output"][0];
    assert_eq!(rs["type"], "reasoning");
    let id = rs["id"].as_str().unwrap();
    assert_eq!(
        rs["summary"][0]["text"],
        "Thinking about o4-mini-2025-04-14."
    );
    assert_eq!(rs["encrypted_content"], format!("gAAAAB-mock-{id}"));
    assert_eq!(v["output"][1]["type"], "message");
    assert_eq!(v["usage"]["output_tokens_details"]["reasoning_tokens"], 8);
    // The Response repeats what the request set, and OpenAI's defaults otherwise.
    assert_eq!(v["tools"], json!([]));
    assert_eq!(v["temperature"], 1.0);
    assert_eq!(v["instructions"], Value::Null);
    let asked = json!({"model": "o4-mini", "input": "hi", "instructions": "Be brief.", "temperature": 0.5,
                       "tools": [{"type": "function", "name": "f", "parameters": {}}], "metadata": {"a": "b"}});
    let v = post_json(mock.addr(), "/v1/responses", &asked).await.json();
    assert_eq!(v["instructions"], "Be brief.");
    assert_eq!(v["temperature"], 0.5);
    assert_eq!(v["tools"][0]["name"], "f");
    assert_eq!(v["tools"][0]["strict"], true);
    assert_eq!(v["metadata"], json!({"a": "b"}));
    // Streamed: the reasoning item's events come first, at output index 0.
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    streamed["include"] = json!([]);
    let r = post_json(mock.addr(), "/v1/responses", &streamed).await;
    let events = r.data_json();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[2..8],
        [
            "response.output_item.added",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.done",
            "response.output_item.done",
        ]
    );
    assert!(events[7]["item"].get("encrypted_content").is_none());
    assert_eq!(events[8]["output_index"], 1);
    let done = events.last().unwrap();
    assert_eq!(
        done["response"]["output"][1]["content"][0]["text"],
        "Hello from mock o4-mini."
    );
    // A reasoning item without its encrypted content, or a reference, is not found.
    for item in [
        json!({"type": "reasoning", "id": "rs_1", "summary": []}),
        json!({"type": "item_reference", "id": "msg_1"}),
    ] {
        let body = json!({"model": "o4-mini", "store": false, "input": [item]});
        let r = post_json(mock.addr(), "/v1/responses", &body).await;
        assert_eq!(r.status, 404);
        let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains("not found"), "{message}");
    }
    let kept = json!({"model": "o4-mini", "store": false, "input": [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB-x"},
        {"role": "user", "content": "hi"}]});
    assert_eq!(
        post_json(mock.addr(), "/v1/responses", &kept).await.status,
        200
    );
}

#[tokio::test]
async fn chat_faults_error_event_refusal_tool_call_empty() {
    let mock = Mock::start().await;
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    mock.script(
        "m",
        vec![
            Step::ErrorEvent,
            Step::Refusal("I can't help with that.".into()),
            Step::ToolCall {
                name: "f".into(),
                arguments: r#"{"x":1}"#.into(),
            },
            Step::Empty,
            Step::ToolCall {
                name: "f".into(),
                arguments: r#"{"x":1}"#.into(),
            },
        ],
    );
    let r = post_json(mock.addr(), "/v1/chat/completions", &chat_body("m", true)).await;
    assert_eq!(r.status, 200);
    assert!(r.complete);
    let chunks = r.data_json();
    assert_eq!(chunks.len(), 1);
    assert_eq!(chunks[0]["error"]["type"], "server_error");
    assert!(!r.text().contains("[DONE]"));

    let chunks = post_json(mock.addr(), "/v1/chat/completions", &chat_body("m", true))
        .await
        .data_json();
    let refusal: String = chunks[1..chunks.len() - 2]
        .iter()
        .map(|c| c["choices"][0]["delta"]["refusal"].as_str().unwrap())
        .collect();
    assert_eq!(refusal, "I can't help with that.");

    let mut body = chat_body("m", true);
    body["tools"] = tools.clone();
    let chunks = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .data_json();
    let first = &chunks[0]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(first["function"]["name"], "f");
    let args: String = chunks[1..chunks.len() - 2]
        .iter()
        .map(|c| {
            c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(args, r#"{"x":1}"#);
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "tool_calls"
    );

    let v = post_json(mock.addr(), "/v1/chat/completions", &chat_body("m", false))
        .await
        .json();
    assert_eq!(v["choices"][0]["message"]["content"], "");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 0);

    let mut body = chat_body("m", false);
    body["tools"] = tools;
    let v = post_json(mock.addr(), "/v1/chat/completions", &body)
        .await
        .json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(v["choices"][0]["message"]["content"], Value::Null);
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["arguments"], r#"{"x":1}"#);
}

#[tokio::test]
async fn chunks_arrive_as_produced() {
    let mock = Mock::start().await;
    mock.script(
        "slow",
        vec![
            Step::SlowChunks {
                n: 3,
                every: Duration::from_millis(80),
            },
            Step::DelayFirstToken(Duration::from_millis(300)),
            Step::DelayHeaders(Duration::from_millis(150)),
        ],
    );
    let r = post_json(
        mock.addr(),
        "/v1/chat/completions",
        &chat_body("slow", true),
    )
    .await;
    assert!(r.complete);
    let first = r.arrival_of("\"content\":\"Hello\"", 0);
    let third = r.arrival_of("\"content\":\" mock", 0);
    assert!(
        third - first >= Duration::from_millis(140),
        "{:?}",
        third - first
    );

    let sent2 = Instant::now();
    let r = post_json(
        mock.addr(),
        "/v1/chat/completions",
        &chat_body("slow", true),
    )
    .await;
    let role = r.arrival_of("\"role\":\"assistant\"", 0);
    let content = r.arrival_of("\"content\":\"Hello\"", 0);
    assert!(
        role - sent2 < Duration::from_millis(250),
        "{:?}",
        role - sent2
    );
    assert!(content - sent2 >= Duration::from_millis(300));

    let sent3 = Instant::now();
    let r = post_json(
        mock.addr(),
        "/v1/chat/completions",
        &chat_body("slow", false),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.reads[0].0 - sent3 >= Duration::from_millis(150));
}

#[tokio::test]
async fn control_api_scripts_and_lists() {
    let mock = Mock::start().await;
    let r = post_json(
        mock.addr(),
        "/_mock/script",
        &json!({"model": "c", "steps": [{"kind": "status", "status": 502}, {"kind": "text", "text": "yo"}]}),
    )
    .await;
    assert_eq!(r.status, 200);
    let r = post_json(mock.addr(), "/v1/chat/completions", &chat_body("c", false)).await;
    assert_eq!(r.status, 502);
    let r = post_json(mock.addr(), "/v1/chat/completions", &chat_body("c", false)).await;
    assert_eq!(r.json()["choices"][0]["message"]["content"], "yo");

    let list = send(mock.addr(), "GET", "/_mock/requests", &[], b"")
        .await
        .json();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2, "control requests are not recorded");
    assert_eq!(list[0]["model"], "c");
    assert_eq!(list[0]["path"], "/v1/chat/completions");
    assert!(list[0]["body"]
        .as_str()
        .unwrap()
        .contains("\"model\":\"c\""));

    assert_eq!(
        post_json(mock.addr(), "/_mock/clear", &json!({}))
            .await
            .status,
        200
    );
    assert!(mock.requests().is_empty());
    let r = post_json(
        mock.addr(),
        "/_mock/script",
        &json!({"model": "c", "steps": [{"kind": "nope"}]}),
    )
    .await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn binary_serves_and_prints_address() {
    use std::process::Stdio;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sluice-mock"))
        .args(["--listen", "127.0.0.1:0", "--chunks", "3"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .await
        .unwrap();
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("listening mock ")
        .unwrap()
        .parse()
        .unwrap();
    let r = post_json(addr, "/v1/chat/completions", &chat_body("b", true)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.data_json().len(), 1 + 3 + 2);
    child.kill().await.unwrap();
}
