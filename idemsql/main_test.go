package idemsql_test

import (
	"fmt"
	"os"
	"testing"
)

// The runnable examples need a database: TEST_DATABASE_URL. This is the
// only TestMain of the package (its internal and external tests share one
// test binary).
func TestMain(m *testing.M) {
	if os.Getenv("TEST_DATABASE_URL") == "" {
		fmt.Fprintln(os.Stderr, `TEST_DATABASE_URL is not set. The examples of package idemsql run against PostgreSQL:
    TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable go test ./idemsql/
(see README.md; .ci/run creates a throwaway database and sets it).`)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
