package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
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
	return cliContext(context.Background(), args...)
}

// cliContext is cli with the context a signal would cancel.
func cliContext(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	getenv := func(name string) string {
		if name == "DATABASE_URL" {
			return databaseURL
		}
		return ""
	}
	code = run(ctx, args, &out, &errOut, getenv)
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

// migrated returns a pool and a fresh schema that 'idem migrate up' has
// created the tables in.
func migrated(t *testing.T) (*pgxpool.Pool, string) {
	pool := testPool(t)
	s := schema(t, pool)
	code, _, errOut := cli(t, "migrate", "up", "--schema", s)
	require.Equal(t, exitOK, code, errOut)
	return pool, s
}

// insertExpired adds n expired records ("k1", "k2", ...) to schema s.
func insertExpired(t *testing.T, pool *pgxpool.Pool, s string, n int) {
	_, err := pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{s, idem.DefaultTable}.Sanitize()+`
		(scope, key, status, attempt, created_at, updated_at, expires_at)
		SELECT 's', 'k' || i, 'succeeded', 1, now(), now(), now() - interval '1 second' FROM generate_series(1, $1) AS i`, n)
	require.NoError(t, err)
}

// insertConsumed adds n inbox rows of consumer c to schema s, consumed the
// given interval ago.
func insertConsumed(t *testing.T, pool *pgxpool.Pool, s, c string, n int, ago string) {
	_, err := pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{s, idem.DefaultInboxTable}.Sanitize()+`
		(consumer, message_id, consumed_at) SELECT $1, 'm' || i, now() - $3::interval FROM generate_series(1, $2) AS i`, c, n, ago)
	require.NoError(t, err)
}

func TestCommandsEndToEnd(t *testing.T) {
	ctx := context.Background()
	pool := testPool(t)
	s := schema(t, pool)
	opt := idem.WithTable(s, idem.DefaultTable)

	code, out, errOut := cli(t, "migrate", "up", "--schema", s)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "migrated up: now at version 2\n", out)
	code, out, errOut = cli(t, "migrate", "up", "--schema", s)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "already at version 2: nothing to migrate\n", out, "an up-to-date schema is said to be so")
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

	// A lease still processing holds checkpoint data, not a response.
	code, out, errOut = cli(t, "inspect", "--schema", s, "--scope", "pay", "--key", "charge-7")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^recovery point +gateway-called\n^checkpoint data +\{"ref":"G1"\}$`, out)
	require.NotRegexp(t, `(?m)^response`, out)

	code, out, _ = cli(t, "inspect", "--schema", s, "--scope", "pay", "--key", "charge-7", "--json")
	require.Equal(t, exitOK, code)
	var rec recordJSON
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	require.Equal(t, idem.StatusProcessing, rec.Status)
	require.Equal(t, "gateway-called", rec.RecoveryPoint)
	require.NotNil(t, rec.LockedUntil)
	require.EqualValues(t, 1, rec.Attempt)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	require.Equal(t, map[string]any{"ref": "G1"}, raw["checkpoint_data"])
	require.NotContains(t, raw, "response")

	code, out, _ = cli(t, "inspect", "--schema", s, "--scope", "shop", "--key", "order-0", "--json")
	require.Equal(t, exitOK, code)
	raw = nil
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	require.Equal(t, map[string]any{"order": 0.0}, raw["response"], "a finished record keeps its response")
	require.NotContains(t, raw, "checkpoint_data")

	code, _, errOut = cli(t, "inspect", "--schema", s, "--scope", "shop", "--key", "nope")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "no record for scope")

	code, out, _ = cli(t, "stuck", "--schema", s)
	require.Equal(t, exitOK, code)
	require.Regexp(t, `(?m)^SCOPE +KEY +ATTEMPT +LEASE ENDED +RECOVERY POINT +CHECKPOINT DATA +CREATED$`, out)
	require.Regexp(t, `(?m)^pay +charge-7 +1 .* gateway-called +\{"ref":"G1"\} +`, out)
	require.Contains(t, out, "\n1 stuck lease (the next Claim of its key takes it over)\n")
	code, out, _ = cli(t, "stuck", "--schema", s, "--json")
	require.Equal(t, exitOK, code)
	var stuck []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &stuck))
	require.Len(t, stuck, 1)
	require.Equal(t, map[string]any{"ref": "G1"}, stuck[0]["checkpoint_data"])
	require.NotContains(t, stuck[0], "response")

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
	require.Equal(t, map[string]int64{idem.StatusSucceeded: 3, idem.StatusProcessing: 1, idem.StatusFailed: 0, idem.StatusIssued: 0},
		st.ByStatus, "every status is listed, 0 included")
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
	pool, s := migrated(t)
	code, out, errOut := cli(t, "stats", "--schema", s, "--json")
	require.Equal(t, exitOK, code, errOut)
	var empty map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &empty))
	require.Equal(t, 0.0, empty["records"], "an empty table")
	require.Equal(t, map[string]any{"processing": 0.0, "succeeded": 0.0, "failed": 0.0, "issued": 0.0}, empty["by_status"],
		"the same fields as for a full table")
	require.Nil(t, empty["oldest"], "no oldest record")
	require.Positive(t, empty["index_bytes"], "the sizes are read even when the table is empty")
	insertExpired(t, pool, s, 2500)
	insertConsumed(t, pool, s, "c", 5, "2 days")
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
	require.Contains(t, errOut, "up, down, version, force N")
	code, _, errOut = cli(t, "migrate", "force", "two", "--yes")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `not "two"`)

	code, _, errOut = cli(t, "stats", "--table", `x"; DROP TABLE y; --`)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "table name")

	code, _, errOut = cli(t, "stats", "--database-url", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "connecting to nobody@127.0.0.1:1/none")
	require.Contains(t, errOut, "DATABASE_URL")

	code, _, errOut = cli(t, "stats", "--schema", "idem_cli_missing")
	require.Equal(t, exitError, code)
	require.Equal(t, "idem stats: table idem_cli_missing.idempotent_record does not exist: "+
		"run 'idem migrate up --schema idem_cli_missing' to create it, or name the table with --schema and --table\n", errOut,
		"one line: the table and the command that creates it")
	code, _, errOut = cli(t, "stuck", "--limit", "3", "--schema=idem_cli_missing", "--table", "t")
	require.Equal(t, exitError, code)
	require.Equal(t, "idem stuck: table idem_cli_missing.t does not exist: "+
		"run 'idem migrate up --schema idem_cli_missing --table t' to create it, or name the table with --schema and --table\n", errOut)
	code, _, errOut = cli(t, "inspect", "--table", "idem_cli_missing", "--scope", "s", "--key", "k")
	require.Equal(t, exitError, code)
	require.Equal(t, "idem inspect: table idem_cli_missing (in the search_path) does not exist: "+
		"run 'idem migrate up --table idem_cli_missing' to create it, or name the table with --schema and --table\n", errOut)

	code, _, errOut = cli(t, "purge", "--batch-size", "-1")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--batch-size")
	code, _, errOut = cli(t, "purge", "--rows-per-second", "-5")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--rows-per-second")

	code, out, _ = cli(t, "stats", "--help")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "--database-url", "asked-for help goes to stdout")
}

