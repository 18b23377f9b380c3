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
    pub search: SearchConfig,
    pub tool_search: ToolSearchConfig,
    pub telemetry: TelemetryConfig,
    pub batches: BatchesConfig,
    pub email: EmailConfig,
    pub signup: SignupConfig,
    pub web: WebConfig,
    pub payments: PaymentsConfig,
    pub observability: ObservabilityConfig,
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

// Sections of CONTRACT.md's second wave.

/// Service-run web search (`src/search`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SearchConfig {
    /// none | searxng | brave.
    pub backend: String,
    pub url: String,
    pub api_key_env: String,
    pub timeout_ms: u64,
    pub results: u32,
    pub fee_usd: f64,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            backend: "none".into(),
            url: String::new(),
            api_key_env: String::new(),
            timeout_ms: 3_000,
            results: 5,
            fee_usd: 0.007,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolSearchConfig {
    pub max_rounds: u32,
    pub max_results: u32,
}

impl Default for ToolSearchConfig {
    fn default() -> Self {
        ToolSearchConfig {
            max_rounds: 3,
            max_results: 5,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    pub max_upload_bytes: u64,
    pub ticket_ttl: String,
    pub braintrust_url: String,
    pub langsmith_url: String,
    pub langfuse_url: String,
    pub posthog_url: String,
    pub mastra_url: String,
    /// A pull's whole time, its pages and look-ups included; past it the pull
    /// is refused (504 `deadline_exceeded`) and what it read is dropped.
    pub pull_timeout_ms: u64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            max_upload_bytes: 52_428_800,
            ticket_ttl: "2h".into(),
            braintrust_url: "https://api.braintrust.dev".into(),
            langsmith_url: "https://api.smith.langchain.com".into(),
            langfuse_url: "https://cloud.langfuse.com".into(),
            posthog_url: "https://us.posthog.com".into(),
            mastra_url: String::new(),
            pull_timeout_ms: 60_000,
        }
    }
}

/// Files and batches (`src/batches`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BatchesConfig {
    /// The largest file `POST /v1/files` takes.
    pub max_file_bytes: u64,
    /// Batch lines this instance serves at once (its share of the instance; 0
    /// runs no lines here).
    pub concurrency: usize,
    /// How often the runner looks for work; with nothing anywhere, twice as far
    /// apart after each empty look, up to 8 polls.
    pub poll_ms: u64,
    /// How long a claimed line is this instance's before another may take it.
    pub lease_ms: u64,
    /// The share of a key's rpm and tpm a batch may use (live traffic keeps the rest).
    pub key_share: f64,
}

impl Default for BatchesConfig {
    fn default() -> Self {
        BatchesConfig {
            max_file_bytes: 209_715_200,
            concurrency: 8,
            poll_ms: 500,
            lease_ms: 300_000,
            key_share: 0.8,
        }
    }
}

/// Outgoing mail. `smtp_url` may carry a password: Debug redacts it.
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmailConfig {
    pub smtp_url: String,
    pub from: String,
}

impl std::fmt::Debug for EmailConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailConfig")
            .field("smtp_url", &redacted(&self.smtp_url))
            .field("from", &self.from)
            .finish()
    }
}

