package exampledb

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// Without DATABASE_URL an example connects nowhere, even where libpq's PG*
// variables name a server that would answer, and says what to set.
func TestConnectWithoutURL(t *testing.T) {
	t.Setenv("PGHOST", "127.0.0.1")
	t.Setenv("PGPORT", "5432")
	t.Setenv("PGUSER", "postgres")
	t.Setenv("PGDATABASE", "postgres")
	pool, err := Connect(context.Background(), "", "some_example")
	if pool != nil {
		pool.Close()
	}
	if !errors.Is(err, ErrNoURL) {
		t.Fatalf("Connect without a URL: %v, want ErrNoURL", err)
	}
	for _, want := range []string{"DATABASE_URL='" + SampleURL + "'", "schema some_example"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}
}

// A mysql:// URL becomes go-sql-driver's configuration: the user and the
// percent-encoded password, TCP to the host (3306 unless given), the
// database, and the driver's parameters; MySQLURL reads back as the same.
func TestParseMySQLURL(t *testing.T) {
	cfg, err := ParseMySQLURL("mysql://app:p%40ss%2Fw@db.example:3307/shop?parseTime=true&timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "app" || cfg.Passwd != "p@ss/w" || cfg.Net != "tcp" || cfg.Addr != "db.example:3307" ||
		cfg.DBName != "shop" || !cfg.ParseTime || cfg.Timeout.String() != "2s" {
		t.Fatalf("parsed %+v", cfg)
	}
	url, err := MySQLURL(cfg)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseMySQLURL(url)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	if back.FormatDSN() != cfg.FormatDSN() {
		t.Errorf("%s reads back as %s, want %s", url, back.FormatDSN(), cfg.FormatDSN())
	}

	cfg, err = ParseMySQLURL("mysql://root@127.0.0.1/")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "127.0.0.1:3306" || cfg.DBName != "" || cfg.ParseTime {
		t.Errorf("defaults: %+v", cfg)
	}
	for _, bad := range []string{"mysql:///test", "mysql://root@h/a/b", "mysql://root@h/db?parseTime=maybe", "postgres://h/db"} {
		if _, err := ParseMySQLURL(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// Connect is PostgreSQL's: a mysql:// URL is refused, saying so, before
// anything is dialled.
func TestConnectRefusesMySQL(t *testing.T) {
	_, err := Connect(context.Background(), SampleMySQLURL, "some_example")
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL only") {
		t.Fatalf("Connect with a mysql:// URL: %v", err)
	}
}
