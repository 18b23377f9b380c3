-- Items of stored turns by their ids (output items, and input items a client gave
-- an id), for `item_reference` input items and replayed reasoning: where in which
-- turn's items each one is.
CREATE TABLE stored_items (
    org_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    response_id TEXT NOT NULL,
    chain_id TEXT NOT NULL,
    position BIGINT NOT NULL,
    PRIMARY KEY (org_id, item_id)
);
CREATE INDEX stored_items_chain ON stored_items (org_id, chain_id);