impl Default for EmailConfig {
    fn default() -> Self {
        EmailConfig {
            smtp_url: String::new(),
            from: "sluice <no-reply@localhost>".into(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SignupConfig {
    pub enabled: bool,
    pub credits_usd: f64,
    pub per_origin_per_hour: u32,
}

impl Default for SignupConfig {
    fn default() -> Self {
        SignupConfig {
            enabled: true,
            credits_usd: 0.0,
            per_origin_per_hour: 5,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    pub session_ttl: String,
    pub cookie_secure: bool,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            session_ttl: "30d".into(),
            cookie_secure: false,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PaymentsConfig {
    /// none | stripe.
    pub provider: String,
    pub api_base: String,
    pub secret_key_env: String,
    pub webhook_secret_env: String,
}

impl Default for PaymentsConfig {
    fn default() -> Self {
        PaymentsConfig {
            provider: "none".into(),
            api_base: "https://api.stripe.com".into(),
            secret_key_env: "STRIPE_SECRET_KEY".into(),
            webhook_secret_env: "STRIPE_WEBHOOK_SECRET".into(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObservabilityConfig {
    /// text | json.
    pub log_format: String,
    pub otlp_endpoint: String,
}

impl Default for ObservabilityConfig {
    fn default() -> Self {
        ObservabilityConfig {
            log_format: "text".into(),
            otlp_endpoint: String::new(),
        }
    }
}

/// The key that seals BYOK secrets at rest (Debug redacts it).
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecretsConfig {
    /// Base64 of 32 random bytes; empty: use (or create) `key_file`.
    pub key: String,
    pub key_file: String,
}

impl std::fmt::Debug for SecretsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsConfig")
            .field("key", &redacted(&self.key))
            .field("key_file", &self.key_file)
            .finish()
    }
}

impl std::fmt::Debug for StorageConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageConfig")
            .field("database_url", &without_userinfo(&self.database_url))
            .field("redis_url", &without_userinfo(&self.redis_url))
            .field("usage_spool", &self.usage_spool)
            .field("objects", &self.objects)
            .field("s3_endpoint", &self.s3_endpoint)
            .field("signing_secret_env", &self.signing_secret_env)
            .finish()
    }
}

/// A URL with its `user:password@` part replaced.
fn without_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find(['/', '?']).unwrap_or(rest.len());
            match rest[..end].rfind('@') {
                Some(at) => format!("{scheme}://<redacted>@{}", &rest[at + 1..]),
                None => url.to_string(),
            }
        }
        None => url.to_string(),
    }
}

/// What Debug shows of a secret: whether it is set, never its text.
fn redacted(secret: &str) -> &'static str {
    if secret.is_empty() {
        ""
    } else {
        "<redacted>"
    }
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
    /// Trusted edge header with the client's IP address (`cf-connecting-ip`,
    /// `x-real-ip`; of an `x-forwarded-for` list the last address, the one the
    /// edge added); empty, or absent from a request: the peer address. Set it
    /// only when every request comes through an edge that overwrites it.
    pub client_ip_header: String,
    /// Worker threads of the gateway service; 0 means one per core.
    pub threads: usize,
    /// How long SIGTERM lets open requests finish before the process exits.
    pub grace_period_seconds: u64,
    /// How long a gateway connection may wait idle for its next request; 0
    /// closes each connection after its answer. Behind a load balancer, set it
    /// above the balancer's own idle timeout, so the balancer never sends a
    /// request on a connection sluice is closing.
    pub keepalive_seconds: u64,
    /// A request head must arrive within this once its first byte has (gateway),
    /// or once the connection waits for it (web and ops, whose idle keep-alive
    /// counts against it): a client that stops mid-head is closed.
    pub header_timeout_ms: u64,
    /// Open client connections of the gateway listener at most; past it a new
    /// one is closed at accept. 0: the process's open-file limit less the web
    /// and ops caps and 512 for stores and providers.
    pub max_connections: usize,
    /// The same of the web listener and of the ops listener.
    pub web_max_connections: usize,
    pub ops_max_connections: usize,
    /// PEM certificate chain and private key: both set, the gateway and web
    /// listeners speak TLS (rustls) instead of plain HTTP.
    pub tls_cert: String,
    pub tls_key: String,
}

/// Debug hides the URLs' credentials (`postgres://user:pass@…`, `redis://:pass@…`).
#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    pub database_url: String,
    /// Empty: in-process counters, one instance only.
    pub redis_url: String,
    /// A local file where usage events that cannot be written wait for the database;
    /// they are replayed, exactly once, as soon as it answers again.
    pub usage_spool: String,
    /// Telemetry uploads, files, batch outputs: `file://dir` or `s3://bucket/prefix`.
    pub objects: String,
    /// An S3-compatible endpoint; empty: the AWS default chain.
    pub s3_endpoint: String,
    /// The variable holding the HMAC key of signed URLs.
    pub signing_secret_env: String,
    /// The longest one Redis call may take (request path, settlement, heartbeat,
    /// readiness); past it the call fails and the caller degrades as documented.
    pub redis_timeout_ms: u64,
    /// The longest a database call may wait for a connection (and a request-path
    /// query may take); past it the caller degrades as documented.
    pub database_timeout_ms: u64,
}

#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Bearer token of /admin; empty disables /admin. Debug redacts it.
    pub token: String,
    /// A file holding the token (a mounted secret), read once at start; set
    /// this or `token`, not both.
    pub token_file: String,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("token", &redacted(&self.token))
            .field("token_file", &self.token_file)
            .finish()
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CatalogConfig {
    /// The public catalog file; empty: the one built into the binary (the
    /// repository's conf/catalog.toml as of the build).
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
    /// Larger answers are not stored for replay (a retry gets 409
    /// `idempotency_replay_unavailable`): every stored row sits in the database.
    pub idempotency_max_tape_bytes: usize,
    /// The whole request body must arrive within this: a client that dribbles it
    /// (slowloris) is answered 408 and its connection closed.
    pub request_read_timeout_ms: u64,
    /// Models an org may create (`POST /api/models`); the next is refused.
    pub custom_models_per_org: usize,
    /// Deployments one of an org's models may have.
    pub deployments_per_model: usize,
    /// Live keys an org's members may hold (minted through the web app); an
    /// operator's admin API is not held to it.
    pub keys_per_org: usize,
    /// Bytes an org may store: its files and its telemetry uploads and pulls
    /// together; past it a new one is refused (429 `insufficient_quota`,
    /// `storage_quota_reached`).
    pub org_storage_bytes: u64,
    /// Files an org may hold.
    pub org_files: u64,
    /// Telemetry upload tickets an org may hold open (issued, not yet uploaded).
    pub org_open_tickets: u64,
    /// Inference requests an instance holds admitted and not yet committed (head
    /// read, first content not yet out); past it 429 `gateway_overloaded`. 0: 1,024
    /// per gateway thread.
    pub max_pending: usize,
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
    /// An org's prompt capture until it changes it.
    pub prompt_capture_default: bool,
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
            client_ip_header: String::new(),
            threads: 0,
            grace_period_seconds: 30,
            keepalive_seconds: 60,
            header_timeout_ms: 30_000,
            max_connections: 0,
            web_max_connections: 1_024,
            ops_max_connections: 64,
            tls_cert: String::new(),
            tls_key: String::new(),
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            database_url: "sqlite://data/sluice.db".into(),
            redis_url: String::new(),
            usage_spool: "data/usage-spool.jsonl".into(),
            objects: "file://data/objects".into(),
            s3_endpoint: String::new(),
            signing_secret_env: "GATEWAY_SIGNING_SECRET".into(),
            redis_timeout_ms: 80,
            database_timeout_ms: 2_000,
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
            idempotency_max_tape_bytes: 4 * 1024 * 1024,
            request_read_timeout_ms: 60_000,
            custom_models_per_org: 1_000,
            deployments_per_model: 32,
            keys_per_org: 1_000,
            org_storage_bytes: 5 * 1024 * 1024 * 1024,
            org_files: 10_000,
            org_open_tickets: 100,
            max_pending: 0,
        }
    }
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        ResponsesConfig {
            retention: "30d".into(),
            prompt_capture_default: true,
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
        "hosted" => ("http://127.0.0.1:8000/v1", "HOSTED_API_KEY"),
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

/// A provider's built-in public endpoint, where an org's own rung goes when it
/// names none: never the operator's configured `[providers.<name>] base_url`,
/// which may be an internal proxy that adds the platform's credential. Empty for
/// a provider with no public endpoint.
pub fn public_base_url(name: &str) -> String {
    let b = provider_default(name).base_url;
    if PROVIDERS.contains(&name) && b.starts_with("https://") {
        b
    } else {
        String::new()
    }
}

/// Whether a provider's built-in endpoint is a public one (https): `local`,
/// `hosted` and `azure` have none, so an org's deployment of them names its own.
pub fn has_public_endpoint(name: &str) -> bool {
    PROVIDERS.contains(&name) && provider_default(name).base_url.starts_with("https://")
}

/// The shortest admin token an ops listener past loopback accepts.
const MIN_ADMIN_TOKEN: usize = 32;

impl Config {
    /// Whether the web app's cookies are `Secure` (and its answers carry HSTS):
    /// `[web] cookie_secure`, or a public web URL that is https (a browser reaches
    /// it only over TLS, so a cookie sent in clear can only be an attacker's
    /// downgrade).
    pub fn web_cookies_secure(&self) -> bool {
        self.web.cookie_secure || self.server.public_web_url.starts_with("https://")
    }

    /// Loads defaults, then `path` (or `conf/sluice.toml` if it exists), then the
    /// environment, and validates the result. Relative paths the file sets resolve
    /// against the file's folder; `SLUICE_` variables that name no config key are
    /// ignored with one warning line.
    pub fn load(path: Option<&Path>) -> anyhow::Result<Config> {
        let file = match path {
            Some(p) => {
                if !p.exists() {
                    bail!("config file {} does not exist", p.display());
                }
                Some(p.to_path_buf())
            }
            None => Some(PathBuf::from("conf/sluice.toml")).filter(|p| p.exists()),
        };
        let known = known_keys();
        let env = Env::prefixed("SLUICE_").split("__");
        let unknown: Vec<String> = env
            .iter()
            .map(|(k, _)| k.as_str().to_string())
            .filter(|k| !key_is_known(&known, k))
            .map(|k| format!("SLUICE_{}", k.replace('.', "__").to_ascii_uppercase()))
            .collect();
        if !unknown.is_empty() {
            tracing::warn!(
                "ignoring environment variables that name no config key: {}",
                unknown.join(", ")
            );
        }
        // The filter sees the variable's own case; `iter` lower-cases later.
        let env = env.filter(move |k| key_is_known(&known, &k.as_str().to_ascii_lowercase()));
        let file_fig = file.as_ref().map(|f| Figment::from(Toml::file(f)));
        let env_fig = Figment::from(env.clone());
        let mut user = Figment::new();
        if let Some(f) = &file_fig {
            user = user.merge(f.clone());
        }
        user = user.merge(env);
        let fig = Figment::from(Serialized::defaults(Config::default())).merge(user);
        let mut config: Config = fig.extract().context("invalid configuration")?;
        if let (Some(file), Some(file_fig)) = (&file, &file_fig) {
            let from_file = |key: &str| file_fig.contains(key) && !env_fig.contains(key);
            config.rebase(&config_dir(file), from_file);
        }
        config.complete()?;
        Ok(config)
    }

    /// Resolves the relative paths the config file set against its folder.
    fn rebase(&mut self, dir: &Path, from_file: impl Fn(&str) -> bool) {
        if from_file("catalog.path") {
            self.catalog.path = rebase_path(dir, &self.catalog.path);
        }
        if from_file("storage.usage_spool") {
            self.storage.usage_spool = rebase_path(dir, &self.storage.usage_spool);
        }
        if from_file("secrets.key_file") {
            self.secrets.key_file = rebase_path(dir, &self.secrets.key_file);
        }
        for (key, path) in [
            ("admin.token_file", &mut self.admin.token_file),
            ("server.tls_cert", &mut self.server.tls_cert),
            ("server.tls_key", &mut self.server.tls_key),
        ] {
            if from_file(key) {
                *path = rebase_path(dir, path);
            }
        }
        if from_file("storage.database_url") && !self.storage.database_url.contains(":memory:") {
            let url = &self.storage.database_url;
            if let Some(rest) = url
                .strip_prefix("sqlite://")
                .or_else(|| url.strip_prefix("sqlite:"))
            {
                let (file, query) = rest.split_at(rest.find('?').unwrap_or(rest.len()));
                self.storage.database_url = format!("sqlite://{}{query}", rebase_path(dir, file));
            }
        }
        if from_file("storage.objects") {
            if let Some(rest) = self.storage.objects.strip_prefix("file://") {
                self.storage.objects = format!("file://{}", rebase_path(dir, rest));
            }
        }
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
        parse_duration(&self.web.session_ttl).context("web.session_ttl")?;
        if !matches!(self.payments.provider.as_str(), "none" | "stripe") {
            bail!(
                "payments.provider = {:?}: expected none or stripe",
                self.payments.provider
            );
        }
        let credits = self.signup.credits_usd;
        if credits.is_nan() || credits < 0.0 {
            bail!("signup.credits_usd must not be negative");
        }
        parse_duration(&self.telemetry.ticket_ttl).context("telemetry.ticket_ttl")?;
        if self.batches.max_file_bytes == 0 || self.batches.lease_ms == 0 {
            bail!("batches.max_file_bytes and batches.lease_ms must be positive");
        }
        if !(self.batches.key_share > 0.0 && self.batches.key_share <= 1.0) {
            bail!("batches.key_share must be in (0, 1]");
        }
        if self.telemetry.max_upload_bytes == 0 {
            bail!("telemetry.max_upload_bytes must be positive");
        }
        if !(self.storage.objects.starts_with("file://")
            || self.storage.objects.starts_with("s3://"))
        {
            bail!("storage.objects must start with file:// or s3://");
        }
        if self.server.tls_cert.is_empty() != self.server.tls_key.is_empty() {
            bail!("server.tls_cert and server.tls_key go together: set both or neither");
        }
        if !self.admin.token_file.is_empty() {
            if !self.admin.token.is_empty() {
                bail!("admin.token and admin.token_file: set one, not both");
            }
            let text = std::fs::read_to_string(&self.admin.token_file)
                .with_context(|| format!("admin.token_file {}", self.admin.token_file))?;
            self.admin.token = text.trim().to_string();
            if self.admin.token.is_empty() {
                bail!("admin.token_file {} is empty", self.admin.token_file);
            }
        }
        // An admin token others can reach must not be guessable: on a listener
        // past loopback it is 32 characters at least (loopback: a warning).
        let short =
            !self.admin.token.is_empty() && self.admin.token.chars().count() < MIN_ADMIN_TOKEN;
        if short {
            let loopback = self
                .server
                .ops_listen
                .parse::<std::net::SocketAddr>()
                .is_ok_and(|a| a.ip().is_loopback())
                || self.server.ops_listen.starts_with("localhost:");
            if !loopback {
                bail!(
                    "admin.token is shorter than {MIN_ADMIN_TOKEN} characters and server.ops_listen ({}) is reached past loopback: use a long random token",
                    self.server.ops_listen
                );
            }
            tracing::warn!("admin.token is shorter than {MIN_ADMIN_TOKEN} characters; acceptable on a loopback ops listener only");
        }
        let o = &self.observability;
        if !matches!(o.log_format.as_str(), "text" | "json") {
            bail!("observability.log_format must be text or json");
        }
        if !(o.otlp_endpoint.is_empty()
            || o.otlp_endpoint.starts_with("http://")
            || o.otlp_endpoint.starts_with("https://"))
        {
            bail!("observability.otlp_endpoint must be an http:// or https:// URL (or empty)");
        }
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
        let search = &self.search;
        if !matches!(search.backend.as_str(), "none" | "searxng" | "brave") {
            bail!("search.backend must be none, searxng or brave");
        }
        if search.backend == "searxng" && search.url.is_empty() {
            bail!("search.url: the searxng backend needs its base URL");
        }
        if search.fee_usd.is_nan() || search.fee_usd < 0.0 {
            bail!("search.fee_usd must not be negative");
        }
        if search.timeout_ms == 0 || search.results == 0 {
            bail!("search.timeout_ms and search.results must be positive");
        }
        if self.tool_search.max_results == 0 {
            bail!("tool_search.max_results must be positive");
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

    /// `[limits] max_pending`, or 1,024 per gateway thread.
    pub fn max_pending(&self) -> usize {
        match self.limits.max_pending {
            0 => 1_024 * self.gateway_threads(),
            n => n,
        }
    }
}

/// The folder a config file's relative paths resolve against (absolute, so logs
/// and error messages name the real place).
fn config_dir(file: &Path) -> PathBuf {
    let dir = file.parent().unwrap_or(Path::new(""));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// `path` against `dir` when it is relative and set.
fn rebase_path(dir: &Path, path: &str) -> String {
    if path.is_empty() || Path::new(path).is_absolute() {
        path.to_string()
    } else {
        dir.join(path).display().to_string()
    }
}

/// Every config key as a tree (the defaults, with one table per provider), for
/// telling the environment's config keys from variables that merely share the
/// prefix.
fn known_keys() -> serde_json::Value {
    let mut tree = serde_json::to_value(Config::default()).unwrap_or_default();
    for name in PROVIDERS {
        tree["providers"][name] = serde_json::to_value(provider_default(name)).unwrap_or_default();
    }
    tree
}

/// Whether a dotted, lower-case key path names a config key (a section or a key
/// in one; a leaf holding a list or nothing takes no further segments).
fn key_is_known(tree: &serde_json::Value, key: &str) -> bool {
    let mut node = tree;
    for seg in key.split('.') {
        match node.get(seg) {
            Some(next) => node = next,
            None => return false,
        }
    }
    true
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
mod tests;
