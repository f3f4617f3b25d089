// Package migrations holds the SQL that creates idem's record table, and
// applies it with golang-migrate.
//
// Users of other migration tools (goose, tern, atlas) can copy or read the
// raw, numbered files from FS: 000001_create_idempotent_record.up.sql (the
// record table "idempotent_record"), 000002_create_idem_inbox.up.sql (the
// consume-once table "idem_inbox"), each with its .down.sql, creating the
// tables in the search_path.
//
// Up, Down and Force apply the same files through golang-migrate's iofs
// source and pgx/v5 driver, under their own version table (by default
// "idempotent_record_schema_migrations"; never the application's
// "schema_migrations"), so idem's migrations never mix with the application's.
// Version reads that table and writes nothing.
//
// # Locking
//
// Before golang-migrate starts, Up, Down and Force take a session advisory
// lock of idem's on a connection of their own, waiting as long as ctx
// allows, and hold it until they return:
//
//	pg_advisory_lock(hashtextextended('idem migrations ' || schema || '.' || version_table, 0))
//
// where schema is the version table's schema (the one WithTable names, else
// current_schema()) and version_table its name. Runs on the same version
// table therefore queue on a wait that their ctx ends, and never contend for
// golang-migrate's own advisory lock, whose wait ignores ctx. A migration
// lock held elsewhere shows in pg_locks as an advisory lock with that key.
//
// # Connections
//
// Every call opens connections of its own with db's configuration (a
// pool's with its BeforeConnect and AfterConnect, or a connection's) and
// closes them before it returns: it never takes one of db's connections nor
// closes db. So it works on a pool or connection the application has
// already closed, as it would on an open one. A nil db (also a typed nil)
// is an idem.ErrInvalidOption.
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
	"time"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/ident"
	"github.com/idemkit/idem/internal/pgerr"
)

// FS holds the raw migration files, named as golang-migrate expects
// (NNNNNN_title.up.sql / NNNNNN_title.down.sql), at its root.
//
//go:embed *.sql
var FS embed.FS

// DB is what Up, Down, Force and Version accept. They work over connections
// of their own, made from the configuration of the *pgxpool.Pool (with its
// BeforeConnect and AfterConnect) or of the *pgx.Conn, and close them when
// they end, whatever happened: the caller's pool or connection is neither
// used nor closed, and no session state of the migration (the advisory
// locks) outlives it. On these connections a cancelled ctx sends PostgreSQL
// a cancel request, so that a statement waiting on the server (for the
// migration lock) ends there too.
type DB interface {
	*pgxpool.Pool | *pgx.Conn
}

// Option configures Up, Down, Force and Version.
type Option func(*config)

type config struct {
	schema, table, versionTable string
	err                         error
}

func newConfig(opts []Option) (config, error) {
	cfg := config{table: idem.DefaultTable}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.err != nil {
		return cfg, cfg.err
	}
	if cfg.versionTable == "" {
		cfg.versionTable = cfg.table + "_schema_migrations"
	}
	return cfg, nil
}

// WithTable creates the record table as schema.table instead of
// "idempotent_record" in the search_path, and the inbox as
// schema.idem_inbox; pass the same names to idem.WithTable (and the schema to
// idem.WithInboxTable). schema may be empty; when set, Up and Force create
// it if missing. Names follow idem.WithTable's rules: plain identifiers
// (letters, digits and underscores), the table at most 48 bytes, the schema
// at most 63.
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

// Up applies every migration not applied yet, creating the schema WithTable
// names and the version table when missing. It succeeds when there is
// nothing to apply, and fails without running any migration when the
// recorded version is dirty (see Force). It waits for the migration lock
// until ctx ends; once migrating, a cancelled ctx stops it between
// migrations. Either way its error then matches ctx.Err().
func Up[D DB](ctx context.Context, db D, opts ...Option) error {
	return run(ctx, db, opts, true, func(ctx context.Context, s *session) error {
		return s.migrate(ctx, true, stoppable(ctx, (*migrate.Migrate).Up))
	})
}

// Down reverts every applied migration, dropping the record table and the
// schema's inbox table, which the schema's record tables share, then drops
// the version table, so that nothing of idem's is left (the schema stays).
// When no version table exists it writes nothing and returns nil; an empty
// one (left by Force(-1)) is dropped. A dirty version fails it before any
// change. ctx works as for Up: a run stopped between migrations keeps its
// version table.
func Down[D DB](ctx context.Context, db D, opts ...Option) error {
	return run(ctx, db, opts, true, func(ctx context.Context, s *session) error {
		rec, err := s.readVersion(ctx)
		if err != nil || !rec.exists {
			return err
		}
		if rec.version >= 0 || rec.dirty {
			if err := s.migrate(ctx, false, stoppable(ctx, (*migrate.Migrate).Down)); err != nil {
				return err
			}
		}
		if _, err := s.conn.Exec(ctx, "DROP TABLE IF EXISTS "+s.versionTable()); err != nil {
			return fmt.Errorf("migrations: dropping the version table: %w", errOrCtx(ctx, err))
		}
		return nil
	})
}

