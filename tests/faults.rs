//! Sixteen provider faults, each injected at the mock provider on the primary rung
//! of a two-rung chat model (or a one-rung one where the caller must see the
//! fault itself), and what the caller sees: throttles with and without
//! Retry-After, 5xx, resets, silence, a slow first token, cuts before and after
//! output, a stall mid-stream, malformed events before and after the commit, a
//! missing `[DONE]`, a context-length 400, a policy refusal (whole and streamed)
//! and a flapping primary. These hold the fail-over rules of SPEC's waterfall and
//! its cut rule (Events 3) in place.

mod harness;

use harness::{assert_error, Env, Provider};
use serde_json::{json, Value};
use sluice_mock::Step;
use std::time::{Duration, Instant};

/// The engine fixture: `chat-a` is openai:a1 then azure:a2, `chat-solo` openai:s1.
/// Timeouts are short so faults settle fast; the breaker stays out of the way.
async fn start() -> Env {
    use Provider::*;
    let providers = [OpenAi, Azure];
    Env::start("tests/fixtures/engine.toml", &providers, |o, _| {
        o.env("SLUICE_BREAKER__FAILURE_THRESHOLD", 1000)
            .each(&providers, "HEADER_TIMEOUT_MS", 600)
            .each(&providers, "FIRST_TOKEN_TIMEOUT_MS", 600)
            .each(&providers, "STREAM_IDLE_TIMEOUT_MS", 600)
    })
    .await
}

fn body(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream,
           "messages": [{"role": "user", "content": "Say hello, please, in a few words."}]})
}

/// One answer: status, the attempts receipt, the JSON body (whole) or the data
/// payloads of its SSE frames.
struct Answer {
    status: u16,
    attempts: String,
    json: Value,
    data: Vec<String>,
}

impl Answer {
    /// Every frame but `[DONE]`, parsed; panics on a frame that is not JSON.
    fn chunks(&self) -> Vec<Value> {
        self.data
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
            .collect()
    }

    fn finishes(&self) -> Vec<String> {
        self.chunks()
            .iter()
            .filter_map(|c| {
                c["choices"][0]["finish_reason"]
                    .as_str()
                    .map(str::to_string)
            })
            .collect()
    }

    fn text(&self) -> String {
        self.chunks()
            .iter()
            .filter_map(|c| {
                c["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_string)
            })
            .collect()
    }
}

async fn call(e: &Env, body: &Value) -> Answer {
    let mut r =
        e.s.http
            .post(format!("{}/v1/chat/completions", e.s.gateway))
            .bearer_auth(&e.key)
            .json(body)
            .send()
            .await
            .unwrap();
    let status = r.status().as_u16();
    let attempts = r
        .headers()
        .get("x-gateway-attempts")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let mut raw = Vec::new();
    while let Ok(Some(c)) = r.chunk().await {
        raw.extend_from_slice(&c);
    }
    let text = String::from_utf8(raw).unwrap();
    let data: Vec<String> = text
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("data: ").map(str::to_string))
        .collect();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Answer {
        status,
        attempts,
        json,
        data,
    }
}

