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
	// example prints, the random payment reference aside.
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	shown := transcript(string(readme), "worker A claimed ")
	if shown == "" {
		t.Fatal("README.md of this example has no transcript (a text block starting with \"worker A claimed\")")
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

var paymentRef = regexp.MustCompile(`pay-[0-9a-f]{12}`)

func normalize(s string) string { return paymentRef.ReplaceAllString(strings.TrimSpace(s), "pay-REF") }
