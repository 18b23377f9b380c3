-- Files and batches (issue 26). A file's bytes live in the object store under
-- object_key; the row is its metadata, per org. A batch's lines are rows of
-- batch_lines, each leased by one instance at a time (claimed_by, lease_until)
-- and done once (done = 1 with its output line); usage events of batch lines
-- carry batch = 1.
CREATE TABLE files (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs (id),
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    object_key TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX files_org ON files (org_id, created_at, id);

CREATE TABLE batches (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs (id),
    key_id TEXT NOT NULL,
    key_hash TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status TEXT NOT NULL,
    metadata TEXT,
    errors TEXT,
    total BIGINT NOT NULL DEFAULT 0,
    output_file_id TEXT,
    error_file_id TEXT,
    created_at BIGINT NOT NULL,
    in_progress_at BIGINT,
    expires_at BIGINT NOT NULL,
    finalizing_at BIGINT,
    completed_at BIGINT,
    failed_at BIGINT,
    expired_at BIGINT,
    cancelling_at BIGINT,
    cancelled_at BIGINT,
    final_by TEXT,
    final_until BIGINT
);
CREATE INDEX batches_org ON batches (org_id, created_at, id);
CREATE INDEX batches_open ON batches (status);

CREATE TABLE batch_lines (
    batch_id TEXT NOT NULL REFERENCES batches (id),
    line_no BIGINT NOT NULL,
    custom_id TEXT NOT NULL,
    body TEXT NOT NULL,
    done BIGINT NOT NULL DEFAULT 0,
    ok BIGINT NOT NULL DEFAULT 0,
    output TEXT,
    claimed_by TEXT,
    lease_until BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, line_no)
);
CREATE INDEX batch_lines_open ON batch_lines (batch_id, done, lease_until);

ALTER TABLE usage_events ADD COLUMN batch BIGINT NOT NULL DEFAULT 0;
