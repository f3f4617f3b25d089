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

// The queue delivers a batch at least once, then the whole batch again,
// three copies of every message at once: the points table, which has no
// unique key, holds one row per message, and the second round processes
// nothing.
func TestRedeliveriesCreditOnce(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ctx := context.Background()
		db, err := exampledb.Open(ctx, b.URL, b.Tables, exampledb.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		st := storeOf(db)
		batch, err := st.setUp(ctx)
		if err != nil {
			t.Fatal(err)
		}
		const n = 60
		msgs := batchOf(batch, n)
		var first consumerStats
		if err := deliver(ctx, st, msgs, copiesOf, failingFirst(), &first); err != nil {
			t.Fatal(err)
		}
		if p := first.processed.Load(); p != n {
			t.Errorf("the first round processed %d messages, want %d", p, n)
		}
		if f := first.failed.Load(); f < n/7 {
			t.Errorf("%d failed deliveries, want at least the %d planned", f, n/7)
		}
		var again consumerStats
		if err := deliver(ctx, st, msgs, func(int) int { return 3 }, failingFirst(), &again); err != nil {
			t.Fatal(err)
		}
		if p, d := again.processed.Load(), again.duplicates.Load(); p != 0 || d != 3*n {
			t.Errorf("the redelivered batch: %d processed, %d duplicates; want 0 and %d", p, d, 3*n)
		}
		rows := exampletest.Count(t, db, `SELECT count(*) FROM loyalty_points WHERE batch = ?`, batch)
		orders := exampletest.Count(t, db, `SELECT count(DISTINCT order_id) FROM loyalty_points WHERE batch = ?`, batch)
		if rows != n || orders != n {
			t.Fatalf("loyalty_points holds %d rows for %d orders, want %d of each", rows, orders, n)
		}
	})
}

// run checks itself (one row per message) and says where its tables are;
// run twice on a database of the test's own, it passes both times and
// keeps to its schema.
func TestKeepsToItsSchema(t *testing.T) {
	exampletest.KeepsToSchema(t, schema, func(url string) {
		start(t, exampletest.Backend{Name: "postgres", URL: url, Tables: schema})
	})
}

// On MySQL the same, in a database of its own.
func TestKeepsToItsDatabase(t *testing.T) {
	exampletest.KeepsToDatabase(t, func(url, database string) {
		start(t, exampletest.Backend{Name: "mysql", URL: url, Tables: database})
	})
}

func start(t *testing.T, b exampletest.Backend) {
	t.Helper()
	var out strings.Builder
	if err := run(context.Background(), 50, b.URL, b.Tables, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := strings.Split(out.String(), "\n")
	exampletest.SaysWhereOn(t, b, lines[1])
	if !strings.Contains(out.String(), "OK: ") {
		t.Errorf("run printed no verdict:\n%s", out.String())
	}
}

// Without DATABASE_URL the example writes nowhere, and says what to set.
func TestWithoutDatabaseURL(t *testing.T) {
	var out strings.Builder
	err := run(context.Background(), 1, "", schema, &out)
	if !errors.Is(err, exampledb.ErrNoURL) || !strings.Contains(err.Error(), "DATABASE_URL='mysql://") {
		t.Fatalf("run without DATABASE_URL: %v", err)
	}
	if out.Len() > 0 {
		t.Errorf("run printed %q", out.String())
	}
}
