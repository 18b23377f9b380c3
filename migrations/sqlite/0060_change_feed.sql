-- The change feed is PostgreSQL's (LISTEN/NOTIFY, src/store/changes.rs): on SQLite
-- the snapshots poll at their own periods, and this migration does nothing.
SELECT 1;
