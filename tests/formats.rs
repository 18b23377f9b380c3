//! Every inbound format against rungs of every wire, through the gateway and the
//! mock provider: chat, responses and messages clients served by OpenAI chat,
//! OpenAI responses, Anthropic and Gemini rungs, whole and streamed; native
//! pass-through; refusals; the parameter policy (dropped and disclosed, refused);
//! empty completions and cut streams in each format.

mod harness;

use harness::{assert_error, recording, Env, Provider};
use serde_json::{json, Value};
use sluice_mock::Step;

async fn start() -> Env {
    use Provider::*;
    let providers = [OpenAi, Anthropic, Google, Bedrock, Vertex];
    Env::start("tests/fixtures/formats.toml", &providers, |o, _| {
        o.each(&providers, "HEADER_TIMEOUT_MS", 2000).each(
            &providers,
            "FIRST_TOKEN_TIMEOUT_MS",
            2000,
        )
    })
    .await
}

/// One answer: status, headers, and the body as JSON (whole) or SSE frames.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    json: Value,
    /// (event name, data) of each SSE frame.
    frames: Vec<(Option<String>, String)>,
}

impl Answer {
    fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    }

    /// The JSON data of every frame but `[DONE]`.
    fn data(&self) -> Vec<Value> {
        self.frames
            .iter()
            .filter(|(_, d)| d != "[DONE]")
            .map(|(_, d)| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
            .collect()
    }

    /// The `usage` of the stream's usage chunk.
    fn usage(&self) -> Value {
        self.data()
            .into_iter()
            .find(|c| c["usage"].is_object())
            .expect("the usage chunk the client asked for")["usage"]
            .clone()
    }

    fn names(&self) -> Vec<String> {
        self.frames.iter().filter_map(|(n, _)| n.clone()).collect()
    }
}

async fn call(e: &Env, path: &str, body: &Value) -> Answer {
    call_with(e, path, body, &[]).await
}

async fn call_with(e: &Env, path: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let mut req =
        e.s.http
            .post(format!("{}{path}", e.s.gateway))
            .bearer_auth(&e.key)
            .json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let sse = headers
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
    let mut raw = Vec::new();
    while let Ok(Some(c)) = r.chunk().await {
        raw.extend_from_slice(&c);
    }
    let text = String::from_utf8(raw).unwrap();
    let (json, frames) = if sse {
        let frames = text
            .split("\n\n")
            .filter(|f| !f.trim().is_empty() && !f.starts_with(':'))
            .map(|f| {
                let name = f
                    .lines()
                    .find_map(|l| l.strip_prefix("event: "))
                    .map(str::to_string);
                let data: Vec<&str> = f.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                (name, data.join("\n"))
            })
            .collect();
        (Value::Null, frames)
    } else {
        (
            serde_json::from_str(&text).unwrap_or(Value::Null),
            Vec::new(),
        )
    };
    Answer {
        status,
        headers,
        json,
        frames,
    }
}

fn chat_body(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello"}]})
}

fn responses_body(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "instructions": "Be brief.", "input": "Say hello"})
}

fn messages_body(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 256, "system": "Be brief.",
           "messages": [{"role": "user", "content": "Say hello"}]})
}

fn chat_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect()
}