// Every help text writes flags with two dashes; the flag package still
// parses both forms.
func TestHelpWritesFlagsWithTwoDashes(t *testing.T) {
	_, top, _ := cli(t, "--help")
	require.Contains(t, top, "  --database-url URL")
	for _, c := range commands {
		code, out, _ := cli(t, c.name, "--help")
		require.Equal(t, exitOK, code, c.name)
		require.Contains(t, out, "\nFlags:\n  --", c.name)
		require.Contains(t, out, "  --json", c.name)
		require.NotRegexp(t, `(?m)^\s*-[a-z]`, out, "%s: a flag written with one dash", c.name)
	}
	_, out, _ := cli(t, "migrate", "--help")
	require.Regexp(t, `(?m)^  --schema NAME +the schema NAME`, out)
	require.Regexp(t, `(?m)^  --table NAME +.*\(default idempotent_record\)$`, out)
	require.Regexp(t, `(?m)^  --yes +confirm`, out)

	// One dash still parses.
	code, _, errOut := cli(t, "stuck", "-limit", "3", "-schema=idem_cli_missing")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "run 'idem migrate up --schema idem_cli_missing'")
}

func TestVersionCommand(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := cli(t, args...)
		require.Equal(t, exitOK, code, errOut)
		require.Regexp(t, `^idem \S+\n`, out)
		require.Regexp(t, `(?m)^  command +github.com/idemkit/idem/cmd/idem \S+$`, out)
		require.Regexp(t, `(?m)^  library +github.com/idemkit/idem \S+`, out)
		require.Contains(t, out, runtime.Version())
	}
	code, out, _ := cli(t, "version", "--json")
	require.Equal(t, exitOK, code)
	var v versionInfo
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Equal(t, "github.com/idemkit/idem/cmd/idem", v.Path)
	require.NotEmpty(t, v.Version)
	require.NotEmpty(t, v.Library)
	require.Equal(t, runtime.Version(), v.Go)

	// A release build names the versions and the commit.
	v = readVersion(&debug.BuildInfo{
		GoVersion: "go1.26.1",
		Main:      debug.Module{Path: "github.com/idemkit/idem/cmd/idem", Version: "v0.3.0"},
		Deps: []*debug.Module{
			{Path: "github.com/jackc/pgx/v5", Version: "v5.12.0"},
			{Path: "github.com/idemkit/idem", Version: "v0.3.0", Replace: &debug.Module{Path: "../../"}},
		},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"}},
	}, true)
	require.Equal(t, versionInfo{Path: "github.com/idemkit/idem/cmd/idem", Version: "v0.3.0", Library: "v0.3.0 => ../../", Go: "go1.26.1",
		Platform: runtime.GOOS + "/" + runtime.GOARCH, Revision: "abc123", Time: "2026-01-02T03:04:05Z", Modified: "true"}, v)
	v = readVersion(nil, false)
	require.Equal(t, "(devel)", v.Version)
	require.Equal(t, "(devel)", v.Library)
}

