// Package migrations holds the SQL that creates idem's record table, and
// applies it with golang-migrate.
//
// Users of other migration tools (goose, tern, atlas) can copy or read the
// raw, numbered files from FS: 000001_create_idempotent_record.up.sql (the
// record table "idempotent_record"), 000002_create_idem_inbox.up.sql (the
// consume-once table "idem_inbox"), each with its .down.sql, creating the
// tables in the search_path.
//
// Up and Down apply the same files through golang-migrate's iofs source and
// pgx/v5 driver, under their own version table (by default
// "idempotent_record_schema_migrations"; never the application's
// "schema_migrations"), so idem's migrations never mix with the application's.
package migrations

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"testing/fstest"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/ident"
	"github.com/idemkit/idem/internal/pgerr"
)

// FS holds the raw migration files, named as golang-migrate expects
// (NNNNNN_title.up.sql / NNNNNN_title.down.sql), at its root.
//
//go:embed *.sql
var FS embed.FS

// DB is what Up, Down and Version accept. They work over a connection of
// their own, made from the configuration of the *pgxpool.Pool (with its
// BeforeConnect and AfterConnect) or of the *pgx.Conn, and close it when they
// end, whatever happened: the caller's pool or connection is neither used
// nor closed, and no session state of the migration (golang-migrate's
// advisory lock) outlives it.
type DB interface {
	*pgxpool.Pool | *pgx.Conn
}

// Option configures Up, Down and Version.
type Option func(*config)

type config struct {
	schema, table, versionTable string
	err                         error
}

// WithTable creates the record table as schema.table instead of
// "idempotent_record" in the search_path, and the inbox as
// schema.idem_inbox; pass the same names to idem.WithTable (and the schema to
// idem.WithInboxTable). schema may be empty; when set, it is created if
// missing. Names follow idem.WithTable's rules: plain identifiers (letters,
// digits and underscores), the table at most 48 bytes, the schema at most 63.
func WithTable(schema, table string) Option {
	return func(c *config) {
		if err := ident.ValidateTable(schema, table); err != nil {
			c.err = fmt.Errorf("%w: %w", idem.ErrInvalidOption, err)
			return
		}
		if table == idem.DefaultInboxTable {
			c.err = fmt.Errorf("%w: %q is the inbox table's name", idem.ErrInvalidOption, table)
			return
		}
		c.schema, c.table = schema, table
	}
}

// WithVersionTable names golang-migrate's version table. It defaults to the
// record table's name followed by "_schema_migrations", in the same schema.
func WithVersionTable(name string) Option {
	return func(c *config) {
		if err := ident.ValidateTable("", name); err != nil {
			c.err = fmt.Errorf("%w: %w", idem.ErrInvalidOption, err)
			return
		}
		c.versionTable = name
	}
}

// Up applies every migration not applied yet. It succeeds when there is
// nothing to apply. A cancelled ctx stops it between migrations.
func Up[D DB](ctx context.Context, db D, opts ...Option) error {
	return run(ctx, db, opts, func(m *migrate.Migrate) error { return m.Up() })
}

// Down reverts every applied migration, dropping the record table and the
// schema's inbox table, which the schema's record tables share. It succeeds
// when there is nothing to revert.
func Down[D DB](ctx context.Context, db D, opts ...Option) error {
	return run(ctx, db, opts, func(m *migrate.Migrate) error { return m.Down() })
}

// Version reports the applied version (0 when none) and whether the last
// migration failed halfway (dirty).
func Version[D DB](ctx context.Context, db D, opts ...Option) (version uint, dirty bool, err error) {
	err = run(ctx, db, opts, func(m *migrate.Migrate) error {
		version, dirty, err = m.Version()
		if errors.Is(err, migrate.ErrNilVersion) {
			return nil
		}
		return err
	})
	return version, dirty, err
}