/// The newest usage event, once the writer has stored `n` of them.
async fn newest_event(e: &Env, n: usize) -> Value {
    for _ in 0..100 {
        let (_, v) =
            e.s.get("/api/gateway/usage/events?limit=50", Some(&e.key))
                .await;
        if let Some(d) = v["data"].as_array().filter(|d| d.len() >= n) {
            return d[0].clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the usage event never arrived");
}

/// Fails over to a2 and serves its whole answer.
fn assert_served_by_a2(a: &Answer, first: &str) {
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.attempts, format!("{first},azure:ok"));
    assert_eq!(a.json["provider"], "azure:a2");
    assert_eq!(
        a.json["choices"][0]["message"]["content"],
        "Hello from mock a2."
    );
}

fn openai_error(status: u16, code: &str, message: &str) -> Step {
    Step::Reply {
        status,
        body: json!({"error": {"message": message, "type": "invalid_request_error",
                               "param": null, "code": code}})
        .to_string(),
        retry_after: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttles_and_server_errors_before_content_fail_over() {
    let e = start().await;
    // 1. A throttle with Retry-After (the mock's 429 carries `retry-after: 1`).
    e.mock.script("a1", vec![Step::Status(429)]);
    assert_served_by_a2(&call(&e, &body("chat-a", false)).await, "openai:429");
    // 2. A throttle without it.
    e.mock.script(
        "a1",
        vec![Step::Reply {
            status: 429,
            body: json!({"error": {"message": "Rate limit reached", "type": "requests",
                                   "code": "rate_limit_exceeded"}})
            .to_string(),
            retry_after: None,
        }],
    );
    assert_served_by_a2(&call(&e, &body("chat-a", false)).await, "openai:429");
    // 3. A 5xx: internal error and overload.
    for status in [500, 503] {
        e.mock.script("a1", vec![Step::Status(status)]);
        assert_served_by_a2(
            &call(&e, &body("chat-a", false)).await,
            &format!("openai:{status}"),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_silence_and_a_slow_first_token_fail_over() {
    let e = start().await;
    // 4. A reset before any byte: the same rung is tried once more, then the next.
    e.mock
        .script("a1", vec![Step::CloseConnection, Step::CloseConnection]);
    assert_served_by_a2(
        &call(&e, &body("chat-a", false)).await,
        "openai:died,openai:died",
    );
    assert_eq!(e.mock.count("a1"), 2);
    // 5. Silence: no response headers within the header timeout.
    e.mock
        .script("a1", vec![Step::DelayHeaders(Duration::from_millis(2_000))]);
    assert_served_by_a2(
        &call(&e, &body("chat-a", false)).await,
        "openai:header_timeout",
    );
    // 6. A slow first token on a stream: the client sees one clean stream from a2.
    e.mock.script(
        "a1",
        vec![Step::DelayFirstToken(Duration::from_millis(2_000))],
    );
    let a = call(&e, &body("chat-a", true)).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.attempts, "openai:first_token_timeout,azure:ok");
    assert_eq!(a.text(), "Hello from mock a2.");
    assert_eq!(a.finishes(), ["stop"]);
    // 10. A whole answer that stalls halfway: the first-token bound ends it.
    e.mock.script("a1", vec![Step::StallAfter(1)]);
    let started = Instant::now();
    assert_served_by_a2(
        &call(&e, &body("chat-a", false)).await,
        "openai:first_token_timeout",
    );
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_settle_as_the_spec_says_and_the_prompt_is_billed() {
    let e = start().await;
    // 7. A cut after output: no fail-over, finish `length`, the usage chunk the
    //    client asked for, the ledger row incomplete, and the prompt counted (the
    //    provider bills it).
    e.mock.script("a1", vec![Step::CutAfter(2)]);
    let mut asked = body("chat-a", true);
    asked["stream_options"] = json!({"include_usage": true});
    let a = call(&e, &asked).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.finishes(), ["length"]);
    assert_eq!(a.text(), "Hello from");
    let usage = a
        .chunks()
        .into_iter()
        .find(|c| c["usage"].is_object())
        .unwrap()["usage"]
        .clone();
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0, "{usage}");
    assert!(usage["completion_tokens"].as_u64().unwrap() > 0, "{usage}");
    assert_eq!(a.data.last().unwrap(), "[DONE]");
    let ev = newest_event(&e, 1).await;
    assert_eq!(ev["incomplete"], true);
    assert!(ev["input_tokens"].as_i64().unwrap() > 0, "{ev}");
    assert!(ev["output_tokens"].as_i64().unwrap() > 0, "{ev}");
    assert!(ev["cost_usd"].as_f64().unwrap() > 0.0, "{ev}");
    assert_eq!(e.mock.count("a2"), 0);
    // 8. A cut before any output: retried once on the rung, then the next rung.
    e.mock
        .script("a1", vec![Step::CutAfter(0), Step::CutAfter(0)]);
    let a = call(&e, &body("chat-a", true)).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.attempts, "openai:died,openai:died,azure:ok");
    assert_eq!(a.text(), "Hello from mock a2.");
    assert_eq!(a.finishes(), ["stop"]);
    // 13. The finish came, then the connection dropped before `[DONE]`: the answer
    //     is whole, with exactly one finish and the end marker.
    e.mock.script("a1", vec![Step::FinishThenCut]);
    let a = call(&e, &body("chat-a", true)).await;
    assert_eq!(a.finishes(), ["stop"]);
    assert_eq!(a.text(), "Hello from mock a1.");
    assert_eq!(a.data.last().unwrap(), "[DONE]");
    let ev = newest_event(&e, 3).await;
    assert_eq!(ev["incomplete"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_mid_stream_settles_as_a_cut_within_the_idle_bound() {
    let e = start().await;
    // 9. Two chunks, then silence with the socket open: past the idle bound the
    //    stream settles as a cut instead of hanging on the provider.
    e.mock.script("a1", vec![Step::StallAfter(2)]);
    let started = Instant::now();
    let a = call(&e, &body("chat-a", true)).await;
    assert!(started.elapsed() < Duration::from_secs(20), "it hung");
    assert_eq!(a.status, 200);
    assert_eq!(a.text(), "Hello from");
    assert_eq!(a.finishes(), ["length"]);
    assert_eq!(a.data.last().unwrap(), "[DONE]");
    assert_eq!(newest_event(&e, 1).await["incomplete"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_events_fail_over_before_content_and_are_dropped_after() {
    let e = start().await;
    // 11. Before any content: the rung's answer is unreadable, the next one serves.
    e.mock.script("a1", vec![Step::MalformedAfter(0)]);
    let a = call(&e, &body("chat-a", true)).await;
    assert_eq!(a.attempts, "openai:bad_answer,azure:ok");
    assert_eq!(a.text(), "Hello from mock a2.");
    // Whole answers too.
    e.mock.script("a1", vec![Step::MalformedAfter(0)]);
    assert_served_by_a2(&call(&e, &body("chat-a", false)).await, "openai:bad_answer");
    // 12. After the commit: the client never gets a frame it cannot parse, and the
    //     rest of the answer still arrives.
    e.mock.script("a1", vec![Step::MalformedAfter(2)]);
    let a = call(&e, &body("chat-a", true)).await;
    assert_eq!(a.status, 200);
    let _every_frame_parses = a.chunks();
    assert_eq!(a.text(), "Hello from mock a1.");
    assert_eq!(a.finishes(), ["stop"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors_and_refusals() {
    let e = start().await;
    // 14. A context-length 400 on the primary: a later rung may take the prompt.
    e.mock.script(
        "a1",
        vec![openai_error(
            400,
            "context_length_exceeded",
            "This model's maximum context length is 8192 tokens.",
        )],
    );
    assert_served_by_a2(&call(&e, &body("chat-a", false)).await, "openai:400");
    assert_eq!(e.mock.count("a2"), 1);
    // 15. A policy refusal ends the waterfall: 400 `refusal`, nothing else tried.
    for stream in [false, true] {
        e.mock.script(
            "a1",
            vec![openai_error(
                400,
                "content_policy_violation",
                "Your request was rejected as a result of our safety system.",
            )],
        );
        let a = call(&e, &body("chat-a", stream)).await;
        assert_error(a.status, &a.json, 400, "refusal");
        assert_eq!(a.json["error"]["refusal_reason"], "content_policy");
        assert_eq!(
            a.json["error"]["message"],
            "provider refused the request: content policy"
        );
    }
    // Azure's filter says it in `innererror`, and a filtered finish before any
    // content is a refusal too, not an empty turn to fail over from.
    e.mock.script(
        "a1",
        vec![Step::Reply {
            status: 400,
            body: json!({"error": {"message": "The response was filtered", "code": "400",
                                   "innererror": {"code": "ResponsibleAIPolicyViolation"}}})
            .to_string(),
            retry_after: None,
        }],
    );
    let a = call(&e, &body("chat-a", false)).await;
    assert_error(a.status, &a.json, 400, "refusal");
    assert_eq!(
        e.mock.count("a2"),
        1,
        "a refusal never reaches another rung"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_primary_never_reaches_the_caller() {
    let e = start().await;
    // 16. Every other call of the primary fails: every request is still served.
    e.mock.script(
        "a1",
        (0..10)
            .map(|i| {
                if i % 2 == 0 {
                    Step::Status(502)
                } else {
                    Step::Ok
                }
            })
            .collect(),
    );
    for i in 0..10 {
        let a = call(&e, &body("chat-a", i % 3 == 0)).await;
        assert_eq!(a.status, 200, "request {i}: {}", a.json);
    }
    assert_eq!(e.mock.count("a1"), 10);
    assert_eq!(e.mock.count("a2"), 5);
}
