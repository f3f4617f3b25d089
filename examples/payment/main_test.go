package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/idemkit/idem/examples/internal/exampletest"
)

// The tests leave no schema behind (see exampletest.Main).
func TestMain(m *testing.M) { os.Exit(exampletest.Main(m, schema)) }

// The example keeps its tables and idem's in its schema: run twice on a
// database of the test's own, with a DATABASE_URL that names no
// search_path, it leaves public and every other schema as they were.
func TestKeepsToItsSchema(t *testing.T) {
	exampletest.KeepsToSchema(t, schema, func(url string) {
		t.Setenv("DATABASE_URL", url)
		var out bytes.Buffer
		if err := run(context.Background(), &out); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		first, _, _ := strings.Cut(out.String(), "\n")
		exampletest.SaysWhere(t, first, schema)
	})
}

// The example checks itself: run fails unless the gateway holds exactly one
// charge and the database one payment.
func TestPaymentChargedOnce(t *testing.T) {
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database (see README.md)")
	}
	t.Setenv("DATABASE_URL", url)
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"took over", `checkpoint "charging"`, "not charging again", "stale fencing token", "lease lost", "OK: charged exactly once"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the story lacks %q:\n%s", want, out.String())
		}
	}

	// The example's README.md shows a run's output: it must be what the
	// example prints, the random payment reference and the database's
	// address aside.
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	shown := transcript(string(readme), "database ")
	if shown == "" {
		t.Fatal("README.md of this example has no transcript (a text block starting with \"database \")")
	}
	if got, want := normalize(out.String()), normalize(shown); got != want {
		t.Errorf("README.md's transcript differs from what the example prints; replace it with:\n%s", out.String())
	}
}

// transcript returns the body of the first ```text block of a markdown text
// whose first line starts with prefix.
func transcript(markdown, prefix string) string {
	for _, part := range strings.Split(markdown, "```text\n")[1:] {
		body, _, ok := strings.Cut(part, "```")
		if ok && strings.HasPrefix(body, prefix) {
			return body
		}
	}
	return ""
}

var (
	paymentRef = regexp.MustCompile(`pay-[0-9a-f]{12}`)
	database   = regexp.MustCompile(`^database \S+, `)
)

func normalize(s string) string {
	s = paymentRef.ReplaceAllString(strings.TrimSpace(s), "pay-REF")
	return database.ReplaceAllString(s, "database USER@HOST:PORT/DB, ")
}
