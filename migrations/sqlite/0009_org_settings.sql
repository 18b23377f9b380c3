-- An org's prompt capture (the responses store keeps its conversations only while
-- it is on): NULL follows `[responses] prompt_capture_default`, 0 or 1 is the org's
-- own choice.
ALTER TABLE orgs ADD COLUMN prompt_capture BIGINT NULL;
