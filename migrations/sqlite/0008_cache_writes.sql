-- Prompt-cache writes (Anthropic's cache creation, Bedrock's cacheWriteInputTokens):
-- the part of input_tokens written to the provider's cache, billed at the model's
-- cache-write price.
ALTER TABLE usage_events ADD COLUMN cache_write_tokens BIGINT NOT NULL DEFAULT 0;