func run[D DB](ctx context.Context, db D, opts []Option, step func(*migrate.Migrate) error) error {
	cfg := config{table: idem.DefaultTable}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.err != nil {
		return cfg.err
	}
	if cfg.versionTable == "" {
		cfg.versionTable = cfg.table + "_schema_migrations"
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	var connector driver.Connector
	switch d := any(db).(type) {
	case *pgxpool.Pool:
		pc := d.Config()
		var opts []stdlib.OptionOpenDB
		if pc.BeforeConnect != nil {
			opts = append(opts, stdlib.OptionBeforeConnect(pc.BeforeConnect))
		}
		if pc.AfterConnect != nil {
			opts = append(opts, stdlib.OptionAfterConnect(pc.AfterConnect))
		}
		connector = stdlib.GetConnector(*pc.ConnConfig, opts...)
	case *pgx.Conn:
		connector = stdlib.GetConnector(*d.Config())
	}
	// Every connection the run opens is closed when it ends, also the one
	// golang-migrate keeps and does not close when its setup fails (a
	// read-only session, no CREATE right).
	tc := &trackingConnector{Connector: connector}
	defer tc.closeAll()
	sqlDB := sql.OpenDB(tc)

	if cfg.schema != "" {
		if _, err := sqlDB.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{cfg.schema}.Sanitize()); err != nil && !schemaCreatedMeanwhile(err) {
			sqlDB.Close()
			return fmt.Errorf("migrations: creating schema %q: %w", cfg.schema, err)
		}
	}
	src, err := iofs.New(Files(cfg.schema, cfg.table), ".")
	if err != nil {
		sqlDB.Close()
		return fmt.Errorf("migrations: reading the embedded files: %w", err)
	}
	driver, err := migratepgx.WithInstance(sqlDB, &migratepgx.Config{
		SchemaName:      cfg.schema,
		MigrationsTable: cfg.versionTable,
	})
	if err != nil {
		sqlDB.Close()
		return fmt.Errorf("migrations: opening the database: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		driver.Close()
		return fmt.Errorf("migrations: %w", err)
	}
	defer m.Close() // closes sqlDB, which is ours

	stop := context.AfterFunc(ctx, func() {
		select {
		case m.GracefulStop <- true:
		default:
		}
	})
	defer stop()

	err = step(m)
	if ctx.Err() != nil {
		// golang-migrate reports a graceful stop as success; the caller
		// must not take a cancelled run for a finished one.
		return fmt.Errorf("migrations: stopped, possibly before the last migration: %w", ctx.Err())
	}
	if err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("migrations: %w", err)
	}
	return nil
}

// schemaCreatedMeanwhile reports whether CREATE SCHEMA IF NOT EXISTS failed
// because a concurrent run created the schema first (PostgreSQL does not
// make IF NOT EXISTS safe against that).
func schemaCreatedMeanwhile(err error) bool {
	code := pgerr.Code(err)
	return code == pgerr.UniqueViolation || code == pgerr.DuplicateSchema
}

// trackingConnector opens connections through Connector and closes every
// one of them in closeAll, whoever holds it.
type trackingConnector struct {
	driver.Connector
	mu     sync.Mutex
	conns  []driver.Conn
	closed bool
}

func (t *trackingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := t.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return nil, errors.New("migrations: the run has ended")
	}
	t.conns = append(t.conns, c)
	return c, nil
}

// closeAll closes every connection opened (closing one twice is harmless).
func (t *trackingConnector) closeAll() {
	t.mu.Lock()
	conns := t.conns
	t.conns, t.closed = nil, true
	t.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// Files returns the migration files for a record table named schema.table
// and the inbox table schema.idem_inbox (schema may be empty): FS itself for
// the default names, otherwise copies with the names replaced and quoted.
// The names must follow WithTable's rules.
func Files(schema, table string) fs.FS {
	if schema == "" && table == idem.DefaultTable {
		return FS
	}
	qualify := func(name string) string {
		if schema == "" {
			return pgx.Identifier{name}.Sanitize()
		}
		return pgx.Identifier{schema, name}.Sanitize()
	}
	// Longer names first: at one position the first match wins.
	r := strings.NewReplacer(
		idem.DefaultTable+"_expires_at_idx", pgx.Identifier{table + "_expires_at_idx"}.Sanitize(),
		idem.DefaultInboxTable+"_consumed_at_idx", pgx.Identifier{idem.DefaultInboxTable + "_consumed_at_idx"}.Sanitize(),
		idem.DefaultTable, qualify(table),
		idem.DefaultInboxTable, qualify(idem.DefaultInboxTable),
	)
	out := fstest.MapFS{}
	entries, _ := fs.ReadDir(FS, ".")
	for _, e := range entries {
		data, _ := fs.ReadFile(FS, e.Name())
		out[e.Name()] = &fstest.MapFile{Data: []byte(r.Replace(string(data))), Mode: 0o444}
	}
	return out
}
