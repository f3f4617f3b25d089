// Package exampledb connects the example programs to their database, chosen
// by DATABASE_URL: PostgreSQL (postgres://...) through pgx, or MySQL 8 and
// MariaDB (mysql://...) through database/sql and go-sql-driver/mysql.
//
// Each example keeps its tables, and idem's, apart, under a name of its own
// (quickstart_example, orders_example, ...), and says so when it starts: on
// PostgreSQL in a schema of that name in the URL's database, on MySQL in a
// database of that name on the URL's server (MySQL's databases are
// PostgreSQL's schemas).
package exampledb

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SampleURL is the DATABASE_URL the README runs the examples with.
const SampleURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// SampleMySQLURL is the DATABASE_URL that runs an example on MySQL or
// MariaDB.
const SampleMySQLURL = "mysql://root@127.0.0.1:3306/test"

// ErrNoURL is returned by Connect and Open when DATABASE_URL is empty: the
// examples do not fall back to libpq's PG* variables and defaults, so that
// they never write to a database nobody named.
var ErrNoURL = errors.New("DATABASE_URL is not set")

// IsMySQL reports whether url is a mysql:// URL.
func IsMySQL(url string) bool { return strings.HasPrefix(url, "mysql://") }

// Connect opens a pool on url (DATABASE_URL), creates schema if it is
// missing, sets search_path to it on every connection, so that the
// example's tables and idem's land there, and checks that the database
// answers within 5 seconds, saying what to set when it does not. Each
// configure function may change the pool's configuration first (its
// MaxConns, say). An empty url is ErrNoURL, with the URL to set. Connect is
// PostgreSQL's alone: a mysql:// URL is refused, saying so.
func Connect(ctx context.Context, url, schema string, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, fmt.Errorf("%w: name the PostgreSQL 13+ database this example may keep its tables in (in the schema %s, created if missing), e.g.\n    DATABASE_URL='%s'",
			ErrNoURL, schema, SampleURL)
	}
	if IsMySQL(url) {
		return nil, errors.New("DATABASE_URL names a MySQL server: this example runs on PostgreSQL only (quickstart, signup, lead and consume run on both)")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach PostgreSQL through DATABASE_URL (e.g. DATABASE_URL='%s'): %w", SampleURL, err)
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
		pool.Close()
		return nil, fmt.Errorf("creating the schema %s: %w", schema, err)
	}
	return pool, nil
}

// Where is the line an example prints when it starts: the database it
// writes to, the schema its tables and idem's are in, and how to remove
// them.
func Where(pool *pgxpool.Pool, schema string) string {
	cfg := pool.Config().ConnConfig
	return fmt.Sprintf("database %s@%s:%d/%s, schema %s: this example's tables and idem's (DROP SCHEMA %s CASCADE removes them)",
		cfg.User, cfg.Host, cfg.Port, cmp.Or(cfg.Database, cfg.User), schema, schema)
}

// DB is the database an example runs on. Exactly one of Pool and SQL is
// set, by DATABASE_URL's scheme.
type DB struct {
	// Pool is PostgreSQL's pool, its search_path set to the example's
	// schema.
	Pool *pgxpool.Pool
	// SQL is MySQL's or MariaDB's handle, its connections in the
	// example's database.
	SQL *sql.DB

	where string
}

// Options are the settings an example may give Open.
type Options struct {
	// MaxConns caps the pool's connections; 0 leaves the driver's default
	// (pgxpool's: 4, or one per CPU; database/sql's: no cap).
	MaxConns int
	// ParseTime makes MySQL's DATETIME columns scan into time.Time, in UTC
	// (go-sql-driver's parseTime=true). It has no effect on PostgreSQL.
	ParseTime bool
}

