-- An org's own provider accounts (BYOK). The secret is sealed with AES-256-GCM
-- under the service's secrets key, bound to the row's id; it never leaves sealed
-- storage except into the process that calls the provider.
CREATE TABLE provider_connections (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs (id),
    provider TEXT NOT NULL,
    setup_alias TEXT NOT NULL,
    sealed_secret TEXT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    status_detail TEXT,
    spend_micro_usd BIGINT,
    spend_checked_at BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (org_id, provider, setup_alias)
);
CREATE INDEX provider_connections_updated_at ON provider_connections (updated_at);

-- An org's own order of rungs for a model (rung ids; `byok:<connection_id>`).
CREATE TABLE org_waterfalls (
    org_id TEXT NOT NULL REFERENCES orgs (id),
    slug TEXT NOT NULL,
    chain TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (org_id, slug)
);

-- The org's provider policy: keep fail-over on zero-retention platform rungs.
ALTER TABLE orgs ADD COLUMN require_zdr BIGINT NOT NULL DEFAULT 0;
