package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A one-round smoke run of the bench command: it must work end to end and
// write its report. It measures nothing worth reading.
func TestBenchSmoke(t *testing.T) {
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database (see README.md)")
	}
	t.Setenv("DATABASE_URL", url)
	out := filepath.Join(t.TempDir(), "report.md")
	transitionRows = 20_000
	purgeRows = 5_000
	tableSizes = []int64{0, 2_000}
	faultRequests = 100
	dupShares = []float64{0, 0.5}
	jsonPath = filepath.Join(t.TempDir(), "results.json")
	chartPath = filepath.Join(t.TempDir(), "chart.png")
	if err := run("2", "core,floor,transition,inbox,http,redis,faults,hotkey,tablesize,purge", 1, 200*time.Millisecond, 50*time.Millisecond, out); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{jsonPath, chartPath} {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			t.Errorf("%s was not written: %v", p, err)
		}
	}
	report, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, su := range suites {
		if su.custom != nil {
			if !strings.Contains(string(report), su.name+":") {
				t.Errorf("the report has no %s suite:\n%s", su.name, report)
			}
			continue
		}
		for _, v := range su.variants {
			if !strings.Contains(string(report), "| "+v.name) {
				t.Errorf("the report has no row for %s:\n%s", v.name, report)
			}
		}
	}
}
