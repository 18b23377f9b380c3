//! What one org may hold of what every instance keeps or serves for it (the
//! 2026-12-01 security review, H3): its own models and their deployments, the
//! size of a model row, and the keys its members mint. Past each bound the next
//! write is refused with a 400 that names the limit, and nothing is stored.

mod harness;

use harness::web::Web;
use harness::{assert_error, Backend, Opts, Sluice};
use serde_json::{json, Value};

async fn api(
    s: &Sluice,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Value,
) -> (u16, Value) {
    let r = s
        .http
        .request(method, format!("{}{path}", s.gateway))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

fn model(slug: &str, deployments: usize) -> Value {
    let providers: Vec<Value> = (0..deployments)
        .map(|i| json!({"provider": "openai", "provider_model_id": format!("m{i}")}))
        .collect();
    json!({"slug": slug, "display_name": slug, "providers": providers})
}

#[tokio::test]
async fn an_org_holds_at_most_its_models_and_deployments() {
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        Opts::default()
            .env("SLUICE_LIMITS__CUSTOM_MODELS_PER_ORG", "3")
            .env("SLUICE_LIMITS__DEPLOYMENTS_PER_MODEL", "2"),
    )
    .await;
    let (_, _, key) = s.org_and_key().await;
    let post = reqwest::Method::POST;
    for i in 0..3 {
        let (st, v) = api(
            &s,
            post.clone(),
            "/api/models",
            &key,
            model(&format!("own-{i}"), 1),
        )
        .await;
        assert_eq!(st, 201, "{v}");
    }
    let (st, v) = api(&s, post.clone(), "/api/models", &key, model("own-3", 1)).await;
    assert_error(st, &v, 400, "invalid_request");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("custom_models_per_org") && msg.contains('3'),
        "{msg}"
    );
    // Nothing of the refused one was stored.
    let (st, list) = s.get("/api/models", Some(&key)).await;
    assert_eq!(st, 200);
    let own: Vec<&Value> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["custom"] == true)
        .collect();
    assert_eq!(own.len(), 3, "{list}");

    // Deployments: at creation and when added.
    let other = Sluice::start(
        &b,
        Opts::default().env("SLUICE_LIMITS__DEPLOYMENTS_PER_MODEL", "2"),
    )
    .await;
    let (_, _, key2) = other.org_and_key().await;
    let (st, v) = api(&other, post.clone(), "/api/models", &key2, model("wide", 3)).await;
    assert_error(st, &v, 400, "invalid_request");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("deployments_per_model"));
    let (st, v) = api(&other, post.clone(), "/api/models", &key2, model("pair", 2)).await;
    assert_eq!(st, 201, "{v}");
    let (st, v) = api(
        &other,
        post.clone(),
        "/api/models/pair/providers",
        &key2,
        json!({"provider": "openai", "provider_model_id": "m9"}),
    )
    .await;
    assert_error(st, &v, 400, "invalid_request");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("deployments_per_model"));
}

/// A model row is read into every instance's snapshot: its lists and names are
/// bounded too.
#[tokio::test]
async fn a_model_row_is_bounded_in_its_lists_and_names() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, Opts::default()).await;
    let (_, _, key) = s.org_and_key().await;
    let many: Vec<String> = (0..65).map(|i| format!("p{i}")).collect();
    for (body, param) in [
        (
            json!({"slug": "big-1", "display_name": "x", "supported_params": many,
                "providers": [{"provider": "openai", "provider_model_id": "m"}]}),
            "supported_params",
        ),
        (
            json!({"slug": "big-2", "display_name": "x".repeat(201),
                "providers": [{"provider": "openai", "provider_model_id": "m"}]}),
            "display_name",
        ),
        (
            json!({"slug": "big-3", "display_name": "x",
                "providers": [{"provider": "openai", "provider_model_id": "m".repeat(201)}]}),
            "providers",
        ),
        (
            json!({"slug": "big-4", "display_name": "x", "modalities": vec!["text"; 9],
                "providers": [{"provider": "openai", "provider_model_id": "m"}]}),
            "modalities",
        ),
    ] {
        let (st, v) = api(&s, reqwest::Method::POST, "/api/models", &key, body).await;
        assert_error(st, &v, 400, "invalid_parameter");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
}

