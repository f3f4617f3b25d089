package idemmysql

import (
	"context"
	"database/sql"

	migrations "github.com/idemkit/idem/migrations/mysql"
)

// Migrate creates or upgrades idem's tables (the record table
// "idempotent_record" and the inbox "idem_inbox") in db's current database,
// through golang-migrate with the embedded SQL of
// github.com/idemkit/idem/migrations/mysql and its own version table. It
// runs on a connection of its own, never in a transaction: MySQL commits
// an open transaction before any DDL. Tables at the newest version are
// success.
func Migrate(ctx context.Context, db *sql.DB) error {
	return migrations.Up(ctx, db)
}
