package main

import (
	"context"
	"os"
	"testing"
)

// The quickstart itself is a check: run fails unless the sign-up table holds
// exactly one row per user. Two runs in a row must both pass.
func TestQuickstartRunsTwice(t *testing.T) {
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database (see README.md)")
	}
	t.Setenv("DATABASE_URL", url)
	for range 2 {
		if err := run(context.Background(), 100); err != nil {
			t.Fatal(err)
		}
	}
}
