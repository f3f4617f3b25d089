-- Consume-once log for message handlers: one row per (consumer, message_id)
-- whose handler committed. Purged by age (consumed_at). One per schema,
-- shared by the schema's record tables: a second record table's migrations
-- find it in place.
CREATE TABLE IF NOT EXISTS idem_inbox (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    consumed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX IF NOT EXISTS idem_inbox_consumed_at_idx ON idem_inbox (consumed_at);
