//! Web search and tool search through the gateway (issue 21), in the chat,
//! responses and messages formats, whole and streamed: the five request forms,
//! the service-run search against fake SearXNG and Brave servers (results before
//! the model, `url_citation` annotations back), the fee on platform lanes and not
//! on BYOK, every drop disclosure, the search once per request (not again on
//! fail-over), native searches passed through and their citations translated back;
//! tool search rounds served by the gateway (deferred tools withheld, `tool_search`
//! in their place, the loaded tool called next) and natively.

mod harness;

use harness::{assert_error, Answer, Env, Provider};
use serde_json::{json, Value};
use sluice_mock::search::{default_results, SearchVendor, VendorResult, VendorStep};
use sluice_mock::Step;
use std::time::Duration;

/// The gateway over the mock provider, with `extra` settings (the search backend).
async fn start(extra: &[(&str, String)]) -> Env {
    use Provider::*;
    let providers = [OpenAi, Anthropic, Google, Bedrock];
    Env::start("tests/fixtures/search.toml", &providers, |o, _| {
        let mut o = o.env("SLUICE_NETWORK__ALLOW_PRIVATE_UPSTREAMS", "true");
        for (k, v) in extra {
            o = o.env(k, v);
        }
        o
    })
    .await
}

fn searxng(v: &SearchVendor) -> Vec<(&'static str, String)> {
    vec![
        ("SLUICE_SEARCH__BACKEND", "searxng".into()),
        ("SLUICE_SEARCH__URL", v.base_url()),
    ]
}

async fn call(e: &Env, path: &str, body: &Value) -> Answer {
    e.s.call(&e.key, path, body).await
}

const QUESTION: &str = "What is new in Rust?";

/// The model's answer: a markdown link to the first result and a numbered
/// reference to the second, as the search prompt asks.
const CITED: &str = "Rust 1.90 is out [blog.rust-lang.org](https://blog.rust-lang.org/2025/09/18/Rust-1.90.0/); background in [2].";

/// The character span of `needle` in `CITED`.
fn span(needle: &str) -> (u64, u64) {
    let at = CITED.find(needle).unwrap();
    let start = CITED[..at].chars().count() as u64;
    (start, start + needle.chars().count() as u64)
}

fn chat(model: &str, stream: bool, extra: Value) -> Value {
    let mut b = json!({"model": model, "stream": stream,
        "messages": [{"role": "user", "content": QUESTION}]});
    if stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn responses(model: &str, stream: bool, tools: Value) -> Value {
    json!({"model": model, "stream": stream, "input": QUESTION, "tools": tools})
}

fn messages(model: &str, stream: bool, tools: Value) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 512, "tools": tools,
           "messages": [{"role": "user", "content": QUESTION}]})
}

/// The text every system-level part of a recorded request holds, whatever its wire.
fn instructions(body: &Value) -> String {
    let mut out = String::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        if m["role"] == "system" {
            out.push_str(m["content"].as_str().unwrap_or_default());
        }
    }
    match &body["system"] {
        Value::String(s) => out.push_str(s),
        Value::Array(a) => a
            .iter()
            .for_each(|b| out.push_str(b["text"].as_str().unwrap_or_default())),
        _ => {}
    }
    out.push_str(body["instructions"].as_str().unwrap_or_default());
    for i in body["input"].as_array().into_iter().flatten() {
        if i["role"] == "developer" || i["role"] == "system" {
            out.push_str(&i["content"].to_string());
        }
    }
    for p in body["systemInstruction"]["parts"]
        .as_array()
        .into_iter()
        .flatten()
    {
        out.push_str(p["text"].as_str().unwrap_or_default());
    }
    out
}

/// Usage in micro-USD at the fixture price from a usage object's token counts.
fn token_cost(input: u64, output: u64) -> f64 {
    (input + 5 * output) as f64 / 1e6
}

const FEE: f64 = 0.007;