// 'migrate version' and 'migrate down' on a schema never migrated create
// nothing; down says there was nothing to revert.
func TestMigrateOnNothingCreatesNothing(t *testing.T) {
	ctx := context.Background()
	pool := testPool(t)
	s := schema(t, pool)
	code, out, errOut := cli(t, "migrate", "version", "--schema", s)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "version 0\n", out)
	code, out, errOut = cli(t, "migrate", "down", "--yes", "--schema", s)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "nothing to revert")
	require.Contains(t, out, s+"."+idem.DefaultTable)
	code, out, errOut = cli(t, "migrate", "down", "--yes", "--schema", s, "--json")
	require.Equal(t, exitOK, code, errOut)
	require.JSONEq(t, `{"action": "down", "version": 0, "dirty": false, "previous_version": 0, "previous_dirty": false}`, out)
	var exists bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, s).Scan(&exists))
	require.False(t, exists, "no schema was created")
}

// A dirty version is reported with what to do; 'migrate force N --yes'
// clears it.
func TestMigrateForce(t *testing.T) {
	ctx := context.Background()
	pool, s := migrated(t)
	_, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{s, idem.DefaultTable + "_schema_migrations"}.Sanitize()+` SET dirty = true`)
	require.NoError(t, err)

	code, out, errOut := cli(t, "migrate", "version", "--schema", s)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "version 2, dirty")
	require.Contains(t, out, "'idem migrate force N --yes --schema "+s+"'")
	code, _, errOut = cli(t, "migrate", "up", "--schema", s)
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "dirty")

	code, _, errOut = cli(t, "migrate", "force", "2", "--schema", s)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--yes")
	code, _, errOut = cli(t, "migrate", "force", "3", "--yes", "--schema", s)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, idem.ErrInvalidOption.Error())

	code, out, errOut = cli(t, "migrate", "force", "2", "--yes", "--schema", s)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "recorded version 2, not dirty; no migration was run\n", out)
	code, out, errOut = cli(t, "migrate", "up", "--schema", s)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "already at version 2")

	// -1 records no version; it is positional, not a flag, before or
	// after the flags.
	code, out, errOut = cli(t, "migrate", "--schema", s, "--yes", "force", "-1", "--json")
	require.Equal(t, exitOK, code, errOut)
	require.JSONEq(t, `{"action": "force", "version": 0, "dirty": false, "previous_version": 2, "previous_dirty": false}`, out)
}

// Interrupted, a purge prints what it deleted and exits 130.
func TestPurgeInterrupted(t *testing.T) {
	ctx := context.Background()
	pool, s := migrated(t)
	records := pgx.Identifier{s, idem.DefaultTable}.Sanitize()
	insertExpired(t, pool, s, 5000)
	remaining := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+records).Scan(&n))
		return n
	}

	for _, asJSON := range []bool{false, true} {
		before := remaining()
		runCtx, cancel := context.WithCancel(ctx)
		type result struct {
			code     int
			out, err string
		}
		done := make(chan result, 1)
		args := []string{"purge", "--schema", s, "--batch-size", "500", "--rows-per-second", "500"}
		if asJSON {
			args = append(args, "--json")
		}
		go func() {
			code, out, errOut := cliContext(runCtx, args...)
			done <- result{code, out, errOut}
		}()
		// Cancel once the first batch is committed: the purge is then
		// waiting a second before the next one.
		require.Eventually(t, func() bool { return remaining() < before }, 10*time.Second, 5*time.Millisecond)
		cancel()
		res := <-done
		require.Equal(t, exitInterrupted, res.code, res.err)
		deleted := before - remaining()
		require.Positive(t, deleted)
		require.Less(t, deleted, before, "the purge stopped before the end")
		if asJSON {
			require.JSONEq(t, fmt.Sprintf(`{"deleted": %d, "records": %d, "inbox": 0, "interrupted": true, "seconds": 0}`, deleted, deleted),
				regexp.MustCompile(`"seconds": [0-9.e+-]+`).ReplaceAllString(res.out, `"seconds": 0`))
		} else {
			require.Regexp(t, fmt.Sprintf(`^interrupted: deleted %d rows in \S+ \(\d+ rows/s\)\n$`, deleted), res.out)
		}
	}
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

