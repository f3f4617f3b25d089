package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/internal/mysqltest"
)

// mysqlDatabase creates a fresh, empty database on the server of
// TEST_MYSQL_DSN, dropped when the test ends, and returns a pool on it and
// the settings that reach it.
func mysqlDatabase(t *testing.T) (*sql.DB, *mysql.Config) {
	t.Helper()
	cfg := mysqltest.Database(t, "idem_cli_")
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db, cfg
}

// mysqlURL is the mysql:// URL of cfg's server and database.
func mysqlURL(cfg *mysql.Config) string {
	u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName}
	if cfg.Passwd != "" {
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	} else if cfg.User != "" {
		u.User = url.User(cfg.User)
	}
	return u.String()
}

// tablesIn lists the tables of database name.
func tablesIn(t *testing.T, db *sql.DB, name string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? ORDER BY TABLE_NAME`, name)
	require.NoError(t, err)
	defer rows.Close()
	var list []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		list = append(list, n)
	}
	require.NoError(t, rows.Err())
	slices.Sort(list)
	return list
}

// keysIn lists the keys of the records in db's record table.
func keysIn(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query(`SELECT CONCAT(scope, '/', idem_key) FROM idempotent_record ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	var list []string
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		list = append(list, k)
	}
	require.NoError(t, rows.Err())
	return list
}

