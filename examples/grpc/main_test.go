package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/examples/internal/exampletest"
)

// The tests leave no schema behind (see exampletest.Main).
func TestMain(m *testing.M) { os.Exit(exampletest.Main(m, schema)) }

// The example checks itself: run fails unless the order and its payment
// are one row each, written by one execution, and both calls got the same
// receipt. On each database, it must also print the retried attempt and
// the replays.
func TestOrderPlacedOnceThroughALossyNetwork(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		out := start(t, b)
		if n := strings.Count(out, ": Unavailable"); n != 1 {
			t.Errorf("%d attempts lost their response, want 1:\n%s", n, out)
		}
		if n := strings.Count(out, "replayed: [true]"); n != 2 {
			t.Errorf("%d receipts were replays, want 2:\n%s", n, out)
		}
		if !strings.Contains(out, "rows: 1 order, 1 payment") {
			t.Errorf("the example does not report one order and one payment:\n%s", out)
		}
	})
}

// Run twice on a database of the test's own, it passes both times and
// keeps to its schema (or, on MySQL, its database).
func TestKeepsToItsSchema(t *testing.T) {
	exampletest.KeepsToSchema(t, schema, func(url string) {
		start(t, exampletest.Backend{Name: "postgres", URL: url, Tables: schema})
	})
}

func TestKeepsToItsDatabase(t *testing.T) {
	exampletest.KeepsToDatabase(t, func(url, database string) {
		start(t, exampletest.Backend{Name: "mysql", URL: url, Tables: database})
	})
}

// start runs the example on b, fails the test if it fails, checks the line
// under the headline and returns what it printed.
func start(t *testing.T, b exampletest.Backend) string {
	t.Helper()
	var out strings.Builder
	if err := run(context.Background(), b.URL, b.Tables, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	exampletest.SaysWhereOn(t, b, strings.Split(out.String(), "\n")[1])
	return out.String()
}

// Without DATABASE_URL the example writes nowhere, and says what to set.
func TestWithoutDatabaseURL(t *testing.T) {
	var out strings.Builder
	err := run(context.Background(), "", schema, &out)
	if !errors.Is(err, exampledb.ErrNoURL) {
		t.Fatalf("run without DATABASE_URL: %v", err)
	}
	if out.Len() > 0 {
		t.Errorf("run without DATABASE_URL printed %q", out.String())
	}
}
