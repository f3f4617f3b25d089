package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/ident"
	"github.com/idemkit/idem/migrations"
)

// store is the database a command works on: PostgreSQL through pgx
// (pgStore), or MySQL and MariaDB through database/sql (mysqlStore). The
// tables are those of the command's --schema and --table.
type store interface {
	// version reports the applied migration version (0 when none) and
	// whether the last migration failed halfway; it writes nothing.
	version(ctx context.Context) (uint, bool, error)
	// up applies the migrations not applied yet.
	up(ctx context.Context) error
	// down reverts every applied migration.
	down(ctx context.Context) error
	// force records version v (-1: none) and clears the dirty flag.
	force(ctx context.Context, v int) error
	lookup(ctx context.Context, scope, key string) (*idem.Record, error)
	stuck(ctx context.Context, limit int) ([]idem.Record, error)
	stats(ctx context.Context) (*idem.Stats, error)
	countExpired(ctx context.Context, inboxRetention time.Duration) (records, inbox int64, err error)
	purge(ctx context.Context, p idem.PurgeParams) (int64, error)
	// explain returns err, or, when err is a statement's on a table of
	// idem's that does not exist, a missingTableError naming it.
	explain(ctx context.Context, err error) error
	close()
}

// The kinds of database the command connects to.
const (
	postgres = "PostgreSQL"
	mysqlDB  = "MySQL"
)

// mysqlDSN matches a go-sql-driver DSN with its network written out:
// user:pass@tcp(host:port)/db, tcp(host:port)/db, user@unix(/path)/db.
var mysqlDSN = regexp.MustCompile(`(^|@)(tcp|tcp4|tcp6|unix)\(`)

// urlScheme matches a URL's scheme (RFC 3986).
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)

// kindOf says which database s points at: a postgres:// or postgresql://
// URL, or anything without a scheme that is not a go-sql-driver DSN (a
// libpq keyword/value string, or nothing: the PG* variables), is
// PostgreSQL; a mysql:// or mariadb:// URL, or a go-sql-driver DSN with its
// network written out, is MySQL. Any other scheme is an error.
func kindOf(s string) (string, error) {
	scheme, _, hasScheme := strings.Cut(s, "://")
	if hasScheme && urlScheme.MatchString(scheme) {
		switch strings.ToLower(scheme) {
		case "postgres", "postgresql":
			return postgres, nil
		case "mysql", "mariadb":
			return mysqlDB, nil
		default:
			return "", fmt.Errorf("unknown database URL scheme %q: want postgres://, postgresql://, mysql:// or mariadb://, "+
				"or a go-sql-driver DSN such as user:pass@tcp(host:3306)/db", scheme+"://")
		}
	}
	if mysqlDSN.MatchString(s) {
		return mysqlDB, nil
	}
	return postgres, nil
}

// connect connects to the database of --database-url, else DATABASE_URL,
// else the PG* variables. forMigrate is set by migrate, which on MySQL
// runs in the database --schema names.
func (c *common) connect(ctx context.Context, getenv env, forMigrate bool) (store, error) {
	if err := ident.ValidateTable(c.schema, c.table); err != nil {
		return nil, usageError{fmt.Sprintf("--schema/--table: %v: %v", idem.ErrInvalidOption, err)}
	}
	u := c.url
	if u == "" {
		u = getenv("DATABASE_URL")
	}
	kind, err := kindOf(u)
	if err != nil {
		return nil, usageError{"--database-url: " + err.Error()}
	}
	if kind == mysqlDB {
		return c.connectMySQL(ctx, u, forMigrate)
	}
	return c.connectPostgres(ctx, u)
}

func (c *common) connectPostgres(ctx context.Context, u string) (store, error) {
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("reading the connection settings: %w", err)
	}
	cfg.MaxConns = 2
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	cfg.ConnConfig.RuntimeParams["application_name"] = "idem-cli"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		where := fmt.Sprintf("%s@%s:%d/%s", cfg.ConnConfig.User, cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
		return nil, fmt.Errorf("connecting to %s: %w\n(set --database-url, DATABASE_URL or the PG* variables)", where, err)
	}
	return &pgStore{pool: pool, c: c}, nil
}

// pgStore is a PostgreSQL database.
type pgStore struct {
	pool *pgxpool.Pool
	c    *common
}

func (s *pgStore) migrations() []migrations.Option {
	return []migrations.Option{migrations.WithTable(s.c.schema, s.c.table)}
}

func (s *pgStore) version(ctx context.Context) (uint, bool, error) {
	return migrations.Version(ctx, s.pool, s.migrations()...)
}

func (s *pgStore) up(ctx context.Context) error { return migrations.Up(ctx, s.pool, s.migrations()...) }

func (s *pgStore) down(ctx context.Context) error {
	return migrations.Down(ctx, s.pool, s.migrations()...)
}

func (s *pgStore) force(ctx context.Context, v int) error {
	return migrations.Force(ctx, s.pool, v, s.migrations()...)
}

func (s *pgStore) lookup(ctx context.Context, scope, key string) (*idem.Record, error) {
	return idem.Lookup(ctx, s.pool, scope, key, s.c.options()...)
}

func (s *pgStore) stuck(ctx context.Context, limit int) ([]idem.Record, error) {
	return idem.Stuck(ctx, s.pool, limit, s.c.options()...)
}

func (s *pgStore) stats(ctx context.Context) (*idem.Stats, error) {
	return idem.TableStats(ctx, s.pool, s.c.options()...)
}

func (s *pgStore) countExpired(ctx context.Context, inbox time.Duration) (int64, int64, error) {
	return idem.CountExpired(ctx, s.pool, inbox, s.c.options()...)
}

func (s *pgStore) purge(ctx context.Context, p idem.PurgeParams) (int64, error) {
	return idem.Purge(ctx, s.pool, p, s.c.options()...)
}

func (s *pgStore) close() { s.pool.Close() }

// explain returns err, or, when err is a statement's on a table that does
// not exist (SQLSTATE 42P01), a missingTableError naming the table: the
// record table, or else the inbox, whichever is missing.
func (s *pgStore) explain(ctx context.Context, err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != undefinedTable {
		return err
	}
	c := s.c
	missing := c.target()
	records := pgx.Identifier{c.schema, c.table}
	if c.schema == "" {
		records = records[1:]
	}
	var recordsExist bool
	if s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, records.Sanitize()).Scan(&recordsExist) == nil && recordsExist {
		missing = c.qualified(idem.DefaultInboxTable)
	}
	if c.schema == "" {
		missing += " (in the search_path)"
	}
	return &missingTableError{table: missing, remedy: fmt.Sprintf("run 'idem migrate up%s' to create it", c.tableFlags())}
}

// undefinedTable is SQLSTATE 42P01.
const undefinedTable = "42P01"
