package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	migratemysql "github.com/golang-migrate/migrate/v4/database/mysql"
	"github.com/golang-migrate/migrate/v4/source"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	mysqlmigrations "github.com/idemkit/idem/migrations/mysql"
)

// parseMySQL reads s, a mysql:// or mariadb:// URL or a go-sql-driver DSN,
// into the driver's settings. A URL is
//
//	mysql://user:password@host:port/database?param=value&...
//
// its user and password percent-encoded, the port 3306 when left out, the
// host 127.0.0.1 when left out, and its parameters those of a
// go-sql-driver DSN (parseTime, tls, timeout, ..., and any other as a
// session variable). Errors never repeat the password.
func parseMySQL(s string) (*mysql.Config, error) {
	scheme, _, _ := strings.Cut(s, "://")
	switch strings.ToLower(scheme) {
	case "mysql", "mariadb":
	default:
		cfg, err := mysql.ParseDSN(s)
		if err != nil {
			return nil, fmt.Errorf("reading the DSN: %w", err)
		}
		return cfg, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // ue's message holds the whole URL, password and all
		}
		return nil, fmt.Errorf("reading the URL: %w", err)
	}
	cfg := mysql.NewConfig()
	cfg.Net = "tcp"
	if u.Host != "" {
		cfg.Addr = u.Host
		if u.Port() == "" {
			cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
		}
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	if strings.Contains(cfg.User, ":") {
		return nil, errors.New("reading the URL: the go-sql-driver cannot take a user name with a colon")
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if strings.Contains(cfg.DBName, "/") {
		return nil, fmt.Errorf("reading the URL: the path names one database (%s://host/database), not %q", scheme, u.Path)
	}
	params, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("reading the URL's parameters: %w", err)
	}
	// The driver reads its parameters, and sets the others as session
	// variables, from the DSN these settings make.
	dsn := cfg.FormatDSN()
	if len(params) > 0 {
		dsn += "?" + params.Encode()
	}
	parsed, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("reading the URL's parameters: %w", err)
	}
	if parsed.User != cfg.User || parsed.Passwd != cfg.Passwd || parsed.DBName != cfg.DBName {
		return nil, errors.New("reading the URL: the go-sql-driver cannot take its user, password or database as they are; " +
			"pass a DSN instead (user:password@tcp(host:port)/database)")
	}
	return parsed, nil
}

// connectMySQL connects to the MySQL or MariaDB server of s. migrate runs
// in the database --schema names, else the URL's.
func (c *common) connectMySQL(ctx context.Context, s string, forMigrate bool) (store, error) {
	cfg, err := parseMySQL(s)
	if err != nil {
		return nil, err
	}
	if forMigrate && c.table != idem.DefaultTable {
		return nil, usageError{fmt.Sprintf("on MySQL, migrate creates the tables %s and %s, in the database of --schema or of the URL; "+
			"it cannot create a record table of another name (--table %s): create that one from the SQL files of "+
			"github.com/idemkit/idem/migrations/mysql with its name changed", idem.DefaultTable, idem.DefaultInboxTable, c.table)}
	}
	if forMigrate && c.schema != "" {
		cfg.DBName = c.schema
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.ConnectionAttributes == "" {
		cfg.ConnectionAttributes = "program_name:idem-cli"
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("reading the connection settings: %w", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(2)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connecting to %s@%s/%s: %w\n(set --database-url or DATABASE_URL)", cfg.User, cfg.Addr, cfg.DBName, err)
	}
	return &mysqlStore{db: db, c: c}, nil
}

// mysqlStore is a MySQL or MariaDB database. --schema names the database
// of the tables: migrate runs in it, the other commands qualify the tables
// with it.
type mysqlStore struct {
	db *sql.DB
	c  *common
}

// errNoDatabase is a connection that selected no database, with no
// --schema to name one.
var errNoDatabase = errors.New("no database selected: name it in the URL (mysql://host/DATABASE), " +
	"in the DSN (user@tcp(host:3306)/DATABASE) or with --schema")

// The errors of MySQL's this file tells apart.
const (
	mysqlNoDatabase = 1046 // ER_NO_DB_ERROR
	mysqlNoTable    = 1146 // ER_NO_SUCH_TABLE
)

func mysqlErrorNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// database is the connection's database, where migrate runs.
func (s *mysqlStore) database(ctx context.Context) (string, error) {
	var name sql.NullString
	if err := s.db.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&name); err != nil {
		return "", err
	}
	if !name.Valid {
		return "", errNoDatabase
	}
	return name.String, nil
}

// version reads golang-migrate's version table, writing nothing: a table
// that does not exist is version 0, not dirty.
func (s *mysqlStore) version(ctx context.Context) (uint, bool, error) {
	if _, err := s.database(ctx); err != nil {
		return 0, false, err
	}
	var v int64
	var dirty bool
	err := s.db.QueryRowContext(ctx, "SELECT version, dirty FROM `"+mysqlmigrations.VersionTable+"` LIMIT 1").Scan(&v, &dirty)
	switch {
	case errors.Is(err, sql.ErrNoRows) || mysqlErrorNumber(err) == mysqlNoTable:
		return 0, false, nil
	case err != nil:
		return 0, false, fmt.Errorf("reading the migrations' version: %w", err)
	}
	return uint(max(v, 0)), dirty, nil
}

func (s *mysqlStore) up(ctx context.Context) error {
	if _, err := s.database(ctx); err != nil {
		return err
	}
	return mysqlmigrations.Up(ctx, s.db)
}

// down reverts the migrations, then drops the version table, so that
// nothing of idem's is left, as on PostgreSQL. With no version recorded it
// writes nothing.
func (s *mysqlStore) down(ctx context.Context) error {
	v, dirty, err := s.version(ctx)
	if err != nil || (v == 0 && !dirty) {
		return err
	}
	if err := mysqlmigrations.Down(ctx, s.db); err != nil {
		return err
	}
	if _, err := s.db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+mysqlmigrations.VersionTable+"`"); err != nil {
		return fmt.Errorf("dropping the version table: %w", err)
	}
	return nil
}

