//! Typed configuration: built-in defaults, then the TOML file, then `SLUICE_`
//! environment overrides (section and key joined by `__`), validated once at start.
//! Everything else in the process reads this typed form, never the raw file.

use anyhow::{bail, Context};
use figment::providers::{Env, Format as _, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every provider name a rung may use.
pub const PROVIDERS: [&str; 10] = [
    "local",
    "openai",
    "anthropic",
    "google",
    "mistral",
    "azure",
    "bedrock",
    "vertex",
    "openrouter",
    "hosted",
];

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub admin: AdminConfig,
    pub catalog: CatalogConfig,
    pub providers: BTreeMap<String, ProviderConfig>,
    pub limits: LimitsConfig,
    pub responses: ResponsesConfig,
    pub probe: ProbeConfig,
    pub breaker: BreakerConfig,
    pub billing: BillingConfig,
    pub secrets: SecretsConfig,
    pub network: NetworkConfig,
}

/// Where org-supplied upstream URLs may point.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetworkConfig {
    /// Org-supplied base URLs (custom deployments, BYOK config, Vertex token_uri,
    /// trace pull sources) may reach loopback, private, link-local and metadata
    /// addresses, and may be plain http. Operator provider tables are trusted.
    pub allow_private_upstreams: bool,
}

/// The key that seals BYOK secrets at rest.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecretsConfig {
    /// Base64 of 32 random bytes; empty: use (or create) `key_file`.
    pub key: String,
    pub key_file: String,
}

impl Default for SecretsConfig {
    fn default() -> Self {
        SecretsConfig {
            key: String::new(),
            key_file: "data/secret.key".into(),
        }
    }
}

/// Platform limits that are not per provider: key guardrail defaults and org tiers.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BillingConfig {
    /// Guardrails of keys that set none of their own (absent: uncapped).
    pub key_defaults: KeyDefaults,
    /// A credit purchase of at least this much moves the org up one tier.
    pub tier_up_purchase_usd: f64,
    /// The org tiers, tier 0 first; an org above the last takes the last.
    pub tiers: Vec<TierConfig>,
    /// Requests per minute one org may send on every lane together (its own
    /// provider keys and deployments included); 0: uncapped.
    pub org_requests_per_minute_all_lanes: i64,
    /// Requests one org may have in flight at once, on every lane; 0: uncapped.
    pub org_concurrency_all_lanes: i64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KeyDefaults {
    pub daily_spend_cap_usd: Option<f64>,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    /// Requests one key may have in flight at once, on every lane (keys set none
    /// of their own); 0: uncapped.
    pub concurrency: i64,
}

/// One tier's platform-funded limits, counted across all the org's keys; absent is
/// uncapped. Token windows count cached input at its price weight.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierConfig {
    pub requests_per_minute: Option<i64>,
    pub tokens_per_minute: Option<i64>,
    pub tokens_per_hour: Option<i64>,
    pub tokens_per_day: Option<i64>,
}

impl Default for BillingConfig {
    fn default() -> Self {
        let tier = |rpm, tpm, tph, tpd| TierConfig {
            requests_per_minute: Some(rpm),
            tokens_per_minute: Some(tpm),
            tokens_per_hour: Some(tph),
            tokens_per_day: Some(tpd),
        };
        BillingConfig {
            key_defaults: KeyDefaults {
                concurrency: 64,
                ..KeyDefaults::default()
            },
            tier_up_purchase_usd: 5.0,
            tiers: vec![
                tier(60, 200_000, 2_000_000, 10_000_000),
                tier(500, 2_000_000, 30_000_000, 200_000_000),
                tier(5_000, 20_000_000, 300_000_000, 2_000_000_000),
                TierConfig::default(),
            ],
            org_requests_per_minute_all_lanes: 60_000,
            org_concurrency_all_lanes: 256,
        }
    }
}