// Force records version as the applied one and clears the dirty flag,
// without running any migration: after a migration failed halfway and the
// schema was repaired by hand, it tells the next Up or Down where the schema
// now stands. A version of -1 records none (the table left empty; with no
// version table, Force(-1) writes nothing). Any other version must be that
// of one of the migrations (the number a file of FS starts with), or Force
// returns an error matching idem.ErrInvalidOption before any SQL. It creates the schema WithTable
// names and the version table when missing, and waits for the migration
// lock until ctx ends.
func Force[D DB](ctx context.Context, db D, version int, opts ...Option) error {
	if version != -1 && !knownVersion(version) {
		return fmt.Errorf("%w: Force needs -1 or the version of one of idem's migrations, not %d", idem.ErrInvalidOption, version)
	}
	return run(ctx, db, opts, true, func(ctx context.Context, s *session) error {
		if version == -1 {
			rec, err := s.readVersion(ctx)
			if err != nil || !rec.exists {
				return err
			}
		}
		return s.migrate(ctx, true, func(m *migrate.Migrate) error { return m.Force(version) })
	})
}

// knownVersion reports whether one of FS's files has version v.
func knownVersion(v int) bool {
	entries, _ := fs.ReadDir(FS, ".")
	for _, e := range entries {
		if m, err := source.Parse(e.Name()); err == nil && v > 0 && m.Version == uint(v) {
			return true
		}
	}
	return false
}

// Version reports the applied version (0 when none) and whether the last
// migration failed halfway (dirty; see Force). It reads the version table
// and writes nothing: a schema or version table that does not exist is
// version 0, not dirty, and is not created. It neither takes nor waits for
// the migration lock, so during a run it reports the version that run has
// committed so far.
func Version[D DB](ctx context.Context, db D, opts ...Option) (version uint, dirty bool, err error) {
	err = run(ctx, db, opts, false, func(ctx context.Context, s *session) error {
		rec, err := s.readVersion(ctx)
		if err != nil {
			return err
		}
		version, dirty = uint(max(rec.version, 0)), rec.dirty
		return nil
	})
	return version, dirty, err
}

// session is one run: its settings and a connection of its own, which holds
// the migration lock when the run takes it.
type session struct {
	cfg       config
	connector driver.Connector
	conn      *pgx.Conn
	// schema is the version table's schema: cfg.schema, else
	// current_schema(); "" when the search_path names no existing schema.
	schema string
}

// run opens the run's connection, resolves the version table's schema,
// takes the migration lock when lock is set, and calls fn. Every connection
// the run opened is closed when it returns, which also releases the lock.
func run[D DB](ctx context.Context, db D, opts []Option, lock bool, fn func(context.Context, *session) error) error {
	if handle.Missing(db) {
		return fmt.Errorf("%w: migrations need a database, not a nil %T", idem.ErrInvalidOption, db)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Every connection the run opens is closed when it ends, also the one
	// golang-migrate keeps and does not close when its setup fails (a
	// read-only session, no CREATE right).
	tc := &trackingConnector{Connector: connector(db)}
	defer tc.closeAll()
	dc, err := tc.Connect(ctx)
	if err != nil {
		return fmt.Errorf("migrations: connecting: %w", errOrCtx(ctx, err))
	}
	s := &session{cfg: cfg, connector: tc, conn: dc.(*stdlib.Conn).Conn(), schema: cfg.schema}
	if s.schema == "" {
		if err := s.conn.QueryRow(ctx, `SELECT coalesce(current_schema(), '')`).Scan(&s.schema); err != nil {
			return fmt.Errorf("migrations: reading current_schema(): %w", errOrCtx(ctx, err))
		}
	}
	if lock {
		key := "idem migrations " + s.schema + "." + cfg.versionTable
		if _, err := s.conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, key); err != nil {
			return fmt.Errorf("migrations: waiting for the migration lock %q: %w", key, errOrCtx(ctx, err))
		}
	}
	return fn(ctx, s)
}

