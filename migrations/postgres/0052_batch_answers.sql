-- A batch line's answer (its output file line) goes to a table of its own,
-- appended as lines finish, instead of into the line's row: a row that grew by its
-- answer split its page again and again and was written whole to the log each
-- time (issue 26's throughput). The line's row keeps what the claim reads: done,
-- ok and its lease.
CREATE TABLE batch_answers (
    batch_id TEXT NOT NULL,
    line_no BIGINT NOT NULL,
    output TEXT NOT NULL,
    PRIMARY KEY (batch_id, line_no)
);
INSERT INTO batch_answers (batch_id, line_no, output)
    SELECT batch_id, line_no, output FROM batch_lines WHERE output IS NOT NULL;
UPDATE batch_lines SET output = NULL WHERE output IS NOT NULL;