func TestMySQLCommandsEndToEnd(t *testing.T) {
	ctx := context.Background()
	db, cfg := mysqlDatabase(t)
	u := mysqlURL(cfg)

	// On a database never migrated, version reads and creates nothing.
	code, out, errOut := cli(t, "migrate", "version", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "version 0\n", out)
	code, out, errOut = cli(t, "migrate", "down", "--yes", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "nothing to revert: no migration of idem's is recorded for idempotent_record (version 0)\n", out)
	require.Empty(t, tablesIn(t, db, cfg.DBName), "version and down on a database never migrated create nothing")

	code, out, errOut = cli(t, "migrate", "up", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "migrated up: now at version 2\n", out)
	require.Equal(t, []string{idem.DefaultInboxTable, idem.DefaultTable, "idempotent_record_schema_migrations"}, tablesIn(t, db, cfg.DBName))
	code, out, errOut = cli(t, "migrate", "up", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "already at version 2: nothing to migrate\n", out)
	code, out, errOut = cli(t, "migrate", "version", "--database-url", u, "--json")
	require.Equal(t, exitOK, code, errOut)
	require.JSONEq(t, `{"action": "version", "version": 2, "dirty": false}`, out)

	// Three finished records, two of them expired, and a lease whose
	// holder stopped. Expiry and the lease's end are moved in SQL.
	for i := range 3 {
		_, err := idemmysql.Do(ctx, db, idem.Key{Scope: "shop", ID: fmt.Sprint("order-", i), Fingerprint: []byte{1, 2}},
			func(context.Context, *sql.Tx) (map[string]int, error) { return map[string]int{"order": i}, nil }, idem.WithTTL(time.Hour))
		require.NoError(t, err)
	}
	_, err := db.Exec(`UPDATE idempotent_record SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND
		WHERE scope = 'shop' AND idem_key IN ('order-1', 'order-2')`)
	require.NoError(t, err)
	lease, _, err := idemmysql.Claim[string](ctx, db, idem.Key{Scope: "pay", ID: "charge-7"}, time.Minute)
	require.NoError(t, err)
	require.NoError(t, lease.Checkpoint(ctx, db, "gateway-called", map[string]string{"ref": "G1"}))
	_, err = db.Exec(`UPDATE idempotent_record SET locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE scope = 'pay' AND idem_key = 'charge-7'`)
	require.NoError(t, err)

	code, out, errOut = cli(t, "inspect", "--database-url", u, "--scope", "shop", "--key", "order-0")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^status +succeeded$`, out)
	require.Regexp(t, `(?m)^response +\{"order":0\}$`, out)
	require.Regexp(t, `(?m)^fingerprint +0102$`, out)
	require.Regexp(t, `(?m)^expires .*\(in (1h0m0s|59m5[0-9]s)\)$`, out, "the expiry is read in UTC")
	code, out, errOut = cli(t, "inspect", "--database-url", u, "--scope", "shop", "--key", "order-1")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^expires .*\([0-9]s ago\)$`, out, "an expired record is shown until purged")

	code, out, errOut = cli(t, "inspect", "--database-url", u, "--scope", "pay", "--key", "charge-7")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^status +processing$`, out)
	require.Regexp(t, `(?m)^lease until .*\([0-9]s ago\)$`, out)
	require.Regexp(t, `(?m)^recovery point +gateway-called\n^checkpoint data +\{"ref":"G1"\}$`, out)
	require.NotRegexp(t, `(?m)^response`, out)
	code, out, _ = cli(t, "inspect", "--database-url", u, "--scope", "pay", "--key", "charge-7", "--json")
	require.Equal(t, exitOK, code)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	require.Equal(t, idem.StatusProcessing, raw["status"])
	require.Equal(t, "gateway-called", raw["recovery_point"])
	require.Equal(t, map[string]any{"ref": "G1"}, raw["checkpoint_data"])
	require.EqualValues(t, 1, raw["attempt"])
	require.NotContains(t, raw, "response")

	code, _, errOut = cli(t, "inspect", "--database-url", u, "--scope", "shop", "--key", "nope")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, `no record for scope "shop", key "nope"`)

	code, out, errOut = cli(t, "stuck", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^pay +charge-7 +1 .* gateway-called +\{"ref":"G1"\} +`, out)
	require.Contains(t, out, "\n1 stuck lease (the next Claim of its key takes it over)\n")
	require.NotContains(t, out, "order-")
	code, out, _ = cli(t, "stuck", "--database-url", u, "--json")
	require.Equal(t, exitOK, code)
	var stuck []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &stuck))
	require.Len(t, stuck, 1)
	require.Equal(t, "charge-7", stuck[0]["key"])

	code, out, errOut = cli(t, "stats", "--database-url", u, "--json")
	require.Equal(t, exitOK, code, errOut)
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
	require.Equal(t, map[string]int64{idem.StatusSucceeded: 3, idem.StatusProcessing: 1, idem.StatusFailed: 0, idem.StatusIssued: 0}, st.ByStatus)
	require.EqualValues(t, 2, st.Expired, "the lease record is never purgeable")
	require.EqualValues(t, 1, st.StuckLeases)
	require.NotNil(t, st.Oldest)
	require.WithinDuration(t, time.Now(), *st.Oldest, time.Minute, "the oldest record's time is read in UTC")
	require.Positive(t, st.TableBytes)
	code, out, _ = cli(t, "stats", "--database-url", u)
	require.Equal(t, exitOK, code)
	require.Regexp(t, `(?m)^records +4$`, out)
	require.Regexp(t, `(?m)^expired \(purgeable\) +2$`, out)

	code, out, errOut = cli(t, "purge", "--database-url", u, "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "2 expired records would be deleted; nothing was deleted\n", out)
	require.Len(t, keysIn(t, db), 4, "a dry run deletes nothing")

	code, out, errOut = cli(t, "purge", "--database-url", u, "--json", "--progress", "always")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, errOut, "100%  2/2 rows")
	var purged map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &purged))
	require.EqualValues(t, 2, purged["deleted"])
	require.EqualValues(t, 2, purged["records"])
	require.Equal(t, []string{"pay/charge-7", "shop/order-0"}, keysIn(t, db), "exactly the expired records are gone")

	code, _, errOut = cli(t, "migrate", "down", "--database-url", u)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--yes")
	require.Len(t, keysIn(t, db), 2)
	code, out, errOut = cli(t, "migrate", "down", "--database-url", u, "--yes")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "migrated down: now at version 0\n", out)
	require.Empty(t, tablesIn(t, db, cfg.DBName), "down dropped the record, inbox and version tables")
}