// A missing inbox is named as such: the record table is there.
func TestMissingInboxIsNamed(t *testing.T) {
	pool, s := migrated(t)
	_, err := pool.Exec(context.Background(), `DROP TABLE `+pgx.Identifier{s, idem.DefaultInboxTable}.Sanitize())
	require.NoError(t, err)
	for _, args := range [][]string{{"--dry-run"}, {"--progress", "never"}} {
		code, _, errOut := cli(t, append([]string{"purge", "--schema", s, "--inbox-retention", "1d"}, args...)...)
		require.Equal(t, exitError, code)
		require.Equal(t, "idem purge: table "+s+".idem_inbox does not exist: run 'idem migrate up --schema "+s+
			"' to create it, or name the table with --schema and --table\n", errOut)
	}
}

// A mistake in the flags is one line, the flag written as the help writes
// it, with where to read more.
func TestBadFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"purge", "-bogus"}, "idem purge: unknown flag --bogus (see idem purge --help)\n"},
		{[]string{"stats", "--nope=1"}, "idem stats: unknown flag --nope (see idem stats --help)\n"},
		{[]string{"purge", "--inbox-retention", "7x"}, `idem purge: invalid value "7x" for --inbox-retention: ` +
			"want a duration such as 7d, 36h or 90m (units: d, h, m, s, ms; a day is 24 hours) (see idem purge --help)\n"},
		{[]string{"purge", "--inbox-retention=7"}, `idem purge: invalid value "7" for --inbox-retention: ` +
			"want a duration such as 7d, 36h or 90m (units: d, h, m, s, ms; a day is 24 hours) (see idem purge --help)\n"},
		{[]string{"stuck", "--limit", "ten"}, `idem stuck: invalid value "ten" for --limit: want a whole number (see idem stuck --help)` + "\n"},
		{[]string{"stats", "--json=maybe"}, `idem stats: invalid value "maybe" for --json: want true or false (see idem stats --help)` + "\n"},
		{[]string{"stuck", "--limit"}, "idem stuck: --limit needs a value (see idem stuck --help)\n"},
		{[]string{"migrate", "up", "---schema", "x"}, "idem migrate: unknown flag ---schema (see idem migrate --help)\n"},
		{[]string{"purge", "--inbox-retention", "-1d"}, "idem purge: --inbox-retention must not be negative (see idem purge --help)\n"},
		{[]string{"purge", "--batch-size", "-1", "--rows-per-second", "-2"}, "idem purge: --batch-size must not be negative (see idem purge --help)\n"},
	} {
		code, out, errOut := cli(t, tt.args...)
		require.Equal(t, exitUsage, code, tt.args)
		require.Equal(t, tt.want, errOut, tt.args)
		require.Empty(t, out, tt.args)
	}
	// Other mistakes take the same form.
	code, _, errOut := cli(t, "inspect", "--key", "k")
	require.Equal(t, exitUsage, code)
	require.Equal(t, "idem inspect: --scope and --key are required (see idem inspect --help)\n", errOut)
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"7d": 7 * 24 * time.Hour, "1.5d": 36 * time.Hour, "1d12h": 36 * time.Hour, "1d30m15s": 24*time.Hour + 30*time.Minute + 15*time.Second,
		"36h": 36 * time.Hour, "90m": 90 * time.Minute, "0": 0, "0d": 0, "-2d": -48 * time.Hour, "+1d": 24 * time.Hour,
	} {
		got, err := parseDuration(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "7", "d", "7x", "1d-5h", "1d+5h", "1dd", "d7", "1e9d", "106752d", "7 d"} {
		_, err := parseDuration(in)
		require.Error(t, err, in)
	}
}

