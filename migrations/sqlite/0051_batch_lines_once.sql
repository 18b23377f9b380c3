-- A batch line is billed once however often it runs (issue 26): its usage event
-- names the line, and a second event of the same line is not stored (nor charged).
-- A line that ran on an instance that stopped before recording its answer simply
-- runs again.
ALTER TABLE usage_events ADD COLUMN batch_line TEXT;
CREATE UNIQUE INDEX usage_events_batch_line ON usage_events (batch_line)
    WHERE batch_line IS NOT NULL;

-- request_counts kept on the batch as its lines are recorded, so a client polling
-- a batch of 50,000 lines reads one row instead of counting them.
ALTER TABLE batches ADD COLUMN completed_count BIGINT NOT NULL DEFAULT 0;
ALTER TABLE batches ADD COLUMN failed_count BIGINT NOT NULL DEFAULT 0;
UPDATE batches SET
    completed_count = (SELECT COUNT(*) FROM batch_lines l
                       WHERE l.batch_id = batches.id AND l.done = 1 AND l.ok = 1),
    failed_count = (SELECT COUNT(*) FROM batch_lines l
                    WHERE l.batch_id = batches.id AND l.done = 1 AND l.ok = 0);

-- A finished batch's lines are deleted an hour after it was finalized (its output
-- and error files hold what a client reads); lines_purged marks it done.
ALTER TABLE batches ADD COLUMN lines_purged BIGINT NOT NULL DEFAULT 0;
CREATE INDEX batches_unpurged ON batches (finalizing_at) WHERE lines_purged = 0;