impl BillingConfig {
    /// The limits of a tier (the last one past the end; uncapped when none).
    pub fn tier(&self, tier: i64) -> TierConfig {
        let i = usize::try_from(tier.max(0)).unwrap_or(usize::MAX);
        self.tiers
            .get(i)
            .or(self.tiers.last())
            .cloned()
            .unwrap_or_default()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: String,
    pub web_listen: String,
    pub ops_listen: String,
    pub public_base_url: String,
    pub public_web_url: String,
    /// Trusted edge header with the client's ISO country; empty: unverifiable.
    pub client_country_header: String,
    /// Worker threads of the gateway service; 0 means one per core.
    pub threads: usize,
    /// How long SIGTERM lets open requests finish before the process exits.
    pub grace_period_seconds: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    pub database_url: String,
    /// Empty: in-process counters, one instance only.
    pub redis_url: String,
    /// A local file where usage events that cannot be written wait for the database;
    /// they are replayed, exactly once, as soon as it answers again.
    pub usage_spool: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Bearer token of /admin; empty disables /admin.
    pub token: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CatalogConfig {
    pub path: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProviderConfig {
    pub base_url: String,
    /// The environment variable holding the platform credential.
    pub api_key_env: String,
    pub connect_timeout_ms: u64,
    pub header_timeout_ms: u64,
    pub first_token_timeout_ms: u64,
    /// Silence between chunks once content flowed; past it the stream settles as a
    /// cut (SPEC Events 3). Any bytes, keep-alive pings included, reset it.
    pub stream_idle_timeout_ms: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    pub request_deadline_ms: u64,
    pub max_request_bytes: usize,
    pub max_response_bytes: usize,
    /// A stream whose first content is this slow gets its 200 header and SSE
    /// keep-alive comments early (fail-over stays invisible); 0 disables.
    pub early_header_ms: u64,
    /// How long an Idempotency-Key result is kept for replay.
    pub idempotency_ttl_seconds: u64,
}

/// The per-rung circuit breaker.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// Consecutive failures that open a rung's breaker.
    pub failure_threshold: u32,
    /// How long an open rung is skipped before one probe may try it.
    pub cooldown_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            cooldown_ms: 5_000,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResponsesConfig {
    /// The previous_response_id window, e.g. "24h" or "30d".
    pub retention: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProbeConfig {
    pub enabled: bool,
    /// How often the periodic probe runs.
    pub interval_seconds: u64,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            enabled: false,
            interval_seconds: 86_400,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".into(),
            web_listen: "127.0.0.1:8081".into(),
            ops_listen: "127.0.0.1:9090".into(),
            public_base_url: "http://127.0.0.1:8080".into(),
            public_web_url: "http://127.0.0.1:8081".into(),
            client_country_header: String::new(),
            threads: 0,
            grace_period_seconds: 30,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            database_url: "sqlite://data/sluice.db".into(),
            redis_url: String::new(),
            usage_spool: "data/usage-spool.jsonl".into(),
        }
    }
}

impl Default for CatalogConfig {
    fn default() -> Self {
        CatalogConfig {
            path: "conf/catalog.toml".into(),
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            request_deadline_ms: 600_000,
            max_request_bytes: 32 * 1024 * 1024,
            max_response_bytes: 64 * 1024 * 1024,
            early_header_ms: 10_000,
            idempotency_ttl_seconds: 86_400,
        }
    }
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        ResponsesConfig {
            retention: "30d".into(),
        }
    }
}

/// The built-in endpoint and credential variable of each provider.
fn provider_default(name: &str) -> ProviderConfig {
    let (base_url, api_key_env) = match name {
        "openai" => ("https://api.openai.com/v1", "OPENAI_API_KEY"),
        "anthropic" => ("https://api.anthropic.com", "ANTHROPIC_API_KEY"),
        "google" => (
            "https://generativelanguage.googleapis.com",
            "GEMINI_API_KEY",
        ),
        "mistral" => ("https://api.mistral.ai/v1", "MISTRAL_API_KEY"),
        "azure" => ("", "AZURE_OPENAI_API_KEY"),
        "bedrock" => (
            "https://bedrock-runtime.us-east-1.amazonaws.com",
            "AWS_SECRET_ACCESS_KEY",
        ),
        "vertex" => (
            "https://us-central1-aiplatform.googleapis.com",
            "GOOGLE_APPLICATION_CREDENTIALS",
        ),
        "openrouter" => ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
        "hosted" => ("http://127.0.0.1:8000/v1", "SLUICE_HOSTED_API_KEY"),
        _ => ("http://127.0.0.1:11434/v1", ""),
    };
    ProviderConfig {
        base_url: base_url.into(),
        api_key_env: api_key_env.into(),
        connect_timeout_ms: 5_000,
        header_timeout_ms: 30_000,
        first_token_timeout_ms: 60_000,
        stream_idle_timeout_ms: 60_000,
    }
}

impl Config {
    /// Loads defaults, then `path` (or `conf/sluice.toml` if it exists), then the
    /// environment, and validates the result.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Config> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        match path {
            Some(p) => {
                if !p.exists() {
                    bail!("config file {} does not exist", p.display());
                }
                fig = fig.merge(Toml::file(p));
            }
            None => {
                let p = PathBuf::from("conf/sluice.toml");
                if p.exists() {
                    fig = fig.merge(Toml::file(p));
                }
            }
        }
        fig = fig.merge(Env::prefixed("SLUICE_").split("__"));
        let mut config: Config = fig.extract().context("invalid configuration")?;
        config.complete()?;
        Ok(config)
    }

    /// Fills every provider table from the built-in one and checks values.
    fn complete(&mut self) -> anyhow::Result<()> {
        for name in self.providers.keys() {
            if !PROVIDERS.contains(&name.as_str()) {
                bail!("[providers.{name}]: unknown provider (known: {PROVIDERS:?})");
            }
        }
        for name in PROVIDERS {
            let d = provider_default(name);
            let p = self.providers.entry(name.to_string()).or_default();
            if p.base_url.is_empty() {
                p.base_url = d.base_url;
            }
            if p.api_key_env.is_empty() {
                p.api_key_env = d.api_key_env;
            }
            for (v, dv) in [
                (&mut p.connect_timeout_ms, d.connect_timeout_ms),
                (&mut p.header_timeout_ms, d.header_timeout_ms),
                (&mut p.first_token_timeout_ms, d.first_token_timeout_ms),
                (&mut p.stream_idle_timeout_ms, d.stream_idle_timeout_ms),
            ] {
                if *v == 0 {
                    *v = dv;
                }
            }
            p.base_url = p.base_url.trim_end_matches('/').to_string();
        }
        for (key, addr) in [
            ("server.listen", &self.server.listen),
            ("server.web_listen", &self.server.web_listen),
            ("server.ops_listen", &self.server.ops_listen),
        ] {
            addr.parse::<SocketAddr>().with_context(|| {
                format!("{key} = {addr:?} is not an address like 127.0.0.1:8080")
            })?;
        }
        parse_duration(&self.responses.retention).context("responses.retention")?;
        let d = &self.billing.key_defaults;
        if d.daily_spend_cap_usd.is_some_and(|v| v.is_nan() || v < 0.0)
            || d.rpm.is_some_and(|v| v < 0)
            || d.tpm.is_some_and(|v| v < 0)
        {
            bail!("billing.key_defaults: guardrails must not be negative");
        }
        let up = self.billing.tier_up_purchase_usd;
        if up.is_nan() || up <= 0.0 {
            bail!("billing.tier_up_purchase_usd must be positive");
        }
        if self.limits.max_request_bytes == 0 || self.limits.max_response_bytes == 0 {
            bail!("limits: byte caps must be positive");
        }
        if !(self.storage.database_url.starts_with("sqlite:")
            || self.storage.database_url.starts_with("postgres://")
            || self.storage.database_url.starts_with("postgresql://"))
        {
            bail!("storage.database_url must start with sqlite: or postgres://");
        }
        Ok(())
    }

    pub fn gateway_threads(&self) -> usize {
        if self.server.threads > 0 {
            self.server.threads
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }
}

/// Parses "90s", "15m", "24h", "30d" (a bare number is seconds).
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .with_context(|| format!("{s:?} is not a duration like 24h or 30d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => bail!("{s:?}: unit must be s, m, h or d"),
    };
    if secs == 0 {
        bail!("{s:?}: a duration must be positive");
    }
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
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
    fn defaults_are_complete() {
        let mut c = Config::default();
        c.complete().unwrap();
        assert_eq!(c.providers.len(), PROVIDERS.len());
        assert_eq!(c.providers["openai"].base_url, "https://api.openai.com/v1");
        assert_eq!(c.providers["openai"].header_timeout_ms, 30_000);
    }
}
