-- The record of every idempotency key: one row per (scope, key).
-- fillfactor leaves room in each page so that the completion UPDATE, which
-- changes no indexed column, can be a HOT update.
CREATE TABLE idempotent_record (
    scope          text        NOT NULL,
    key            text        NOT NULL,
    fingerprint    bytea,
    status         text        NOT NULL
        CHECK (status IN ('issued', 'processing', 'succeeded', 'failed')),
    response       bytea,
    attempt        integer     NOT NULL DEFAULT 1,
    locked_until   timestamptz,
    recovery_point text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 70);

-- Purging deletes by expiry.
CREATE INDEX idempotent_record_expires_at_idx ON idempotent_record (expires_at);