// Open connects to the database url names, PostgreSQL or MySQL, with the
// example's tables under name: on PostgreSQL through Connect, in the schema
// name; on MySQL in the database name, created if missing (the URL's own
// database, if it names one, is only where the connection starts). An empty
// url is ErrNoURL, saying what to set.
func Open(ctx context.Context, url, name string, opts Options) (*DB, error) {
	if url == "" {
		return nil, fmt.Errorf("%w: name the database this example may keep its tables in, e.g.\n"+
			"    DATABASE_URL='%s'    (PostgreSQL 13+: in the schema %s, created if missing)\n"+
			"    DATABASE_URL='%s'    (MySQL 8 or MariaDB 10.5+: in the database %s, created if missing)",
			ErrNoURL, SampleURL, name, SampleMySQLURL, name)
	}
	if !IsMySQL(url) {
		pool, err := Connect(ctx, url, name, func(cfg *pgxpool.Config) {
			if opts.MaxConns > 0 {
				cfg.MaxConns = int32(opts.MaxConns)
			}
		})
		if err != nil {
			return nil, err
		}
		return &DB{Pool: pool, where: Where(pool, name)}, nil
	}
	cfg, err := ParseMySQLURL(url)
	if err != nil {
		return nil, err
	}
	if opts.ParseTime {
		cfg.ParseTime, cfg.Loc = true, time.UTC
	}
	db, err := connectMySQL(ctx, cfg, name)
	if err != nil {
		return nil, err
	}
	if opts.MaxConns > 0 {
		db.SetMaxOpenConns(opts.MaxConns)
	}
	return &DB{SQL: db, where: fmt.Sprintf("MySQL %s@%s, database %s: this example's tables and idem's (DROP DATABASE %s removes them)",
		cfg.User, cfg.Addr, name, name)}, nil
}

// Where is the line the example prints when it starts: the server it
// writes to, the schema or database its tables and idem's are in, and how
// to remove them.
func (db *DB) Where() string { return db.where }

// Close closes the pool or the handle.
func (db *DB) Close() {
	if db.Pool != nil {
		db.Pool.Close()
	}
	if db.SQL != nil {
		db.SQL.Close()
	}
}

// ParseMySQLURL turns mysql://user:password@host:port/database?params
// into go-sql-driver's configuration: TCP to host:port (3306 unless given),
// the user and password percent-decoded, and params as the driver's DSN
// takes them (parseTime=true, tls=true, timeout=5s, or a system variable).
func ParseMySQLURL(raw string) (*mysql.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	if u.Scheme != "mysql" {
		return nil, fmt.Errorf("DATABASE_URL: the scheme is %q, want mysql://", u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("DATABASE_URL: no host (e.g. DATABASE_URL='%s')", SampleMySQLURL)
	}
	// The driver reads its parameters from a DSN's query: an empty DSN with
	// them gives a configuration with its defaults and these applied.
	cfg := mysql.NewConfig()
	if u.RawQuery != "" {
		if cfg, err = mysql.ParseDSN("/?" + u.RawQuery); err != nil {
			return nil, fmt.Errorf("DATABASE_URL's parameters: %w", err)
		}
	}
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr = u.Host + ":3306"
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if strings.Contains(cfg.DBName, "/") {
		return nil, fmt.Errorf("DATABASE_URL: %q is not a database name", cfg.DBName)
	}
	return cfg, nil
}

// MySQLURL is the mysql:// URL of cfg, which ParseMySQLURL reads back: its
// user, password, TCP address, database and the parameters of its DSN.
func MySQLURL(cfg *mysql.Config) (string, error) {
	if cfg.Net != "tcp" {
		return "", fmt.Errorf("a mysql:// URL reaches the server over TCP, not %q", cfg.Net)
	}
	u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName}
	if cfg.User != "" {
		u.User = url.User(cfg.User)
		if cfg.Passwd != "" {
			u.User = url.UserPassword(cfg.User, cfg.Passwd)
		}
	}
	_, u.RawQuery, _ = strings.Cut(cfg.FormatDSN(), "?")
	return u.String(), nil
}

// connectMySQL creates the database name on cfg's server if it is missing
// and opens a handle whose connections use it, after checking that the
// server answers within 5 seconds.
func connectMySQL(ctx context.Context, cfg *mysql.Config, name string) (*sql.DB, error) {
	if name == "" || strings.ContainsAny(name, "`\x00") || len(name) > 64 {
		return nil, fmt.Errorf("%q cannot name a MySQL database", name)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	first, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	admin := sql.OpenDB(first)
	defer admin.Close()
	if err := admin.PingContext(pingCtx); err != nil {
		return nil, fmt.Errorf("cannot reach MySQL through DATABASE_URL (e.g. DATABASE_URL='%s'): %w", SampleMySQLURL, err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS `"+name+"` CHARACTER SET utf8mb4"); err != nil {
		return nil, fmt.Errorf("creating the database %s: %w", name, err)
	}
	own := cfg.Clone()
	own.DBName = name
	c, err := mysql.NewConnector(own)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(c), nil
}
