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
		var out strings.Builder
		if err := run(context.Background(), 100, url, &out); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		lines := strings.Split(out.String(), "\n")
		exampletest.SaysWhere(t, lines[1], schema) // under the headline
	})
}

// Without DATABASE_URL the quickstart writes nowhere, and says what to set.
func TestQuickstartWithoutDatabaseURL(t *testing.T) {
	var out strings.Builder
	err := run(context.Background(), 1, "", &out)
	if !errors.Is(err, exampledb.ErrNoURL) || !strings.Contains(err.Error(), "DATABASE_URL='postgres://") {
		t.Fatalf("run without DATABASE_URL: %v", err)
	}
	if out.Len() > 0 {
		t.Errorf("run without DATABASE_URL printed %q", out.String())
	}
}
