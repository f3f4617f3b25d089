// Package exampletest lets the tests of an example leave the database they
// ran against as they found it. Each example keeps its tables in a schema
// of its own (lead_example, orders_example, ...): Main creates it for the
// tests, marked as theirs, and drops it when they end.
package exampletest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// marker is the comment on a schema the tests made.
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

// DatabaseURL is TEST_DATABASE_URL with search_path set to schema, for an
// example that keeps its tables in the first schema of its search_path. It
// is "" when TEST_DATABASE_URL is not set.
func DatabaseURL(schema string) string {
	dsn := strings.TrimSpace(os.Getenv("TEST_DATABASE_URL"))
	if dsn == "" {
		return ""
	}
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " search_path=" + schema // keyword/value form
}
