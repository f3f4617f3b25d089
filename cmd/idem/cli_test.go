package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

var databaseURL string

func TestMain(m *testing.M) {
	databaseURL = os.Getenv("TEST_DATABASE_URL")
	if databaseURL == "" {
		fmt.Fprintln(os.Stderr, "cmd/idem tests need a PostgreSQL: set TEST_DATABASE_URL, e.g.\n"+
			"    TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// cli runs the command line with DATABASE_URL set to the test database.
func cli(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	getenv := func(name string) string {
		if name == "DATABASE_URL" {
			return databaseURL
		}
		return ""
	}
	code = run(context.Background(), args, &out, &errOut, getenv)
	return code, out.String(), errOut.String()
}

// schema returns a fresh schema name, dropped when the test ends.
func schema(t *testing.T, pool *pgxpool.Pool) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idem_cli_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`)
		require.NoError(t, err)
	})
	return name
}

func testPool(t *testing.T) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), databaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestCommandsEndToEnd(t *testing.T) {
	ctx := context.Background()
	pool := testPool(t)
	s := schema(t, pool)
	opt := idem.WithTable(s, idem.DefaultTable)

	code, out, errOut := cli(t, "migrate", "up", "--schema", s)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "now at version 2")
	code, out, _ = cli(t, "migrate", "version", "--schema", s, "--json")
	require.Equal(t, exitOK, code)
	var ver struct {
		Version uint `json:"version"`
		Dirty   bool `json:"dirty"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &ver))
	require.Equal(t, uint(2), ver.Version)
	require.False(t, ver.Dirty)

	// Three finished records, two of them already expired, and a lease
	// whose holder stopped: its lease ran out. Expiry and the lease's end
	// are moved by the database clock, not waited for.
	records := pgx.Identifier{s, idem.DefaultTable}.Sanitize()
	for i := range 3 {
		_, err := idem.Do(ctx, pool, idem.Key{Scope: "shop", ID: fmt.Sprint("order-", i), Fingerprint: []byte{1, 2}},
			func(context.Context, pgx.Tx) (map[string]int, error) { return map[string]int{"order": i}, nil }, opt, idem.WithTTL(time.Hour))
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `UPDATE `+records+` SET expires_at = now() - interval '1 second' WHERE scope = 'shop' AND key IN ('order-1', 'order-2')`)
	require.NoError(t, err)
	lease, _, err := idem.Claim[string](ctx, pool, idem.Key{Scope: "pay", ID: "charge-7"}, time.Minute, opt)
	require.NoError(t, err)
	require.NoError(t, lease.Checkpoint(ctx, pool, "gateway-called", map[string]string{"ref": "G1"}))
	_, err = pool.Exec(ctx, `UPDATE `+records+` SET locked_until = now() - interval '1 second' WHERE scope = 'pay' AND key = 'charge-7'`)
	require.NoError(t, err)

	code, out, errOut = cli(t, "inspect", "--schema", s, "--scope", "shop", "--key", "order-0")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^status +succeeded$`, out)
	require.Regexp(t, `(?m)^response +\{"order":0\}$`, out)
	require.Regexp(t, `(?m)^fingerprint +0102$`, out)
	require.Regexp(t, `(?m)^expires .*\(in (1h0m0s|59m5[0-9]s)\)$`, out)

	code, out, _ = cli(t, "inspect", "--schema", s, "--scope", "pay", "--key", "charge-7", "--json")
	require.Equal(t, exitOK, code)
	var rec recordJSON
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	require.Equal(t, idem.StatusProcessing, rec.Status)
	require.Equal(t, "gateway-called", rec.RecoveryPoint)
	require.NotNil(t, rec.LockedUntil)
	require.EqualValues(t, 1, rec.Attempt)

	code, _, errOut = cli(t, "inspect", "--schema", s, "--scope", "shop", "--key", "nope")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "no record for scope")

	code, out, _ = cli(t, "stuck", "--schema", s)
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "charge-7")
	require.Contains(t, out, "gateway-called")
	require.Contains(t, out, "1 stuck leases")

	code, out, _ = cli(t, "stats", "--schema", s, "--json")
	require.Equal(t, exitOK, code)
	var st struct {
		Records     int64            `json:"records"`
		ByStatus    map[string]int64 `json:"by_status"`
		Expired     int64            `json:"expired"`
		StuckLeases int64            `json:"stuck_leases"`
		Oldest      *time.Time       `json:"oldest"`
		TableBytes  int64            `json:"table_bytes"`
		IndexBytes  int64            `json:"index_bytes"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.EqualValues(t, 4, st.Records)
	require.EqualValues(t, 3, st.ByStatus[idem.StatusSucceeded])
	require.EqualValues(t, 1, st.ByStatus[idem.StatusProcessing])
	require.EqualValues(t, 2, st.Expired, "the lease record is never purgeable")
	require.EqualValues(t, 1, st.StuckLeases)
	require.NotNil(t, st.Oldest)
	require.Positive(t, st.TableBytes)
	require.Positive(t, st.IndexBytes)

	code, out, _ = cli(t, "stats", "--schema", s)
	require.Equal(t, exitOK, code)
	require.Regexp(t, `(?m)^expired \(purgeable\) +2$`, out)

	code, out, _ = cli(t, "purge", "--schema", s, "--dry-run")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "2 expired records would be deleted; nothing was deleted")
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{s, idem.DefaultTable}.Sanitize()).Scan(&n))
	require.Equal(t, 4, n, "a dry run deletes nothing")

	code, out, errOut = cli(t, "purge", "--schema", s, "--json", "--progress", "always")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, errOut, "100%", "the progress bar reached the end")
	var purged struct {
		Deleted int64 `json:"deleted"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &purged))
	require.EqualValues(t, 2, purged.Deleted)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{s, idem.DefaultTable}.Sanitize()).Scan(&n))
	require.Equal(t, 2, n)

	code, _, errOut = cli(t, "migrate", "down", "--schema", s)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--yes")
	code, out, errOut = cli(t, "migrate", "down", "--schema", s, "--yes")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "now at version 0")
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s+"."+idem.DefaultTable).Scan(&exists))
	require.False(t, exists, "migrate down dropped the table")
}

func TestPurgeManyRowsInBatches(t *testing.T) {
	ctx := context.Background()
	pool := testPool(t)
	s := schema(t, pool)
	code, _, errOut := cli(t, "migrate", "up", "--schema", s)
	require.Equal(t, exitOK, code, errOut)
	code, out, errOut := cli(t, "stats", "--schema", s, "--json")
	require.Equal(t, exitOK, code, errOut)
	var empty map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &empty))
	require.Equal(t, 0.0, empty["records"], "an empty table")
	require.Empty(t, empty["by_status"])
	require.Nil(t, empty["oldest"], "no oldest record")
	require.Positive(t, empty["index_bytes"], "the sizes are read even when the table is empty")
	_, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{s, idem.DefaultTable}.Sanitize()+`
		(scope, key, status, attempt, created_at, updated_at, expires_at)
		SELECT 's', 'k' || i, 'succeeded', 1, now(), now(), now() - interval '1 second' FROM generate_series(1, 2500) AS i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{s, idem.DefaultInboxTable}.Sanitize()+` (consumer, message_id, consumed_at)
		SELECT 'c', 'm' || i, now() - interval '2 days' FROM generate_series(1, 5) AS i`)
	require.NoError(t, err)
	code, out, errOut = cli(t, "purge", "--schema", s, "--dry-run", "--inbox-retention", "24h")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "2500 expired records would be deleted, and 5 inbox rows; nothing was deleted")

	started := time.Now()
	code, out, errOut = cli(t, "purge", "--schema", s, "--progress", "always", "--rows-per-second", "10000")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "deleted 2500 rows")
	require.GreaterOrEqual(t, time.Since(started), 200*time.Millisecond, "a full batch of 2000 at 10,000 rows/s")
	require.Equal(t, 2, strings.Count(errOut, "\r"), "one progress line per batch: 2000 (the paced default), then 500")
	require.Contains(t, errOut, "2500/2500 rows")
}

