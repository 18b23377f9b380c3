use super::*;

#[test]
fn durations() {
    assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86_400));
    assert_eq!(
        parse_duration("30d").unwrap(),
        Duration::from_secs(2_592_000)
    );
    assert!(parse_duration("3w").is_err());
    assert!(parse_duration("0s").is_err());
}

#[test]
fn only_config_keys_are_known() {
    let tree = known_keys();
    for k in [
        "server",
        "storage.database_url",
        "providers.openai.base_url",
        "providers.hosted.api_key_env",
        "billing.key_defaults.rpm",
        "billing.tiers",
        "network.allow_private_upstreams",
        "search.backend",
        "responses.prompt_capture_default",
        "observability.log_format",
    ] {
        assert!(key_is_known(&tree, k), "{k}");
    }
    // What orchestrators and the test scripts put beside them.
    for k in [
        "service_host",
        "service_port",
        "port",
        "port_8080_tcp_addr",
        "test_redis_url",
        "test_database_url",
        "hosted_api_key",
        "server.listen.extra",
        "providers.nosuch.base_url",
    ] {
        assert!(!key_is_known(&tree, k), "{k}");
    }
}

#[test]
fn a_contract_file_loads_and_its_paths_resolve_against_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("etc");
    std::fs::create_dir(&conf).unwrap();
    let file = conf.join("sluice.toml");
    std::fs::write(
        &file,
        r#"
[storage]
database_url = "sqlite://state/sluice.db?mode=rwc"
usage_spool = "state/spool.jsonl"
objects = "file://objects"
s3_endpoint = ""
signing_secret_env = "GATEWAY_SIGNING_SECRET"
[catalog]
path = "catalog.toml"
[secrets]
key_file = "/abs/secret.key"
[search]
backend = "none"
fee_usd = 0.007
[tool_search]
max_rounds = 3
[responses]
retention = "30d"
prompt_capture_default = false
[telemetry]
ticket_ttl = "2h"
[email]
smtp_url = "smtps://u:p@mail:465"
[signup]
enabled = false
[web]
cookie_secure = true
[payments]
provider = "stripe"
[network]
allow_private_upstreams = true
[observability]
log_format = "json"
"#,
    )
    .unwrap();
    let c = Config::load(Some(&file)).unwrap();
    let base = std::path::absolute(&conf).unwrap();
    assert_eq!(
        c.storage.database_url,
        format!(
            "sqlite://{}?mode=rwc",
            base.join("state/sluice.db").display()
        )
    );
    assert_eq!(
        c.catalog.path,
        base.join("catalog.toml").display().to_string()
    );
    assert_eq!(
        c.storage.usage_spool,
        base.join("state/spool.jsonl").display().to_string()
    );
    assert_eq!(
        c.storage.objects,
        format!("file://{}", base.join("objects").display())
    );
    assert_eq!(c.secrets.key_file, "/abs/secret.key");
    assert!(!c.responses.prompt_capture_default);
    assert!(!c.signup.enabled && c.web.cookie_secure);
    assert_eq!(c.payments.provider, "stripe");
    assert_eq!(c.observability.log_format, "json");
    assert!(c.network.allow_private_upstreams);
    // Keys the file does not set keep their (contract) defaults.
    assert_eq!(c.search.timeout_ms, 3_000);
    assert_eq!(c.telemetry.max_upload_bytes, 52_428_800);
    assert_eq!(c.email.from, "sluice <no-reply@localhost>");
}

#[test]
fn the_admin_token_can_come_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin-token"), "tok-from-file\n").unwrap();
    let file = dir.path().join("sluice.toml");
    std::fs::write(&file, "[admin]\ntoken_file = \"admin-token\"\n").unwrap();
    let c = Config::load(Some(&file)).unwrap();
    assert_eq!(c.admin.token, "tok-from-file");
    assert!(!format!("{c:?}").contains("tok-from-file"));
    std::fs::write(
        &file,
        "[admin]\ntoken = \"x\"\ntoken_file = \"admin-token\"\n",
    )
    .unwrap();
    assert!(Config::load(Some(&file)).is_err(), "one or the other");
    std::fs::write(&file, "[admin]\ntoken_file = \"missing\"\n").unwrap();
    assert!(Config::load(Some(&file)).is_err());
    std::fs::write(&file, "[server]\ntls_cert = \"c.pem\"\n").unwrap();
    assert!(Config::load(Some(&file)).is_err(), "a cert needs its key");
    std::fs::write(&file, "[observability]\nlog_format = \"xml\"\n").unwrap();
    assert!(Config::load(Some(&file)).is_err());
}

