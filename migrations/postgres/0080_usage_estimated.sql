-- Usage the gateway estimated (issue 55): the provider reported none for an answer
-- it served (a stream without a usage chunk, a cut), so the tokens are counted
-- from what was sent and delivered.
ALTER TABLE usage_events ADD COLUMN estimated BIGINT NOT NULL DEFAULT 0;