// errOrCtx returns ctx's error when ctx has ended (a statement it cancelled
// fails with SQLSTATE 57014 or a closed connection), else err.
func errOrCtx(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// connector opens connections with db's configuration, answering a
// cancelled ctx with a cancel request.
func connector[D DB](db D) driver.Connector {
	cancelRequest := func(pc *pgconn.PgConn) ctxwatch.Handler {
		// The deadline breaks the connection if the cancel request gets
		// no answer (a server that cannot be reached that way).
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
	}
	switch d := any(db).(type) {
	case *pgxpool.Pool:
		pc := d.Config()
		cc := pc.ConnConfig.Copy()
		cc.BuildContextWatcherHandler = cancelRequest
		var opts []stdlib.OptionOpenDB
		if pc.BeforeConnect != nil {
			opts = append(opts, stdlib.OptionBeforeConnect(pc.BeforeConnect))
		}
		if pc.AfterConnect != nil {
			opts = append(opts, stdlib.OptionAfterConnect(pc.AfterConnect))
		}
		return stdlib.GetConnector(*cc, opts...)
	case *pgx.Conn:
		cc := d.Config()
		cc.BuildContextWatcherHandler = cancelRequest
		return stdlib.GetConnector(*cc)
	}
	panic("unreachable")
}

// versionTable is the version table's sanitized, qualified name.
func (s *session) versionTable() string {
	return pgx.Identifier{s.schema, s.cfg.versionTable}.Sanitize()
}

// recorded is what the version table holds.
type recorded struct {
	exists  bool  // the version table exists
	version int64 // -1 for none
	dirty   bool
}

// readVersion reads the version table as golang-migrate's pgx/v5 driver
// writes it (one row, version bigint and dirty boolean; none for no
// version), without creating it.
func (s *session) readVersion(ctx context.Context) (recorded, error) {
	none := recorded{version: -1}
	if s.schema == "" {
		return none, nil
	}
	var exists bool
	err := s.conn.QueryRow(ctx, `SELECT to_regclass(format('%I.%I', $1::text, $2::text)) IS NOT NULL`,
		s.schema, s.cfg.versionTable).Scan(&exists)
	if err != nil {
		return none, fmt.Errorf("migrations: looking for the version table: %w", errOrCtx(ctx, err))
	}
	if !exists {
		return none, nil
	}
	rec := recorded{exists: true}
	err = s.conn.QueryRow(ctx, `SELECT version, dirty FROM `+s.versionTable()+` LIMIT 1`).Scan(&rec.version, &rec.dirty)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return recorded{exists: true, version: -1}, nil
	case pgerr.Code(err) == pgerr.UndefinedTable: // dropped meanwhile
		return none, nil
	case err != nil:
		return none, fmt.Errorf("migrations: reading the version table: %w", errOrCtx(ctx, err))
	}
	return rec, nil
}

// migrate runs step on a golang-migrate instance over connections of the
// run, creating the schema first when createSchema is set, and closes the
// instance before it returns.
func (s *session) migrate(ctx context.Context, createSchema bool, step func(*migrate.Migrate) error) error {
	if createSchema && s.cfg.schema != "" {
		if _, err := s.conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{s.cfg.schema}.Sanitize()); err != nil && !schemaCreatedMeanwhile(err) {
			return fmt.Errorf("migrations: creating schema %q: %w", s.cfg.schema, errOrCtx(ctx, err))
		}
	}
	src, err := iofs.New(Files(s.cfg.schema, s.cfg.table), ".")
	if err != nil {
		return fmt.Errorf("migrations: reading the embedded files: %w", err)
	}
	sqlDB := sql.OpenDB(s.connector)
	driver, err := migratepgx.WithInstance(sqlDB, &migratepgx.Config{
		SchemaName:      s.schema,
		MigrationsTable: s.cfg.versionTable,
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
	defer m.Close() // closes sqlDB

	err = step(m)
	var dirty migrate.ErrDirty
	switch {
	case err == nil, errors.Is(err, migrate.ErrNoChange):
		return nil
	case errors.As(err, &dirty):
		return fmt.Errorf("migrations: the recorded version %d is dirty: a migration failed halfway; "+
			"repair the schema by hand, then record the version it is at with Force: %w", dirty.Version, err)
	default:
		return fmt.Errorf("migrations: %w", err)
	}
}

// stoppable runs step (Up or Down) so that ctx ending stops it between
// migrations, and reports that as ctx's error: golang-migrate takes a
// graceful stop for success.
func stoppable(ctx context.Context, step func(*migrate.Migrate) error) func(*migrate.Migrate) error {
	return func(m *migrate.Migrate) error {
		stop := context.AfterFunc(ctx, func() {
			select {
			case m.GracefulStop <- true:
			default:
			}
		})
		defer stop()
		err := step(m)
		if ctx.Err() != nil {
			return fmt.Errorf("stopped, possibly before the last migration: %w", ctx.Err())
		}
		return err
	}
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
