-- The running total of credits ever added (grants, purchases, the verification
-- refund): the live balance in the counters store takes in each increase once.
ALTER TABLE orgs ADD COLUMN credited_micro_usd BIGINT NOT NULL DEFAULT 0;
UPDATE orgs SET credited_micro_usd = COALESCE(
    (SELECT SUM(l.amount_micro_usd) FROM credit_ledger l WHERE l.org_id = orgs.id), 0);
-- A review opened for a payment reason is lifted by a settled payment.
ALTER TABLE orgs ADD COLUMN review_for_payment BIGINT NOT NULL DEFAULT 0;

-- Idempotency-Key results: claimed by one instance (state pending, owner), then
-- stored whole (state done) for replay until expires_at.
CREATE TABLE idempotency_keys (
    org_id TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    route TEXT NOT NULL,
    body_hash TEXT NOT NULL,
    owner TEXT NOT NULL,
    state TEXT NOT NULL,
    status BIGINT,
    content_type TEXT,
    headers TEXT,
    body TEXT,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (org_id, idem_key)
);
CREATE INDEX idempotency_keys_expires ON idempotency_keys (expires_at);
