//! A conversation's second turn as the client libraries send it: the
//! chat assistant message appended as it was returned, `item_reference` input
//! items (the Vercel AI SDK's default), and reasoning items replayed without their
//! encrypted content (LangChain on the responses API). Each case asserts what
//! reached the provider, not only that an answer came back.

mod harness;

use harness::{assert_error, Answer, Env, Provider};
use serde_json::{json, Value};
use sluice_mock::Step;

async fn start() -> Env {
    let providers = [Provider::OpenAi, Provider::Anthropic];
    Env::start("tests/fixtures/formats.toml", &providers, |o, _| o).await
}

impl Env {
    async fn call(&self, path: &str, body: Value) -> Answer {
        self.s.call(&self.key, path, &body).await
    }

    /// The org's usage events once `n` are written (the writer is asynchronous).
    async fn events(&self, n: usize) -> Vec<Value> {
        for _ in 0..100 {
            let (_, v) = self
                .s
                .get("/api/gateway/usage/events?limit=100", Some(&self.key))
                .await;
            let data = v["data"].as_array().cloned().unwrap_or_default();
            if data.len() >= n {
                return data;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("{n} usage events were never written");
    }

    fn sent(&self, model: &str) -> Value {
        let reqs = self.mock.requests_for(model);
        reqs.last()
            .expect("a request reached the mock")
            .json()
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_assistant_message_goes_back_as_it_was_returned() {
    let e = start().await;
    let first = e
        .call(
            "/v1/chat/completions",
            json!({"model": "fmt-gpt", "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await;
    assert_eq!(first.status, 200, "{}", first.json);
    // The message as the openai SDKs append it: every key of the answer's message,
    // nulls and the empty annotations included.
    let mut message = first.json["choices"][0]["message"].clone();
    for (k, v) in [
        ("annotations", json!([])),
        ("audio", Value::Null),
        ("function_call", Value::Null),
        ("refusal", Value::Null),
        ("reasoning_content", json!("thought about it")),
    ] {
        message[k] = v;
    }
    for model in ["fmt-gpt", "fmt-claude"] {
        let second = e
            .call(
                "/v1/chat/completions",
                json!({"model": model, "messages": [{"role": "user", "content": "Hi"}, message, {"role": "user", "content": "And?"}]}),
            )
            .await;
        assert_eq!(second.status, 200, "{model}: {}", second.json);
    }
    // The native rung gets the message without the answer-only keys.
    let sent = e.sent("o1")["messages"][1].clone();
    assert_eq!(
        sent,
        json!({"role": "assistant", "content": "Hello from mock o1."}),
        "{sent}"
    );
    assert_eq!(
        e.sent("c1")["messages"][1]["content"],
        "Hello from mock o1."
    );

    // Unknown keys and a real audio or function_call stay refused, naming them.
    for (k, v, code) in [
        ("agent", json!("x"), "invalid_parameter"),
        (
            "function_call",
            json!({"name": "f", "arguments": "{}"}),
            "unsupported_parameter",
        ),
        ("audio", json!({"id": "audio_1"}), "unsupported_parameter"),
    ] {
        let mut m = message.clone();
        m[k] = v;
        let a = e
            .call(
                "/v1/chat/completions",
                json!({"model": "fmt-gpt", "messages": [{"role": "user", "content": "Hi"}, m]}),
            )
            .await;
        assert_error(a.status, &a.json, 400, code);
        assert_eq!(a.json["error"]["param"], format!("messages[1].{k}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_references_resolve_to_the_orgs_stored_items() {
    let e = start().await;
    let first = e
        .call("/v1/responses", json!({"model": "fmt-gpt", "input": "Hi"}))
        .await;
    assert_eq!(first.status, 200, "{}", first.json);
    let item = first.json["output"][0]["id"].as_str().unwrap().to_string();
    // The AI SDK's second turn: the user's message again, the answer by reference.
    let input = json!([
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "item_reference", "id": item},
        {"role": "user", "content": [{"type": "input_text", "text": "And?"}]}
    ]);
    for model in ["fmt-gpt", "fmt-claude"] {
        let a = e
            .call("/v1/responses", json!({"model": model, "input": input}))
            .await;
        assert_eq!(a.status, 200, "{model}: {}", a.json);
    }
    assert_eq!(
        e.sent("o1")["input"][1],
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello from mock o1."}]})
    );
    let claude = e.sent("c1")["messages"].clone();
    assert_eq!(claude[1]["role"], "assistant", "{claude}");
    assert_eq!(claude[1]["content"], "Hello from mock o1.", "{claude}");

    // Unknown, another org's, or of an unstored response: 400 naming the item,
    // nothing sent, nothing charged.
    let unstored = e
        .call(
            "/v1/responses",
            json!({"model": "fmt-gpt", "input": "x", "store": false}),
        )
        .await;
    let unstored_item = unstored.json["output"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, _, other_key) = e.s.org_and_key().await;
    let sent_before = e.mock.requests_for("o1").len();
    // Four calls were served: their usage is written before the balance is read.
    e.events(4).await;
    let balance = e.s.balance_usd(&e.org).await;
    for (key, id) in [
        (&e.key, "msg_unknown".to_string()),
        (&other_key, item.clone()),
        (&e.key, unstored_item),
    ] {
        let a =
            e.s.call(
                key,
                "/v1/responses",
                &json!({"model": "fmt-gpt", "input": [{"role": "user", "content": "Hi"}, {"type": "item_reference", "id": id}]}),
            )
            .await;
        assert_error(a.status, &a.json, 400, "invalid_parameter");
        assert_eq!(a.json["error"]["param"], "input[1].id", "{}", a.json);
        assert!(
            a.json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("send the item itself"),
            "{}",
            a.json
        );
    }
    assert_eq!(e.mock.requests_for("o1").len(), sent_before);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(e.events(4).await.len(), 4, "the refusals recorded no usage");
    assert_eq!(e.s.balance_usd(&e.org).await, balance);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_replayed_without_its_content_is_completed_or_removed() {
    let e = start().await;
    // A first turn whose answer carries a reasoning item with its encrypted
    // content, as OpenAI returns it.
    let answer = json!({
        "id": "resp_reasoned", "object": "response", "created_at": 1, "status": "completed",
        "model": "o1", "output": [
            {"type": "reasoning", "id": "rs_kept", "summary": [{"type": "summary_text", "text": "Thinking."}], "encrypted_content": "gAAAA-kept"},
            {"type": "message", "id": "msg_kept", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]}
        ],
        "usage": {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 4}}
    });
    e.mock.script(
        "o1",
        vec![Step::Reply {
            status: 200,
            body: answer.to_string(),
            retry_after: None,
        }],
    );
    let first = e
        .call("/v1/responses", json!({"model": "fmt-gpt", "input": "Hi"}))
        .await;
    assert_eq!(first.status, 200, "{}", first.json);
    // LangChain's replay: the reasoning item by id and summary, no content.
    let replay = |id: &str| {
        json!([
            {"role": "user", "content": "Hi"},
            {"type": "reasoning", "id": id, "summary": [{"type": "summary_text", "text": "Thinking."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
            {"role": "user", "content": "And?"}
        ])
    };
    let a = e
        .call(
            "/v1/responses",
            json!({"model": "fmt-gpt", "input": replay("rs_kept")}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.header("x-gateway-replay-repair"), "");
    assert_eq!(e.sent("o1")["input"][1]["encrypted_content"], "gAAAA-kept");
    // Reasoning the store does not have is removed, and the answer says so.
    let a = e
        .call(
            "/v1/responses",
            json!({"model": "fmt-gpt", "input": replay("rs_unknown"), "stream": true}),
        )
        .await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.header("x-gateway-replay-repair"),
        "encrypted_reasoning_stripped"
    );
    let input = e.sent("o1")["input"].clone();
    assert_eq!(input.as_array().unwrap().len(), 3, "{input}");
    assert!(!input.to_string().contains("rs_unknown"), "{input}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_objects_carry_every_member_the_schema_requires() {
    let e = start().await;
    let tools = json!([{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]);
    let check = |r: &Value, with_tools: bool| {
        for k in [
            "instructions",
            "metadata",
            "temperature",
            "top_p",
            "tool_choice",
            "tools",
            "parallel_tool_calls",
        ] {
            assert!(r.get(k).is_some(), "{k} missing: {r}");
        }
        assert_eq!(r["parallel_tool_calls"], true, "{r}");
        assert_eq!(r["tool_choice"], "auto", "{r}");
        // The request's tools, a function's `strict` filled in as the API does.
        let mut want = if with_tools { tools.clone() } else { json!([]) };
        if with_tools {
            want[0]["strict"] = json!(true);
        }
        assert_eq!(r["tools"], want, "{r}");
    };
    // A translated rung, whole and streamed, with and without tools.
    let a = e
        .call("/v1/responses", json!({"model": "fmt-claude", "input": "Hi", "instructions": "Be brief.", "tools": tools}))
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    check(&a.json, true);
    assert_eq!(a.json["instructions"], "Be brief.");
    assert_eq!(
        a.json["usage"]["input_tokens_details"]["cache_write_tokens"],
        0
    );
    assert_eq!(a.json["output"][0]["content"][0]["logprobs"], json!([]));
    let s = e
        .call(
            "/v1/responses",
            json!({"model": "fmt-claude", "input": "Hi", "stream": true}),
        )
        .await;
    for event in [
        "response.created",
        "response.in_progress",
        "response.completed",
    ] {
        let r = s.last_event(event).unwrap_or_else(|| panic!("{event}"))["response"].clone();
        check(&r, false);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_messages_route_refuses_unknown_fields_and_streams_counts_and_cost() {
    let e = start().await;
    let before = e.mock.requests().len();
    let a = e
        .call("/v1/messages", json!({"model": "fmt-claude", "max_tokens": 10, "foo": 1, "messages": [{"role": "user", "content": "Hi"}]}))
        .await;
    assert_eq!(a.status, 400, "{}", a.json);
    assert_eq!(a.json["type"], "error");
    assert_eq!(a.json["error"]["type"], "invalid_request_error");
    assert!(
        a.json["error"]["message"].as_str().unwrap().contains("foo"),
        "{}",
        a.json
    );
    assert_eq!(e.mock.requests().len(), before, "refused before any rung");

    for model in ["fmt-claude", "fmt-gpt"] {
        let s = e
            .call("/v1/messages", json!({"model": model, "max_tokens": 64, "stream": true, "messages": [{"role": "user", "content": "Say hello in a few words"}]}))
            .await;
        assert_eq!(s.status, 200, "{model}");
        // The prompt is counted up front (a translated rung: the gateway's own count).
        let start = s.last_event("message_start").unwrap();
        assert!(
            start["message"]["usage"]["input_tokens"].as_u64().unwrap() > 0,
            "{model}: {start}"
        );
        // The final usage carries what the call cost.
        let delta = s.last_event("message_delta").unwrap();
        assert!(
            delta["usage"]["cost"].as_f64().unwrap() > 0.0,
            "{model}: {delta}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_keeps_encrypted_reasoning_the_client_did_not_ask_for() {
    let e = start().await;
    let answer = |id: &str| {
        json!({
            "id": format!("resp_{id}"), "object": "response", "created_at": 1, "status": "completed",
            "model": "r1", "output": [
                {"type": "reasoning", "id": format!("rs_{id}"), "summary": [{"type": "summary_text", "text": "Thinking."}], "encrypted_content": format!("gAAAA-{id}")},
                {"type": "message", "id": format!("msg_{id}"), "status": "completed", "role": "assistant",
                 "content": [{"type": "output_text", "text": "Hello.", "annotations": []}]}
            ],
            "usage": {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 4}}
        })
        .to_string()
    };
    let reply = |id: &str| Step::Reply {
        status: 200,
        body: answer(id),
        retry_after: None,
    };
    // Kept, not asked: the gateway asks the reasoning rung for it, the client's
    // answer goes without it.
    e.mock.script("r1", vec![reply("a")]);
    let a = e
        .call(
            "/v1/responses",
            json!({"model": "fmt-reason", "input": "Hi", "reasoning": {"summary": "auto"}}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(
        e.sent("r1")["include"],
        json!(["reasoning.encrypted_content"])
    );
    assert!(
        a.json["output"][0].get("encrypted_content").is_none(),
        "{}",
        a.json
    );
    assert_eq!(a.json["output"][0]["summary"][0]["text"], "Thinking.");
    // A replay of the item by id gets its content back from the store.
    let a = e
        .call(
            "/v1/responses",
            json!({"model": "fmt-reason", "input": [
                {"role": "user", "content": "Hi"},
                {"type": "reasoning", "id": "rs_a", "summary": [{"type": "summary_text", "text": "Thinking."}]},
                {"role": "user", "content": "And?"}
            ]}),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(e.sent("r1")["input"][1]["encrypted_content"], "gAAAA-a");
    assert_eq!(a.header("x-gateway-replay-repair"), "");
    // Asked for: the client gets it, streamed too.
    e.mock.script("r1", vec![reply("b")]);
    let a = e
        .call("/v1/responses", json!({"model": "fmt-reason", "input": "Hi", "include": ["reasoning.encrypted_content"]}))
        .await;
    assert_eq!(a.json["output"][0]["encrypted_content"], "gAAAA-b");
    // Not kept and not asked: nothing is asked of the rung.
    e.mock.script("r1", vec![reply("c")]);
    let a = e
        .call(
            "/v1/responses",
            json!({"model": "fmt-reason", "input": "Hi", "store": false}),
        )
        .await;
    assert_eq!(a.status, 200);
    assert!(e.sent("r1").get("include").is_none());
    assert!(
        a.json["output"][0].get("encrypted_content").is_none(),
        "{}",
        a.json
    );
}
