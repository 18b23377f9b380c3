-- Key and org changes are stamped with the database's clock, not the writer's:
-- the directories of all instances poll `updated_at >= watermark - overlap`, so a
-- writer whose clock lags would otherwise stamp a change (a revocation) below
-- every other instance's watermark, and they would never see it. A write that
-- leaves updated_at alone (usage settling a balance) stays unstamped.

CREATE FUNCTION sluice_stamp_updated_at() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.updated_at IS DISTINCT FROM OLD.updated_at THEN
        NEW.updated_at := (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT;
    END IF;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER api_keys_stamp BEFORE INSERT OR UPDATE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION sluice_stamp_updated_at();

CREATE TRIGGER orgs_stamp BEFORE INSERT OR UPDATE ON orgs
    FOR EACH ROW EXECUTE FUNCTION sluice_stamp_updated_at();
