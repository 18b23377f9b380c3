-- The change feed (src/store/changes.rs): a write to a table behind an in-process
-- snapshot notifies `sluice_changes` with the table's name at its commit, so every
-- listening instance re-reads it at once, whoever wrote it. Statement-level: one
-- notification per statement, and PostgreSQL folds equal ones within a
-- transaction.
CREATE FUNCTION sluice_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('sluice_changes', TG_TABLE_NAME);
    RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_changed AFTER INSERT OR UPDATE OR DELETE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_notify_change();
-- Only updates that move `updated_at`, what the directory's poll reads: the usage
-- writer debits balances every tick without it, and those wake nobody.
CREATE TRIGGER orgs_changed AFTER INSERT OR DELETE OR UPDATE OF updated_at ON orgs
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_notify_change();
CREATE TRIGGER models_changed AFTER INSERT OR UPDATE OR DELETE ON models
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_notify_change();
CREATE TRIGGER rung_probes_changed AFTER INSERT OR UPDATE OR DELETE ON rung_probes
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_notify_change();
CREATE TRIGGER provider_connections_changed AFTER INSERT OR UPDATE OR DELETE ON provider_connections
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_notify_change();
CREATE TRIGGER org_waterfalls_changed AFTER INSERT OR UPDATE OR DELETE ON org_waterfalls
    FOR EACH STATEMENT EXECUTE FUNCTION sluice_notify_change();