// Days are accepted where operators type them, and counts are in the
// singular when they are 1.
func TestPurgeSaysWhatItDeletes(t *testing.T) {
	ctx := context.Background()
	pool, s := migrated(t)
	insertExpired(t, pool, s, 2)
	records := pgx.Identifier{s, idem.DefaultTable}.Sanitize()
	_, err := pool.Exec(ctx, `UPDATE `+records+` SET expires_at = now() + interval '1 hour' WHERE key = 'k2'`)
	require.NoError(t, err)
	// Consumed eight days ago (purged with a retention of 7d) and six
	// days ago (kept).
	insertConsumed(t, pool, s, "old", 1, "8 days")
	insertConsumed(t, pool, s, "recent", 1, "6 days")

	code, out, errOut := cli(t, "purge", "--schema", s, "--dry-run", "--inbox-retention", "7d")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "1 expired record would be deleted, and 1 inbox row; nothing was deleted\n", out)

	code, out, errOut = cli(t, "purge", "--schema", s, "--inbox-retention=7d", "--progress", "never")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `^deleted 2 rows \(1 record, 1 inbox row\) in \S+ \(\d+ rows/s\)\n$`, out)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{s, idem.DefaultInboxTable}.Sanitize()).Scan(&left))
	require.Equal(t, 1, left, "the row consumed six days ago stays")

	code, out, errOut = cli(t, "purge", "--schema", s, "--inbox-retention=7d", "--json")
	require.Equal(t, exitOK, code, errOut)
	require.JSONEq(t, `{"deleted": 0, "records": 0, "inbox": 0, "interrupted": false, "seconds": 0}`,
		regexp.MustCompile(`"seconds": [0-9.e+-]+`).ReplaceAllString(out, `"seconds": 0`))

	_, err = pool.Exec(ctx, `UPDATE `+records+` SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	code, out, errOut = cli(t, "purge", "--schema", s, "--progress", "never")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `^deleted 1 row in `, out)
}

// The progress bar counts what the summary counts: records and inbox rows.
func TestPurgeProgressAgreesWithTheSummary(t *testing.T) {
	pool, s := migrated(t)
	insertExpired(t, pool, s, 3)
	insertConsumed(t, pool, s, "c", 1, "2 days")
	code, out, errOut := cli(t, "purge", "--schema", s, "--inbox-retention", "1d", "--progress", "always")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "deleted 4 rows (3 records, 1 inbox row)")
	bars := strings.Split(strings.TrimSpace(errOut), "\r")
	require.Contains(t, bars[len(bars)-1], "100%  4/4 rows", "the bar ends where the summary does: %q", errOut)
	require.NotContains(t, errOut, "/3 rows")
}

// A build that recorded its commit shows it on the first line; one that
// recorded nothing says how to build one that does.
func TestVersionSaysHowToRecordIt(t *testing.T) {
	text := func(v versionInfo) string {
		var b bytes.Buffer
		require.NoError(t, writeVersion(&b, v))
		return b.String()
	}
	bare := text(readVersion(&debug.BuildInfo{Main: debug.Module{Path: "github.com/idemkit/idem/cmd/idem", Version: "(devel)"}}, true))
	require.Regexp(t, `^idem \(devel\)\n`, bare)
	require.Contains(t, bare, "This build recorded no version and no commit.")
	require.Contains(t, bare, "'go install ./cmd/idem'")
	require.Contains(t, bare, "-buildvcs=false")
	require.Contains(t, bare, "'go install github.com/idemkit/idem/cmd/idem@<version>'")
	require.Contains(t, text(readVersion(nil, false)), "This build recorded no version")

	// A build from a checkout: the commit, and whether the tree was clean.
	checkout := text(readVersion(&debug.BuildInfo{
		Main:     debug.Module{Path: "github.com/idemkit/idem/cmd/idem", Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}},
	}, true))
	require.Regexp(t, `^idem \(devel\) at commit abc123, with uncommitted changes\n`, checkout)
	require.Regexp(t, `(?m)^  vcs.revision +abc123$`, checkout)
	require.NotContains(t, checkout, "recorded no version")

	// Go stamps a checkout's build with a pseudo-version naming the commit.
	stamped := text(readVersion(&debug.BuildInfo{
		Main:     debug.Module{Path: "github.com/idemkit/idem/cmd/idem", Version: "v0.0.0-20261201210045-1e609ac252d0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "1e609ac252d05b3a7252b64f5cb0de710d658dc5"}, {Key: "vcs.modified", Value: "false"}},
	}, true))
	require.Regexp(t, `^idem v0.0.0-20261201210045-1e609ac252d0\n`, stamped)
	require.Regexp(t, `(?m)^  vcs.revision +1e609ac252d05b3a7252b64f5cb0de710d658dc5$`, stamped)
	require.NotContains(t, stamped, "recorded no version")
}
