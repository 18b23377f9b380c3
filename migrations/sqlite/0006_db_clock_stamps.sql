-- Key and org changes are stamped with the database's clock, not the writer's:
-- the directories of all instances poll `updated_at >= watermark - overlap`, so a
-- writer whose clock lags would otherwise stamp a change (a revocation) below
-- every other instance's watermark, and they would never see it. A write that
-- leaves updated_at alone (usage settling a balance) stays unstamped.
-- Triggers do not fire themselves again (recursive_triggers is off).

CREATE TRIGGER api_keys_stamp_insert AFTER INSERT ON api_keys
BEGIN
    UPDATE api_keys SET updated_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    WHERE id = NEW.id;
END;

CREATE TRIGGER api_keys_stamp_update AFTER UPDATE OF updated_at ON api_keys
WHEN NEW.updated_at IS NOT OLD.updated_at
BEGIN
    UPDATE api_keys SET updated_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    WHERE id = NEW.id;
END;

CREATE TRIGGER orgs_stamp_insert AFTER INSERT ON orgs
BEGIN
    UPDATE orgs SET updated_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    WHERE id = NEW.id;
END;

CREATE TRIGGER orgs_stamp_update AFTER UPDATE OF updated_at ON orgs
WHEN NEW.updated_at IS NOT OLD.updated_at
BEGIN
    UPDATE orgs SET updated_at = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
    WHERE id = NEW.id;
END;
