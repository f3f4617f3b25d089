DROP TABLE IF EXISTS idempotent_record
