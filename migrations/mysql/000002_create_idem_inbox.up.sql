-- The consume-once table: one row per (consumer, message ID), inserted in
-- the consumer's transaction before it processes the message.
CREATE TABLE idem_inbox (
    consumer    VARBINARY(255) NOT NULL,
    message_id  VARBINARY(255) NOT NULL,
    consumed_at DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer, message_id),
    KEY idem_inbox_consumed_at_idx (consumed_at)
) ENGINE = InnoDB