func TestHelpfulErrors(t *testing.T) {
	code, out, _ := cli(t, "--help")
	require.Equal(t, exitOK, code)
	for _, c := range commands {
		require.Contains(t, out, c.name, "the usage lists every command")
	}
	code, _, errOut := cli(t, "frobnicate")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `unknown command "frobnicate"`)

	code, _, errOut = cli(t, "inspect", "--key", "k")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--scope and --key are required")

	code, _, errOut = cli(t, "migrate", "sideways")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "up, down, version")

	code, _, errOut = cli(t, "stats", "--table", `x"; DROP TABLE y; --`)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "table name")

	code, _, errOut = cli(t, "stats", "--nope")
	require.Equal(t, exitUsage, code)
	require.Equal(t, 1, strings.Count(errOut, "flag provided but not defined"), "the mistake is said once")

	code, _, errOut = cli(t, "stats", "--database-url", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "connecting to nobody@127.0.0.1:1/none")
	require.Contains(t, errOut, "DATABASE_URL")

	code, _, errOut = cli(t, "stats", "--schema", "idem_cli_missing")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "run 'idem migrate up --schema idem_cli_missing'")
	code, _, errOut = cli(t, "stuck", "--limit", "3", "--schema=idem_cli_missing", "--table", "t")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "run 'idem migrate up --schema idem_cli_missing --table t'")

	code, _, errOut = cli(t, "purge", "--batch-size", "-1")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--batch-size")
	code, _, errOut = cli(t, "purge", "--rows-per-second", "-5")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--rows-per-second")

	code, out, _ = cli(t, "stats", "--help")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "-database-url", "asked-for help goes to stdout")
}

// Without --database-url and DATABASE_URL, the PG* variables are used.
func TestConnectsWithPGVariables(t *testing.T) {
	cfg, err := pgx.ParseConfig(databaseURL)
	require.NoError(t, err)
	t.Setenv("PGHOST", cfg.Host)
	t.Setenv("PGPORT", fmt.Sprint(cfg.Port))
	t.Setenv("PGUSER", cfg.User)
	t.Setenv("PGPASSWORD", cfg.Password)
	t.Setenv("PGDATABASE", cfg.Database)
	t.Setenv("PGSSLMODE", "disable")
	pool := testPool(t)
	s := schema(t, pool)
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"migrate", "up", "--schema", s}, &out, &errOut, func(string) string { return "" })
	require.Equal(t, exitOK, code, errOut.String())
	require.Contains(t, out.String(), "now at version 2")
}
