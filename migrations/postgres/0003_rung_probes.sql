-- What probing learned of each platform rung's capabilities. A row overrides the
-- catalog's declared capability for every model served by that rung.
CREATE TABLE rung_probes (
    provider TEXT NOT NULL,
    provider_model_id TEXT NOT NULL,
    base_url TEXT NOT NULL,
    capability TEXT NOT NULL,
    supported BIGINT NOT NULL,
    status BIGINT NOT NULL,
    probed_at BIGINT NOT NULL,
    PRIMARY KEY (provider, provider_model_id, base_url, capability)
);
