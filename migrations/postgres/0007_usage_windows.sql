-- What the counters' windows are rebuilt from after an in-process restart: whether
-- the free allowance served the request, its tokens as the limits count them, and
-- its cost at list price (what free allowance dollar caps count).
ALTER TABLE usage_events ADD COLUMN free BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_events ADD COLUMN weighted_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_events ADD COLUMN list_micro_usd BIGINT NOT NULL DEFAULT 0;
CREATE INDEX usage_events_free ON usage_events (org_id, model, created_at) WHERE free = 1;
