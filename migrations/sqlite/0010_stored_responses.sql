-- The responses store (previous_response_id). Each row is one turn: its own input
-- items and its output items (JSON, zstd-compressed when large: codec 1), never
-- the whole history, so a conversation's storage grows with its length. A chain
-- (a conversation and its branches) shares one expiry, renewed by each stored turn.
CREATE TABLE response_chains (
    org_id TEXT NOT NULL,
    chain_id TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (org_id, chain_id)
);
CREATE INDEX response_chains_expiry ON response_chains (expires_at);

CREATE TABLE stored_responses (
    org_id TEXT NOT NULL,
    id TEXT NOT NULL,
    chain_id TEXT NOT NULL,
    parent_id TEXT,
    model TEXT NOT NULL,
    status TEXT NOT NULL,
    codec BIGINT NOT NULL DEFAULT 0,
    items BLOB NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (org_id, id)
);
CREATE INDEX stored_responses_chain ON stored_responses (org_id, chain_id);
