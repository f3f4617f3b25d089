package integration_test

import (
	"database/sql"
	"net/url"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "github.com/lib/pq"              // database/sql driver "postgres"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/integration/internal/pgtest"
)

// sqlDBDrivers are the database/sql drivers the database/sql tests run on:
// the test's name, then the name the driver registered with database/sql.
var sqlDBDrivers = []struct{ name, driver string }{{"stdlib", "pgx"}, {"libpq", "postgres"}}

// openSQLDB opens a database/sql pool of at most maxConns connections with
// driverName ("pgx": pgx's stdlib driver; "postgres": lib/pq), closed when
// the test ends.
func openSQLDB(t *testing.T, driverName, databaseURL string, maxConns int) *sql.DB {
	t.Helper()
	if driverName == "postgres" {
		// lib/pq would send pgx's own parameter to the server.
		u, err := url.Parse(databaseURL)
		require.NoError(t, err)
		q := u.Query()
		q.Del("default_query_exec_mode")
		if pgtest.ViaPgBouncer() && databaseURL == pgtest.ClientURL() {
			// Outside a transaction lib/pq prepares and executes a
			// statement with arguments in two round trips, which
			// transaction pooling may send to two servers; with
			// binary_parameters it sends them in one.
			q.Set("binary_parameters", "yes")
		}
		u.RawQuery = q.Encode()
		databaseURL = u.String()
	}
	db, err := sql.Open(driverName, databaseURL)
	require.NoError(t, err)
	db.SetMaxOpenConns(maxConns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
