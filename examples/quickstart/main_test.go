package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/examples/internal/exampletest"
)

// The quickstart itself is a check: run fails unless the sign-up table holds
// exactly one row per user. Run twice, as the README runs it (DATABASE_URL
// with no search_path), on a database of the test's own, it must pass both
// times, leave public and every other schema as they were, and say in its
// first lines where its tables are and how to drop them.
func TestQuickstartKeepsToItsSchema(t *testing.T) {
	exampletest.KeepsToSchema(t, schema, func(url string) {
		start(t, exampletest.Backend{Name: "postgres", URL: url, Tables: schema})
	})
}

// On MySQL the same, with its tables in a database of its own: the
// database the URL names gets none of them.
func TestQuickstartKeepsToItsDatabase(t *testing.T) {
	exampletest.KeepsToDatabase(t, func(url, database string) {
		start(t, exampletest.Backend{Name: "mysql", URL: url, Tables: database})
	})
}

// start runs the quickstart with 100 users on b and checks its line under
// the headline.
func start(t *testing.T, b exampletest.Backend) {
	t.Helper()
	var out strings.Builder
	if err := run(context.Background(), 100, b.URL, b.Tables, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := strings.Split(out.String(), "\n")
	exampletest.SaysWhereOn(t, b, lines[1]) // under the headline
}

// Without DATABASE_URL the quickstart writes nowhere, and says what to set,
// for either database.
func TestQuickstartWithoutDatabaseURL(t *testing.T) {
	var out strings.Builder
	err := run(context.Background(), 1, "", schema, &out)
	if !errors.Is(err, exampledb.ErrNoURL) || !strings.Contains(err.Error(), "DATABASE_URL='postgres://") ||
		!strings.Contains(err.Error(), "DATABASE_URL='mysql://") {
		t.Fatalf("run without DATABASE_URL: %v", err)
	}
	if out.Len() > 0 {
		t.Errorf("run without DATABASE_URL printed %q", out.String())
	}
}
