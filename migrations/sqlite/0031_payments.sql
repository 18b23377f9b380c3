-- Payments through the payment provider: one row per checkout (what it is for,
-- what it credited, what refunds and disputes took back), and every webhook event
-- applied, so each is applied once.

CREATE TABLE payments (
    checkout_session_id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs (id),
    kind TEXT NOT NULL,
    amount_micro_usd BIGINT NOT NULL,
    status TEXT NOT NULL,
    payment_intent TEXT,
    credited_micro_usd BIGINT NOT NULL DEFAULT 0,
    reversed_micro_usd BIGINT NOT NULL DEFAULT 0,
    created_by TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE INDEX payments_org ON payments (org_id, created_at);
CREATE INDEX payments_intent ON payments (payment_intent);

CREATE TABLE payment_events (
    event_id TEXT PRIMARY KEY,
    type TEXT NOT NULL,
    org_id TEXT,
    received_at BIGINT NOT NULL
);
