package exampletest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/examples/internal/exampledb"
)

// MySQLEnv is the variable that names the MySQL or MariaDB server of the
// tests, as a go-sql-driver DSN: TEST_MYSQL_DSN='root@tcp(127.0.0.1:3306)/test'.
const MySQLEnv = "TEST_MYSQL_DSN"

// Backend is one database an example's tests run it on.
type Backend struct {
	// Name is "postgres" or "mysql", the subtest's name.
	Name string
	// URL is the DATABASE_URL the example is started with.
	URL string
	// Tables is where the example keeps its tables: the schema on
	// PostgreSQL, the database on MySQL.
	Tables string
}

// MySQL reports whether b is the MySQL one.
func (b Backend) MySQL() bool { return b.Name == "mysql" }

// Postgres is the backend on TEST_DATABASE_URL, with the tables in schema
// (made and dropped by Main). Without TEST_DATABASE_URL the test fails,
// saying so, as the examples' PostgreSQL tests always have.
func Postgres(t *testing.T, schema string) Backend {
	t.Helper()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database (see README.md)")
	}
	return Backend{Name: "postgres", URL: url, Tables: schema}
}

// MySQLBackend is a backend on TEST_MYSQL_DSN's server whose tables go to
// a database of the test's own, dropped when the test ends; its URL names
// TEST_MYSQL_DSN's database, as a reader's DATABASE_URL would. Without
// TEST_MYSQL_DSN the test is skipped, unless CI is set, when it fails.
func MySQLBackend(t *testing.T) Backend {
	t.Helper()
	cfg := mysqlConfig(t)
	url, err := exampledb.MySQLURL(cfg)
	if err != nil {
		t.Fatalf("%s: %v", MySQLEnv, err)
	}
	return Backend{Name: "mysql", URL: url, Tables: FreshMySQLDatabase(t)}
}

// OnEach runs test once on each database, as the subtests postgres (the
// tables in schema) and mysql (in a database of its own).
func OnEach(t *testing.T, schema string, test func(t *testing.T, b Backend)) {
	t.Helper()
	t.Run("postgres", func(t *testing.T) { test(t, Postgres(t, schema)) })
	t.Run("mysql", func(t *testing.T) { test(t, MySQLBackend(t)) })
}

// mysqlConfig is TEST_MYSQL_DSN parsed, or the test skipped (failed with CI
// set) without it.
func mysqlConfig(t *testing.T) *mysql.Config {
	t.Helper()
	dsn := os.Getenv(MySQLEnv)
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set (and CI is): point it at a MySQL or MariaDB server, e.g. %s='root@tcp(127.0.0.1:3306)/test'", MySQLEnv, MySQLEnv)
		}
		t.Skipf("%s is not set: point it at a MySQL or MariaDB server, e.g. %s='root@tcp(127.0.0.1:3306)/test'", MySQLEnv, MySQLEnv)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("%s: %v", MySQLEnv, err)
	}
	return cfg
}

// mysqlAdmin opens a handle on TEST_MYSQL_DSN, closed when the test ends.
func mysqlAdmin(t *testing.T) *sql.DB {
	t.Helper()
	c, err := mysql.NewConnector(mysqlConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	return db
}

// FreshMySQLDatabase creates an empty database on TEST_MYSQL_DSN's server,
// with a comment saying the tests made it, drops it when the test ends, and
// returns its name.
func FreshMySQLDatabase(t *testing.T) string {
	t.Helper()
	admin := mysqlAdmin(t)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idem_example_" + hex.EncodeToString(b)
	if _, err := admin.Exec("CREATE DATABASE `" + name + "` COMMENT '" + marker + "'"); err != nil {
		t.Fatalf("creating a database for the test: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE IF EXISTS `" + name + "`"); err != nil {
			t.Errorf("dropping the test's database %s: %v", name, err)
		}
	})
	return name
}

// KeepsToDatabase is KeepsToSchema on MySQL: it starts the example twice
// (the second start finds its database in place) with its tables in a
// database of the test's own, on a URL that names another one, also the
// test's own, and fails the test if the example made a table in the URL's
// database, or none of idem's tables in its own. Both are dropped when the
// test ends.
func KeepsToDatabase(t *testing.T, start func(url, database string)) {
	t.Helper()
	cfg := mysqlConfig(t)
	cfg.DBName = FreshMySQLDatabase(t)
	url, err := exampledb.MySQLURL(cfg)
	if err != nil {
		t.Fatal(err)
	}
	own := FreshMySQLDatabase(t)
	for range 2 {
		start(url, own)
	}
	if tables := mysqlTables(t, cfg.DBName); len(tables) > 0 {
		t.Errorf("the example made %v in the URL's database %s, outside its database %s", tables, cfg.DBName, own)
	}
	if tables := mysqlTables(t, own); !slices.Contains(tables, "idempotent_record") {
		t.Errorf("database %s holds %v, not idem's record table", own, tables)
	}
}

// mysqlTables lists the tables and views of database, sorted.
func mysqlTables(t *testing.T, database string) []string {
	t.Helper()
	rows, err := mysqlAdmin(t).Query(`SELECT table_name FROM information_schema.tables WHERE table_schema = ? ORDER BY 1`, database)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// SaysWhereOn is SaysWhere for either backend: on MySQL the line must name
// the database and how to drop it.
func SaysWhereOn(t *testing.T, b Backend, line string) {
	t.Helper()
	if !b.MySQL() {
		SaysWhere(t, line, b.Tables)
		return
	}
	if !strings.Contains(line, "database "+b.Tables) || !strings.Contains(line, "DROP DATABASE "+b.Tables) {
		t.Errorf("the example's line %q does not say that its tables are in the database %s, and how to drop it", line, b.Tables)
	}
}

// Count runs query, a SELECT of one integer written with ? placeholders,
// on db (rewritten to $1, $2, ... on PostgreSQL), and returns the integer.
func Count(t *testing.T, db *exampledb.DB, query string, args ...any) int {
	t.Helper()
	var n int
	var err error
	if db.Pool != nil {
		err = db.Pool.QueryRow(context.Background(), dollars(query), args...).Scan(&n)
	} else {
		err = db.SQL.QueryRow(query, args...).Scan(&n)
	}
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// Exec runs statement, written with ? placeholders, on db.
func Exec(t *testing.T, db *exampledb.DB, statement string, args ...any) {
	t.Helper()
	var err error
	if db.Pool != nil {
		_, err = db.Pool.Exec(context.Background(), dollars(statement), args...)
	} else {
		_, err = db.SQL.Exec(statement, args...)
	}
	if err != nil {
		t.Fatalf("%s: %v", statement, err)
	}
}

// dollars numbers the ? placeholders of query for PostgreSQL. The tests'
// queries hold no ? in a literal.
func dollars(query string) string {
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