#[tokio::test]
async fn members_mint_at_most_the_orgs_key_limit() {
    let b = Backend::fresh().await;
    let w = Web::start(&b, |o| o.env("SLUICE_LIMITS__KEYS_PER_ORG", "3")).await;
    // The signup's own key is the first.
    let m = w.sign_up_and_in("keys-limit@example.com").await;
    let mint = |name: &str| json!({"name": name});
    let post = reqwest::Method::POST;
    let mut minted = Vec::new();
    for i in 0..2 {
        let (st, v) = w
            .call(
                &m,
                post.clone(),
                "/api/session/keys",
                Some(mint(&format!("k{i}"))),
            )
            .await;
        assert_eq!(st, 201, "{v}");
        minted.push(v["api_key_id"].as_str().unwrap().to_string());
    }
    let (st, v) = w
        .call(&m, post.clone(), "/api/session/keys", Some(mint("k3")))
        .await;
    assert_error(st, &v, 400, "invalid_request");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("keys_per_org"));
    // A revoked key frees its place.
    let (st, _) = w
        .call(
            &m,
            reqwest::Method::DELETE,
            &format!("/api/session/keys/{}", minted[0]),
            None,
        )
        .await;
    assert_eq!(st, 204);
    let (st, v) = w
        .call(&m, post, "/api/session/keys", Some(mint("k3")))
        .await;
    assert_eq!(st, 201, "{v}");
}

const BOUNDARY: &str = "----sluice-quota-boundary";

async fn upload_file(s: &Sluice, key: &str, size: usize) -> (u16, Value) {
    let mut body = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nuser_data\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"data.txt\"\r\n\
         Content-Type: text/plain\r\n\r\n"
    )
    .into_bytes();
    body.extend(std::iter::repeat_n(b'x', size));
    body.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    let r = s
        .http
        .post(format!("{}/v1/files", s.gateway))
        .bearer_auth(key)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={BOUNDARY}"),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

/// M7 of the 2026-12-01 security review: what an org stores (files, telemetry
/// uploads and pulls) is bounded by its quota; past it the next one is refused
/// (429 `insufficient_quota`, `storage_quota_reached`), and a file that would pass
/// it is cut off as it arrives (413).
#[tokio::test]
async fn an_org_stores_at_most_its_quota_of_files_and_uploads() {
    let b = Backend::fresh().await;
    let s = Sluice::start(
        &b,
        Opts::default()
            .env("SLUICE_LIMITS__ORG_STORAGE_BYTES", "200000")
            .env("SLUICE_LIMITS__ORG_FILES", "2")
            .env("SLUICE_LIMITS__ORG_OPEN_TICKETS", "2")
            .env("GATEWAY_SIGNING_SECRET", "quota-test-secret"),
    )
    .await;
    let (org, _, key) = s.org_and_key().await;
    let (st, v) = upload_file(&s, &key, 120_000).await;
    assert_eq!(st, 200, "{v}");
    // 80,000 bytes are left: a larger file is cut off.
    let (st, v) = upload_file(&s, &key, 100_000).await;
    assert_error(st, &v, 413, "invalid_request");
    let (st, v) = upload_file(&s, &key, 50_000).await;
    assert_eq!(st, 200, "{v}");
    // Two files: the third is refused, however small.
    let (st, v) = upload_file(&s, &key, 10).await;
    assert_error(st, &v, 429, "insufficient_quota");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("storage_quota_reached"),
        "{v}"
    );

    // Upload tickets: at most two open at once.
    let ticket = format!("/api/orgs/{org}/telemetry/traces/upload");
    let body = json!({"source_kind": "chat-json", "source_label": "quota"});
    for _ in 0..2 {
        let (st, v) = s.post(&ticket, Some(&key), &body).await;
        assert_eq!(st, 201, "{v}");
    }
    let (st, v) = s.post(&ticket, Some(&key), &body).await;
    assert_error(st, &v, 429, "insufficient_quota");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("org_open_tickets"),
        "{v}"
    );
}