// A go-sql-driver DSN is taken too, and --schema names the database: migrate
// runs in it, the other commands read its tables, whatever database the DSN
// names.
func TestMySQLDSNAndSchema(t *testing.T) {
	ctx := context.Background()
	db, cfg := mysqlDatabase(t)
	bare := *cfg
	bare.DBName = ""
	dsn := bare.FormatDSN()
	require.Regexp(t, `@tcp\(`, dsn)

	for _, cmd := range []string{"stats", "migrate version"} {
		code, _, errOut := cli(t, append(strings.Fields(cmd), "--database-url", dsn)...)
		require.Equal(t, exitError, code, cmd)
		require.Equal(t, "idem "+strings.Fields(cmd)[0]+": "+errNoDatabase.Error()+"\n", errOut, cmd)
	}

	code, out, errOut := cli(t, "migrate", "up", "--database-url", dsn, "--schema", cfg.DBName)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "migrated up: now at version 2\n", out)
	require.Contains(t, tablesIn(t, db, cfg.DBName), idem.DefaultTable)

	token, err := idemmysql.IssueToken(ctx, db, "signup", time.Hour)
	require.NoError(t, err)
	code, out, errOut = cli(t, "inspect", "--database-url", dsn, "--schema", cfg.DBName, "--scope", "signup", "--key", token)
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^status +issued$`, out)
	require.Regexp(t, `(?m)^key +`+regexp.QuoteMeta(token)+`$`, out)

	// The DSN names another database (information_schema, which every
	// server has): --schema still decides.
	other := *cfg
	other.DBName = "information_schema"
	code, out, errOut = cli(t, "stats", "--database-url", other.FormatDSN(), "--schema", cfg.DBName, "--json")
	require.Equal(t, exitOK, code, errOut)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.EqualValues(t, 1, st["records"])
	require.Equal(t, map[string]any{"processing": 0.0, "succeeded": 0.0, "failed": 0.0, "issued": 1.0}, st["by_status"])

	// mariadb:// is the same as mysql://.
	code, out, errOut = cli(t, "migrate", "version", "--database-url", "mariadb"+strings.TrimPrefix(mysqlURL(cfg), "mysql"))
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "version 2\n", out)
}

// A password the URL carries percent-encoded reaches the server as it is.
func TestMySQLURLPassword(t *testing.T) {
	db, cfg := mysqlDatabase(t)
	user, password := cfg.DBName, "p@ss:w/rd?#%&="
	// Neither name nor password holds a quote or a backslash.
	_, err := db.Exec("CREATE USER '" + user + "'@'%' IDENTIFIED BY '" + password + "'")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.Exec("DROP USER '" + user + "'@'%'")
		require.NoError(t, err)
	})
	_, err = db.Exec("GRANT ALL ON " + cfg.DBName + ".* TO '" + user + "'@'%'")
	require.NoError(t, err)
	withUser := *cfg
	withUser.User, withUser.Passwd = user, password
	u := mysqlURL(&withUser)
	require.Contains(t, u, ":p%40ss%3Aw%2Frd%3F%23%25&=@", "the password is percent-encoded in the URL")
	code, out, errOut := cli(t, "migrate", "up", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "migrated up: now at version 2\n", out)

	withUser.Passwd = "wrong"
	code, _, errOut = cli(t, "stats", "--database-url", mysqlURL(&withUser))
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "connecting to "+user+"@"+cfg.Addr+"/"+cfg.DBName+": ")
	require.Contains(t, errOut, "Access denied")
	require.NotContains(t, errOut, "wrong", "the password is never shown")
}

// A dirty version is reported with what to do; 'migrate force N --yes'
// clears it.
func TestMySQLMigrateForce(t *testing.T) {
	db, cfg := mysqlDatabase(t)
	u := mysqlURL(cfg)

	// -1 on a database never migrated writes nothing.
	code, out, errOut := cli(t, "migrate", "force", "-1", "--yes", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "recorded no version (version 0), not dirty; no migration was run\n", out)
	require.Empty(t, tablesIn(t, db, cfg.DBName))

	code, _, errOut = cli(t, "migrate", "up", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	_, err := db.Exec(`UPDATE idempotent_record_schema_migrations SET dirty = 1`)
	require.NoError(t, err)

	code, out, errOut = cli(t, "migrate", "version", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "version 2, dirty")
	require.Contains(t, out, "'idem migrate force N --yes'")
	code, _, errOut = cli(t, "migrate", "up", "--database-url", u)
	require.Equal(t, exitError, code)
	require.Contains(t, strings.ToLower(errOut), "dirty")
	code, _, errOut = cli(t, "migrate", "down", "--yes", "--database-url", u)
	require.Equal(t, exitError, code, "a dirty version fails down before any change")
	require.Contains(t, strings.ToLower(errOut), "dirty")
	require.Contains(t, tablesIn(t, db, cfg.DBName), idem.DefaultTable)

	code, _, errOut = cli(t, "migrate", "force", "2", "--database-url", u)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--yes")
	code, _, errOut = cli(t, "migrate", "force", "3", "--yes", "--database-url", u)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, idem.ErrInvalidOption.Error())

	code, out, errOut = cli(t, "migrate", "force", "2", "--yes", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "recorded version 2, not dirty; no migration was run\n", out)
	var v, dirty int
	require.NoError(t, db.QueryRow(`SELECT version, dirty FROM idempotent_record_schema_migrations`).Scan(&v, &dirty))
	require.Equal(t, [2]int{2, 0}, [2]int{v, dirty})
	code, out, errOut = cli(t, "migrate", "up", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "already at version 2: nothing to migrate\n", out)

	code, out, errOut = cli(t, "migrate", "--database-url", u, "--yes", "force", "-1", "--json")
	require.Equal(t, exitOK, code, errOut)
	require.JSONEq(t, `{"action": "force", "version": 0, "dirty": false, "previous_version": 2, "previous_dirty": false}`, out)
	var rows int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM idempotent_record_schema_migrations`).Scan(&rows))
	require.Zero(t, rows)
}

