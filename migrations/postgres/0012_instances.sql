-- Each instance's heartbeat, beside its Redis marker: a claim of an Idempotency-Key
-- is waited on while its owner beats in either place, so a Redis that lost its
-- markers (a restart) is never read as every instance having died.
CREATE TABLE instances (
    id TEXT PRIMARY KEY,
    seen_at BIGINT NOT NULL
);