// ---------------------------------------------------------------------------
// chat clients on rungs of other makers

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_client_on_an_anthropic_rung_whole_and_streamed() {
    let e = start().await;
    let a = call(&e, "/v1/chat/completions", &chat_body("fmt-claude", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["object"], "chat.completion");
    assert_eq!(
        a.json["choices"][0]["message"]["content"],
        "Hello from mock c1."
    );
    assert_eq!(a.json["choices"][0]["finish_reason"], "stop");
    assert_eq!(a.json["provider"], "anthropic:c1");
    assert!(a.json["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        a.json["usage"]["total_tokens"].as_u64().unwrap(),
        a.json["usage"]["prompt_tokens"].as_u64().unwrap()
            + a.json["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let sent = &e.mock.requests_for("c1")[0];
    assert_eq!(sent.header("x-api-key"), Some("sk-ant-platform"));
    assert!(sent.header("anthropic-version").is_some());
    let body = sent.json().unwrap();
    assert_eq!(body["model"], "c1");
    assert_eq!(
        body["system"]
            .as_str()
            .or(body["system"][0]["text"].as_str()),
        Some("Be brief.")
    );
    assert_eq!(body["messages"][0]["role"], "user");
    assert!(
        body["max_tokens"].as_u64().unwrap() > 0,
        "Anthropic requires max_tokens"
    );

    let s = call(&e, "/v1/chat/completions", &chat_body("fmt-claude", true)).await;
    assert_eq!(s.status, 200);
    let chunks = s.data();
    assert_eq!(chat_text(&chunks), "Hello from mock c1.");
    assert!(
        chunks.iter().all(|c| c["provider"] == "anthropic:c1"),
        "{chunks:?}"
    );
    let finish: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["finish_reason"].is_string())
        .collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(finish[0]["choices"][0]["finish_reason"], "stop");
    assert!(finish[0]["x_gateway"]["attempts"].is_string());
    assert_eq!(s.frames.last().unwrap().1, "[DONE]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_client_on_a_gemini_rung_whole_and_streamed() {
    let e = start().await;
    let a = call(&e, "/v1/chat/completions", &chat_body("fmt-gemini", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(
        a.json["choices"][0]["message"]["content"],
        "Hello from mock g1."
    );
    assert_eq!(a.json["provider"], "google:g1");
    let sent = &e.mock.requests_for("g1")[0];
    assert_eq!(sent.header("x-goog-api-key"), Some("gm-platform"));
    let body = sent.json().unwrap();
    assert_eq!(body["systemInstruction"]["parts"][0]["text"], "Be brief.");
    assert_eq!(body["contents"][0]["role"], "user");

    let s = call(
        &e,
        "/v1/chat/completions",
        &json!({
        "model": "fmt-gemini", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Say hello"}]}),
    )
    .await;
    assert_eq!(s.status, 200);
    let chunks = s.data();
    assert_eq!(chat_text(&chunks), "Hello from mock g1.");
    let usage = chunks
        .iter()
        .find(|c| c["usage"].is_object())
        .expect("a usage chunk");
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_tool_calls_translate_both_ways_on_an_anthropic_rung() {
    let e = start().await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    for stream in [false, true] {
        e.mock.script(
            "c1",
            vec![Step::ToolCall {
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into(),
            }],
        );
        let a = call(
            &e,
            "/v1/chat/completions",
            &json!({
            "model": "fmt-claude", "stream": stream, "tools": tools,
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}),
        )
        .await;
        assert_eq!(a.status, 200);
        let (name, args, finish) = if stream {
            let chunks = a.data();
            let mut name = String::new();
            let mut args = String::new();
            let mut finish = String::new();
            for c in &chunks {
                for tc in c["choices"][0]["delta"]["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    name.push_str(tc["function"]["name"].as_str().unwrap_or(""));
                    args.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
                }
                if let Some(f) = c["choices"][0]["finish_reason"].as_str() {
                    finish = f.to_string();
                }
            }
            (name, args, finish)
        } else {
            let tc = &a.json["choices"][0]["message"]["tool_calls"][0];
            (
                tc["function"]["name"].as_str().unwrap().to_string(),
                tc["function"]["arguments"].as_str().unwrap().to_string(),
                a.json["choices"][0]["finish_reason"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        };
        assert_eq!(name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&args).unwrap(),
            json!({"city": "Paris"})
        );
        assert_eq!(finish, "tool_calls");
        let sent = e.mock.requests_for("c1").pop().unwrap().json().unwrap();
        assert_eq!(sent["tools"][0]["name"], "get_weather");
        assert_eq!(sent["tools"][0]["input_schema"]["required"][0], "city");
    }
}

/// A chat history never carries Claude's signed thinking: a tool turn sent back
/// with reasoning on goes without thinking (Anthropic refuses it otherwise, as the
/// mock does), disclosed; a turn after the tool cycle closed thinks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_tool_turn_on_claude_with_reasoning_goes_without_thinking() {
    let e = start().await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let mut history = vec![
        json!({"role": "user", "content": "Weather in Paris?"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "toolu_1",
            "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "18 C, clear"}),
    ];
    let body = |messages: &[Value]| {
        json!({"model": "fmt-claude", "reasoning_effort": "low", "tools": tools,
            "messages": messages})
    };
    let a = call(&e, "/v1/chat/completions", &body(&history)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = e.mock.requests_for("c1").pop().unwrap().json().unwrap();
    assert!(sent.get("thinking").is_none(), "{sent}");
    assert!(
        a.header("x-service-ignored-parameters")
            .contains("reasoning"),
        "{:?}",
        a.headers
    );
    history.push(json!({"role": "assistant", "content": "It is 18 C and clear."}));
    history.push(json!({"role": "user", "content": "And tomorrow?"}));
    let a = call(&e, "/v1/chat/completions", &body(&history)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = e.mock.requests_for("c1").pop().unwrap().json().unwrap();
    assert_eq!(sent["thinking"]["type"], "enabled", "{sent}");
    assert_eq!(a.header("x-service-ignored-parameters"), "");
}

// ---------------------------------------------------------------------------
// responses clients

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_client_on_a_gemini_rung_whole_and_streamed() {
    let e = start().await;
    let a = call(&e, "/v1/responses", &responses_body("fmt-gemini", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["object"], "response");
    assert_eq!(a.json["status"], "completed");
    let msg = a.json["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["type"] == "message")
        .unwrap();
    assert_eq!(msg["content"][0]["text"], "Hello from mock g1.");
    assert!(a.json["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(a.json["usage"]["input_tokens_details"]["cached_tokens"].is_u64());
    assert_eq!(a.json["provider"], "google:g1");

    let s = call(&e, "/v1/responses", &responses_body("fmt-gemini", true)).await;
    assert_eq!(s.status, 200);
    let names = s.names();
    assert_eq!(names.first().map(String::as_str), Some("response.created"));
    assert_eq!(names.last().map(String::as_str), Some("response.completed"));
    let text: String = s
        .data()
        .iter()
        .filter(|d| d["type"] == "response.output_text.delta")
        .map(|d| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, "Hello from mock g1.");
    let done = s.data().pop().unwrap();
    assert!(done["response"]["usage"]["output_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_client_on_openai_passes_through_natively_without_gateway_fields() {
    let e = start().await;
    let body = json!({"model": "fmt-gpt", "input": "Say hello", "store": true,
        "prompt_cache_key": "conv-1", "include": ["reasoning.encrypted_content"],
        "text": {"verbosity": "low"}, "metadata": {"team": "a"}});
    let a = call(&e, "/v1/responses", &body).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = &e.mock.requests_for("o1")[0];
    assert!(sent.path.ends_with("/v1/responses"), "{}", sent.path);
    assert_eq!(
        sent.header("authorization"),
        Some("Bearer sk-platform-openai")
    );
    let b = sent.json().unwrap();
    assert_eq!(b["store"], false, "nothing is stored with the provider");
    assert!(
        b.get("prompt_cache_key").is_none(),
        "the routing hint is never sent upstream"
    );
    assert_eq!(b["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(b["text"], json!({"verbosity": "low"}));
    assert_eq!(b["metadata"], json!({"team": "a"}));
    assert_eq!(a.json["provider"], "openai:o1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_response_id_is_the_gateways_and_unknown_ids_are_refused() {
    let e = start().await;
    let mut body = responses_body("fmt-gpt", false);
    body["previous_response_id"] = json!("resp_unknown");
    let a = call(&e, "/v1/responses", &body).await;
    assert_error(a.status, &a.json, 400, "previous_response_not_found");
    assert_eq!(a.json["error"]["param"], "previous_response_id");
    assert_eq!(e.mock.count("o1"), 0);
}

// ---------------------------------------------------------------------------
// messages clients

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_client_on_an_openai_rung_whole_and_streamed() {
    let e = start().await;
    let a = call(&e, "/v1/messages", &messages_body("fmt-gpt", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["type"], "message");
    assert_eq!(a.json["role"], "assistant");
    assert_eq!(a.json["content"][0]["type"], "text");
    assert_eq!(a.json["content"][0]["text"], "Hello from mock o1.");
    assert_eq!(a.json["stop_reason"], "end_turn");
    assert!(a.json["usage"]["input_tokens"].is_u64());
    assert!(a.json["usage"]["output_tokens"].as_u64().unwrap() > 0);
    let sent = e.mock.requests_for("o1")[0].json().unwrap();
    assert_eq!(
        sent["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );

    let s = call(&e, "/v1/messages", &messages_body("fmt-gpt", true)).await;
    assert_eq!(s.status, 200);
    let names = s.names();
    assert_eq!(names.first().map(String::as_str), Some("message_start"));
    assert_eq!(names.last().map(String::as_str), Some("message_stop"));
    assert!(names.iter().any(|n| n == "content_block_delta"));
    assert!(names.iter().any(|n| n == "message_delta"));
    let text: String = s
        .data()
        .iter()
        .filter(|d| d["type"] == "content_block_delta")
        .filter_map(|d| d["delta"]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, "Hello from mock o1.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_client_on_anthropic_passes_thinking_through_verbatim() {
    let e = start().await;
    let body = json!({"model": "fmt-claude", "max_tokens": 2048,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {"user_id": "u-1"},
        "messages": [{"role": "user", "content": "Say hello"}]});
    // The messages route also takes the key in x-api-key.
    let r =
        e.s.http
            .post(format!("{}/v1/messages", e.s.gateway))
            .header("x-api-key", &e.key)
            .json(&body)
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), 200);
    let sent = e.mock.requests_for("c1")[0].json().unwrap();
    assert_eq!(
        sent["thinking"],
        json!({"type": "enabled", "budget_tokens": 1024})
    );
    assert_eq!(sent["metadata"], json!({"user_id": "u-1"}));
    assert_eq!(sent["max_tokens"], 2048);
    assert_eq!(sent["model"], "c1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_route_limits() {
    let e = start().await;
    // Image blocks: text only on this route.
    let a = call(&e, "/v1/messages", &json!({"model": "fmt-claude", "max_tokens": 10,
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "text", "text": "what is this"}]}]})).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json["type"], "error");
    assert_eq!(a.json["error"]["type"], "invalid_request_error");
    let said = a.json["error"]["message"].as_str().unwrap();
    assert!(said.starts_with("messages[0].content[0]:"), "{said}");
    // Documents, and media inside a tool result, are refused the same way, also
    // on a model whose rungs take images on other routes.
    for (content, at) in [
        (
            json!([{"type": "text", "text": "read"},
                   {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}]),
            "messages[0].content[1]:",
        ),
        (
            json!([{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]),
            "messages[0].content[0].content[0]:",
        ),
    ] {
        let a = call(
            &e,
            "/v1/messages",
            &json!({"model": "fmt-claude", "max_tokens": 10,
            "messages": [{"role": "user", "content": content}]}),
        )
        .await;
        assert_eq!(a.status, 400, "{}", a.json);
        let said = a.json["error"]["message"].as_str().unwrap();
        assert!(said.starts_with(at), "{said}");
        assert!(said.contains("text only"), "{said}");
    }
    // Thinking on a route with a rung of another maker.
    let a = call(
        &e,
        "/v1/messages",
        &json!({"model": "fmt-mixed", "max_tokens": 2048,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.json);
    // count_tokens is not served.
    let a = call(
        &e,
        "/v1/messages/count_tokens",
        &messages_body("fmt-claude", false),
    )
    .await;
    assert_eq!(a.status, 404);
    assert_eq!(a.json["error"]["type"], "not_found_error");
    assert_eq!(
        e.mock.count("c1") + e.mock.count("x1"),
        0,
        "nothing was sent upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_1m_suffix_selects_the_long_window_where_a_rung_serves_it() {
    let e = start().await;
    let a = call(&e, "/v1/messages", &messages_body("fmt-claude[1m]", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = &e.mock.requests_for("c1")[0];
    assert_eq!(sent.header("anthropic-beta"), Some("context-1m-2025-08-07"));
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat_body("fmt-gemini[1m]", false),
    )
    .await;
    assert_error(a.status, &a.json, 400, "unsupported_capability");
    assert_eq!(a.json["error"]["param"], "model");
    // Without the suffix no beta flag is sent.
    let a = call(&e, "/v1/messages", &messages_body("fmt-claude", false)).await;
    assert_eq!(a.status, 200);
    assert_eq!(e.mock.requests_for("c1")[1].header("anthropic-beta"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_claude_host_of_a_1m_route_is_asked_for_the_long_window() {
    let e = start().await;
    let (bedrock, vertex, anthropic) = (
        "anthropic.claude-long-b-v1:0",
        "claude-long-v@20250101",
        "claude-long-a",
    );
    for rung in [bedrock, vertex] {
        e.mock.script(rung, vec![Step::Status(500)]);
    }
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat_body("fmt-claude-long[1m]", false),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["provider"], format!("anthropic:{anthropic}"));
    // Bedrock takes the flag in the Converse body, Vertex and Anthropic as a header.
    let sent = e.mock.requests_for(bedrock)[0].json().unwrap();
    assert_eq!(
        sent["additionalModelRequestFields"]["anthropic_beta"],
        json!(["context-1m-2025-08-07"])
    );
    for rung in [vertex, anthropic] {
        let sent = &e.mock.requests_for(rung)[0];
        assert_eq!(
            sent.header("anthropic-beta"),
            Some("context-1m-2025-08-07"),
            "{rung}"
        );
    }
    // Without the suffix none of them is.
    e.mock.script(bedrock, vec![Step::Status(500)]);
    let a = call(&e, "/v1/messages", &messages_body("fmt-claude-long", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = e.mock.requests_for(bedrock)[1].json().unwrap();
    assert!(sent.get("additionalModelRequestFields").is_none(), "{sent}");
    assert_eq!(
        e.mock.requests_for(vertex)[1].header("anthropic-beta"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_clients_anthropic_headers_reach_anthropic_and_are_disclosed_elsewhere() {
    let e = start().await;
    let headers = [
        ("anthropic-version", "2023-01-01"),
        (
            "anthropic-beta",
            "tools-2024-04-04, prompt-caching-2024-07-31",
        ),
    ];
    let a = call_with(
        &e,
        "/v1/messages",
        &messages_body("fmt-claude[1m]", false),
        &headers,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.header("x-service-ignored-parameters"), "");
    let sent = &e.mock.requests_for("c1")[0];
    let versions: Vec<&str> = sent
        .headers
        .iter()
        .filter(|(k, _)| k == "anthropic-version")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(versions, ["2023-01-01"], "the client's version, once");
    assert_eq!(
        sent.header("anthropic-beta"),
        Some("context-1m-2025-08-07,tools-2024-04-04,prompt-caching-2024-07-31")
    );
    // Another maker, and Claude behind Vertex's own version: said, not silent.
    for (model, rung) in [
        ("fmt-gpt", "o1"),
        ("fmt-vertex-claude", "claude-v1@20250101"),
    ] {
        let a = call_with(&e, "/v1/messages", &messages_body(model, false), &headers).await;
        assert_eq!(a.status, 200, "{model}: {}", a.json);
        assert_eq!(
            a.header("x-service-ignored-parameters"),
            "anthropic-version,anthropic-beta",
            "{model}"
        );
        assert_eq!(e.mock.requests_for(rung)[0].header("anthropic-beta"), None);
    }
    // The version the gateway speaks (what the anthropic SDK sends) is honoured
    // everywhere: nothing to disclose.
    let a = call_with(
        &e,
        "/v1/messages",
        &messages_body("fmt-gpt", false),
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-service-ignored-parameters"), "");
    let sent = &e.mock.requests_for("c1");
    assert_eq!(sent.len(), 1);
    let a = call_with(
        &e,
        "/v1/messages",
        &messages_body("fmt-claude", false),
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(
        e.mock.requests_for("c1")[1].header("anthropic-version"),
        Some("2023-06-01")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thinking_history_off_an_all_claude_route_is_refused_naming_the_block() {
    let e = start().await;
    let history = |thinking: Value| {
        json!({"model": "fmt-mixed", "max_tokens": 64, "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
                thinking,
                {"type": "text", "text": "ok"}]},
            {"role": "user", "content": "more"}]})
    };
    for block in [
        // Another maker's reasoning, as the gateway renders it: no signature.
        json!({"type": "thinking", "thinking": "hmm", "signature": ""}),
        json!({"type": "thinking", "thinking": "hmm"}),
        json!({"type": "thinking", "thinking": "hmm", "signature": "sig"}),
        json!({"type": "redacted_thinking", "data": "opaque"}),
    ] {
        let a = call(&e, "/v1/messages", &history(block.clone())).await;
        assert_eq!(a.status, 400, "{block}: {}", a.json);
        assert_eq!(a.json["error"]["type"], "invalid_request_error");
        let said = a.json["error"]["message"].as_str().unwrap();
        assert!(
            said.starts_with("messages[1].content[1]:"),
            "{block}: {said}"
        );
    }
    assert_eq!(e.mock.count("x1") + e.mock.count("x2"), 0);
    // On a route whose every rung is Claude the turn is served: a rung the gateway
    // renders for leaves unsigned thinking out (Claude cannot verify it), and
    // Anthropic's own API gets the client's body as sent.
    let mut body = history(json!({"type": "thinking", "thinking": "hmm", "signature": ""}));
    body["model"] = json!("fmt-vertex-claude");
    let a = call(&e, "/v1/messages", &body).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = e.mock.requests_for("claude-v1@20250101")[0].json().unwrap();
    let turn = sent["messages"][1]["content"].to_string();
    assert!(turn.contains("ok") && !turn.contains("hmm"), "{turn}");
    body["model"] = json!("fmt-claude");
    let a = call(&e, "/v1/messages", &body).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = e.mock.requests_for("c1")[0].json().unwrap();
    assert_eq!(sent["messages"][1]["content"][1]["type"], "thinking");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_client_that_did_not_enable_thinking_gets_no_thinking_blocks() {
    let e = start().await;
    // A reasoning model on a chat wire thinks without being asked.
    let reply = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "r1",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": "42", "reasoning_content": "Let me think."}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}});
    e.mock.script("r1", vec![Step::ok_reply(&reply)]);
    let a = call(&e, "/v1/messages", &messages_body("fmt-reason", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["content"], json!([{"type": "text", "text": "42"}]));
    // So the client's next turn, its answer appended, is served.
    let next = json!({"model": "fmt-reason", "max_tokens": 64, "messages": [
        {"role": "user", "content": "Say hello"},
        {"role": "assistant", "content": a.json["content"]},
        {"role": "user", "content": "again"}]});
    let a = call(&e, "/v1/messages", &next).await;
    assert_eq!(a.status, 200, "{}", a.json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_error_off_a_native_route_names_the_block_the_client_sent() {
    let e = start().await;
    let body = json!({"model": "fmt-mixed", "max_tokens": 64, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [
            {"type": "text", "text": "here it is"},
            {"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": true}]}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]});
    let a = call(&e, "/v1/messages", &body).await;
    assert_eq!(a.status, 400, "{}", a.json);
    let said = a.json["error"]["message"].as_str().unwrap();
    assert!(
        said.starts_with("messages[2].content[1].is_error:"),
        "{said}"
    );
    assert_eq!(e.mock.count("x1") + e.mock.count("x2"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_chat_stream_without_provider_usage_is_billed_on_a_disclosed_estimate() {
    let e = start().await;
    e.mock.script(
        "o1",
        vec![recording("vercel-ai/openai-compatible-no-usage.chunks.txt")],
    );
    let mut body = chat_body("fmt-gpt", true);
    body["stream_options"] = json!({"include_usage": true});
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_eq!(a.status, 200);
    assert_eq!(chat_text(&a.data()), "Hi there!");
    let usage = a.usage();
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0, "{usage}");
    assert!(usage["completion_tokens"].as_u64().unwrap() > 0, "{usage}");
    assert!(usage["cost"].as_f64().unwrap() > 0.0, "{usage}");
    assert_eq!(usage["estimated"], true, "{usage}");
    // The ledger bills it, marked as the gateway's count.
    let event = e.s.usage_events(&e.key, 1).await[0].clone();
    assert_eq!(event["estimated"], true, "{event}");
    assert!(event["cost_usd"].as_f64().unwrap() > 0.0, "{event}");
    assert_eq!(event["incomplete"], false, "{event}");
    // A provider that reports usage is billed on its count, not marked.
    let a = call(&e, "/v1/chat/completions", &body).await;
    let usage = a.usage();
    assert!(usage.get("estimated").is_none(), "{usage}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_native_answer_without_provider_usage_is_billed_on_a_disclosed_estimate() {
    let e = start().await;
    // An OpenAI-compatible server's answer with no `usage` member.
    let reply = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
        "model": "o1", "choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": "Hello there, friend."}}]});
    e.mock.script("o1", vec![Step::ok_reply(&reply)]);
    let a = call(&e, "/v1/chat/completions", &chat_body("fmt-gpt", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let usage = &a.json["usage"];
    assert_eq!(usage["estimated"], true, "{usage}");
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0, "{usage}");
    // "Hello there, friend." is 20 characters: five tokens by the approximation.
    assert_eq!(usage["completion_tokens"], 5, "{usage}");
    assert!(usage["cost"].as_f64().unwrap() > 0.0, "{usage}");
    let event = e.s.usage_events(&e.key, 1).await[0].clone();
    assert_eq!(event["estimated"], true, "{event}");
    assert_eq!(event["input_tokens"], usage["prompt_tokens"], "{event}");
    assert!(event["cost_usd"].as_f64().unwrap() > 0.0, "{event}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_is_billed_on_the_text_the_model_saw_and_never_past_its_budget() {
    let e = start().await;
    // A long prompt in a body heavy with JSON syntax: many short turns.
    let turns: Vec<Value> = (0..40)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "ok"}))
        .collect();
    let text_chars = 40 * "ok".len();
    let mut body = json!({"model": "fmt-gpt", "stream": true, "messages": turns,
        "stream_options": {"include_usage": true}});
    let bytes = serde_json::to_vec(&body).unwrap().len();
    e.mock.script("o1", vec![Step::CutAfter(3)]);
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_eq!(a.status, 200);
    let usage = a.usage();
    assert_eq!(usage["estimated"], true, "{usage}");
    let prompt = usage["prompt_tokens"].as_u64().unwrap() as usize;
    // The text (in OpenAI's tokens: the rung serves `o1`, and four tokens of
    // framing a turn), not the body's bytes.
    let ok = tiktoken_rs::o200k_base_singleton()
        .encode_ordinary("ok")
        .len();
    assert_eq!(prompt, 40 * ok + 4 * 40, "{usage}");
    assert!(
        text_chars > 0 && prompt < bytes / 4,
        "{prompt} of {bytes} body bytes: {usage}"
    );
    // The output estimate stays within the budget the request set.
    body["max_tokens"] = json!(1);
    e.mock.script("o1", vec![Step::CutAfter(3)]);
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_eq!(a.status, 200);
    let delivered: String = chat_text(&a.data());
    assert!(delivered.chars().count() > 4, "{delivered}");
    let usage = a.usage();
    assert_eq!(usage["completion_tokens"], 1, "{usage}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_prompt_is_counted_with_the_makers_tokenizer_where_the_gateway_holds_it() {
    let e = start().await;
    // Text a token per four characters undercounts threefold: CJK, digits.
    let text =
        "数据库连接池的配置在高并发下决定了延迟的尾部。".repeat(12) + &"1 22 333 ".repeat(30);
    let body = |model: &str| {
        json!({"model": model, "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "system", "content": "Answer briefly."},
                         {"role": "user", "content": text}]})
    };
    let o200k = tiktoken_rs::o200k_base_singleton();
    let tokens = |t: &str| o200k.encode_ordinary(t).len() as u64;
    // fmt-gpt's rung serves `o1`, an o200k model: billed in its tokens, with four
    // of framing for each of the two turns.
    e.mock.script("o1", vec![Step::CutAfter(3)]);
    let a = call(&e, "/v1/chat/completions", &body("fmt-gpt")).await;
    assert_eq!(a.status, 200);
    let usage = a.usage();
    assert_eq!(usage["estimated"], true, "{usage}");
    let exact = tokens("Answer briefly.") + tokens(&text) + 8;
    assert_eq!(usage["prompt_tokens"], exact, "{usage}");
    let approx = ("Answer briefly.".chars().count() + text.chars().count()).div_ceil(4) as u64 + 8;
    assert!(exact > 2 * approx, "{exact} against {approx}");
    // The ledger bills what the client was told.
    let event = e.s.usage_events(&e.key, 1).await[0].clone();
    assert_eq!(event["input_tokens"], exact, "{event}");
    assert_eq!(event["estimated"], true, "{event}");
    // A model whose maker's tokenizer the gateway does not hold (`n1`): the
    // documented approximation, a token per four characters.
    e.mock.script("n1", vec![Step::CutAfter(3)]);
    let a = call(&e, "/v1/chat/completions", &body("fmt-nojson")).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.usage()["prompt_tokens"], approx, "{}", a.usage());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_claude_call_without_arguments_reaches_every_client_as_an_empty_object() {
    let e = start().await;
    let recorded = "vercel-ai/anthropic-tool-no-args.chunks.txt";
    let tools = json!([{"type": "function", "function": {"name": "updateIssueList",
        "parameters": {"type": "object", "properties": {}}}}]);
    e.mock.script("c1", vec![recording(recorded)]);
    let mut body = chat_body("fmt-claude", true);
    body["tools"] = tools.clone();
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_eq!(a.status, 200);
    let arguments: String = a
        .data()
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, "{}");
    assert!(a.data().iter().any(
        |c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "updateIssueList"
    ));

    e.mock.script("c1", vec![recording(recorded)]);
    let mut body = responses_body("fmt-claude", true);
    body["tools"] = json!([{"type": "function", "name": "updateIssueList",
        "parameters": {"type": "object", "properties": {}}}]);
    let a = call(&e, "/v1/responses", &body).await;
    assert_eq!(a.status, 200);
    let data = a.data();
    let done = data
        .iter()
        .find(|d| d["type"] == "response.function_call_arguments.done")
        .expect("the arguments are done");
    assert_eq!(done["arguments"], "{}");
    let item = data
        .iter()
        .find(|d| d["type"] == "response.output_item.done" && d["item"]["type"] == "function_call")
        .expect("the call is done");
    assert_eq!(item["item"]["arguments"], "{}");
    let last = data.last().unwrap();
    let call = last["response"]["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["type"] == "function_call")
        .unwrap()
        .clone();
    assert_eq!(call["arguments"], "{}");
}

// ---------------------------------------------------------------------------
// across makers: fail-over, refusals, empty completions, cuts

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_over_crosses_makers_in_every_format() {
    let e = start().await;
    for (path, body) in [
        ("/v1/chat/completions", chat_body("fmt-mixed", false)),
        ("/v1/responses", responses_body("fmt-mixed", false)),
        ("/v1/messages", messages_body("fmt-mixed", false)),
        ("/v1/messages", messages_body("fmt-mixed", true)),
    ] {
        e.mock.script("x1", vec![Step::Status(529)]);
        let a = call(&e, path, &body).await;
        assert_eq!(a.status, 200, "{path}: {}", a.json);
        assert_eq!(
            a.header("x-gateway-attempts"),
            "anthropic:529,openai:ok",
            "{path}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_become_400_refusal_on_every_route_without_fail_over() {
    let e = start().await;
    for (path, body) in [
        ("/v1/chat/completions", chat_body("fmt-mixed", false)),
        ("/v1/chat/completions", chat_body("fmt-mixed", true)),
        ("/v1/responses", responses_body("fmt-mixed", true)),
        ("/v1/messages", messages_body("fmt-mixed", false)),
    ] {
        // A refusal with no text: Anthropic's stop_reason "refusal" before any output.
        e.mock.script("x1", vec![Step::Refusal(String::new())]);
        let a = call(&e, path, &body).await;
        assert_eq!(a.status, 400, "{path}");
        let msg = a.json["error"]["message"].as_str().unwrap();
        assert!(msg.starts_with("provider refused the request: "), "{msg}");
        if path != "/v1/messages" {
            assert_eq!(a.json["error"]["code"], "refusal");
            assert!(a.json["error"]["refusal_reason"].is_string());
        }
    }
    assert_eq!(e.mock.count("x2"), 0, "a refusal does not fail over");
    e.mock.script("g1", vec![Step::Refusal("blocked".into())]);
    let a = call(&e, "/v1/chat/completions", &chat_body("fmt-gemini", false)).await;
    assert_error(a.status, &a.json, 400, "refusal");
    // A whole answer that says some words and then refuses is still a refusal.
    e.mock
        .script("x1", vec![Step::Refusal("I can't help with that.".into())]);
    let a = call(&e, "/v1/messages", &messages_body("fmt-mixed", false)).await;
    assert_eq!(a.status, 400, "{}", a.json);
    assert_eq!(a.json["error"]["type"], "invalid_request_error");
    assert!(a.json["error"]["refusal_reason"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_completions_in_each_format() {
    let e = start().await;
    e.mock.set_default("c1", Step::Empty);
    let a = call(&e, "/v1/messages", &messages_body("fmt-claude", false)).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-gateway-warning"), "empty_completion");
    assert_eq!(a.json["content"], json!([]));
    assert_eq!(a.json["stop_reason"], "end_turn");
    let a = call(&e, "/v1/responses", &responses_body("fmt-claude", false)).await;
    assert_eq!(a.header("x-gateway-warning"), "empty_completion");
    assert_eq!(a.json["status"], "completed");
    assert_eq!(a.json["output"], json!([]));
    let a = call(&e, "/v1/chat/completions", &chat_body("fmt-claude", true)).await;
    assert_eq!(a.header("x-gateway-warning"), "empty_completion");
    let chunks = a.data();
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    assert_eq!(a.frames.last().unwrap().1, "[DONE]");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_translated_stream_cut_after_output_settles_as_length() {
    let e = start().await;
    e.mock.script("c1", vec![Step::CutAfter(2)]);
    let a = call(&e, "/v1/chat/completions", &chat_body("fmt-claude", true)).await;
    assert_eq!(a.status, 200);
    let chunks = a.data();
    assert!(!chat_text(&chunks).is_empty());
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    // Not asked for: no usage chunk.
    assert!(chunks.iter().all(|c| c.get("usage").is_none()), "{last}");
    assert_eq!(a.frames.last().unwrap().1, "[DONE]");
    // Asked for: the delivered usage in its own last chunk.
    e.mock.script("c1", vec![Step::CutAfter(2)]);
    let mut asked = chat_body("fmt-claude", true);
    asked["stream_options"] = json!({"include_usage": true});
    let chunks = call(&e, "/v1/chat/completions", &asked).await.data();
    let (fin, usage) = (&chunks[chunks.len() - 2], &chunks[chunks.len() - 1]);
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    assert_eq!(usage["choices"], json!([]));
    assert!(usage["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    e.mock.script("c1", vec![Step::CutAfter(2)]);
    let a = call(&e, "/v1/responses", &responses_body("fmt-claude", true)).await;
    let last = a.data().pop().unwrap();
    assert_eq!(last["type"], "response.incomplete", "{last}");
}

// ---------------------------------------------------------------------------
// the parameter policy

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_the_serving_rung_cannot_use_is_dropped_and_disclosed() {
    let e = start().await;
    let mut body = chat_body("fmt-sampling", false);
    body["top_p"] = json!(0.5);
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.header("x-service-ignored-parameters"), "top_p");
    let sent = e.mock.requests_for("ms1")[0].json().unwrap();
    assert!(sent.get("top_p").is_none());
    body["stream"] = json!(true);
    let s = call(&e, "/v1/chat/completions", &body).await;
    assert_eq!(s.header("x-service-ignored-parameters"), "top_p");
    let finish = s
        .data()
        .into_iter()
        .find(|c| c["choices"][0]["finish_reason"].is_string())
        .unwrap();
    assert_eq!(finish["x-service-ignored-parameters"], "top_p");
    // The rung that samples gets it.
    e.mock.script("ms1", vec![Step::Status(500)]);
    body["stream"] = json!(false);
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-service-ignored-parameters"), "");
    assert_eq!(
        e.mock.requests_for("ms2").pop().unwrap().json().unwrap()["top_p"],
        0.5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_fields_answer_400_with_their_param_before_anything_is_sent() {
    let e = start().await;
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "/v1/chat/completions",
            json!({"seed": 7}),
            "unsupported_parameter",
            "seed",
        ),
        (
            "/v1/chat/completions",
            json!({"logit_bias": {"1": 2}}),
            "unsupported_parameter",
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            json!({"provider": {"order": ["x"]}}),
            "unsupported_parameter",
            "provider",
        ),
        (
            "/v1/responses",
            json!({"route": "fallback"}),
            "unsupported_parameter",
            "route",
        ),
        (
            "/v1/chat/completions",
            json!({"modalities": ["audio"]}),
            "unsupported_parameter",
            "modalities",
        ),
    ];
    for (path, extra, code, param) in cases {
        let mut body = if path == "/v1/responses" {
            responses_body("fmt-gpt", false)
        } else {
            chat_body("fmt-gpt", false)
        };
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let a = call(&e, path, &body).await;
        assert_error(a.status, &a.json, 400, code);
        assert_eq!(a.json["error"]["param"], param);
    }
    // Unknown message-level keys.
    let a = call(
        &e,
        "/v1/chat/completions",
        &json!({"model": "fmt-gpt",
        "messages": [{"role": "user", "content": "hi", "agent": "x"}]}),
    )
    .await;
    assert_error(a.status, &a.json, 400, "invalid_parameter");
    assert_eq!(a.json["error"]["param"], "messages[0].agent");
    // A pinned sampling value.
    let mut body = chat_body("fmt-reason", false);
    body["temperature"] = json!(0.2);
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_error(a.status, &a.json, 400, "invalid_parameter");
    assert_eq!(a.json["error"]["param"], "temperature");
    // top_p where no rung samples.
    let mut body = chat_body("fmt-reason", false);
    body["top_p"] = json!(0.9);
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_error(a.status, &a.json, 400, "unsupported_parameter");
    assert_eq!(a.json["error"]["param"], "top_p");
    // Descriptions over the cap name the limit and the length.
    let long = "d".repeat(65_537);
    let a = call(
        &e,
        "/v1/chat/completions",
        &json!({"model": "fmt-gpt",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": long,
            "parameters": {"type": "object"}}}]}),
    )
    .await;
    assert_error(a.status, &a.json, 400, "invalid_parameter");
    let msg = a.json["error"]["message"].as_str().unwrap();
    assert!(msg.contains("65536") || msg.contains("65,536"), "{msg}");
    assert!(msg.contains("65537") || msg.contains("65,537"), "{msg}");
    assert_eq!(e.mock.count("o1") + e.mock.count("r1"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_output_is_served_only_by_capable_rungs() {
    let e = start().await;
    let schema = json!({"type": "json_schema", "json_schema": {"name": "answer", "strict": true,
        "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
                   "additionalProperties": false}}});
    let mut body = chat_body("fmt-nojson", false);
    body["response_format"] = schema.clone();
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_error(a.status, &a.json, 400, "unsupported_capability");
    assert_eq!(a.json["error"]["param"], "response_format");
    let a = call(
        &e,
        "/v1/responses",
        &json!({"model": "fmt-nojson", "input": "hi",
        "text": {"format": {"type": "json_schema", "name": "answer", "strict": true,
                            "schema": schema["json_schema"]["schema"]}}}),
    )
    .await;
    assert_error(a.status, &a.json, 400, "unsupported_capability");
    assert_eq!(a.json["error"]["param"], "text.format");
    assert_eq!(e.mock.count("n1"), 0);
    // A capable Gemini rung gets the schema in its own terms.
    let mut body = chat_body("fmt-gemini", false);
    body["response_format"] = schema;
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = e.mock.requests_for("g1")[0].json().unwrap();
    assert_eq!(
        sent["generationConfig"]["responseMimeType"],
        "application/json"
    );
}

// ---------------------------------------------------------------------------
// cloud hosts: Bedrock (SigV4, binary event stream) and Vertex (OAuth)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bedrock_rungs_are_signed_and_streamed_in_aws_framing() {
    let e = start().await;
    let model = "anthropic.claude-b1-v1:0";
    let a = call(&e, "/v1/chat/completions", &chat_body("fmt-bedrock", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(
        a.json["choices"][0]["message"]["content"],
        format!("Hello from mock {model}.")
    );
    assert_eq!(a.json["provider"], format!("bedrock:{model}"));
    let sent = &e.mock.requests_for(model)[0];
    assert!(sent.path.ends_with("/converse"), "{}", sent.path);
    assert!(
        sent.path.contains("%3A"),
        "the model id is percent-encoded: {}",
        sent.path
    );
    let auth = sent.header("authorization").unwrap();
    assert!(
        auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"),
        "{auth}"
    );
    assert!(auth.contains("/bedrock/aws4_request"), "{auth}");
    assert!(sent.header("x-amz-date").is_some());
    assert_eq!(sent.json().unwrap()["system"][0]["text"], "Be brief.");

    let s = call(&e, "/v1/messages", &messages_body("fmt-bedrock", true)).await;
    assert_eq!(s.status, 200);
    let text: String = s
        .data()
        .iter()
        .filter(|d| d["type"] == "content_block_delta")
        .filter_map(|d| d["delta"]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, format!("Hello from mock {model}."));
    assert!(e.mock.requests_for(model)[1]
        .path
        .ends_with("/converse-stream"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vertex_rungs_use_one_cached_oauth_token_for_claude_and_gemini() {
    let e = start().await;
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat_body("fmt-vertex-claude", false),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(
        a.json["choices"][0]["message"]["content"],
        "Hello from mock claude-v1@20250101."
    );
    let sent = &e.mock.requests_for("claude-v1@20250101")[0];
    assert!(
        sent.path
            .contains("/projects/sluice-test-project/locations/")
            && sent
                .path
                .ends_with("/publishers/anthropic/models/claude-v1@20250101:rawPredict"),
        "{}",
        sent.path
    );
    let body = sent.json().unwrap();
    assert_eq!(body["anthropic_version"], "vertex-2023-10-16");
    assert!(body.get("model").is_none());
    let token = sent.header("authorization").unwrap().to_string();
    assert!(token.starts_with("Bearer mock-token-"), "{token}");

    let s = call(
        &e,
        "/v1/chat/completions",
        &chat_body("fmt-vertex-gemini", true),
    )
    .await;
    assert_eq!(s.status, 200);
    let chunks = s.data();
    assert_eq!(chat_text(&chunks), "Hello from mock gemini-v2.");
    let sent = &e.mock.requests_for("gemini-v2")[0];
    assert!(
        sent.path
            .contains("/publishers/google/models/gemini-v2:streamGenerateContent"),
        "{}",
        sent.path
    );
    assert_eq!(sent.header("authorization"), Some(token.as_str()));
    assert_eq!(
        e.mock.count(sluice_mock::oauth::SCRIPT_KEY),
        1,
        "the token is cached"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_spent_on_thinking_is_a_length_answer_not_an_empty_completion() {
    let e = start().await;
    // Native chat, whole and streamed.
    e.mock.script("o1", vec![Step::Exhausted, Step::Exhausted]);
    let a = call(&e, "/v1/chat/completions", &chat_body("fmt-gpt", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.header("x-gateway-warning"), "");
    assert_eq!(a.json["choices"][0]["finish_reason"], "length");
    assert!(a.json["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    let s = call(&e, "/v1/chat/completions", &chat_body("fmt-gpt", true)).await;
    assert_eq!(s.header("x-gateway-warning"), "");
    let finish: Vec<Value> = s
        .data()
        .into_iter()
        .filter(|c| c["choices"][0]["finish_reason"].is_string())
        .collect();
    assert_eq!(finish[0]["choices"][0]["finish_reason"], "length");
    assert_eq!(chat_text(&s.data()), "");
    // Translated: a chat client on Anthropic, a responses client on Gemini.
    e.mock.script("c1", vec![Step::Exhausted]);
    let a = call(&e, "/v1/chat/completions", &chat_body("fmt-claude", true)).await;
    let last = a
        .data()
        .into_iter()
        .rev()
        .find(|c| c["choices"][0]["finish_reason"].is_string())
        .unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    e.mock.script("g1", vec![Step::Exhausted]);
    let a = call(&e, "/v1/responses", &responses_body("fmt-gemini", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["status"], "incomplete");
    assert_eq!(a.json["incomplete_details"]["reason"], "max_output_tokens");
    // Native messages on Anthropic.
    e.mock.script("c1", vec![Step::Exhausted]);
    let a = call(&e, "/v1/messages", &messages_body("fmt-claude", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["stop_reason"], "max_tokens");
    assert_eq!(a.header("x-gateway-warning"), "");
    // None of these fell over to another rung or counted as empty.
    assert_eq!(e.mock.count("x2"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_dies_after_its_finish_ends_cleanly_without_a_second_finish() {
    let e = start().await;
    for (model, rung) in [("fmt-gpt", "o1"), ("fmt-claude", "c1")] {
        e.mock.script(rung, vec![Step::FinishThenCut]);
        let s = call(&e, "/v1/chat/completions", &chat_body(model, true)).await;
        assert_eq!(s.status, 200);
        let chunks = s.data();
        let finishes: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["choices"][0]["finish_reason"].is_string())
            .collect();
        assert_eq!(finishes.len(), 1, "{model}: {chunks:?}");
        assert_eq!(
            finishes[0]["choices"][0]["finish_reason"], "stop",
            "{model}"
        );
        assert_eq!(chat_text(&chunks), format!("Hello from mock {rung}."));
        assert_eq!(s.frames.last().unwrap().1, "[DONE]", "{model}");
    }
}

/// The finish markers of a stream in each format, and whether it ended cleanly.
fn finishes(route: &str, a: &Answer) -> (usize, bool) {
    let names = a.names();
    match route {
        "/v1/responses" => {
            let n = names
                .iter()
                .filter(|n| *n == "response.completed" || *n == "response.incomplete")
                .count();
            (n, names.last().is_some_and(|l| l.starts_with("response.")))
        }
        "/v1/messages" => (
            names.iter().filter(|n| *n == "message_delta").count(),
            names.last().map(String::as_str) == Some("message_stop"),
        ),
        _ => (
            a.data()
                .iter()
                .filter(|c| c["choices"][0]["finish_reason"].is_string())
                .count(),
            a.frames.last().is_some_and(|f| f.1 == "[DONE]"),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_ends_a_stream_cut_after_its_finish_with_exactly_one_finish() {
    let e = start().await;
    for (route, model, rung) in [
        ("/v1/responses", "fmt-gpt", "o1"),
        ("/v1/responses", "fmt-claude", "c1"),
        ("/v1/responses", "fmt-gemini", "g1"),
        ("/v1/messages", "fmt-claude", "c1"),
        ("/v1/messages", "fmt-gpt", "o1"),
        ("/v1/chat/completions", "fmt-gemini", "g1"),
    ] {
        let body = match route {
            "/v1/responses" => responses_body(model, true),
            "/v1/messages" => messages_body(model, true),
            _ => chat_body(model, true),
        };
        e.mock.script(rung, vec![Step::FinishThenCut]);
        let a = call(&e, route, &body).await;
        assert_eq!(a.status, 200, "{route} {model}");
        assert_eq!(
            finishes(route, &a),
            (1, true),
            "{route} {model}: {:?}",
            a.frames
        );
        // And an untroubled stream likewise.
        let a = call(&e, route, &body).await;
        assert_eq!(
            finishes(route, &a),
            (1, true),
            "{route} {model}: {:?}",
            a.frames
        );
    }
}

/// A web-search answer as Anthropic sends it: server tool blocks, citations, a
/// stop sequence and usage members sluice does not model.
fn anthropic_search_answer() -> Value {
    json!({"id": "msg_01", "type": "message", "role": "assistant", "model": "c1-2025",
        "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "sluice"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [
                {"type": "web_search_result", "url": "https://example.com/a", "title": "A",
                 "encrypted_content": "EqQ", "page_age": null}]},
            {"type": "text", "text": "Sluice is a gateway.", "citations": [
                {"type": "web_search_result_location", "url": "https://example.com/a", "title": "A",
                 "encrypted_index": "Eo8", "cited_text": "gateway"}]}],
        "stop_reason": "stop_sequence", "stop_sequence": "END", "container": null,
        "usage": {"input_tokens": 12, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                  "output_tokens": 7, "server_tool_use": {"web_search_requests": 1},
                  "service_tier": "standard"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_rungs_pass_every_event_and_field_through() {
    let e = start().await;
    // A whole messages answer.
    let whole = anthropic_search_answer();
    e.mock.script("c1", vec![Step::ok_reply(&whole)]);
    let a = call(&e, "/v1/messages", &messages_body("fmt-claude", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    for key in [
        "id",
        "model",
        "content",
        "stop_reason",
        "stop_sequence",
        "container",
    ] {
        assert_eq!(a.json[key], whole[key], "{key}");
    }
    assert_eq!(a.json["usage"]["server_tool_use"]["web_search_requests"], 1);
    assert_eq!(a.json["usage"]["service_tier"], "standard");
    assert!(a.json["usage"]["cost"].as_f64().unwrap() > 0.0);
    assert_eq!(a.json["provider"], "anthropic:c1");
    assert_eq!(a.json["x_gateway"]["attempts"], "anthropic:ok");
    // The same answer streamed: every frame as it came, but for the owned members.
    let frames: Vec<(&str, Value)> = vec![
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_01", "type": "message",
            "role": "assistant", "model": "c1-2025", "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": {"input_tokens": 12, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": "{\"query\":\"sluice\"}"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1,
            "content_block": whole["content"][1].clone()}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 2,
            "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 2,
            "delta": {"type": "citations_delta", "citation": whole["content"][2]["citations"][0].clone()}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 2,
            "delta": {"type": "text_delta", "text": "Sluice is a gateway."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 2}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": 7, "server_tool_use": {"web_search_requests": 1}}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    let sse: String = frames
        .iter()
        .map(|(n, d)| format!("event: {n}\ndata: {d}\n\n"))
        .collect();
    e.mock.script("c1", vec![Step::ok_reply(sse)]);
    let a = call(&e, "/v1/messages", &messages_body("fmt-claude", true)).await;
    assert_eq!(a.status, 200);
    let got: Vec<(String, Value)> = a
        .frames
        .iter()
        .filter(|(n, _)| n.as_deref() != Some("ping"))
        .map(|(n, d)| {
            (
                n.clone().unwrap_or_default(),
                serde_json::from_str(d).unwrap(),
            )
        })
        .collect();
    assert_eq!(got.len(), frames.len(), "{:?}", a.frames);
    for ((name, mut data), (want_name, want)) in got.into_iter().zip(frames) {
        assert_eq!(name, want_name);
        match want_name {
            "message_start" => {
                assert_eq!(data["message"]["provider"], "anthropic:c1");
                data["message"].as_object_mut().unwrap().remove("provider");
            }
            "message_delta" => {
                assert!(data["usage"]["cost"].as_f64().unwrap() > 0.0);
                assert_eq!(data["x_gateway"]["attempts"], "anthropic:ok");
                data["usage"].as_object_mut().unwrap().remove("cost");
                data.as_object_mut().unwrap().remove("x_gateway");
            }
            _ => {}
        }
        assert_eq!(data, want, "{want_name}");
    }
    // A whole responses answer with a search call item and fields sluice does not model.
    let resp = json!({"id": "resp_1", "object": "response", "created_at": 1, "status": "completed",
        "model": "o1-2025", "output": [
            {"type": "web_search_call", "id": "ws_1", "status": "completed",
             "action": {"type": "search", "query": "sluice"}},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Sluice is a gateway.", "logprobs": [],
                          "annotations": [{"type": "url_citation", "url": "https://example.com/a",
                                           "title": "A", "start_index": 0, "end_index": 6}]}]}],
        "tools": [], "tool_choice": "auto", "parallel_tool_calls": true, "future_member": {"x": 1},
        "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": 19}});
    e.mock.script("o1", vec![Step::ok_reply(&resp)]);
    let a = call(&e, "/v1/responses", &responses_body("fmt-gpt", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    for key in [
        "id",
        "output",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "future_member",
    ] {
        assert_eq!(a.json[key], resp[key], "{key}");
    }
    assert!(a.json["usage"]["cost"].as_f64().unwrap() > 0.0);
    assert_eq!(a.json["provider"], "openai:o1");
}

/// A long history with escapes, quotes and non-ASCII text: long enough that the
/// gateway sends it from the client's own body instead of copying it.
fn long_history() -> Value {
    long_history_of(300)
}

/// [`long_history`] with each long turn `n` phrases (about 50 bytes each).
fn long_history_of(n: usize) -> Value {
    let turn = "Quote \"this\", a back\\slash, a tab\t, é and 漢字 — ".repeat(n);
    json!([
        {"role": "user", "content": turn},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": format!("{turn} Say hello")}
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_values_reach_native_rungs_byte_for_byte() {
    let e = start().await;
    let history = long_history();
    let exact = format!("\"messages\":{}", serde_json::to_string(&history).unwrap());
    assert!(exact.len() > 20_000);
    // Chat to an OpenAI chat rung, whole and streamed; members after the long
    // value keep their place and the gateway's members are still replaced.
    for stream in [false, true] {
        e.mock.clear();
        let body = json!({"model": "fmt-gpt", "messages": history, "stream": stream,
            "prompt_cache_key": "conv-1", "temperature": 0.5, "user": "u-1"});
        let a = call(&e, "/v1/chat/completions", &body).await;
        assert_eq!(a.status, 200, "{}", a.json);
        if stream {
            assert!(chat_text(&a.data()).starts_with("Hello"), "{:?}", a.frames);
        }
        let sent = &e.mock.requests_for("o1")[0];
        let raw = std::str::from_utf8(&sent.body).unwrap();
        assert!(raw.contains(&exact), "the history arrives unchanged");
        let b = sent.json().unwrap();
        assert_eq!(b["model"], "o1");
        assert_eq!(b["messages"], history);
        assert_eq!(b["temperature"], 0.5);
        assert_eq!(b["user"], "u-1");
        assert!(b.get("prompt_cache_key").is_none());
        assert_eq!(b["stream"], stream);
        assert_eq!(
            sent.header("content-length")
                .map(|l| l.parse::<usize>().unwrap()),
            Some(sent.body.len())
        );
    }
    // A history between the borrowing size and the size sent beside the head:
    // its pieces are written behind the head in one buffer.
    e.mock.clear();
    let medium = long_history_of(100);
    let exact_medium = format!("\"messages\":{}", serde_json::to_string(&medium).unwrap());
    assert!((8_000..16_000).contains(&exact_medium.len()));
    let body = json!({"model": "fmt-gpt", "messages": medium, "user": "u-1"});
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = &e.mock.requests_for("o1")[0];
    assert!(std::str::from_utf8(&sent.body)
        .unwrap()
        .contains(&exact_medium));
    assert_eq!(sent.json().unwrap()["user"], "u-1");
    // Messages to an Anthropic rung.
    let body = json!({"model": "fmt-claude", "max_tokens": 64, "messages": history,
        "metadata": {"user_id": "u-1"}});
    let a = call(&e, "/v1/messages", &body).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = &e.mock.requests_for("c1")[0];
    assert!(std::str::from_utf8(&sent.body).unwrap().contains(&exact));
    let b = sent.json().unwrap();
    assert_eq!(
        (b["model"].as_str(), &b["metadata"]),
        (Some("c1"), &json!({"user_id": "u-1"}))
    );
    // Responses to an OpenAI responses rung: a long input, and `store` the gateway's.
    let input = history.to_string();
    let body = json!({"model": "fmt-gpt", "input": input, "store": true});
    let a = call(&e, "/v1/responses", &body).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let b = e.mock.requests_for("o1").last().unwrap().json().unwrap();
    assert_eq!(
        (b["input"].as_str(), &b["store"]),
        (Some(input.as_str()), &json!(false))
    );
}
