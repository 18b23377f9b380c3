-- One row per inference request, written after the answer completes.
CREATE TABLE usage_events (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    route TEXT NOT NULL,
    model TEXT NOT NULL,
    rung TEXT,
    lane TEXT NOT NULL,
    input_tokens BIGINT NOT NULL DEFAULT 0,
    cached_tokens BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    reasoning_tokens BIGINT NOT NULL DEFAULT 0,
    cost_micro_usd BIGINT NOT NULL DEFAULT 0,
    status BIGINT NOT NULL,
    error_class TEXT,
    incomplete BIGINT NOT NULL DEFAULT 0,
    attempts TEXT NOT NULL,
    empty_attempts BIGINT NOT NULL DEFAULT 0,
    latency_ms BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX usage_events_org ON usage_events (org_id, created_at);
