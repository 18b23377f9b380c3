-- What a payment unlocked, so that reversing it takes that back (security review
-- 2026-12-01, M5): whether it raised the org's tier, and the payment review it
-- lifted (its reason), if any.
ALTER TABLE payments ADD COLUMN raised_tier BIGINT NOT NULL DEFAULT 0;
ALTER TABLE payments ADD COLUMN lifted_review TEXT;