/// L10 of the 2026-12-01 security review: an admin token others can reach is
/// long; a short one is refused past loopback.
#[test]
fn a_short_admin_token_is_refused_on_an_ops_listener_past_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sluice.toml");
    let conf = |listen: &str, token: &str| {
        format!("[server]\nops_listen = \"{listen}\"\n[admin]\ntoken = \"{token}\"\n")
    };
    std::fs::write(&file, conf("0.0.0.0:9090", "short-token")).unwrap();
    let e = Config::load(Some(&file)).unwrap_err();
    assert!(format!("{e:#}").contains("32 characters"), "{e:#}");
    std::fs::write(&file, conf("0.0.0.0:9090", &"k".repeat(32))).unwrap();
    assert!(Config::load(Some(&file)).is_ok());
    std::fs::write(&file, conf("127.0.0.1:9090", "short-token")).unwrap();
    assert!(
        Config::load(Some(&file)).is_ok(),
        "loopback: a warning only"
    );
}

#[test]
fn debug_never_shows_secrets() {
    let mut c = Config::default();
    c.admin.token = "admin-token-abc".into();
    c.secrets.key = "c2VjcmV0LWtleS1ieXRlcw==".into();
    c.email.smtp_url = "smtps://user:hunter2@mail:465".into();
    c.storage.database_url = "postgres://app:pg-pass-9@db.internal/sluice".into();
    c.storage.redis_url = "redis://:redis-pass-7@cache:6379/0".into();
    let shown = format!("{c:?}");
    assert!(shown.contains("db.internal/sluice"), "{shown}");
    for secret in [
        "admin-token-abc",
        "c2VjcmV0LWtleS1ieXRlcw==",
        "hunter2",
        "pg-pass-9",
        "redis-pass-7",
    ] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    assert!(shown.contains("<redacted>"));
}

#[test]
fn the_hosted_credential_variable_is_outside_the_config_prefix() {
    let mut c = Config::default();
    c.complete().unwrap();
    for p in c.providers.values() {
        assert!(!p.api_key_env.starts_with("SLUICE_"), "{}", p.api_key_env);
    }
}

#[test]
fn defaults_are_complete() {
    let mut c = Config::default();
    c.complete().unwrap();
    assert_eq!(c.providers.len(), PROVIDERS.len());
    assert_eq!(c.providers["openai"].base_url, "https://api.openai.com/v1");
    assert_eq!(c.providers["openai"].header_timeout_ms, 30_000);
}

/// `conf/sluice.toml` writes the built-in defaults out: every value it sets is the
/// default's, and every key of the defaults' sections (other than the providers',
/// whose file entries are examples) is written there, so the file and the
/// `impl Default`s cannot drift apart.
#[test]
fn the_shipped_config_file_is_the_defaults() {
    fn leaves(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, serde_json::Value)>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    leaves(&key, v, out);
                }
            }
            other => out.push((prefix.to_string(), other.clone())),
        }
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/sluice.toml");
    let file: toml::Value = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let file = serde_json::to_value(file).unwrap();
    let defaults = serde_json::to_value(Config::default()).unwrap();
    let (mut in_file, mut in_defaults) = (Vec::new(), Vec::new());
    leaves("", &file, &mut in_file);
    leaves("", &defaults, &mut in_defaults);
    let lookup = |key: &str| -> Option<&serde_json::Value> {
        key.split('.').try_fold(&defaults, |v, k| v.get(k))
    };
    // Paths in the file are relative to its folder (`conf/`): `../data/x` is the
    // default's `data/x`. The file names the catalog beside it, which is the
    // embedded one (the default, "").
    let rebased = |v: &serde_json::Value| -> serde_json::Value {
        match v.as_str() {
            Some(s) => serde_json::Value::String(s.replacen("../", "", 1)),
            None => v.clone(),
        }
    };
    // A tier with no limits is nulls in the defaults and an empty table in TOML.
    let no_nulls = |v: &serde_json::Value| -> serde_json::Value {
        let mut v = v.clone();
        if let Some(tiers) = v.as_array_mut() {
            for t in tiers.iter_mut().filter_map(|t| t.as_object_mut()) {
                t.retain(|_, x| !x.is_null());
            }
        }
        v
    };
    let mut differ = Vec::new();
    for (key, value) in &in_file {
        if key.starts_with("providers.") || key == "catalog.path" {
            continue;
        }
        let value = rebased(value);
        match lookup(key).map(no_nulls) {
            Some(d) if d == value || (d.as_f64().is_some() && d.as_f64() == value.as_f64()) => {}
            d => differ.push(format!("{key}: file {value}, default {d:?}")),
        }
    }
    assert!(
        differ.is_empty(),
        "conf/sluice.toml differs from the defaults:\n{}",
        differ.join("\n")
    );
    let file_keys: std::collections::BTreeSet<&str> =
        in_file.iter().map(|(k, _)| k.as_str()).collect();
    let missing: Vec<&str> = in_defaults
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !k.starts_with("providers.") && !file_keys.contains(k))
        // An unset option (no TOML form) is written as a comment.
        .filter(|k| lookup(k).is_some_and(|v| !v.is_null()))
        .collect();
    assert!(
        missing.is_empty(),
        "keys of the defaults not in conf/sluice.toml: {missing:?}"
    );
}
