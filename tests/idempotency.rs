//! Idempotency-Key on chat completions and responses: an exact retry replays the
//! first answer (streams included) without a second provider call or charge; another
//! body is a conflict; concurrent duplicates wait for the first; a result lost with
//! its instance is `idempotency_replay_unavailable`; a refused request releases its
//! key. With Redis, every check also runs across two instances.

mod harness;

use harness::{assert_error, repo_path, Backend, Opts, Sluice};
use serde_json::{json, Value};
use sluice_mock::{Mock, Step};
use std::time::Duration;

fn opts(mock: &Mock) -> Opts {
    Opts::default()
        .catalog(repo_path("tests/fixtures/gates.toml"))
        .env(
            "SLUICE_PROVIDERS__OPENAI__BASE_URL",
            format!("{}/v1", mock.base_url()),
        )
        .env("OPENAI_API_KEY", "sk-openai")
}

struct Answer {
    status: u16,
    replayed: bool,
    text: String,
}

async fn send(s: &Sluice, key: &str, path: &str, idem: Option<&str>, body: &Value) -> Answer {
    send_to(&s.http, &s.gateway, key, path, idem, body).await
}

async fn send_to(
    http: &reqwest::Client,
    gateway: &str,
    key: &str,
    path: &str,
    idem: Option<&str>,
    body: &Value,
) -> Answer {
    let mut req = http
        .post(format!("{gateway}{path}"))
        .bearer_auth(key)
        .json(body);
    if let Some(k) = idem {
        req = req.header("Idempotency-Key", k);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    Answer {
        status,
        replayed,
        text: r.text().await.unwrap(),
    }
}

fn chat(stream: bool, content: &str) -> Value {
    json!({"model": "g-std", "max_tokens": 50, "stream": stream,
           "messages": [{"role": "user", "content": content}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_retry_replays_the_first_answer_without_a_second_call() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let other = match b.redis_url {
        Some(_) => Some(Sluice::start(&b, opts(&mock)).await),
        None => None,
    };
    let (org, _, key) = s.org_and_key().await;
    if let Some(o) = &other {
        o.wait_for_key(&key).await;
    }
    let path = "/v1/chat/completions";

    // Whole answers.
    let first = send(&s, &key, path, Some("k-whole"), &chat(false, "hi")).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert!(!first.replayed);
    let again = send(&s, &key, path, Some("k-whole"), &chat(false, "hi")).await;
    assert_eq!((again.status, again.replayed), (200, true));
    assert_eq!(again.text, first.text, "the same answer, byte for byte");
    assert_eq!(mock.count("o1"), 1, "one provider call");

    // Streams replay their frames.
    let first = send(&s, &key, path, Some("k-stream"), &chat(true, "hi")).await;
    assert_eq!(first.status, 200);
    assert!(first.text.contains("data: [DONE]"), "{}", first.text);
    let again = send(&s, &key, path, Some("k-stream"), &chat(true, "hi")).await;
    assert!(again.replayed);
    assert_eq!(again.text, first.text);
    assert_eq!(mock.count("o1"), 2);

    // The responses route too.
    let body = json!({"model": "g-std", "input": "hi", "max_output_tokens": 50});
    let first = send(&s, &key, "/v1/responses", Some("k-resp"), &body).await;
    assert_eq!(first.status, 200, "{}", first.text);
    let again = send(&s, &key, "/v1/responses", Some("k-resp"), &body).await;
    assert_eq!((again.replayed, &again.text), (true, &first.text));
    assert_eq!(mock.count("o1"), 3);

    // Another instance replays it as well.
    if let Some(o) = &other {
        let again = send(o, &key, path, Some("k-whole"), &chat(false, "hi")).await;
        assert!(again.replayed, "{}", again.text);
        assert_eq!(mock.count("o1"), 3);
    }

    // Charged once per key: three calls' worth, whatever the retries.
    let events = loop {
        let (_, v) = s
            .get("/api/gateway/usage/events?limit=50", Some(&key))
            .await;
        let n = v["data"].as_array().unwrap().len();
        if n >= 3 {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, v) = s
        .get("/api/gateway/usage/events?limit=50", Some(&key))
        .await;
    assert_eq!(v["data"].as_array().unwrap().len(), events);
    assert_eq!(events, 3, "replays are not recorded or billed");
    assert!(s.balance_usd(&org).await < 10.0);

    // The same key with another body is a conflict; keys are per org.
    let other_body = send(&s, &key, path, Some("k-whole"), &chat(false, "bye")).await;
    let v: Value = serde_json::from_str(&other_body.text).unwrap();
    assert_error(other_body.status, &v, 409, "idempotency_conflict");
    let (_, _, key2) = s.org_and_key().await;
    let fresh = send(&s, &key2, path, Some("k-whole"), &chat(false, "bye")).await;
    assert_eq!((fresh.status, fresh.replayed), (200, false));

    // Messages does not honour the header: each call is new.
    let m = json!({"model": "g-std", "max_tokens": 50,
                   "messages": [{"role": "user", "content": "hi"}]});
    let before = mock.count("o1");
    for _ in 0..2 {
        let a = send(&s, &key, "/v1/messages", Some("k-msg"), &m).await;
        assert_eq!((a.status, a.replayed), (200, false), "{}", a.text);
    }
    assert_eq!(mock.count("o1"), before + 2);

    // A malformed key is a 400 naming the header.
    let long = "k".repeat(300);
    let bad = send(&s, &key, path, Some(&long), &chat(false, "hi")).await;
    let v: Value = serde_json::from_str(&bad.text).unwrap();
    assert_error(bad.status, &v, 400, "invalid_parameter");
    assert_eq!(v["error"]["param"], "Idempotency-Key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_wait_for_the_first_and_refusals_release_the_key() {
    let mock = Mock::start().await;
    mock.script("o1", vec![Step::DelayHeaders(Duration::from_millis(600))]);
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let other = match b.redis_url {
        Some(_) => Some(Sluice::start(&b, opts(&mock)).await),
        None => None,
    };
    let (_, _, key) = s.org_and_key().await;
    if let Some(o) = &other {
        o.wait_for_key(&key).await;
    }
    let second_gateway = other
        .as_ref()
        .map_or(s.gateway.clone(), |o| o.gateway.clone());
    let path = "/v1/chat/completions";
    let body = chat(true, "hi");
    let a = send(&s, &key, path, Some("dup"), &body);
    let b2 = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        send_to(
            &s.http,
            &second_gateway,
            &key,
            path,
            Some("dup"),
            &chat(true, "hi"),
        )
        .await
    };
    let (a, b2) = tokio::join!(a, b2);
    assert_eq!((a.status, b2.status), (200, 200));
    assert_eq!(a.text, b2.text);
    assert!(!a.replayed && b2.replayed);
    assert_eq!(mock.count("o1"), 1, "never two provider calls");

    // A request every rung refused is not kept: the retry runs anew and succeeds.
    mock.script("o1", vec![Step::Status(500)]);
    let failed = send(&s, &key, path, Some("retry-me"), &chat(false, "hi")).await;
    assert_eq!(failed.status, 502, "{}", failed.text);
    let ok = send(&s, &key, path, Some("retry-me"), &chat(false, "hi")).await;
    assert_eq!((ok.status, ok.replayed), (200, false), "{}", ok.text);
    let again = send(&s, &key, path, Some("retry-me"), &chat(false, "hi")).await;
    assert!(again.replayed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_lost_with_its_instance_cannot_be_replayed() {
    let mock = Mock::start().await;
    mock.script("o1", vec![Step::DelayHeaders(Duration::from_secs(5))]);
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, opts(&mock)).await;
    let (_, _, key) = s.org_and_key().await;
    let (http, gateway) = (s.http.clone(), s.gateway.clone());
    let k = key.clone();
    let pending = tokio::spawn(async move {
        let _ = http
            .post(format!("{gateway}/v1/chat/completions"))
            .bearer_auth(&k)
            .header("Idempotency-Key", "lost")
            .json(&chat(false, "hi"))
            .send()
            .await;
    });
    // The claim is taken once the provider has the request; then the instance dies.
    for _ in 0..100 {
        if mock.count("o1") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(mock.count("o1"), 1);
    drop(s);
    pending.abort();
    let s = Sluice::start(&b, opts(&mock)).await;
    let a = send(
        &s,
        &key,
        "/v1/chat/completions",
        Some("lost"),
        &chat(false, "hi"),
    )
    .await;
    let v: Value = serde_json::from_str(&a.text).unwrap();
    assert_error(a.status, &v, 409, "idempotency_replay_unavailable");
    assert_eq!(mock.count("o1"), 1, "the lost request is not sent again");
    // A new key works.
    let a = send(
        &s,
        &key,
        "/v1/chat/completions",
        Some("new"),
        &chat(false, "hi"),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_too_large_to_keep_is_not_replayed_nor_run_again() {
    let mock = Mock::start().await;
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        opts(&mock).env("SLUICE_LIMITS__IDEMPOTENCY_MAX_TAPE_BYTES", 64),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    let path = "/v1/chat/completions";
    for (idem, stream) in [("big-whole", false), ("big-stream", true)] {
        let before = mock.count("o1");
        let first = send(&s, &key, path, Some(idem), &chat(stream, "hi")).await;
        assert_eq!(first.status, 200, "{}", first.text);
        assert!(first.text.len() > 64, "the answer outgrows the cap");
        let again = send(&s, &key, path, Some(idem), &chat(stream, "hi")).await;
        let v: Value = serde_json::from_str(&again.text).unwrap();
        assert_error(again.status, &v, 409, "idempotency_replay_unavailable");
        assert_eq!(mock.count("o1"), before + 1, "no second provider call");
    }
}
