-- Telemetry trace intake (issue 25). One row per ingest: an upload (ticket, PUT,
-- finalize, the worker's projection) or a pull (projected in its request). The
-- pull's credential is never stored: no column holds it.
CREATE TABLE telemetry_ingests (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs (id),
    origin TEXT NOT NULL,
    transport_kind TEXT,
    source_kind TEXT NOT NULL,
    source_label TEXT NOT NULL,
    status TEXT NOT NULL,
    object_key TEXT NOT NULL,
    byte_size BIGINT,
    sha256 TEXT,
    trace_count BIGINT,
    span_count BIGINT,
    error TEXT,
    expires_at BIGINT NOT NULL,
    upload_started_at BIGINT,
    claimed_by TEXT,
    claim_until BIGINT,
    attempts BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    finished_at BIGINT
);
CREATE INDEX telemetry_ingests_org ON telemetry_ingests (org_id, created_at);
CREATE INDEX telemetry_ingests_queue ON telemetry_ingests (status, claim_until);

-- The org's traces, projected from an ingest into one model: the summary in
-- columns, the spans (parent links, times, model, messages, tokens, cost) as JSON.
-- One trace id once per ingest: a retried projection can never count it twice.
CREATE TABLE telemetry_traces (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs (id),
    ingest_id TEXT NOT NULL REFERENCES telemetry_ingests (id),
    trace_id TEXT NOT NULL,
    name TEXT,
    started_at BIGINT,
    ended_at BIGINT,
    span_count BIGINT NOT NULL,
    model TEXT,
    provider TEXT,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cost_micro_usd BIGINT,
    tags TEXT NOT NULL,
    spans TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (ingest_id, trace_id)
);
CREATE INDEX telemetry_traces_org ON telemetry_traces (org_id, created_at);
