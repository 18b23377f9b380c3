//! The catalog as a client reads it: org-scoped listings with pricing, filters,
//! sorting and pages, the shipped catalog loads, and a platform rung's base URL is
//! never shown.

mod harness;

use harness::{assert_error, model_list, repo_path, slugs, Backend, Opts, Sluice};
use reqwest::Method;
use serde_json::{json, Value};

fn fixture() -> Opts {
    Opts::default().catalog(repo_path("tests/fixtures/catalog.toml"))
}

#[tokio::test]
async fn model_listing_is_org_scoped_with_pricing() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let (org, _, key) = s.org_and_key().await;
    let (st, v) = s.get("/v1/models", Some(&key)).await;
    assert_eq!(st, 200);
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["alpha-1.0", "beta-2.5", "embed-small", "gamma-3"],
        "restricted secret-1 hidden"
    );
    let alpha = &v["data"][0];
    assert_eq!(alpha["object"], "model");
    assert_eq!(alpha["owned_by"], "openai");
    assert!(alpha["created"].as_i64().unwrap() > 1_600_000_000);
    assert_eq!(alpha["pricing"]["input_micro_usd_per_million"], 1_000_000);
    assert_eq!(
        alpha["pricing"]["cached_input_micro_usd_per_million"],
        250_000
    );
    assert_eq!(alpha["pricing"]["output_micro_usd_per_million"], 4_000_000);
    // The unprefixed twin and the single-model read.
    let (st, twin) = s.get("/models", Some(&key)).await;
    assert_eq!((st, &twin), (200, &v));
    let (st, one) = s.get("/v1/models/alpha-1.0", Some(&key)).await;
    assert_eq!((st, &one), (200, alpha));
    let (st, e) = s.get("/v1/models/secret-1", Some(&key)).await;
    assert_error(st, &e, 404, "not_found");
    // A grant makes the restricted model visible, on this instance at once.
    let (st, _) = s
        .admin(
            Method::PUT,
            &format!("/admin/orgs/{org}/grants"),
            Some(json!({"slugs": ["secret-1"]})),
        )
        .await;
    assert_eq!(st, 200);
    let (_, v) = s.get("/v1/models", Some(&key)).await;
    assert!(v["data"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["id"] == "secret-1"));
}

