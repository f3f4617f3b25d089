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
