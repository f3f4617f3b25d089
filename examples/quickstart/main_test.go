package main

import (
	"context"
	"os"
	"testing"

	"github.com/idemkit/idem/examples/internal/exampletest"
)

// testSchema holds the tables of the quickstart's tests. (The quickstart
// itself uses the first schema of DATABASE_URL's search_path.)
const testSchema = "quickstart_example"

// The tests leave no schema behind (see exampletest.Main).
func TestMain(m *testing.M) { os.Exit(exampletest.Main(m, testSchema)) }

// The quickstart itself is a check: run fails unless the sign-up table holds
// exactly one row per user. Two runs in a row must both pass.
func TestQuickstartRunsTwice(t *testing.T) {
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database (see README.md)")
	}
	t.Setenv("DATABASE_URL", exampletest.DatabaseURL(testSchema))
	for range 2 {
		if err := run(context.Background(), 100); err != nil {
			t.Fatal(err)
		}
	}
}
