-- Accounts of people: users (one per email address), their memberships of orgs,
-- web sessions, the single-use links mails carry, and the per-origin record of
-- signups and sign-in requests their rate limits count. Keys remember the member
-- who minted them (NULL: an operator's key), for `scope=self` usage reads.

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    email TEXT NOT NULL UNIQUE,
    email_verified_at BIGINT,
    last_sign_in_at BIGINT,
    created_at BIGINT NOT NULL
);

CREATE TABLE org_members (
    org_id TEXT NOT NULL REFERENCES orgs (id),
    user_id TEXT NOT NULL REFERENCES users (id),
    role TEXT NOT NULL,
    invited_by TEXT,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (org_id, user_id)
);
CREATE INDEX org_members_user ON org_members (user_id, created_at);

-- The cookie holds a random token; only its SHA-256 is stored.
CREATE TABLE web_sessions (
    token_hash TEXT PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    user_id TEXT NOT NULL REFERENCES users (id),
    org_id TEXT NOT NULL REFERENCES orgs (id),
    csrf_token TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    revoked_at BIGINT
);
CREATE INDEX web_sessions_user ON web_sessions (user_id);

-- purpose: verify | sign_in | invite. Only the SHA-256 of the link's token is stored.
CREATE TABLE email_links (
    token_hash TEXT PRIMARY KEY,
    purpose TEXT NOT NULL,
    user_id TEXT NOT NULL REFERENCES users (id),
    org_id TEXT NOT NULL REFERENCES orgs (id),
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    used_at BIGINT
);
CREATE INDEX email_links_user ON email_links (user_id, purpose, created_at);

-- action: signup | login. origin: the client's IP address.
CREATE TABLE origin_attempts (
    action TEXT NOT NULL,
    origin TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX origin_attempts_origin ON origin_attempts (action, origin, created_at);

ALTER TABLE api_keys ADD COLUMN user_id TEXT NULL;
CREATE INDEX api_keys_user ON api_keys (user_id);
