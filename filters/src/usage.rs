//! Token usage as providers report it, in one shape for every format.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    /// The part of `input_tokens` served from the provider's prompt cache.
    pub cached_tokens: u64,
    /// The part of `input_tokens` written to the provider's prompt cache (billed
    /// at the cache-write price; Anthropic's and Bedrock's cache creation).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// The part of `cache_write_tokens` kept for an hour (Anthropic's 1-hour
    /// cache, priced apart).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_1h_tokens: u64,
    pub output_tokens: u64,
    /// The part of `output_tokens` spent on hidden reasoning.
    pub reasoning_tokens: u64,
    /// Web searches run for the answer: the gateway's own, or the provider's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub web_search_requests: u64,
    /// What the call cost, in micro-USD (`usage.cost` in USD on every answer);
    /// `None` until the gateway prices it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micro_usd: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// Input and output together; saturates, since both are provider-supplied.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Input neither read from nor written to the prompt cache.
    pub fn fresh_input(&self) -> u64 {
        self.input_tokens
            .saturating_sub(self.cached_tokens)
            .saturating_sub(self.cache_write_tokens)
    }

    /// `usage.cost` in USD, when priced.
    pub fn cost_usd(&self) -> Option<f64> {
        self.cost_micro_usd.map(|m| m as f64 / 1_000_000.0)
    }
}

/// The usage object in the chat format.
pub fn usage_json(u: &Usage) -> serde_json::Value {
    let mut v = serde_json::json!({
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.total(),
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    });
    // Only when the provider wrote to its cache (OpenAI never does).
    if u.cache_write_tokens > 0 {
        v["prompt_tokens_details"]["cache_write_tokens"] = u.cache_write_tokens.into();
    }
    if u.web_search_requests > 0 {
        v["server_tool_use_details"] =
            serde_json::json!({"web_search_requests": u.web_search_requests});
    }
    if let Some(cost) = u.cost_usd() {
        v["cost"] = serde_json::Value::from(cost);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::Usage;

    #[test]
    fn totals_saturate() {
        let u = Usage {
            input_tokens: u64::MAX,
            output_tokens: 5,
            ..Usage::default()
        };
        assert_eq!(u.total(), u64::MAX);
    }
}