// ---------------------------------------------------------------------------
// The service-run search

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_service_run_search_gives_results_and_url_citations_whole_and_streamed() {
    let searx = SearchVendor::searxng().await;
    let e = start(&searxng(&searx)).await;
    e.mock.script(
        "g1",
        vec![Step::Text(CITED.into()), Step::Text(CITED.into())],
    );

    let a = call(
        &e,
        "/v1/chat/completions",
        &chat("ws-gpt", false, json!({"web_search_options": {}})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    // Exactly one search, for the latest user turn, in SearXNG's JSON API.
    let asked = searx.requests();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].path, "/search");
    assert_eq!(asked[0].query("q").as_deref(), Some(QUESTION));
    assert_eq!(asked[0].query("format").as_deref(), Some("json"));
    // The model got the ranked results in a system-level message that asks to cite.
    let sent = e.mock.requests_for("g1")[0].json().unwrap();
    let told = instructions(&sent);
    assert!(told.contains("[1] Rust 1.90 released"), "{told}");
    assert!(
        told.contains("URL: https://doc.rust-lang.org/book/"),
        "{told}"
    );
    assert!(told.contains("markdown link"), "{told}");
    assert!(sent.get("web_search_options").is_none(), "{sent}");
    // The answer cites the sources it used, where it used them.
    let msg = &a.json["choices"][0]["message"];
    assert_eq!(msg["content"], CITED);
    let notes = msg["annotations"].as_array().unwrap();
    assert_eq!(notes.len(), 2, "{msg}");
    let first = &notes[0]["url_citation"];
    assert_eq!(notes[0]["type"], "url_citation");
    assert_eq!(
        first["url"],
        "https://blog.rust-lang.org/2025/09/18/Rust-1.90.0/"
    );
    assert_eq!(first["title"], "Rust 1.90 released");
    assert_eq!(first["content"], default_results()[0].snippet);
    let (s0, e0) = span("[blog.rust-lang.org](https://blog.rust-lang.org/2025/09/18/Rust-1.90.0/)");
    assert_eq!(
        (first["start_index"].as_u64(), first["end_index"].as_u64()),
        (Some(s0), Some(e0))
    );
    let second = &notes[1]["url_citation"];
    assert_eq!(second["url"], default_results()[1].url);
    assert_eq!(
        (second["start_index"].as_u64(), second["end_index"].as_u64()),
        (Some(span("[2]").0), Some(span("[2]").1))
    );
    // Counted and charged: the fee is in usage.cost on this platform lane.
    let u = &a.json["usage"];
    assert_eq!(u["server_tool_use_details"]["web_search_requests"], 1);
    let tokens = token_cost(
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert!(
        (u["cost"].as_f64().unwrap() - tokens - FEE).abs() < 1e-9,
        "{u}"
    );
    // The vendor's time is in the receipt; nothing was dropped.
    assert!(a.header("x-gateway-search-us").parse::<u64>().is_ok());
    assert!(a.header("x-service-ignored-parameters").is_empty());

    // Streamed: the text as it comes, then exactly one annotations chunk.
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat(
            "ws-gpt",
            true,
            json!({"web_search_options": {"search_context_size": "low"}}),
        ),
    )
    .await;
    assert_eq!(a.status, 200);
    let chunks = a.data();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, CITED);
    let with_notes: Vec<usize> = chunks
        .iter()
        .enumerate()
        .filter(|(_, c)| c["choices"][0]["delta"]["annotations"].is_array())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(with_notes.len(), 1, "{chunks:?}");
    let notes = &chunks[with_notes[0]]["choices"][0]["delta"]["annotations"];
    assert_eq!(notes.as_array().unwrap().len(), 2);
    assert_eq!(notes[0]["url_citation"]["start_index"].as_u64(), Some(s0));
    let finish = chunks
        .iter()
        .position(|c| c["choices"][0]["finish_reason"].is_string())
        .unwrap();
    assert!(with_notes[0] < finish, "annotations come before the finish");
    assert!(chunks[finish]["x_gateway"]["search_us"].is_u64());
    let usage = chunks.last().unwrap()["usage"].clone();
    assert_eq!(usage["server_tool_use_details"]["web_search_requests"], 1);
    assert!(usage["cost"].as_f64().unwrap() > FEE);
    assert_eq!(searx.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_messages_show_the_search_and_cite_it_whole_and_streamed() {
    let searx = SearchVendor::searxng().await;
    let e = start(&searxng(&searx)).await;
    e.mock.set_default("g1", Step::Text(CITED.into()));
    e.mock.set_default("c1", Step::Text(CITED.into()));
    let (s0, e0) = span("[blog.rust-lang.org](https://blog.rust-lang.org/2025/09/18/Rust-1.90.0/)");

    // Responses: a web_search_call item, then the message with its annotations.
    for tool in ["web_search", "web_search_preview"] {
        let a = call(
            &e,
            "/v1/responses",
            &responses("ws-gpt", false, json!([{"type": tool}])),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.json);
        let out = a.json["output"].as_array().unwrap();
        assert_eq!(out[0]["type"], "web_search_call", "{}", a.json);
        assert_eq!(out[0]["status"], "completed");
        assert_eq!(out[0]["action"]["query"], QUESTION);
        let text = &out[1]["content"][0];
        assert_eq!(text["text"], CITED);
        let note = &text["annotations"][0];
        assert_eq!(note["type"], "url_citation");
        assert_eq!(note["url"], default_results()[0].url);
        assert_eq!(
            (note["start_index"].as_u64(), note["end_index"].as_u64()),
            (Some(s0), Some(e0))
        );
        assert_eq!(
            a.json["usage"]["server_tool_use_details"]["web_search_requests"],
            1
        );
    }
    // The responses wire did not get the hosted tool: the gateway searched.
    let sent = e.mock.requests_for("g1")[0].json().unwrap();
    assert!(!sent.to_string().contains("\"web_search\""), "{sent}");
    assert!(instructions(&sent).contains("[1] Rust 1.90 released"));

    let a = call(
        &e,
        "/v1/responses",
        &responses("ws-gpt", true, json!([{"type": "web_search"}])),
    )
    .await;
    assert_eq!(a.status, 200);
    let added = a.named("response.output_text.annotation.added");
    assert_eq!(added.len(), 2, "{:?}", a.frames);
    assert_eq!(added[0]["annotation"]["url"], default_results()[0].url);
    assert_eq!(added[0]["annotation_index"], 0);
    assert_eq!(added[1]["annotation_index"], 1);
    assert!(!a.named("response.web_search_call.completed").is_empty());
    let done = &a.named("response.completed")[0]["response"];
    assert_eq!(done["output"][0]["type"], "web_search_call");
    assert_eq!(
        done["output"][1]["content"][0]["annotations"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        done["usage"]["server_tool_use_details"]["web_search_requests"],
        1
    );

    // Messages: server_tool_use and web_search_tool_result blocks, and citations on
    // the text that cites.
    let tools = json!([{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}]);
    let a = call(
        &e,
        "/v1/messages",
        &messages("ws-claude", false, tools.clone()),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    let content = a.json["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "server_tool_use");
    assert_eq!(content[0]["name"], "web_search");
    assert_eq!(content[0]["input"]["query"], QUESTION);
    assert_eq!(content[1]["type"], "web_search_tool_result");
    assert_eq!(content[1]["tool_use_id"], content[0]["id"]);
    assert_eq!(content[1]["content"][0]["type"], "web_search_result");
    assert_eq!(content[1]["content"][0]["url"], default_results()[0].url);
    let texts: Vec<&Value> = content.iter().filter(|b| b["type"] == "text").collect();
    let joined: String = texts.iter().map(|b| b["text"].as_str().unwrap()).collect();
    assert_eq!(joined, CITED);
    let cited: Vec<&Value> = texts
        .iter()
        .copied()
        .filter(|b| b["citations"].is_array())
        .collect();
    assert_eq!(cited.len(), 2, "{}", a.json);
    assert_eq!(
        cited[0]["citations"][0]["type"],
        "web_search_result_location"
    );
    assert_eq!(cited[0]["citations"][0]["url"], default_results()[0].url);
    assert!(cited[0]["text"]
        .as_str()
        .unwrap()
        .starts_with("[blog.rust-lang.org]"));
    // Both counts, as the anthropic SDK's types require them.
    assert_eq!(
        a.json["usage"]["server_tool_use"],
        json!({"web_search_requests": 1, "web_fetch_requests": 0})
    );
    let sent = e.mock.requests_for("c1")[0].json().unwrap();
    assert!(!sent.to_string().contains("web_search_20250305"), "{sent}");
    assert!(instructions(&sent).contains("[2] Rust (programming language)"));

    let a = call(&e, "/v1/messages", &messages("ws-claude", true, tools)).await;
    assert_eq!(a.status, 200);
    let starts = a.named("content_block_start");
    assert_eq!(starts[0]["content_block"]["type"], "server_tool_use");
    assert_eq!(starts[1]["content_block"]["type"], "web_search_tool_result");
    let deltas = a.named("content_block_delta");
    let query: String = deltas
        .iter()
        .filter(|d| d["delta"]["type"] == "input_json_delta")
        .map(|d| d["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&query).unwrap()["query"],
        QUESTION
    );
    let cites: Vec<&Value> = deltas
        .iter()
        .filter(|d| d["delta"]["type"] == "citations_delta")
        .collect();
    assert_eq!(cites.len(), 2);
    assert_eq!(
        cites[0]["delta"]["citation"]["url"],
        default_results()[0].url
    );
    let end = &a.named("message_delta")[0];
    assert_eq!(
        end["usage"]["server_tool_use"],
        json!({"web_search_requests": 1, "web_fetch_requests": 0})
    );
    assert_eq!(searx.requests().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_form_asks_for_web_search_and_only_the_web_plugin_is_served() {
    let searx = SearchVendor::searxng().await;
    let e = start(&searxng(&searx)).await;
    for m in ["g1", "c1", "m1", "amazon.nova-lite-v1:0"] {
        e.mock.set_default(m, Step::Text("ok".into()));
    }
    let forms = [
        (
            "/v1/chat/completions",
            chat("ws-gpt", false, json!({"web_search_options": {}})),
            "g1",
        ),
        (
            "/v1/chat/completions",
            chat("ws-gemini", false, json!({"plugins": [{"id": "web"}]})),
            "m1",
        ),
        (
            "/v1/chat/completions",
            chat("ws-gpt:online", false, json!({})),
            "g1",
        ),
        (
            "/v1/messages",
            json!({"model": "ws-claude:online", "max_tokens": 64,
            "messages": [{"role": "user", "content": QUESTION}]}),
            "c1",
        ),
        (
            "/v1/responses",
            responses(
                "ws-gemini",
                false,
                json!([{"type": "web_search_preview_2025_03_11"}]),
            ),
            "m1",
        ),
        (
            "/v1/messages",
            messages(
                "ws-gemini",
                false,
                json!([{"type": "web_search_20250305", "name": "web_search"}]),
            ),
            "m1",
        ),
        (
            "/v1/responses",
            json!({"model": "ws-claude", "input": QUESTION, "plugins": [{"id": "web"}]}),
            "c1",
        ),
    ];
    for (i, (path, body, rung)) in forms.iter().enumerate() {
        e.mock.clear();
        let a = call(&e, path, body).await;
        assert_eq!(a.status, 200, "{path} {body}: {}", a.json);
        assert_eq!(searx.requests().len(), i + 1, "{path} {body}");
        let sent = e.mock.requests_for(rung)[0].json().unwrap();
        assert!(
            instructions(&sent).contains("Rust 1.90 released"),
            "{path} {body}: {sent}"
        );
    }
    // The plugin's options: max_results and search_prompt are honoured.
    e.mock.clear();
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat(
            "ws-gemini",
            false,
            json!({"plugins": [{"id": "web", "max_results": 2,
            "search_prompt": "Sources found today:"}]}),
        ),
    )
    .await;
    assert_eq!(a.status, 200);
    let told = instructions(&e.mock.requests_for("m1")[0].json().unwrap());
    assert!(told.starts_with("Sources found today:"), "{told}");
    assert!(told.contains("[2] ") && !told.contains("[3] "), "{told}");
    // Another plugin id is refused, naming `plugins`, in each envelope.
    let bad = json!([{"id": "file-parser"}]);
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat("ws-gpt", false, json!({"plugins": bad})),
    )
    .await;
    assert_error(a.status, &a.json, 400, "unsupported_parameter");
    assert_eq!(a.json["error"]["param"], "plugins");
    let a = call(
        &e,
        "/v1/responses",
        &json!({"model": "ws-gpt", "input": "x", "plugins": bad}),
    )
    .await;
    assert_error(a.status, &a.json, 400, "unsupported_parameter");
    let a = call(
        &e,
        "/v1/messages",
        &json!({"model": "ws-claude", "max_tokens": 9, "plugins": bad,
        "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json["type"], "error");
    assert_eq!(searx.requests().len(), forms.len() + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brave_search_is_called_with_its_token_and_count() {
    let brave = SearchVendor::brave("brave-test-key").await;
    brave.set_results(vec![
        VendorResult::new("One", "https://one.test/a", "first"),
        VendorResult::new("Two", "https://two.test/b", "second"),
        VendorResult::new("Three", "https://three.test/c", "third"),
    ]);
    let e = start(&[
        ("SLUICE_SEARCH__BACKEND", "brave".into()),
        ("SLUICE_SEARCH__URL", brave.base_url()),
        ("SLUICE_SEARCH__API_KEY_ENV", "BRAVE_SEARCH_KEY".into()),
        ("BRAVE_SEARCH_KEY", "brave-test-key".into()),
        ("SLUICE_SEARCH__RESULTS", "2".into()),
    ])
    .await;
    e.mock.set_default(
        "g1",
        Step::Text("See [two.test](https://two.test/b).".into()),
    );
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat("ws-gpt", false, json!({"plugins": [{"id": "web"}]})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    let asked = &brave.requests()[0];
    assert_eq!(asked.path, "/res/v1/web/search");
    assert_eq!(asked.header("x-subscription-token"), Some("brave-test-key"));
    assert_eq!(asked.query("q").as_deref(), Some(QUESTION));
    assert_eq!(asked.query("count").as_deref(), Some("2"));
    let told = instructions(&e.mock.requests_for("g1")[0].json().unwrap());
    assert!(
        told.contains("[2] Two") && !told.contains("Three"),
        "{told}"
    );
    // Brave's <strong> marks are taken out of the snippets.
    assert!(
        told.contains("\nsecond") && !told.contains("<strong>"),
        "{told}"
    );
    let note = &a.json["choices"][0]["message"]["annotations"][0]["url_citation"];
    assert_eq!(note["url"], "https://two.test/b");
    assert_eq!(note["content"], "second");
}

// ---------------------------------------------------------------------------
// A search never fails a request

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_backend_the_turn_is_served_and_the_drop_disclosed_without_a_fee() {
    // The default backend is none.
    let e = start(&[]).await;
    e.mock.set_default("g1", Step::Text("plain".into()));
    e.mock.set_default("c1", Step::Text("plain".into()));
    const DROP: &str = "web_search->dropped(search_unavailable)";
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat("ws-gpt", false, json!({"web_search_options": {}})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.header("x-service-ignored-parameters"), DROP);
    assert_eq!(a.json["x-service-ignored-parameters"], DROP);
    let u = &a.json["usage"];
    assert!(u.get("server_tool_use_details").is_none(), "{u}");
    let tokens = token_cost(
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert!(
        (u["cost"].as_f64().unwrap() - tokens).abs() < 1e-9,
        "no fee: {u}"
    );
    assert!(a.header("x-gateway-search-us").is_empty());
    assert!(a.json["choices"][0]["message"].get("annotations").is_none());
    // On a stream, in the chunk with the finish.
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat("ws-gpt", true, json!({"plugins": [{"id": "web"}]})),
    )
    .await;
    let chunks = a.data();
    let finish = chunks
        .iter()
        .find(|c| c["choices"][0]["finish_reason"].is_string())
        .unwrap();
    assert_eq!(finish["x-service-ignored-parameters"], DROP);
    // Messages and responses too.
    let a = call(
        &e,
        "/v1/messages",
        &messages(
            "ws-claude",
            true,
            json!([{"type": "web_search_20250305", "name": "web_search"}]),
        ),
    )
    .await;
    assert_eq!(
        a.named("message_delta")[0]["x-service-ignored-parameters"],
        DROP
    );
    let a = call(
        &e,
        "/v1/responses",
        &responses("ws-gpt", false, json!([{"type": "web_search"}])),
    )
    .await;
    assert_eq!(a.json["x-service-ignored-parameters"], DROP);
    assert_eq!(a.json["output"][0]["type"], "message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vendor_error_timeout_or_unreadable_answer_drops_the_search_not_the_request() {
    let searx = SearchVendor::searxng().await;
    let mut env = searxng(&searx);
    env.push(("SLUICE_SEARCH__TIMEOUT_MS", "300".into()));
    let e = start(&env).await;
    e.mock.set_default("g1", Step::Text("plain".into()));
    searx.script(vec![
        VendorStep::Status(500),
        VendorStep::Malformed,
        VendorStep::Delay(Duration::from_secs(5)),
    ]);
    for why in ["status", "malformed", "timeout"] {
        let a = call(
            &e,
            "/v1/chat/completions",
            &chat("ws-gpt", false, json!({"web_search_options": {}})),
        )
        .await;
        assert_eq!(a.status, 200, "{why}: {}", a.json);
        assert_eq!(
            a.header("x-service-ignored-parameters"),
            "web_search->dropped(search_unavailable)",
            "{why}"
        );
        let u = &a.json["usage"];
        assert!(u.get("server_tool_use_details").is_none(), "{why}: {u}");
        assert!(
            !instructions(&e.mock.requests_for("g1").last().unwrap().json().unwrap())
                .contains("web search")
        );
    }
    assert_eq!(searx.requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_runs_once_before_the_first_attempt_not_again_on_fail_over() {
    let searx = SearchVendor::searxng().await;
    let e = start(&searxng(&searx)).await;
    e.mock.script("f1", vec![Step::Status(500)]);
    e.mock.set_default("f2", Step::Text(CITED.into()));
    for stream in [false, true] {
        let a = call(
            &e,
            "/v1/chat/completions",
            &chat("ws-failover", stream, json!({"web_search_options": {}})),
        )
        .await;
        assert_eq!(a.status, 200);
        let attempts = a.header("x-gateway-attempts");
        if !stream {
            assert_eq!(attempts, "openai:500,anthropic:ok");
            assert!(a.json["choices"][0]["message"]["annotations"].is_array());
        }
        e.mock.script("f1", vec![Step::Status(503)]);
    }
    assert_eq!(searx.requests().len(), 2, "one search per request");
    // Both rungs got the same results.
    let f1 = e.mock.requests_for("f1")[0].json().unwrap();
    let f2 = e.mock.requests_for("f2")[0].json().unwrap();
    assert!(instructions(&f1).contains("Rust 1.90 released"));
    assert!(instructions(&f2).contains("Rust 1.90 released"));
}

// ---------------------------------------------------------------------------
// Money

async fn events(e: &Env, n: usize) -> Vec<Value> {
    for _ in 0..100 {
        let (_, v) =
            e.s.get("/api/gateway/usage/events?limit=50", Some(&e.key))
                .await;
        if v["data"].as_array().is_some_and(|d| d.len() >= n) {
            return v["data"].as_array().unwrap().clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("usage events never arrived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fee_is_charged_on_platform_lanes_never_on_byok_and_rolls_up() {
    let searx = SearchVendor::searxng().await;
    let e = start(&searxng(&searx)).await;
    e.mock.set_default("g1", Step::Text(CITED.into()));
    let start_balance = e.s.balance_usd(&e.org).await;
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat("ws-gpt", false, json!({"web_search_options": {}})),
    )
    .await;
    assert_eq!(a.status, 200);
    let platform_cost = a.json["usage"]["cost"].as_f64().unwrap();
    assert!(platform_cost > FEE);
    // The balance draws the whole cost, fee included.
    let want = start_balance - platform_cost;
    let mut now = 0.0;
    for _ in 0..100 {
        now = e.s.balance_usd(&e.org).await;
        if (now - want).abs() < 1e-9 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!((now - want).abs() < 1e-9, "balance {now}, want {want}");

    // The org's own key: counted, never charged.
    let (st, c) = {
        let r =
            e.s.http
                .post(format!(
                    "{}/api/orgs/{}/provider-connections/openai",
                    e.s.gateway, e.org
                ))
                .bearer_auth(&e.key)
                .json(&json!({"setup_alias": "own", "secret": "sk-own",
                "config": {"base_url": format!("{}/v1", e.mock.base_url())}}))
                .send()
                .await
                .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(st, 201, "{c}");
    let byok = format!("byok:{}", c["id"].as_str().unwrap());
    let r =
        e.s.http
            .put(format!("{}/api/models/ws-gpt/waterfall", e.s.gateway))
            .bearer_auth(&e.key)
            .json(&json!({"model_provider_ids": [byok]}))
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat("ws-gpt", false, json!({"web_search_options": {}})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["provider"], byok);
    assert_eq!(a.json["usage"]["cost"], 0.0);
    assert_eq!(
        a.json["usage"]["server_tool_use_details"]["web_search_requests"],
        1
    );
    let own = e
        .mock
        .requests_for("g1")
        .last()
        .unwrap()
        .header("authorization")
        .unwrap()
        .to_string();
    assert_eq!(own, "Bearer sk-own");
    assert!(a.json["choices"][0]["message"]["annotations"].is_array());

    // The usage events and the daily rollups carry the count and the cost.
    let ev = events(&e, 2).await;
    let byok_ev = &ev[0];
    let platform_ev = &ev[1];
    assert_eq!(byok_ev["lane"], "pass_through");
    assert_eq!(byok_ev["cost_usd"], 0.0);
    assert_eq!(byok_ev["web_search_requests"], 1);
    assert_eq!(platform_ev["lane"], "platform_funded");
    assert_eq!(platform_ev["web_search_requests"], 1);
    assert!((platform_ev["cost_usd"].as_f64().unwrap() - platform_cost).abs() < 1e-9);
    let (_, daily) = e.s.get("/api/gateway/usage/daily", Some(&e.key)).await;
    assert_eq!(daily["data"][0]["web_search_requests"], 2, "{daily}");
    assert!((daily["data"][0]["cost_usd"].as_f64().unwrap() - platform_cost).abs() < 1e-9);
    // The operator's view: two searches run, one fee billed.
    let metrics = e.s.metrics().await;
    let value = |line: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(line))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{line} in {metrics}"))
    };
    assert_eq!(value("sluice_search_rounds_total{kind=\"web\"}"), 2.0);
    assert_eq!(
        value("sluice_search_fees_micro_usd_total"),
        (FEE * 1e6).round()
    );
}

// ---------------------------------------------------------------------------
// Native searches

/// An Anthropic answer whose own web search ran: the server tool blocks, a cited
/// text block, and the count.
fn anthropic_search_answer() -> Value {
    json!({
        "id": "msg_native1", "type": "message", "role": "assistant", "model": "nc1",
        "content": [
            {"type": "text", "text": "Let me search."},
            {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search",
             "input": {"query": "rust news"}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_01", "content": [
                {"type": "web_search_result", "url": "https://native.test/r", "title": "Native",
                 "encrypted_content": "EqgfCioIARgB", "page_age": "April 1, 2025"}]},
            {"type": "text", "text": "Rust shipped.", "citations": [
                {"type": "web_search_result_location", "url": "https://native.test/r",
                 "title": "Native", "encrypted_index": "Eo8BCioI", "cited_text": "Rust shipped a release."}]}
        ],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 0,
                  "cache_creation_input_tokens": 0, "server_tool_use": {"web_search_requests": 1}}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_searches_pass_through_and_their_citations_come_back_translated() {
    let searx = SearchVendor::searxng().await;
    let e = start(&searxng(&searx)).await;
    for m in ["nc1", "ng1", "nm1"] {
        e.mock.set_default(m, Step::Text("ok".into()));
    }
    // A messages client's own server tool reaches Claude verbatim.
    let tool = json!({"type": "web_search_20250305", "name": "web_search", "max_uses": 3,
                      "allowed_domains": ["rust-lang.org"]});
    let a = call(
        &e,
        "/v1/messages",
        &messages("ws-native-claude", false, json!([tool])),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = e.mock.requests_for("nc1")[0].json().unwrap();
    assert_eq!(sent["tools"][0], tool);
    assert!(a.json["usage"].get("cost").is_some());

    // Another spelling is translated to Claude's tool; Claude's citations come back
    // as url_citation annotations, its count reported, no service fee.
    e.mock.script(
        "nc1",
        vec![Step::Reply {
            status: 200,
            body: anthropic_search_answer().to_string(),
            retry_after: None,
        }],
    );
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat(
            "ws-native-claude",
            false,
            json!({"plugins": [{"id": "web"}]}),
        ),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = e.mock.requests_for("nc1")[1].json().unwrap();
    assert_eq!(
        sent["tools"],
        json!([{"type": "web_search_20250305", "name": "web_search"}])
    );
    let msg = &a.json["choices"][0]["message"];
    assert_eq!(msg["content"], "Let me search.Rust shipped.");
    let note = &msg["annotations"][0]["url_citation"];
    assert_eq!(note["url"], "https://native.test/r");
    assert_eq!(note["content"], "Rust shipped a release.");
    assert_eq!(
        (note["start_index"].as_u64(), note["end_index"].as_u64()),
        (Some(14), Some(27))
    );
    let u = &a.json["usage"];
    assert_eq!(u["server_tool_use_details"]["web_search_requests"], 1);
    assert!(
        (u["cost"].as_f64().unwrap() - token_cost(100, 20)).abs() < 1e-9,
        "{u}"
    );
    // The same answer to a responses client: the provider's search as an item.
    e.mock.script(
        "nc1",
        vec![Step::Reply {
            status: 200,
            body: anthropic_search_answer().to_string(),
            retry_after: None,
        }],
    );
    let a = call(
        &e,
        "/v1/responses",
        &responses("ws-native-claude", false, json!([{"type": "web_search"}])),
    )
    .await;
    assert_eq!(a.json["output"][0]["type"], "web_search_call", "{}", a.json);
    assert_eq!(a.json["output"][0]["action"]["query"], "rust news");

    // OpenAI: a chat client's web_search_options and a responses client's tool pass
    // through as sent; Gemini gets Google Search grounding.
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat(
            "ws-native-gpt",
            false,
            json!({"web_search_options": {"search_context_size": "high"}}),
        ),
    )
    .await;
    assert_eq!(a.status, 200);
    let sent = e.mock.requests_for("ng1")[0].json().unwrap();
    assert_eq!(
        sent["web_search_options"],
        json!({"search_context_size": "high"})
    );
    let a = call(
        &e,
        "/v1/responses",
        &responses(
            "ws-native-gpt",
            false,
            json!([{"type": "web_search", "search_context_size": "low"}]),
        ),
    )
    .await;
    assert_eq!(a.status, 200);
    let sent = e.mock.requests_for("ng1")[1].json().unwrap();
    assert_eq!(
        sent["tools"],
        json!([{"type": "web_search", "search_context_size": "low"}])
    );
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat("ws-native-gemini:online", false, json!({})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = e.mock.requests_for("nm1")[0].json().unwrap();
    assert_eq!(sent["tools"], json!([{"google_search": {}}]));
    // None of these ran the gateway's search.
    assert!(searx.requests().is_empty());
    // A route where only one rung searches natively is served by the gateway.
    e.mock.set_default("hn1", Step::Text("ok".into()));
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat("ws-half-native", false, json!({"web_search_options": {}})),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(searx.requests().len(), 1);
    let sent = e.mock.requests_for("hn1")[0].json().unwrap();
    assert!(sent.get("tools").is_none(), "{sent}");
}

// ---------------------------------------------------------------------------
// Tool search

fn function(name: &str, description: &str, deferred: bool) -> Value {
    let mut t = json!({"type": "function", "function": {"name": name, "description": description,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
    if deferred {
        t["defer_loading"] = json!(true);
    }
    t
}

/// A chat request with one loaded tool, three deferred ones and tool search.
fn chat_tools(model: &str, stream: bool) -> Value {
    chat(
        model,
        stream,
        json!({"tools": [
            {"type": "service:tool_search", "max_results": 2},
            function("echo", "Repeat the input", false),
            function("get_weather", "Current weather for a city", true),
            function("send_email", "Send an email to someone", true),
            function("list_files", "List files in a folder", true),
        ]}),
    )
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            t["function"]["name"]
                .as_str()
                .or(t["name"].as_str())
                .map(str::to_string)
        })
        .collect()
}

fn search_then_call(query: &str) -> Vec<Step> {
    vec![
        Step::CallIfDeclared {
            name: "tool_search".into(),
            arguments: json!({ "query": query }).to_string(),
        },
        Step::CallIfDeclared {
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_tool_search_loads_the_found_tool_and_calls_the_model_again() {
    let e = start(&[]).await;
    e.mock.script("g1", search_then_call("weather forecast"));
    let a = call(&e, "/v1/chat/completions", &chat_tools("ws-gpt", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    // The caller sees only the final answer: a call of the loaded tool.
    let calls = &a.json["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls.as_array().unwrap().len(), 1, "{}", a.json);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(a.json["choices"][0]["finish_reason"], "tool_calls");
    // Each round is an attempt in the receipt.
    assert_eq!(
        a.header("x-gateway-attempts"),
        "openai:tool_search,openai:ok"
    );
    let sent = e.mock.requests_for("g1");
    assert_eq!(sent.len(), 2);
    let first = sent[0].json().unwrap();
    assert_eq!(
        tool_names(&first),
        ["echo", "tool_search"],
        "deferred tools withheld"
    );
    assert!(!first.to_string().contains("defer_loading"));
    let second = sent[1].json().unwrap();
    let loaded = tool_names(&second);
    assert!(loaded.contains(&"get_weather".to_string()), "{loaded:?}");
    assert!(!loaded.contains(&"send_email".to_string()), "{loaded:?}");
    // The search round is in the history the model sees next.
    let history = second["messages"].as_array().unwrap();
    let asked = &history[history.len() - 2];
    assert_eq!(asked["tool_calls"][0]["function"]["name"], "tool_search");
    let result = &history[history.len() - 1];
    assert_eq!(result["role"], "tool");
    assert!(
        result["content"].as_str().unwrap().contains("get_weather"),
        "{result}"
    );
    // Every model call is billed: usage sums over the rounds.
    let prompts: u64 = sent
        .iter()
        .map(|r| (r.body.len() as u64).div_ceil(4).max(1))
        .sum();
    let u = &a.json["usage"];
    assert_eq!(u["prompt_tokens"].as_u64(), Some(prompts), "{u}");
    let tokens = token_cost(prompts, u["completion_tokens"].as_u64().unwrap());
    assert!((u["cost"].as_f64().unwrap() - tokens).abs() < 1e-9, "{u}");

    // Streamed: only the final turn reaches the client.
    e.mock.clear();
    e.mock.script("g1", search_then_call("weather"));
    let a = call(&e, "/v1/chat/completions", &chat_tools("ws-gpt", true)).await;
    assert_eq!(a.status, 200);
    let chunks = a.data();
    // (The receipt names the round; the answer itself never does.)
    let said: String = chunks.iter().map(|c| c["choices"].to_string()).collect();
    assert!(!said.contains("tool_search"), "{said}");
    let names: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["name"].as_str())
        .collect();
    assert_eq!(names, ["get_weather"]);
    let finish = chunks
        .iter()
        .find(|c| c["choices"][0]["finish_reason"].is_string())
        .unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        finish["x_gateway"]["attempts"],
        "openai:tool_search,openai:ok"
    );
    let sent = e.mock.requests_for("g1");
    let prompts: u64 = sent
        .iter()
        .map(|r| (r.body.len() as u64).div_ceil(4).max(1))
        .sum();
    assert_eq!(
        chunks.last().unwrap()["usage"]["prompt_tokens"].as_u64(),
        Some(prompts)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_messages_tool_search_in_rounds_bm25_and_regex() {
    let e = start(&[]).await;
    let deferred_fn = |name: &str, d: &str| {
        json!({"type": "function", "name": name, "description": d,
        "defer_loading": true, "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}})
    };
    let tools = json!([
        {"type": "tool_search"},
        deferred_fn("get_weather", "Current weather for a city"),
        deferred_fn("send_email", "Send an email"),
    ]);
    for stream in [false, true] {
        e.mock.clear();
        e.mock.script("g1", search_then_call("weather"));
        let a = call(
            &e,
            "/v1/responses",
            &json!({"model": "ws-gpt", "stream": stream,
            "input": "Weather in Paris?", "tools": tools}),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.json);
        let out = if stream {
            a.named("response.completed")[0]["response"]["output"].clone()
        } else {
            a.json["output"].clone()
        };
        let calls: Vec<&Value> = out
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"] == "function_call")
            .collect();
        assert_eq!(calls.len(), 1, "{out}");
        assert_eq!(calls[0]["name"], "get_weather");
        let sent = e.mock.requests_for("g1");
        assert_eq!(tool_names(&sent[0].json().unwrap()), ["tool_search"]);
        assert!(tool_names(&sent[1].json().unwrap()).contains(&"get_weather".to_string()));
        if stream {
            // The response object repeats the request's tools (tool_search among
            // them); no other frame names it.
            let text: String = a
                .frames
                .iter()
                .filter(|(n, _)| {
                    !matches!(
                        n.as_deref(),
                        Some("response.created" | "response.in_progress" | "response.completed")
                    )
                })
                .map(|(_, d)| d.as_str())
                .collect();
            assert!(
                !text.contains("\"tool_search\""),
                "only the final turn streams"
            );
        }
    }
    // Messages, with the regular-expression variant, on a Claude rung.
    let custom = |name: &str, d: &str| {
        json!({"name": name, "description": d, "defer_loading": true,
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}})
    };
    let tools = json!([
        {"type": "tool_search_tool_regex_20251119", "name": "tool_search"},
        custom("get_weather", "Current weather for a city"),
        custom("send_email", "Send an email"),
    ]);
    for stream in [false, true] {
        e.mock.clear();
        e.mock.script("c1", search_then_call("^get_wea.*|forecast"));
        let a = call(
            &e,
            "/v1/messages",
            &messages("ws-claude", stream, tools.clone()),
        )
        .await;
        assert_eq!(a.status, 200, "{}", a.json);
        let content = if stream {
            a.named("content_block_start")
                .iter()
                .map(|b| b["content_block"].clone())
                .collect::<Vec<_>>()
        } else {
            a.json["content"].as_array().unwrap().clone()
        };
        let uses: Vec<&Value> = content.iter().filter(|b| b["type"] == "tool_use").collect();
        assert_eq!(uses.len(), 1, "{content:?}");
        assert_eq!(uses[0]["name"], "get_weather");
        let sent = e.mock.requests_for("c1");
        assert_eq!(tool_names(&sent[0].json().unwrap()), ["tool_search"]);
        let second = sent[1].json().unwrap();
        assert_eq!(tool_names(&second), ["tool_search", "get_weather"]);
        // The round in Anthropic's terms: a tool_use of tool_search and its result.
        let turns = second["messages"].as_array().unwrap();
        assert_eq!(turns[1]["content"][0]["type"], "tool_use");
        assert_eq!(turns[2]["content"][0]["type"], "tool_result");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_search_budget_drops_and_refusals() {
    let e = start(&[("SLUICE_TOOL_SEARCH__MAX_ROUNDS", "1".into())]).await;
    // Past the last round a further tool_search call becomes text.
    let search = Step::CallIfDeclared {
        name: "tool_search".into(),
        arguments: r#"{"query":"nothing matches this"}"#.into(),
    };
    e.mock.script("g1", vec![search.clone(), search.clone()]);
    let a = call(&e, "/v1/chat/completions", &chat_tools("ws-gpt", false)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let msg = &a.json["choices"][0]["message"];
    assert!(msg.get("tool_calls").is_none(), "{msg}");
    assert!(msg["content"].as_str().unwrap().contains("budget"), "{msg}");
    assert_eq!(a.json["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        a.header("x-gateway-attempts"),
        "openai:tool_search,openai:ok"
    );
    let round = e.mock.requests_for("g1")[1].json().unwrap();
    let answer = round["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        answer["content"]
            .as_str()
            .unwrap()
            .contains("No more tools matched"),
        "{answer}"
    );
    // Streamed, the same.
    e.mock.script("g1", vec![search.clone(), search]);
    let a = call(&e, "/v1/chat/completions", &chat_tools("ws-gpt", true)).await;
    let text: String = a
        .data()
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(text.contains("budget"), "{text}");

    // A declaration with nothing deferred is dropped and disclosed.
    e.mock.set_default("g1", Step::Text("ok".into()));
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat(
            "ws-gpt",
            false,
            json!({"tools": [
        {"type": "service:tool_search"}, function("echo", "Repeat", false)]}),
        ),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(
        a.header("x-service-ignored-parameters"),
        "tool_search->dropped(no_deferred_tools)"
    );
    assert_eq!(
        tool_names(&e.mock.requests_for("g1").last().unwrap().json().unwrap()),
        ["echo"]
    );
    let a = call(
        &e,
        "/v1/messages",
        &messages(
            "ws-claude",
            true,
            json!([
        {"type": "tool_search_tool_bm25_20251119", "name": "tool_search"}]),
        ),
    )
    .await;
    assert_eq!(
        a.named("message_delta")[0]["x-service-ignored-parameters"],
        "tool_search->dropped(no_deferred_tools)"
    );

    // A tool_choice naming tool_search is refused; auto and required are served.
    let mut body = chat_tools("ws-gpt", false);
    body["tool_choice"] = json!({"type": "function", "function": {"name": "tool_search"}});
    let a = call(&e, "/v1/chat/completions", &body).await;
    assert_error(a.status, &a.json, 400, "unsupported_parameter");
    assert_eq!(a.json["error"]["param"], "tool_choice");
    let a = call(&e, "/v1/responses", &json!({"model": "ws-gpt", "input": "x",
        "tools": [{"type": "tool_search"}, {"type": "function", "name": "f", "defer_loading": true}],
        "tool_choice": {"type": "function", "name": "tool_search"}})).await;
    assert_error(a.status, &a.json, 400, "unsupported_parameter");
    for choice in ["auto", "required"] {
        e.mock.script("g1", search_then_call("weather"));
        let mut body = chat_tools("ws-gpt", false);
        body["tool_choice"] = json!(choice);
        let a = call(&e, "/v1/chat/completions", &body).await;
        assert_eq!(a.status, 200, "{choice}: {}", a.json);
        assert_eq!(
            a.json["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
            "get_weather"
        );
    }
    // Deferred tools without a declaration are refused, naming `tools`.
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat(
            "ws-gpt",
            false,
            json!({"tools": [function("get_weather", "w", true)]}),
        ),
    )
    .await;
    assert_error(a.status, &a.json, 400, "invalid_parameter");
    assert_eq!(a.json["error"]["param"], "tools");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_before_a_tool_search_call_streams_and_the_next_turn_continues_it() {
    let e = start(&[]).await;
    let first = [
        json!({"id": "chatcmpl-a", "object": "chat.completion.chunk", "created": 1, "model": "g1",
               "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me look. "}, "finish_reason": null}]}),
        json!({"id": "chatcmpl-a", "object": "chat.completion.chunk", "created": 1, "model": "g1",
               "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_s", "type": "function",
                 "function": {"name": "tool_search", "arguments": "{\"query\":\"weather\"}"}}]}, "finish_reason": null}]}),
        json!({"id": "chatcmpl-a", "object": "chat.completion.chunk", "created": 1, "model": "g1",
               "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
               "usage": {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57}}),
    ];
    let mut sse: String = first.iter().map(|c| format!("data: {c}\n\n")).collect();
    sse.push_str("data: [DONE]\n\n");
    e.mock.script(
        "g1",
        vec![
            Step::Reply {
                status: 200,
                body: sse,
                retry_after: None,
            },
            Step::Text("It is sunny.".into()),
        ],
    );
    let a = call(&e, "/v1/chat/completions", &chat_tools("ws-gpt", true)).await;
    assert_eq!(a.status, 200);
    let chunks = a.data();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Let me look. It is sunny.");
    let finishes: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["finish_reason"].is_string())
        .collect();
    assert_eq!(finishes.len(), 1, "one finish: {chunks:?}");
    assert_eq!(finishes[0]["choices"][0]["finish_reason"], "stop");
    assert!(!chunks
        .iter()
        .any(|c| c["choices"].to_string().contains("tool_search")));
    let usage = &chunks.last().unwrap()["usage"];
    assert!(
        usage["prompt_tokens"].as_u64().unwrap() > 50,
        "rounds summed: {usage}"
    );
    // The round's text is in the history the model saw next.
    let second = e.mock.requests_for("g1")[1].json().unwrap();
    let turns = second["messages"].as_array().unwrap();
    assert_eq!(turns[turns.len() - 2]["content"], "Let me look. ");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_tool_search_passes_the_declaration_and_deferred_tools_through() {
    let e = start(&[]).await;
    e.mock.set_default("nc1", Step::Text("ok".into()));
    e.mock.set_default("ng1", Step::Text("ok".into()));
    let deferred = json!({"name": "get_weather", "description": "Weather", "defer_loading": true,
        "input_schema": {"type": "object", "properties": {}}});
    let decl = json!({"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"});
    let a = call(
        &e,
        "/v1/messages",
        &messages("ws-native-claude", false, json!([decl, deferred])),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = e.mock.requests_for("nc1")[0].json().unwrap();
    assert_eq!(sent["tools"], json!([decl, deferred]));
    // A chat client's declaration becomes Claude's own, its deferred tools marked.
    let a = call(
        &e,
        "/v1/chat/completions",
        &chat_tools("ws-native-claude", false),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    let sent = e.mock.requests_for("nc1")[1].json().unwrap();
    let tools = sent["tools"].as_array().unwrap();
    assert!(
        tools
            .iter()
            .any(|t| t["type"] == "tool_search_tool_bm25_20251119"),
        "{sent}"
    );
    let weather = tools.iter().find(|t| t["name"] == "get_weather").unwrap();
    assert_eq!(weather["defer_loading"], true);
    assert_eq!(
        e.mock.requests_for("nc1").len(),
        2,
        "the provider searches: one call"
    );
    // A responses client's tool_search goes to OpenAI as sent.
    let tools = json!([{"type": "tool_search"},
        {"type": "function", "name": "get_weather", "defer_loading": true, "parameters": {"type": "object"}}]);
    let a = call(
        &e,
        "/v1/responses",
        &json!({"model": "ws-native-gpt", "input": "x", "tools": tools}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(
        e.mock.requests_for("ng1")[0].json().unwrap()["tools"],
        tools
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reservation_holds_the_fee_and_every_round_a_tool_search_may_make() {
    let searx = SearchVendor::searxng().await;
    let e = start(&searxng(&searx)).await;
    e.mock.set_default("g1", Step::Text("ok".into()));
    // Enough for one call of 1,000 output tokens ($0.005), not for that plus a
    // search's fee and results, nor for four calls.
    let (_, thin) = e
        .s
        .org_with(json!({"name": "thin", "email_verified": true, "credits_usd": 0.008, "tier": 3}))
        .await;
    let post = |body: Value| {
        let req =
            e.s.http
                .post(format!("{}/v1/chat/completions", e.s.gateway))
                .bearer_auth(&thin)
                .json(&body);
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let plain = chat("ws-gpt", false, json!({"max_tokens": 1000}));
    let (st, v) = post(plain).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = post(chat(
        "ws-gpt",
        false,
        json!({"max_tokens": 1000, "web_search_options": {}}),
    ))
    .await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["code"], "insufficient_quota");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("insufficient_credits"),
        "{v}"
    );
    let mut rounds = chat_tools("ws-gpt", false);
    rounds["max_tokens"] = json!(1000);
    let (st, v) = post(rounds).await;
    assert_eq!(st, 429, "{v}");
    // Nothing was searched for a refused request.
    assert!(searx.requests().is_empty());
}
