package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary serve as the bench's delay proxy process,
// as the bench binary does.
func TestMain(m *testing.M) {
	if spec := os.Getenv(proxyEnv); spec != "" {
		if err := runProxyChild(spec); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

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
	if err := run("2", "core,floor,model,shape,transition,inbox,http,grpc,redis,faults,hotkey,tablesize,purge,sql", []time.Duration{0}, 1, 200*time.Millisecond, 50*time.Millisecond, out); err != nil {
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
		if su.mysql {
			continue // TestBenchMySQLSmoke
		}
		if !strings.Contains(string(report), su.name+":") {
			t.Errorf("the report has no %s suite:\n%s", su.name, report)
		}
		if su.custom != nil {
			continue
		}
		for _, v := range su.variants {
			if !strings.Contains(string(report), "| "+v.name) {
				t.Errorf("the report has no row for %s:\n%s", v.name, report)
			}
		}
	}
}

// A smoke run of the latency mode: the suites run straight and behind a
// delay proxy, the proxy's added round trip is measured and recorded, and
// the JSON and the latency chart are written.
func TestBenchLatencySmoke(t *testing.T) {
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database (see README.md)")
	}
	t.Setenv("DATABASE_URL", url)
	results = nil
	dupShares = []float64{0}
	jsonPath = filepath.Join(t.TempDir(), "latency.json")
	chartPath = filepath.Join(t.TempDir(), "latency.png")
	t.Cleanup(func() { jsonPath, chartPath, results = "", "", nil })
	const rtt = 2 * time.Millisecond
	if err := run("1,2", "core,http,redis", []time.Duration{0, rtt}, 1, 200*time.Millisecond, 50*time.Millisecond, ""); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(chartPath); err != nil || st.Size() == 0 {
		t.Errorf("the chart was not written: %v", err)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []result `json:"results"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range doc.Results {
		seen[fmt.Sprintf("%s/%s/%d/%d", r.Suite, r.Variant, r.RTTMicro, r.Workers)] = true
		if r.RTTMicro > 0 && r.MeasuredRTTMicro < rtt.Microseconds()/2 {
			t.Errorf("%s/%s: the proxy added %dµs to a round trip, set to %v", r.Suite, r.Variant, r.MeasuredRTTMicro, rtt)
		}
		if r.Rounds != 1 || r.OpsPerS <= 0 || r.RatioToBare <= 0 || r.RatioMin > r.RatioToBare || r.RatioMax < r.RatioToBare {
			t.Errorf("an incoherent result: %+v", r)
		}
	}
	for _, want := range []string{"core/Do/0/1", "core/Do/2000/2", "http/middleware/2000/1", "redis/redis recipe/2000/2"} {
		if !seen[want] {
			t.Errorf("no result for %s", want)
		}
	}
}
