-- Foundation: organizations, API keys, credits, grants, catalog rows.
-- Portable SQL: the same text serves SQLite and PostgreSQL. Times are Unix
-- milliseconds, money is integer micro-USD, flags are 0/1 integers.

CREATE TABLE orgs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT,
    email_verified BIGINT NOT NULL DEFAULT 0,
    card_on_file BIGINT NOT NULL DEFAULT 0,
    settled BIGINT NOT NULL DEFAULT 0,
    tier BIGINT NOT NULL DEFAULT 0,
    balance_micro_usd BIGINT NOT NULL DEFAULT 0,
    purchased_micro_usd BIGINT NOT NULL DEFAULT 0,
    under_review BIGINT NOT NULL DEFAULT 0,
    review_reason TEXT,
    credits_overflow BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX orgs_updated_at ON orgs (updated_at);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs (id),
    name TEXT,
    key_hash TEXT NOT NULL UNIQUE,
    hint TEXT NOT NULL,
    daily_spend_cap_micro_usd BIGINT,
    rpm BIGINT,
    tpm BIGINT,
    expires_at BIGINT,
    revoked_at BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX api_keys_org ON api_keys (org_id);
CREATE INDEX api_keys_updated_at ON api_keys (updated_at);

CREATE TABLE credit_ledger (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs (id),
    amount_micro_usd BIGINT NOT NULL,
    kind TEXT NOT NULL,
    note TEXT,
    created_at BIGINT NOT NULL
);
CREATE INDEX credit_ledger_org ON credit_ledger (org_id, created_at);

CREATE TABLE org_grants (
    org_id TEXT NOT NULL REFERENCES orgs (id),
    slug TEXT NOT NULL,
    PRIMARY KEY (org_id, slug)
);

-- owner '' is the public catalog; otherwise the org that created the model.
CREATE TABLE models (
    owner TEXT NOT NULL,
    slug TEXT NOT NULL,
    spec TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (owner, slug)
);
CREATE INDEX models_updated_at ON models (updated_at);
