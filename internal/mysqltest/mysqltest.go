// Package mysqltest gives tests a database of their own on the MySQL or
// MariaDB server that TEST_MYSQL_DSN names, in every module of the
// repository. It is never part of the library.
package mysqltest

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// Env names the DSN of a MySQL or MariaDB server whose user may create
// databases, e.g. root@tcp(127.0.0.1:3306)/test.
const Env = "TEST_MYSQL_DSN"

// Server returns the server of TEST_MYSQL_DSN, parsed. Without it the test
// is skipped, unless CI is set, when it fails: CI must not pass by
// skipping.
func Server(t testing.TB) *mysql.Config {
	t.Helper()
	dsn := os.Getenv(Env)
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set (.ci/run sets it)", Env)
		}
		t.Skipf("%s is not set: point it at a MySQL or MariaDB server, e.g. %s='root@tcp(127.0.0.1:3306)/test'", Env, Env)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("%s: %v", Env, err)
	}
	return cfg
}

// Database creates a database on the server of TEST_MYSQL_DSN, named
// prefix and random hex, which is dropped when the test ends, and returns
// the server's settings with DBName set to it.
func Database(t testing.TB, prefix string) *mysql.Config {
	t.Helper()
	cfg := Server(t)
	admin := *cfg
	admin.DBName = ""
	db, err := sql.Open("mysql", admin.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	if _, err := db.Exec("CREATE DATABASE " + name); err != nil {
		db.Close()
		t.Fatalf("creating the test's database: %v", err)
	}
	t.Cleanup(func() {
		defer db.Close()
		if _, err := db.Exec("DROP DATABASE IF EXISTS " + name); err != nil {
			t.Errorf("dropping the test's database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	return cfg
}
