//! The responses store, as a client of the responses API sees it: `store` (on by
//! default) keeps a turn, `previous_response_id` continues it on any instance with
//! the whole history sent to the serving rung of whatever maker (upstream never
//! stores anything), every way a continuation can be refused, retention and
//! expiry, prompt capture, hidden reasoning kept to its maker, and Idempotency-Key
//! replays that store nothing twice.

mod harness;

use harness::{assert_error, repo_path, sql_rows, Answer, Backend, Env, Opts, Provider, Sluice};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use std::time::Duration;

const FIXTURE: &str = "tests/fixtures/formats.toml";
const PROVIDERS: [Provider; 2] = [Provider::OpenAi, Provider::Anthropic];

fn opts(base: &str) -> Opts {
    Opts::default()
        .catalog(repo_path(FIXTURE))
        .providers(base, &PROVIDERS)
}

async fn start_with(extra: &[(&str, &str)]) -> Env {
    Env::start(FIXTURE, &PROVIDERS, |mut o, _| {
        for (k, v) in extra {
            o = o.env(k, v);
        }
        o
    })
    .await
}

async fn start() -> Env {
    start_with(&[]).await
}

impl Env {
    async fn respond(&self, body: Value) -> Answer {
        self.s.call(&self.key, "/v1/responses", &body).await
    }

    /// The body the mock's last request for `model` carried.
    fn sent(&self, model: &str) -> Value {
        let reqs = self.mock.requests_for(model);
        reqs.last()
            .expect("a request reached the mock")
            .json()
            .unwrap()
    }

    async fn stored_rows(&self) -> Vec<serde_json::Map<String, Value>> {
        sql_rows(
            &self.b.database_url,
            &format!(
                "SELECT id, status, parent_id FROM stored_responses WHERE org_id = '{}'",
                self.org
            ),
        )
        .await
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
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{n} usage events were never written");
    }

    /// Waits until the org has `n` stored turns (the writer is asynchronous).
    async fn wait_stored(&self, n: usize) {
        for _ in 0..100 {
            if self.stored_rows().await.len() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "{n} turns were never stored: {:?}",
            self.stored_rows().await
        );
    }
}

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": text})
}

fn assistant(text: &str) -> Value {
    json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
}

