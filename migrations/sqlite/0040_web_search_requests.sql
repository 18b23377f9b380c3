-- Web searches run for a request (issue 21): the gateway's service-run search or
-- the provider's own; the service-run search's fee is part of cost_micro_usd.
ALTER TABLE usage_events ADD COLUMN web_search_requests BIGINT NOT NULL DEFAULT 0;
