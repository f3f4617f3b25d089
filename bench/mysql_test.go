package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	dialect "github.com/idemkit/idem/internal/dialect/mysql"
	"github.com/idemkit/idem/internal/protocol"
)

// useTestMySQL points the mysql suites at TEST_MYSQL_DSN, in a database of
// the test's own, which it drops at the end whatever the run did. Without
// TEST_MYSQL_DSN the test skips, unless CI is set, when it fails.
func useTestMySQL(t *testing.T) {
	t.Helper()
	dsn := os.Getenv("TEST_MYSQL_DSN")
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("TEST_MYSQL_DSN is not set (.ci/run sets it)")
		}
		t.Skip("TEST_MYSQL_DSN is not set: point it at a MySQL or MariaDB server, e.g. TEST_MYSQL_DSN='root@tcp(127.0.0.1:3306)/test'")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	oldDSN, oldDB := mysqlDSN, mysqlDatabase
	mysqlDSN, mysqlDatabase = dsn, "idem_bench_t_"+hex.EncodeToString(b)
	name := mysqlDatabase
	t.Cleanup(func() {
		mysqlDSN, mysqlDatabase = oldDSN, oldDB
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Error(err)
			return
		}
		cfg.DBName = ""
		admin, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close()
		if _, err := admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Error(err)
		}
	})
}

// databaseExists reports whether the server of TEST_MYSQL_DSN has the
// database name.
func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	cfg, err := mysql.ParseDSN(os.Getenv("TEST_MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = ""
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// A one-round smoke run of the mysql suites, on loopback and behind a delay
// proxy: every variant reports, the proxy's added round trip is measured,
// the fault suite finds no duplicate and no lost write for either system
// and idemmysql no stuck key and no false error, and the bench drops its
// database. It measures nothing worth reading.
func TestBenchMySQLSmoke(t *testing.T) {
	useTestMySQL(t)
	results = nil
	dupShares = []float64{0}
	faultRequests = 100
	out := filepath.Join(t.TempDir(), "report.md")
	jsonPath = filepath.Join(t.TempDir(), "results.json")
	t.Cleanup(func() { jsonPath, results = "", nil })
	const rtt = 2 * time.Millisecond
	if err := run("2", "mysql-model,mysql-recipe,mysql-floor,mysql-faults", []time.Duration{0, rtt}, 1, 200*time.Millisecond, 50*time.Millisecond, out); err != nil {
		t.Fatal(err)
	}
	if databaseExists(t, mysqlDatabase) {
		t.Errorf("the bench left its database %s behind", mysqlDatabase)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	report := string(b)
	for _, su := range suites {
		if su.mysql && strings.Count(report, su.name+": ") != 2 {
			t.Errorf("the report lacks the %s suite on either network:\n%s", su.name, report)
		}
	}
	rows := regexp.MustCompile(`(?m)^\| (redis recipe|idemmysql Do) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$`).FindAllStringSubmatch(report, -1)
	if len(rows) != 4 {
		t.Fatalf("want the fault table's two rows on each network, got %d:\n%s", len(rows), report)
	}
	for _, r := range rows {
		n := make([]int, 5)
		for i := range n {
			n[i], _ = strconv.Atoi(r[i+2])
		}
		cuts, dups, stuck, falseErrs, lost := n[0], n[1], n[2], n[3], n[4]
		if cuts == 0 || dups != 0 || lost != 0 {
			t.Errorf("%s: %d cuts, %d duplicate effects, %d lost writes", r[1], cuts, dups, lost)
		}
		if r[1] == "idemmysql Do" && (stuck != 0 || falseErrs != 0) {
			t.Errorf("idemmysql Do: %d stuck keys, %d errors although committed", stuck, falseErrs)
		}
	}
	jb, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		MySQL   string   `json:"mysql"`
		Results []result `json:"results"`
	}
	if err := json.Unmarshal(jb, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.MySQL == "" {
		t.Error("the JSON file does not name the MySQL server")
	}
	seen := map[string]bool{}
	for _, r := range doc.Results {
		seen[fmt.Sprintf("%s/%s/%d", r.Suite, r.Variant, r.RTTMicro)] = true
		if r.RTTMicro > 0 && r.MeasuredRTTMicro < rtt.Microseconds()/2 {
			t.Errorf("%s/%s: the proxy added %dµs to a round trip, set to %v", r.Suite, r.Variant, r.MeasuredRTTMicro, rtt)
		}
		if r.OpsPerS <= 0 || r.RatioToBare <= 0 {
			t.Errorf("an incoherent result: %+v", r)
		}
	}
	for _, su := range suites {
		if !su.mysql || su.custom != nil {
			continue
		}
		for _, v := range su.variants {
			for _, us := range []int64{0, rtt.Microseconds()} {
				if want := fmt.Sprintf("%s/%s/%d", su.name, v.name, us); !seen[want] {
					t.Errorf("no result for %s", want)
				}
			}
		}
	}
}

// The mysql-model suite's statements by hand are the ones idemmysql runs on
// MariaDB and on MySQL 8 for the default table, with their arguments in the
// same order.
func TestMySQLModelStatements(t *testing.T) {
	fields := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	args := []any{1, 2, 3, 4, 5}
	for _, c := range []struct {
		name     string
		d        *protocol.Dialect
		claim    string
		wantArgs []any // of the claim: scope, key, fingerprint, token, TTL
	}{
		{"MariaDB", dialect.MariaDB, myClaimReturning, []any{1, 2, 3, 5, 4}},
		{"MySQL 8", dialect.MySQL8, myClaim, []any{1, 2, 3, 5, 4}},
	} {
		q := c.d.Records(protocol.Table{Name: idem.DefaultTable})
		claim, claimArgs := dialect.Bind(q.Claim, args)
		if fields(claim) != fields(c.claim) || !slices.Equal(claimArgs, c.wantArgs) {
			t.Errorf("%s: the claim is\n%s %v\nby hand\n%s %v", c.name, claim, claimArgs, c.claim, c.wantArgs)
		}
		read, readArgs := dialect.Bind(q.ClaimRead, args)
		if fields(read) != fields(myClaimRead) || !slices.Equal(readArgs, []any{1, 2}) {
			t.Errorf("%s: the claim's read is\n%s %v\nby hand\n%s", c.name, read, readArgs, myClaimRead)
		}
		// The completion's arguments: scope, key, status, response, attempt.
		complete, completeArgs := dialect.Bind(q.Complete, args)
		if fields(complete) != fields(myComplete) || !slices.Equal(completeArgs, []any{3, 4, 1, 2, 5}) {
			t.Errorf("%s: the completion is\n%s %v\nby hand\n%s", c.name, complete, completeArgs, myComplete)
		}
	}
}
