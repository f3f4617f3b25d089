// Package exampletest lets the tests of an example leave the database they
// ran against as they found it. Each example keeps its tables in a schema
// of its own (lead_example, orders_example, ...): Main creates it for the
// tests, marked as theirs, and drops it when they end. KeepsToSchema checks
// on a database of the test's own that an example writes nowhere else.
//
// The examples that also run on MySQL or MariaDB run their tests on both:
// OnEach runs a test on TEST_DATABASE_URL and on TEST_MYSQL_DSN, where each
// test keeps the example's tables in a database of its own, dropped when
// it ends (without TEST_MYSQL_DSN the MySQL half is skipped, unless CI is
// set, when it fails). KeepsToDatabase is KeepsToSchema on MySQL; Count
// and Exec run SQL written with ? placeholders on either.
package exampletest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// marker is the comment on a schema or database the tests made.
const marker = "made by the tests of an idem example; dropped when they end"

// Main runs the tests of an example whose tables live in schema, on
// TEST_DATABASE_URL, and returns the code for os.Exit. Before the tests it
// creates schema, with a comment saying the tests made it. A schema that
// exists without that comment was made by a run of the example itself: it
// is kept, and the tests add their rows to it. After the tests Main drops
// the schema if it carries the comment (made by these tests, or left by an
// interrupted run of them). Without TEST_DATABASE_URL it only runs the
// tests, which fail saying so.
func Main(m *testing.M, schema string) int {
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		return m.Run()
	}
	ctx := context.Background()
	ours, err := create(ctx, dsn, schema)
	if err != nil {
		fmt.Fprintf(os.Stderr, "creating schema %s for the tests: %v\n", schema, err)
		return 1
	}
	if !ours {
		fmt.Fprintf(os.Stderr, "schema %s was made by a run of the example, not by its tests: it is kept, with the tests' rows\n", schema)
	}
	code := m.Run()
	if ours {
		if err := drop(ctx, dsn, schema); err != nil {
			fmt.Fprintf(os.Stderr, "dropping schema %s after the tests: %v\n", schema, err)
			code = max(code, 1)
		}
	}
	return code
}

// create makes schema, commented as the tests', and reports whether the
// tests own it: they made it now, or an earlier run of them did.
func create(ctx context.Context, dsn, schema string) (bool, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	var comment *string
	err = conn.QueryRow(ctx, `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1`, schema).Scan(&comment)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		ident := pgx.Identifier{schema}.Sanitize()
		_, err := conn.Exec(ctx, `CREATE SCHEMA `+ident+`; COMMENT ON SCHEMA `+ident+` IS '`+marker+`'`)
		return err == nil, err
	case err != nil:
		return false, err
	}
	return comment != nil && *comment == marker, nil
}

// drop drops schema and everything in it.
func drop(ctx context.Context, dsn, schema string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	return err
}

// KeepsToSchema checks that an example keeps to its schema: it runs the
// example twice (the second run finds the schema in place) on a database of
// its own, created for the test on TEST_DATABASE_URL's server and dropped
// when the test ends, and fails the test if the example made a table, index,
// sequence or view outside schema, or none of idem's tables in it. start
// runs the example on url, a URL with no search_path, as the README's
// DATABASE_URL has none.
func KeepsToSchema(t *testing.T, schema string, start func(url string)) {
	t.Helper()
	url := freshDatabase(t)
	before := relations(t, url)
	for range 2 {
		start(url)
	}
	after := relations(t, url)
	for s, names := range after {
		if s != schema && !slices.Equal(names, before[s]) {
			t.Errorf("the example made %v in schema %s, outside its schema %s (before it: %v)", names, s, schema, before[s])
		}
	}
	if !slices.Contains(after[schema], "idempotent_record") {
		t.Errorf("schema %s holds %v, not idem's record table", schema, after[schema])
	}
}

// SaysWhere fails the test unless line, printed by an example as it
// starts, names schema and how to drop it.
func SaysWhere(t *testing.T, line, schema string) {
	t.Helper()
	if !strings.Contains(line, "schema "+schema) || !strings.Contains(line, "DROP SCHEMA "+schema+" CASCADE") {
		t.Errorf("the example's line %q does not say that its tables are in the schema %s, and how to drop it", line, schema)
	}
}

// freshDatabase creates an empty database, commented as the tests', on the
// server of TEST_DATABASE_URL, drops it when the test ends, and returns its
// URL.
func freshDatabase(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("TEST_DATABASE_URL")
	if dsn == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database (see README.md)")
	}
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idem_example_" + hex.EncodeToString(b)
	ident := pgx.Identifier{name}.Sanitize()
	admin := func(sql string) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	// CREATE DATABASE copies template1, and fails while another session is
	// connected to it (55006): wait for that one to go.
	var err error
	for range 50 {
		var pgErr *pgconn.PgError
		if err = admin(`CREATE DATABASE ` + ident); !errors.As(err, &pgErr) || pgErr.Code != objectInUse {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("creating a database for the test: %v", err)
	}
	t.Cleanup(func() {
		if err := admin(`DROP DATABASE IF EXISTS ` + ident + ` WITH (FORCE)`); err != nil {
			t.Errorf("dropping the test's database %s: %v", ident, err)
		}
	})
	if err := admin(`COMMENT ON DATABASE ` + ident + ` IS '` + marker + `'`); err != nil {
		t.Fatal(err)
	}
	return withDatabase(dsn, name)
}

// objectInUse is SQLSTATE 55006, object_in_use.
const objectInUse = "55006"

// withDatabase is dsn naming the database name instead of its own.
func withDatabase(dsn, name string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		q := u.Query()
		q.Del("dbname")
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " dbname=" + name // keyword/value form: the last one counts
}

// relations lists the tables, indexes, sequences and views of the database
// at dsn, sorted, by schema, leaving out PostgreSQL's own schemas.
func relations(t *testing.T, dsn string) map[string][]string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `
		SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\_%'
		ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string][]string{}
	var schema, name string
	if _, err := pgx.ForEachRow(rows, []any{&schema, &name}, func() error {
		found[schema] = append(found[schema], name)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return found
}
