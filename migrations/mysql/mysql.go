// Package mysql holds the SQL that creates idem's tables on MySQL 8 and
// MariaDB, and applies it with golang-migrate.
//
// Users of other migration tools (goose, atlas) can copy or read the raw,
// numbered files from FS: 000001_create_idempotent_record.up.sql (the
// record table "idempotent_record") and 000002_create_idem_inbox.up.sql
// (the consume-once table "idem_inbox"), each with its .down.sql, creating
// the tables in the connection's current database. Each file holds one
// statement, so no connection needs multiStatements.
//
// Up and Down apply the same files through golang-migrate's iofs source and
// MySQL driver, under their own version table, VersionTable (never the
// application's "schema_migrations"). MySQL commits the open transaction
// before any DDL, so they run on a connection of their own, never in a
// transaction of the caller's.
package mysql

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"

	"github.com/golang-migrate/migrate/v4"
	migratemysql "github.com/golang-migrate/migrate/v4/database/mysql"
	"github.com/golang-migrate/migrate/v4/source/iofs"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handle"
)

// FS holds the raw migration files, named as golang-migrate expects
// (NNNNNN_title.up.sql / NNNNNN_title.down.sql), at its root.
//
//go:embed *.sql
var FS embed.FS

// VersionTable is the table in which golang-migrate keeps the version of
// idem's tables.
const VersionTable = "idempotent_record_schema_migrations"

// Up creates or upgrades idem's tables in db's current database. Tables at
// the newest version already are success. It takes one of db's connections
// for the run (golang-migrate's lock, GET_LOCK, is the connection's) and
// gives it back; it never closes db.
func Up(ctx context.Context, db *sql.DB) error {
	return run(ctx, db, "up", (*migrate.Migrate).Up)
}

// Down drops idem's tables from db's current database, with what they
// hold.
func Down(ctx context.Context, db *sql.DB) error {
	return run(ctx, db, "down", (*migrate.Migrate).Down)
}

func run(ctx context.Context, db *sql.DB, what string, step func(*migrate.Migrate) error) (err error) {
	if handle.Missing(db) {
		return fmt.Errorf("%w: migrations need a database", idem.ErrInvalidOption)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("idem: migrations %s: %w", what, err)
	}
	// The driver closes conn (not db) when m is closed.
	driver, err := migratemysql.WithConnection(ctx, conn, &migratemysql.Config{MigrationsTable: VersionTable})
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("idem: migrations %s: %w", what, err)
	}
	src, err := iofs.New(FS, ".")
	if err != nil {
		_ = driver.Close()
		return fmt.Errorf("idem: migrations %s: %w", what, err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "mysql", driver)
	if err != nil {
		_ = driver.Close()
		return fmt.Errorf("idem: migrations %s: %w", what, err)
	}
	defer func() {
		if serr, derr := m.Close(); err == nil {
			err = errors.Join(serr, derr)
		}
	}()
	// A ctx that ends stops golang-migrate between two migrations.
	stop := context.AfterFunc(ctx, func() { m.GracefulStop <- true })
	err = step(m)
	if !stop() && err == nil {
		err = ctx.Err() // stopped early: some migrations may not have run
	}
	if err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("idem: migrations %s: %w", what, err)
	}
	return nil
}