#[tokio::test]
async fn catalog_reads_filter_sort_page_and_fold_retention() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, fixture()).await;
    let (st, all) = model_list(&s, "").await;
    assert_eq!(st, 200);
    assert_eq!(all["total"], 5, "keyless list shows public rows: {all}");
    let alpha = &all["data"][0];
    assert_eq!(alpha["slug"], "alpha-1.0");
    assert_eq!(alpha["retention"], "zdr_all_rungs");
    assert_eq!(alpha["context_window"], 128000);
    assert_eq!(alpha["max_input_tokens"], 120000);
    assert_eq!(alpha["pricing"]["input_micro_usd_per_million"], 1_000_000);
    assert_eq!(alpha["providers"][1]["rung_id"], "azure:alpha-b");

    for (q, want) in [
        (
            "?retention=zdr_all_rungs",
            vec!["alpha-1.0", "embed-small", "secret-1"],
        ),
        (
            "?retention=zdr_enforceable",
            vec!["alpha-1.0", "beta-2.5", "embed-small", "secret-1"],
        ),
        ("?retention=not_zdr", vec!["gamma-3"]),
        ("?modality=image", vec!["alpha-1.0"]),
        ("?category=reasoning", vec!["beta-2.5", "secret-1"]),
        ("?provider=openrouter", vec!["beta-2.5"]),
        ("?min_context=100000", vec!["alpha-1.0", "beta-2.5"]),
        (
            "?max_input_price=1000000",
            vec!["alpha-1.0", "embed-small", "gamma-3"],
        ),
        ("?max_output_price=600000&kind=chat", vec!["gamma-3"]),
        ("?kind=embedding", vec!["embed-small"]),
        (
            "?sort=-context_window&limit=2",
            vec!["beta-2.5", "alpha-1.0"],
        ),
        (
            "?sort=input_price&limit=2&offset=1",
            vec!["gamma-3", "alpha-1.0"],
        ),
    ] {
        let (st, v) = model_list(&s, q).await;
        assert_eq!(st, 200, "{q}: {v}");
        assert_eq!(slugs(&v), want, "{q}");
    }
    let (_, paged) = model_list(&s, "?sort=input_price&limit=2&offset=1").await;
    assert_eq!(paged["total"], 5);
    for (q, param) in [
        ("?retention=some", "retention"),
        ("?min_context=big", "min_context"),
        ("?limit=0", "limit"),
        ("?sort=vibes", "sort"),
        ("?colour=red", "colour"),
    ] {
        let (st, v) = model_list(&s, q).await;
        assert_error(st, &v, 400, "invalid_parameter");
        assert_eq!(v["error"]["param"], param, "{q}");
    }

    let r = s
        .http
        .get(format!("{}/api/models/beta-2.5", s.gateway))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let beta: Value = r.json().await.unwrap();
    assert_eq!(beta["retention"], "zdr_enforceable");
    assert_eq!(
        beta["default_waterfall"],
        json!(["anthropic:beta-a", "openrouter:vendor/beta-b"])
    );
    assert_eq!(beta["providers"][0]["provider_model_id"], "beta-a");
    let r = s
        .http
        .get(format!("{}/api/models/beta-2.5/providers", s.gateway))
        .send()
        .await
        .unwrap();
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["data"].as_array().unwrap().len(), 2);
    assert_eq!(p["data"][1]["provider"], "openrouter");
    let r = s
        .http
        .get(format!("{}/api/models/nope-1", s.gateway))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "not_found"
    );
    // A bad key on a keyless read is still refused.
    let r = s
        .http
        .get(format!("{}/api/models", s.gateway))
        .bearer_auth("xpl_bad")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn the_shipped_catalog_is_real_and_loads() {
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, Opts::default()).await;
    let (_, chat) = model_list(&s, "?kind=chat&limit=1000").await;
    let (_, emb) = model_list(&s, "?kind=embedding&limit=1000").await;
    assert!(chat["total"].as_u64().unwrap() >= 12, "{chat}");
    assert!(emb["total"].as_u64().unwrap() >= 3, "{emb}");
    let makers: std::collections::HashSet<_> = chat["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["owned_by"].as_str().unwrap().to_string())
        .collect();
    assert!(makers.len() >= 4, "{makers:?}");
    for m in chat["data"].as_array().unwrap() {
        assert!(!m["providers"].as_array().unwrap().is_empty());
        assert!(m["context_window"].as_u64().unwrap() >= m["max_input_tokens"].as_u64().unwrap());
    }
    let verdicts: std::collections::HashSet<_> = chat["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["retention"].to_string())
        .collect();
    assert!(
        verdicts.len() >= 3,
        "all three verdicts occur: {verdicts:?}"
    );
}

#[tokio::test]
async fn platform_rung_base_urls_are_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("catalog.toml");
    let mut text = std::fs::read_to_string(repo_path("tests/fixtures/catalog.toml")).unwrap();
    text.push_str(
        "\n[[model]]\nslug = \"inner-1.0\"\ndisplay_name = \"Inner\"\nkind = \"chat\"\n\
         owned_by = \"meta\"\ncontext_window = 8192\nmax_input_tokens = 8192\n\
         modalities = [\"text\"]\nsupported_params = [\"max_tokens\"]\n\
         price = { input = 1, cached_input = 1, output = 1 }\ncategory = \"general\"\n\
         max_output_tokens = 1024\n\n[[model.rung]]\nprovider = \"hosted\"\n\
         provider_model_id = \"inner\"\nbase_url = \"http://gpu-7.corp.internal:8000/v1\"\n",
    );
    std::fs::write(&catalog, text).unwrap();
    let b = Backend::fresh().await;
    let s = Sluice::start(&b, Opts::default().catalog(catalog.display())).await;
    let (_, _, key) = s.org_and_key().await;
    for (path, key) in [
        ("/api/models/inner-1.0/providers", None),
        ("/api/models/inner-1.0/providers", Some(key.as_str())),
        ("/api/models/inner-1.0", None),
        ("/api/models?limit=1000", None),
    ] {
        let r = s.get(path, key).await;
        assert_eq!(r.0, 200, "{path}: {}", r.1);
        assert!(
            !r.1.to_string().contains("gpu-7.corp.internal"),
            "{path}: {}",
            r.1
        );
    }
}
