-- The record of every idempotency key: one row per (scope, key), clustered
-- on that primary key. VARBINARY keeps keys byte-exact (no collation folds
-- case, accents or trailing spaces); there is no auto-increment id and no
-- second unique index, which would take gap locks under same-key storms.
-- Times are DATETIME(6) in UTC, written and compared with UTC_TIMESTAMP(6),
-- so a session time_zone cannot move them. claim_token is the random token
-- of the claim that holds the record: ownership is decided by it, never by
-- rows affected.
CREATE TABLE idempotent_record (
    scope          VARBINARY(255) NOT NULL,
    idem_key       VARBINARY(255) NOT NULL,
    fingerprint    BLOB           NOT NULL,
    status         VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    attempt        INT            NOT NULL,
    claim_token    BINARY(16)     NOT NULL,
    response       LONGBLOB       NULL,
    locked_until   DATETIME(6)    NULL,
    recovery_point BLOB           NULL,
    created_at     DATETIME(6)    NOT NULL,
    updated_at     DATETIME(6)    NOT NULL,
    expires_at     DATETIME(6)    NOT NULL,
    PRIMARY KEY (scope, idem_key),
    KEY idempotent_record_expires_at_idx (expires_at),
    CONSTRAINT idempotent_record_status CHECK (status IN ('issued', 'processing', 'succeeded', 'failed'))
) ENGINE = InnoDB