// force records v in golang-migrate's version table, not dirty, under its
// lock, running no migration. v is -1 (none) or the version of one of the
// MySQL migrations; with no version table, -1 writes nothing.
func (s *mysqlStore) force(ctx context.Context, v int) (err error) {
	if v != -1 && !knownMySQLVersion(v) {
		return fmt.Errorf("%w: force needs -1 or the version of one of idem's MySQL migrations, not %d", idem.ErrInvalidOption, v)
	}
	if _, err := s.database(ctx); err != nil {
		return err
	}
	if v == -1 {
		var n int
		if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`,
			mysqlmigrations.VersionTable).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	// The driver closes conn when it is closed.
	drv, err := migratemysql.WithConnection(ctx, conn, &migratemysql.Config{MigrationsTable: mysqlmigrations.VersionTable})
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("migrate force: %w", err)
	}
	defer func() { err = errors.Join(err, drv.Close()) }()
	if err := drv.Lock(); err != nil {
		return fmt.Errorf("migrate force: %w", err)
	}
	err = drv.SetVersion(v, false)
	if uerr := drv.Unlock(); err == nil {
		err = uerr
	}
	if err != nil {
		return fmt.Errorf("migrate force: %w", err)
	}
	return nil
}

// knownMySQLVersion reports whether one of the MySQL migrations' files has
// version v.
func knownMySQLVersion(v int) bool {
	entries, _ := fs.ReadDir(mysqlmigrations.FS, ".")
	for _, e := range entries {
		if m, err := source.Parse(e.Name()); err == nil && v > 0 && m.Version == uint(v) {
			return true
		}
	}
	return false
}

func (s *mysqlStore) lookup(ctx context.Context, scope, key string) (*idem.Record, error) {
	return idemmysql.Lookup(ctx, s.db, scope, key, s.c.options()...)
}

func (s *mysqlStore) stuck(ctx context.Context, limit int) ([]idem.Record, error) {
	return idemmysql.Stuck(ctx, s.db, limit, s.c.options()...)
}

func (s *mysqlStore) stats(ctx context.Context) (*idem.Stats, error) {
	return idemmysql.TableStats(ctx, s.db, s.c.options()...)
}

func (s *mysqlStore) countExpired(ctx context.Context, inbox time.Duration) (int64, int64, error) {
	return idemmysql.CountExpired(ctx, s.db, inbox, s.c.options()...)
}

func (s *mysqlStore) purge(ctx context.Context, p idem.PurgeParams) (int64, error) {
	return idemmysql.Purge(ctx, s.db, p, s.c.options()...)
}

func (s *mysqlStore) close() { s.db.Close() }

// explain returns err, or, when err is a statement's on a table that does
// not exist (error 1146), a missingTableError naming the table: the record
// table, or else the inbox, whichever is missing. A connection without a
// database (error 1046) is told how to name one.
func (s *mysqlStore) explain(ctx context.Context, err error) error {
	switch mysqlErrorNumber(err) {
	case mysqlNoDatabase:
		return errNoDatabase
	case mysqlNoTable:
	default:
		return err
	}
	c := s.c
	var schema sql.NullString
	if c.schema != "" {
		schema = sql.NullString{String: c.schema, Valid: true}
	}
	var database sql.NullString
	var databaseExists, recordsExist bool
	if s.db.QueryRowContext(ctx, `SELECT DATABASE(),
		EXISTS (SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = COALESCE(?, DATABASE())),
		EXISTS (SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?)`,
		schema, schema, c.table).Scan(&database, &databaseExists, &recordsExist) != nil {
		return err
	}
	if !databaseExists {
		return fmt.Errorf("database %s does not exist: create it (CREATE DATABASE %s), then run 'idem migrate up --schema %s', "+
			"or name the database with --schema", c.schema, c.schema, c.schema)
	}
	missing, table := c.target(), c.table
	if recordsExist {
		missing, table = c.qualified(idem.DefaultInboxTable), idem.DefaultInboxTable
	}
	if c.schema == "" {
		missing += " (in database " + database.String + ")"
	}
	remedy := "run 'idem migrate up"
	if c.schema != "" {
		remedy += " --schema " + c.schema
	}
	remedy += "' to create it"
	if table != idem.DefaultTable && table != idem.DefaultInboxTable {
		remedy = "create it from the SQL files of github.com/idemkit/idem/migrations/mysql with its name changed " +
			"('idem migrate up' creates " + idem.DefaultTable + ")"
	}
	return &missingTableError{table: missing, remedy: remedy}
}
