//! A catalog row as the catalog file and the database hold it: the model, its
//! prices, its rules, and its ordered rungs.

use crate::config::PROVIDERS;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_filters::slug::slug_problem;
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    Chat,
    Embedding,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Requires {
    #[default]
    None,
    Payment,
    Purchase,
}

/// Micro-USD per million tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Price {
    pub input: u64,
    pub cached_input: u64,
    pub output: u64,
    /// Prompt-cache writes (Anthropic's and Bedrock's cache creation); absent
    /// means the input price.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_input: Option<u64>,
    /// One-hour prompt-cache writes (Anthropic's `ttl: 1h`); absent means the
    /// cache-write price.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_1h_input: Option<u64>,
}

impl Price {
    /// The price of a token written to the prompt cache.
    pub fn cache_write(&self) -> u64 {
        self.cache_write_input.unwrap_or(self.input)
    }

    /// The price of a token written to the one-hour prompt cache.
    pub fn cache_write_1h(&self) -> u64 {
        self.cache_write_1h_input
            .unwrap_or_else(|| self.cache_write())
    }
}

/// A model's free allowance; zero means none of that kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FreeAllowance {
    pub tokens_per_hour: u64,
    pub tokens_per_day: u64,
    pub usd_per_month: f64,
    pub usd_lifetime: f64,
    pub needs_card: bool,
    pub needs_settled: bool,
}

/// Capability names a rung may declare.
pub const CAPABILITIES: [&str; 11] = [
    "json_object",
    "json_schema",
    "sampling",
    "tools",
    "reasoning",
    "thinking",
    "web_search",
    "tool_search",
    "cache_key_routing",
    "long_context_1m",
    "embeddings_dimensions",
];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RungSpec {
    pub provider: String,
    pub provider_model_id: String,
    #[serde(default)]
    pub base_url: String,
    #[serde(default)]
    pub zdr: bool,
    #[serde(default)]
    pub caps: Vec<String>,
}

impl RungSpec {
    /// The public rung id: `<provider>:<provider_model_id>`.
    pub fn id(&self) -> String {
        format!("{}:{}", self.provider, self.provider_model_id)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub slug: String,
    pub display_name: String,
    pub kind: ModelKind,
    #[serde(default)]
    pub owned_by: String,
    pub context_window: u64,
    pub max_input_tokens: u64,
    #[serde(default)]
    pub modalities: Vec<String>,
    #[serde(default)]
    pub supported_params: Vec<String>,
    #[serde(default)]
    pub pinned: BTreeMap<String, Value>,
    #[serde(default)]
    pub price: Price,
    #[serde(default)]
    pub category: String,
    #[serde(default)]
    pub max_output_tokens: u64,
    #[serde(default = "everywhere")]
    pub regions: Vec<String>,
    #[serde(default)]
    pub restricted: bool,
    #[serde(default)]
    pub requires: Requires,
    #[serde(default)]
    pub free: FreeAllowance,
    #[serde(default, rename = "rung")]
    pub rungs: Vec<RungSpec>,
}

fn everywhere() -> Vec<String> {
    vec!["*".into()]
}

/// Bounds of a model row (the catalog file's and every org's): a row is read into
/// every instance's snapshot, so none may be large.
const MAX_NAME: usize = 200;
const MAX_WORD: usize = 64;
const MAX_URL: usize = 2_048;
const MAX_MODALITIES: usize = 8;
const MAX_PARAMS: usize = 64;
const MAX_REGIONS: usize = 300;
/// Any model's; an org's own are held to `[limits] deployments_per_model` too.
const MAX_RUNGS: usize = 256;

impl ModelSpec {
    /// Checks a row; the error names the field at fault.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if let Some(why) = slug_problem(&self.slug) {
            return Err(("slug", format!("{:?}: {why}", self.slug)));
        }
        if self.display_name.trim().is_empty() {
            return Err(("display_name", "display_name must not be empty".into()));
        }
        if self.context_window == 0 {
            return Err(("context_window", "context_window must be positive".into()));
        }
        if self.max_input_tokens == 0 || self.max_input_tokens > self.context_window {
            return Err((
                "max_input_tokens",
                format!(
                    "max_input_tokens must be between 1 and context_window ({})",
                    self.context_window
                ),
            ));
        }
        if self.rungs.is_empty() {
            return Err(("providers", "a model needs at least one deployment".into()));
        }
        let too_long = |what: &str, max: usize| format!("{what} may be at most {max} characters");
        if self.display_name.chars().count() > MAX_NAME {
            return Err(("display_name", too_long("display_name", MAX_NAME)));
        }
        if self.category.chars().count() > MAX_WORD {
            return Err(("category", too_long("category", MAX_WORD)));
        }
        for (field, list, max) in [
            ("modalities", &self.modalities, MAX_MODALITIES),
            ("supported_params", &self.supported_params, MAX_PARAMS),
            ("regions", &self.regions, MAX_REGIONS),
        ] {
            if list.len() > max {
                return Err((field, format!("{field} may list at most {max} entries")));
            }
            if list.iter().any(|w| w.chars().count() > MAX_WORD) {
                return Err((
                    field,
                    format!("each of {field} may be at most {MAX_WORD} characters"),
                ));
            }
        }
        if self.rungs.len() > MAX_RUNGS {
            return Err((
                "providers",
                format!("a model may have at most {MAX_RUNGS} deployments"),
            ));
        }
        for r in &self.rungs {
            if r.provider_model_id.chars().count() > MAX_NAME {
                return Err(("provider_model_id", too_long("provider_model_id", MAX_NAME)));
            }
            if r.base_url.len() > MAX_URL {
                return Err(("base_url", too_long("base_url", MAX_URL)));
            }
            if r.caps.len() > CAPABILITIES.len() {
                return Err((
                    "caps",
                    format!("caps may list at most {} entries", CAPABILITIES.len()),
                ));
            }
            if !PROVIDERS.contains(&r.provider.as_str()) {
                return Err((
                    "provider",
                    format!(
                        "unknown provider {:?} (known: {})",
                        r.provider,
                        PROVIDERS.join(", ")
                    ),
                ));
            }
            if r.provider_model_id.trim().is_empty() {
                return Err((
                    "provider_model_id",
                    "provider_model_id must not be empty".into(),
                ));
            }
            if let Some(c) = r.caps.iter().find(|c| !CAPABILITIES.contains(&c.as_str())) {
                return Err(("caps", format!("unknown capability {c:?}")));
            }
            let http = r.base_url.starts_with("http://") || r.base_url.starts_with("https://");
            if !r.base_url.is_empty() && !http {
                return Err(("base_url", "base_url must be an http(s) URL".into()));
            }
        }
        Ok(())
    }

    /// Whether a client in `country` (ISO code, upper case) may call the model.
    /// An unknown country passes only models served everywhere.
    pub fn serves_country(&self, country: Option<&str>) -> bool {
        if self.regions.iter().any(|r| r == "*") {
            return true;
        }
        country.is_some_and(|c| self.regions.iter().any(|r| r.eq_ignore_ascii_case(c)))
    }
}

/// The catalog file: `[[model]]` tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogFile {
    #[serde(default, rename = "model")]
    pub models: Vec<ModelSpec>,
}