/// The id of a whole answer, or of a stream's completed response.
fn id_of(a: &Answer) -> String {
    let r = if a.frames.is_empty() {
        a.json.clone()
    } else {
        a.last_event("response.completed")
            .or_else(|| a.last_event("response.incomplete"))
            .expect("a final response event")["response"]
            .clone()
    };
    r["id"].as_str().expect("a response id").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_is_continued_with_its_whole_history_on_any_maker() {
    let e = start().await;
    let a = e
        .respond(json!({"model": "fmt-gpt", "input": "Hi", "instructions": "Be brief."}))
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    let first = id_of(&a);

    // Streamed, continuing the first: the native OpenAI rung gets the whole
    // conversation, stores nothing and sees no previous_response_id.
    let b = e
        .respond(json!({"model": "fmt-gpt", "input": "Again?", "stream": true, "previous_response_id": first}))
        .await;
    assert_eq!(b.status, 200, "{:?}", b.frames);
    let second = id_of(&b);
    let sent = e.sent("o1");
    assert_eq!(
        sent["input"],
        json!([user("Hi"), assistant("Hello from mock o1."), user("Again?")])
    );
    assert_eq!(sent["store"], json!(false));
    assert!(sent.get("previous_response_id").is_none(), "{sent}");
    // Instructions are not carried over, as with OpenAI's own store.
    assert!(sent.get("instructions").is_none(), "{sent}");

    // A third turn with an item list, then a fourth on an Anthropic rung.
    let c = e
        .respond(json!({"model": "fmt-gpt", "previous_response_id": second, "input": [{"role": "user", "content": "Third"}]}))
        .await;
    assert_eq!(c.status, 200, "{}", c.json);
    assert_eq!(e.sent("o1")["input"].as_array().unwrap().len(), 5);
    let third = id_of(&c);
    let d = e
        .respond(
            json!({"model": "fmt-claude", "previous_response_id": third, "input": "Claude now"}),
        )
        .await;
    assert_eq!(d.status, 200, "{}", d.json);
    let messages = e.sent("c1")["messages"].clone();
    let roles: Vec<&str> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant",
            "user"
        ],
        "{messages}"
    );
    assert_eq!(messages[6]["content"], "Claude now", "{messages}");
    assert_eq!(
        d.json["output"][0]["content"][0]["text"],
        "Hello from mock c1."
    );

    // Storage grows with the conversation: one row a turn, each with its parent.
    e.wait_stored(4).await;
    let rows = e.stored_rows().await;
    let parent = |id: &str| {
        rows.iter()
            .find(|r| r["id"] == json!(id))
            .map(|r| r["parent_id"].clone())
            .unwrap()
    };
    assert_eq!(parent(&first), Value::Null);
    assert_eq!(parent(&second), json!(first));
    assert_eq!(parent(&third), json!(second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refused_continuation_is_previous_response_not_found_and_free() {
    let e = start().await;
    let refused = |a: &Answer| {
        assert_error(a.status, &a.json, 400, "previous_response_not_found");
        assert_eq!(
            a.json["error"]["param"], "previous_response_id",
            "{}",
            a.json
        );
    };
    // Unknown.
    let a = e
        .respond(json!({"model": "fmt-gpt", "input": "x", "previous_response_id": "resp_nope"}))
        .await;
    refused(&a);
    // Not stored (store: false).
    let unstored = e
        .respond(json!({"model": "fmt-gpt", "input": "x", "store": false}))
        .await;
    assert_eq!(unstored.status, 200);
    let a = e
        .respond(
            json!({"model": "fmt-gpt", "input": "y", "previous_response_id": id_of(&unstored)}),
        )
        .await;
    refused(&a);
    // Another org's.
    let kept = e.respond(json!({"model": "fmt-gpt", "input": "x"})).await;
    let kept_id = id_of(&kept);
    let (_, _, other_key) = e.s.org_and_key().await;
    let a =
        e.s.call(
            &other_key,
            "/v1/responses",
            &json!({"model": "fmt-gpt", "input": "y", "previous_response_id": kept_id}),
        )
        .await;
    refused(&a);
    // The refused calls reached no rung and cost nothing: the two served calls
    // are the org's only usage.
    assert_eq!(e.mock.requests_for("o1").len(), 2);
    let events = e.events(2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(e.events(2).await.len(), events.len());
    assert_eq!(events.len(), 2);

    // Prompt capture off: nothing is continued, and the message says why; nothing
    // answered meanwhile is kept.
    let settings = format!("/admin/orgs/{}/settings", e.org);
    let (st, _) =
        e.s.admin(
            reqwest::Method::PUT,
            &settings,
            Some(json!({"prompt_capture": false})),
        )
        .await;
    assert_eq!(st, 200);
    e.s.wait_for_key(&e.key).await;
    let a = e
        .respond(json!({"model": "fmt-gpt", "input": "y", "previous_response_id": kept_id}))
        .await;
    refused(&a);
    assert!(
        a.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Prompt capture is off"),
        "{}",
        a.json
    );
    let while_off = e.respond(json!({"model": "fmt-gpt", "input": "z"})).await;
    assert_eq!(while_off.status, 200);
    e.s.admin(
        reqwest::Method::PUT,
        &settings,
        Some(json!({"prompt_capture": true})),
    )
    .await;
    e.s.wait_for_key(&e.key).await;
    let a = e
        .respond(
            json!({"model": "fmt-gpt", "input": "y", "previous_response_id": id_of(&while_off)}),
        )
        .await;
    refused(&a);
    // The one kept before capture went off continues again.
    let a = e
        .respond(json!({"model": "fmt-gpt", "input": "y", "previous_response_id": kept_id}))
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_counts_from_the_chains_last_turn_and_expired_turns_are_gone() {
    // Both published windows are accepted and stamp the chain's expiry.
    for (window, ms) in [("24h", 86_400_000i64), ("30d", 2_592_000_000)] {
        let e = start_with(&[("SLUICE_RESPONSES__RETENTION", window)]).await;
        let a = e.respond(json!({"model": "fmt-gpt", "input": "Hi"})).await;
        e.wait_stored(1).await;
        let rows = sql_rows(
            &e.b.database_url,
            &format!(
                "SELECT c.expires_at - r.created_at AS window FROM response_chains c \
                 JOIN stored_responses r ON r.chain_id = c.chain_id WHERE r.id = '{}'",
                id_of(&a)
            ),
        )
        .await;
        assert_eq!(rows[0]["window"], json!(ms), "{window}");
    }

    // A short window: continuing renews it; past it the chain is gone.
    let e = start_with(&[("SLUICE_RESPONSES__RETENTION", "2s")]).await;
    let a = e.respond(json!({"model": "fmt-gpt", "input": "Hi"})).await;
    let first = id_of(&a);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let b = e
        .respond(json!({"model": "fmt-gpt", "input": "More", "previous_response_id": first}))
        .await;
    assert_eq!(b.status, 200, "{}", b.json);
    let second = id_of(&b);
    e.wait_stored(2).await;
    // 2.2 s after the first turn, 1 s after the second: renewed, still there.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let c = e
        .respond(json!({"model": "fmt-gpt", "input": "Still?", "store": false, "previous_response_id": first}))
        .await;
    assert_eq!(c.status, 200, "{}", c.json);
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let d = e
        .respond(json!({"model": "fmt-gpt", "input": "Gone?", "previous_response_id": second}))
        .await;
    assert_error(d.status, &d.json, 400, "previous_response_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_reasoning_goes_back_only_to_its_maker() {
    let e = start().await;
    let openai_reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB-openai"});
    let input = json!([
        user("Hi"),
        openai_reasoning,
        assistant("Hello"),
        user("And?")
    ]);
    // On its maker's rung it is replayed as it came, and nothing is said.
    let a = e
        .respond(json!({"model": "fmt-gpt", "input": input, "store": false}))
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.header("x-gateway-replay-repair"), "");
    assert_eq!(e.sent("o1")["input"][1], openai_reasoning);
    // On another maker's it is removed, the rest kept, and the answer says so,
    // whole and streamed.
    for stream in [false, true] {
        let a = e
            .respond(
                json!({"model": "fmt-claude", "input": input, "stream": stream, "store": false}),
            )
            .await;
        assert_eq!(a.status, 200, "{}", a.json);
        assert_eq!(
            a.header("x-gateway-replay-repair"),
            "encrypted_reasoning_stripped"
        );
        let sent = e.sent("c1");
        let text = sent.to_string();
        assert!(!text.contains("gAAAAB-openai"), "{sent}");
        assert_eq!(sent["messages"].as_array().unwrap().len(), 3, "{sent}");
    }
    // Anthropic's hidden reasoning, as this gateway returns it in the responses
    // format, goes back to Claude as redacted thinking and never to OpenAI.
    let claude_reasoning = json!({"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "sluice:anthropic:EncryptedBlob"});
    let input = json!([
        user("Hi"),
        claude_reasoning,
        assistant("Hello"),
        user("And?")
    ]);
    let a = e
        .respond(json!({"model": "fmt-claude", "input": input, "store": false}))
        .await;
    assert_eq!(a.header("x-gateway-replay-repair"), "");
    let sent = e.sent("c1");
    assert_eq!(
        sent["messages"][1]["content"][0],
        json!({"type": "redacted_thinking", "data": "EncryptedBlob"}),
        "{sent}"
    );
    let a = e
        .respond(json!({"model": "fmt-gpt", "input": input, "store": false}))
        .await;
    assert_eq!(
        a.header("x-gateway-replay-repair"),
        "encrypted_reasoning_stripped"
    );
    assert_eq!(
        e.sent("o1")["input"],
        json!([user("Hi"), assistant("Hello"), user("And?")])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_kept_when_they_end_and_a_cut_one_as_incomplete() {
    let e = start().await;
    e.mock.script("o1", vec![Step::CutAfter(3)]);
    let a = e
        .respond(json!({"model": "fmt-gpt", "input": "Hi", "stream": true}))
        .await;
    assert_eq!(a.status, 200);
    let id = id_of(&a);
    e.wait_stored(1).await;
    assert_eq!(e.stored_rows().await[0]["status"], json!("incomplete"));
    // An incomplete response can be continued: its partial answer is history.
    let b = e
        .respond(json!({"model": "fmt-gpt", "input": "Go on", "previous_response_id": id}))
        .await;
    assert_eq!(b.status, 200, "{}", b.json);
    let input = e.sent("o1")["input"].clone();
    assert_eq!(input.as_array().unwrap().len(), 3, "{input}");
    assert_eq!(input[1]["role"], "assistant", "{input}");

    // A client that leaves mid-stream leaves nothing half-written.
    e.mock.script(
        "o1",
        vec![Step::SlowChunks {
            n: 20,
            every: Duration::from_millis(100),
        }],
    );
    let mut r =
        e.s.http
            .post(format!("{}/v1/responses", e.s.gateway))
            .bearer_auth(&e.key)
            .json(&json!({"model": "fmt-gpt", "input": "Long", "stream": true}))
            .send()
            .await
            .unwrap();
    let _ = r.chunk().await;
    drop(r);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(e.stored_rows().await.len(), 2, "only the two whole turns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_replay_stores_no_second_copy() {
    let e = start().await;
    let body = json!({"model": "fmt-gpt", "input": "Once"});
    let h = [("idempotency-key", "turn-1")];
    let a = e.s.call_with(&e.key, "/v1/responses", &body, &h).await;
    let b = e.s.call_with(&e.key, "/v1/responses", &body, &h).await;
    assert_eq!((a.status, b.status), (200, 200));
    assert_eq!(id_of(&a), id_of(&b));
    assert_eq!(e.mock.requests_for("o1").len(), 1);
    e.wait_stored(1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(e.stored_rows().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_crosses_instances_over_one_database() {
    let b = Backend::fresh().await;
    if !b.is_postgres() {
        eprintln!("several instances share PostgreSQL: skipped on SQLite");
        return;
    }
    let mock = Mock::start().await;
    let one = Sluice::start(&b, opts(&mock.base_url())).await;
    let two = Sluice::start(&b, opts(&mock.base_url())).await;
    let (_, _, key) = one.org_and_key().await;
    two.wait_for_key(&key).await;
    let mut previous = Value::Null;
    for (i, s) in [&one, &two, &one, &two].into_iter().enumerate() {
        let a = s
            .call(
                &key,
                "/v1/responses",
                &json!({"model": "fmt-gpt", "input": format!("turn {i}"), "previous_response_id": previous, "stream": i % 2 == 1}),
            )
            .await;
        assert_eq!(a.status, 200, "turn {i}: {} {:?}", a.json, a.frames);
        let input = mock.requests_for("o1").last().unwrap().json().unwrap()["input"].clone();
        let n = input.as_array().map_or(1, Vec::len);
        assert_eq!(n, 2 * i + 1, "turn {i}: {input}");
        previous = json!(id_of(&a));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_effort_passes_through_and_a_refused_value_is_the_providers_400() {
    let e = start().await;
    // The top tier and a summary reach the native rung exactly as asked.
    let a = e
        .respond(json!({"model": "fmt-reason", "input": "Think", "reasoning": {"effort": "max", "summary": "auto"}}))
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(
        e.sent("r1")["reasoning"],
        json!({"effort": "max", "summary": "auto"})
    );
    // A value the provider refuses is the caller's 400, naming the field and the
    // provider's supported set; nothing is billed for it.
    e.events(1).await;
    let before = e.s.balance_usd(&e.org).await;
    for stream in [false, true] {
        let a = e
            .respond(json!({"model": "fmt-reason", "input": "Think", "stream": stream, "reasoning": {"effort": "ultra"}}))
            .await;
        assert_error(a.status, &a.json, 400, "invalid_parameter");
        assert_eq!(a.json["error"]["param"], "reasoning.effort");
        let message = a.json["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("'max'") && message.contains("'ultra'"),
            "{message}"
        );
        assert_eq!(a.header("x-gateway-attempts"), "openai:400");
    }
    // Each refusal is in the ledger as a 400 at no cost; the balance is as it was.
    let events = e.events(3).await;
    for ev in &events[..2] {
        assert_eq!(
            (&ev["status"], &ev["cost_usd"]),
            (&json!(400), &json!(0.0)),
            "{ev}"
        );
    }
    assert_eq!(e.s.balance_usd(&e.org).await, before);
    // On a Claude rung an effort becomes the thinking budget.
    let a = e
        .respond(json!({"model": "fmt-claude", "input": "Think", "reasoning": {"effort": "high"}, "max_output_tokens": 20000}))
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(e.sent("c1")["thinking"]["budget_tokens"], 16384);
}

/// M4 of the 2026-12-01 security review: a conversation rebuilt from the store is
/// held to `[limits] max_request_bytes`, what a client could send itself. A chain
/// whose stored turns outgrow it is refused by name, before anything is built or
/// sent, and costs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_conversation_larger_than_a_request_is_refused_not_rebuilt() {
    let e = start_with(&[("SLUICE_LIMITS__MAX_REQUEST_BYTES", "40000")]).await;
    let big = "lorem ipsum ".repeat(1_200); // about 14 KB a turn
    let mut prev: Option<String> = None;
    let mut refused = None;
    for turn in 0..5 {
        let mut body = json!({"model": "fmt-gpt", "input": big});
        if let Some(p) = &prev {
            body["previous_response_id"] = json!(p);
        }
        let sent_before = e.mock.requests_for("o1").len();
        let a = e.respond(body).await;
        if a.status != 200 {
            assert_eq!(
                e.mock.requests_for("o1").len(),
                sent_before,
                "nothing went upstream"
            );
            refused = Some((turn, a));
            break;
        }
        e.wait_stored(turn + 1).await;
        prev = Some(id_of(&a));
    }
    let (turn, a) = refused.expect("the chain outgrows the bound");
    assert!(turn >= 2, "the first turns fit: refused at {turn}");
    assert_error(a.status, &a.json, 400, "invalid_parameter");
    assert_eq!(
        a.json["error"]["param"], "previous_response_id",
        "{}",
        a.json
    );
    assert!(
        a.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_request_bytes"),
        "{}",
        a.json
    );
}

/// L8 of the 2026-12-01 security review: `DELETE /v1/responses/{id}` erases a
/// stored turn before its retention ends; it cannot be continued afterwards, and
/// another org cannot delete (or learn of) it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_response_can_be_deleted_by_its_org_only() {
    let e = start().await;
    let a = e
        .respond(json!({"model": "fmt-gpt", "input": "Remember the number 7"}))
        .await;
    assert_eq!(a.status, 200, "{}", a.json);
    let id = id_of(&a);
    e.wait_stored(1).await;
    let (other_org, _, other_key) = e.s.org_and_key().await;
    assert_ne!(other_org, e.org);
    let delete = |key: &str, id: &str| {
        let (s, key, id) = (&e.s, key.to_string(), id.to_string());
        async move {
            let r = s
                .http
                .delete(format!("{}/v1/responses/{id}", s.gateway))
                .bearer_auth(&key)
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (st, v) = delete(&other_key, &id).await;
    assert_error(st, &v, 404, "not_found");
    let (st, v) = delete(&e.key, &id).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v, json!({"id": id, "object": "response", "deleted": true}));
    assert!(e.stored_rows().await.is_empty());
    let (st, v) = delete(&e.key, &id).await;
    assert_error(st, &v, 404, "not_found");
    let a = e
        .respond(json!({"model": "fmt-gpt", "input": "Which number?", "previous_response_id": id}))
        .await;
    assert_error(a.status, &a.json, 400, "previous_response_not_found");
}

/// The response object of a whole answer, or every response snapshot of a stream
/// (`response.created` … the terminal event).
fn snapshots(a: &Answer) -> Vec<Value> {
    if a.frames.is_empty() {
        return vec![a.json.clone()];
    }
    a.frames
        .iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v.get("response").cloned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_echoes_what_the_client_asked_not_what_the_provider_was_sent() {
    let e = start().await;
    // On the native rung the provider is asked to store nothing and continue
    // nothing; the answer still says what the client asked and the gateway did.
    for model in ["fmt-gpt", "fmt-claude"] {
        let a = e
            .respond(json!({"model": model, "input": "Hi", "metadata": {"k": "v"}}))
            .await;
        assert_eq!(a.status, 200, "{}", a.json);
        assert_eq!(a.json["store"], true, "{model}: {}", a.json);
        assert_eq!(a.json["previous_response_id"], Value::Null, "{model}");
        assert_eq!(a.json["metadata"], json!({"k": "v"}), "{model}");
        let first = id_of(&a);
        for stream in [false, true] {
            let b = e
                .respond(json!({"model": model, "input": "Again?", "stream": stream, "previous_response_id": first}))
                .await;
            assert_eq!(b.status, 200, "{model}: {:?}", b.frames);
            let all = snapshots(&b);
            assert!(!all.is_empty());
            for r in all {
                assert_eq!(r["store"], true, "{model} stream={stream}: {r}");
                assert_eq!(
                    r["previous_response_id"], first,
                    "{model} stream={stream}: {r}"
                );
            }
        }
        let c = e
            .respond(json!({"model": model, "input": "Hi", "store": false}))
            .await;
        assert_eq!(c.json["store"], false, "{model}: {}", c.json);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_stream_cut_after_output_marks_every_item_done_first() {
    let e = start().await;
    for (model, rung) in [("fmt-gpt", "o1"), ("fmt-claude", "c1")] {
        e.mock.script(rung, vec![Step::CutAfter(2)]);
        let a = e
            .respond(json!({"model": model, "input": "Hi", "stream": true}))
            .await;
        assert_eq!(a.status, 200, "{model}");
        let events: Vec<Value> = a
            .frames
            .iter()
            .filter_map(|(_, d)| serde_json::from_str(d).ok())
            .collect();
        let kinds: Vec<&str> = events.iter().filter_map(|v| v["type"].as_str()).collect();
        let at = |k: &str| kinds.iter().position(|x| *x == k);
        let end = at("response.incomplete").unwrap_or_else(|| panic!("{model}: {kinds:?}"));
        assert_eq!(end, kinds.len() - 1, "{model}: {kinds:?}");
        for done in [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ] {
            let i = at(done).unwrap_or_else(|| panic!("{model}: no {done} in {kinds:?}"));
            assert!(i < end, "{model}: {kinds:?}");
        }
        // Each item added is done, and the terminal snapshot lists them in order
        // with the text the stream sent.
        let added: Vec<&Value> = events
            .iter()
            .filter(|v| v["type"] == "response.output_item.added")
            .map(|v| &v["item"]["id"])
            .collect();
        let done: Vec<&Value> = events
            .iter()
            .filter(|v| v["type"] == "response.output_item.done")
            .map(|v| &v["item"]["id"])
            .collect();
        assert_eq!(added, done, "{model}");
        let text: String = events
            .iter()
            .filter(|v| v["type"] == "response.output_text.delta")
            .filter_map(|v| v["delta"].as_str())
            .collect();
        assert!(!text.is_empty(), "{model}");
        let output = &events[end]["response"]["output"];
        let ids: Vec<&Value> = output
            .as_array()
            .unwrap()
            .iter()
            .map(|i| &i["id"])
            .collect();
        assert_eq!(ids, added, "{model}: {output}");
        let message = output
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["type"] == "message")
            .unwrap();
        assert_eq!(message["content"][0]["text"], text, "{model}: {output}");
        let text_done = &events[at("response.output_text.done").unwrap()];
        assert_eq!(text_done["text"], text, "{model}");
        // Sequence numbers run on without a gap or repeat.
        let seqs: Vec<u64> = events
            .iter()
            .filter_map(|v| v["sequence_number"].as_u64())
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "{model}: {seqs:?}"
        );
    }
}