// insertMySQLRecords adds n records of scope s ("k1", "k2", ...) with the
// given status, expiring after the given number of seconds (negative:
// expired), in batches that any server's limits allow.
func insertMySQLRecords(t *testing.T, db *sql.DB, s, status string, n, expiresIn int) {
	t.Helper()
	for first := 1; first <= n; first += 500 {
		var values []string
		var args []any
		for i := first; i < first+500 && i <= n; i++ {
			values = append(values, `(?, ?, '', ?, 1, UNHEX(MD5(?)), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? SECOND)`)
			k := fmt.Sprint("k", i)
			args = append(args, s, k, status, k, expiresIn)
		}
		_, err := db.Exec(`INSERT INTO idempotent_record (scope, idem_key, fingerprint, status, attempt, claim_token, created_at, updated_at, expires_at)
			VALUES `+strings.Join(values, ", "), args...)
		require.NoError(t, err)
	}
}

// A purge deletes exactly the expired records and the inbox rows consumed
// before the retention, in batches, with a bar that counts them all.
func TestMySQLPurge(t *testing.T) {
	db, cfg := mysqlDatabase(t)
	u := mysqlURL(cfg)
	code, _, errOut := cli(t, "migrate", "up", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	insertMySQLRecords(t, db, "old", idem.StatusSucceeded, 1200, -1)
	insertMySQLRecords(t, db, "live", idem.StatusSucceeded, 2, 3600)
	// A lease still processing, past its expiry: never purged.
	_, err := db.Exec(`INSERT INTO idempotent_record (scope, idem_key, fingerprint, status, attempt, claim_token, locked_until, created_at, updated_at, expires_at)
		VALUES ('lease', 'k1', '', 'processing', 1, REPEAT('x', 16), UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL 1 SECOND)`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO idem_inbox (consumer, message_id, consumed_at) VALUES
		('c', 'eight-days', UTC_TIMESTAMP(6) - INTERVAL 8 DAY), ('c', 'six-days', UTC_TIMESTAMP(6) - INTERVAL 6 DAY)`)
	require.NoError(t, err)

	code, out, errOut := cli(t, "purge", "--database-url", u, "--dry-run", "--inbox-retention", "7d")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "1200 expired records would be deleted, and 1 inbox row; nothing was deleted\n", out)

	code, out, errOut = cli(t, "purge", "--database-url", u, "--inbox-retention", "7d", "--batch-size", "500", "--progress", "always")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `^deleted 1201 rows \(1200 records, 1 inbox row\) in \S+ \(\d+ rows/s\)\n$`, out)
	require.Equal(t, 4, strings.Count(errOut, "\r"), "one progress line per batch: 500, 500, 200 records, then the inbox row: %q", errOut)
	require.Contains(t, errOut, "1201/1201 rows")
	require.Equal(t, []string{"lease/k1", "live/k1", "live/k2"}, keysIn(t, db))
	var inbox []string
	rows, err := db.Query(`SELECT message_id FROM idem_inbox`)
	require.NoError(t, err)
	for rows.Next() {
		var m string
		require.NoError(t, rows.Scan(&m))
		inbox = append(inbox, m)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"six-days"}, inbox)

	code, out, errOut = cli(t, "purge", "--database-url", u, "--inbox-retention", "7d", "--json")
	require.Equal(t, exitOK, code, errOut)
	require.JSONEq(t, `{"deleted": 0, "records": 0, "inbox": 0, "interrupted": false, "seconds": 0}`,
		regexp.MustCompile(`"seconds": [0-9.e+-]+`).ReplaceAllString(out, `"seconds": 0`))
}

// What MySQL cannot do, and tables or databases that are missing, are
// explained in one line.
func TestMySQLHelpfulErrors(t *testing.T) {
	db, cfg := mysqlDatabase(t)
	u := mysqlURL(cfg)

	code, _, errOut := cli(t, "stats", "--database-url", u)
	require.Equal(t, exitError, code)
	require.Equal(t, "idem stats: table idempotent_record (in database "+cfg.DBName+") does not exist: "+
		"run 'idem migrate up' to create it, or name the table with --schema and --table\n", errOut)
	code, _, errOut = cli(t, "inspect", "--database-url", u, "--schema", cfg.DBName, "--scope", "s", "--key", "k")
	require.Equal(t, exitError, code)
	require.Equal(t, "idem inspect: table "+cfg.DBName+".idempotent_record does not exist: "+
		"run 'idem migrate up --schema "+cfg.DBName+"' to create it, or name the table with --schema and --table\n", errOut)
	code, _, errOut = cli(t, "stuck", "--database-url", u, "--schema", "idem_cli_missing")
	require.Equal(t, exitError, code)
	require.Equal(t, "idem stuck: database idem_cli_missing does not exist: create it (CREATE DATABASE idem_cli_missing), "+
		"then run 'idem migrate up --schema idem_cli_missing', or name the database with --schema\n", errOut)
	code, _, errOut = cli(t, "migrate", "up", "--database-url", u, "--schema", "idem_cli_missing")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "connecting to ")
	require.Contains(t, errOut, "/idem_cli_missing: ")
	require.Contains(t, errOut, "Unknown database")

	// migrate creates idem's two tables only.
	code, _, errOut = cli(t, "migrate", "up", "--database-url", u, "--table", "orders_idem")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "cannot create a record table of another name (--table orders_idem)")
	require.Empty(t, tablesIn(t, db, cfg.DBName))

	code, _, errOut = cli(t, "migrate", "up", "--database-url", u)
	require.Equal(t, exitOK, code, errOut)
	code, _, errOut = cli(t, "stats", "--database-url", u, "--table", "orders_idem")
	require.Equal(t, exitError, code)
	require.Equal(t, "idem stats: table orders_idem (in database "+cfg.DBName+") does not exist: create it from the SQL files of "+
		"github.com/idemkit/idem/migrations/mysql with its name changed ('idem migrate up' creates idempotent_record), "+
		"or name the table with --schema and --table\n", errOut)

	_, err := db.Exec(`DROP TABLE idem_inbox`)
	require.NoError(t, err)
	for _, args := range [][]string{{"--dry-run"}, {"--progress", "never"}} {
		code, _, errOut := cli(t, append([]string{"purge", "--database-url", u, "--inbox-retention", "1d"}, args...)...)
		require.Equal(t, exitError, code)
		require.Equal(t, "idem purge: table idem_inbox (in database "+cfg.DBName+") does not exist: "+
			"run 'idem migrate up' to create it, or name the table with --schema and --table\n", errOut)
	}

	code, _, errOut = cli(t, "stats", "--database-url", u, "--table", "x`; DROP TABLE idempotent_record; --")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "table name")
	require.Contains(t, tablesIn(t, db, cfg.DBName), idem.DefaultTable)

	code, _, errOut = cli(t, "stats", "--database-url", u+"?parseTime=maybe")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "invalid bool value: maybe")

	code, _, errOut = cli(t, "stats", "--database-url", "mysql://nobody:secret@127.0.0.1:1/none?timeout=2s")
	require.Equal(t, exitError, code)
	require.Contains(t, errOut, "connecting to nobody@127.0.0.1:1/none: ")
	require.Contains(t, errOut, "DATABASE_URL")
	require.NotContains(t, errOut, "secret")
}

func TestKindOf(t *testing.T) {
	for in, want := range map[string]string{
		"":                                   postgres,
		"postgres://u@h/db":                  postgres,
		"PostgreSQL://u@h/db":                postgres,
		"host=127.0.0.1 dbname=app":          postgres,
		"mysql://u:p@h:3306/db":              mysqlDB,
		"MariaDB://u@h/db":                   mysqlDB,
		"root@tcp(127.0.0.1:3306)/test":      mysqlDB,
		"u:p@tcp6([::1]:3306)/d?parseTime=1": mysqlDB,
		"tcp(h:3306)/d":                      mysqlDB,
		"u@unix(/run/mysqld/mysqld.sock)/d":  mysqlDB,
		"u:a://b@tcp(h)/d":                   mysqlDB,
	} {
		got, err := kindOf(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := kindOf("sqlite://file.db")
	require.ErrorContains(t, err, `unknown database URL scheme "sqlite://": want postgres://, postgresql://, mysql:// or mariadb://`)

	code, _, errOut := cli(t, "stats", "--database-url", "sqlite://file.db")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `idem stats: --database-url: unknown database URL scheme "sqlite://"`)
}

func TestParseMySQL(t *testing.T) {
	cfg, err := parseMySQL("mysql://app:p%40ss%3Aw%2Frd%3F@db.example:3307/shop?parseTime=true&tls=preferred" +
		"&time_zone=%27%2B00%3A00%27&loc=Europe%2FParis&interpolateParams=true")
	require.NoError(t, err)
	require.Equal(t, "tcp", cfg.Net)
	require.Equal(t, "db.example:3307", cfg.Addr)
	require.Equal(t, "app", cfg.User)
	require.Equal(t, "p@ss:w/rd?", cfg.Passwd)
	require.Equal(t, "shop", cfg.DBName)
	require.True(t, cfg.ParseTime, "the driver's own parameters are read")
	require.True(t, cfg.InterpolateParams)
	require.Equal(t, "preferred", cfg.TLSConfig)
	require.Equal(t, "Europe/Paris", cfg.Loc.String())
	require.Equal(t, map[string]string{"time_zone": "'+00:00'"}, cfg.Params, "other parameters are session variables")

	for in, addr := range map[string]string{
		"mariadb://u@db.example/d": "db.example:3306",
		"mysql://[::1]/d":          "[::1]:3306",
		"mysql:///d":               "127.0.0.1:3306",
	} {
		cfg, err := parseMySQL(in)
		require.NoError(t, err, in)
		require.Equal(t, addr, cfg.Addr, in)
		require.Equal(t, "d", cfg.DBName, in)
	}
	cfg, err = parseMySQL("mysql://u@h")
	require.NoError(t, err)
	require.Empty(t, cfg.DBName, "no database: --schema names it")

	cfg, err = parseMySQL("app:pw@tcp(h:3306)/shop?parseTime=true&sql_mode=%27ANSI%27")
	require.NoError(t, err)
	require.Equal(t, "app", cfg.User)
	require.Equal(t, "pw", cfg.Passwd)
	require.Equal(t, "h:3306", cfg.Addr)
	require.Equal(t, "shop", cfg.DBName)
	require.True(t, cfg.ParseTime)
	require.Equal(t, map[string]string{"sql_mode": "'ANSI'"}, cfg.Params)
	cfg, err = parseMySQL("app:s3cr@t@tcp(db.internal:3306)/shop")
	require.NoError(t, err)
	require.Equal(t, "s3cr@t", cfg.Passwd, "the docs' example")

	for in, want := range map[string]string{
		"mysql://u:secret@h/a/b":             "the path names one database",
		"mysql://u:secret@h/d?parseTime=no!": "invalid bool value",
		"mysql://u:secret@h:port/d":          "invalid port",
		"mysql://u%3Ax:secret@h/d":           "user name with a colon",
		"u:secret@tcp(h/d":                   "reading the DSN",
	} {
		_, err := parseMySQL(in)
		require.ErrorContains(t, err, want, in)
		require.NotContains(t, err.Error(), "secret", in)
	}
}
