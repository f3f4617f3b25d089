package idemmysql_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// The README's MySQL snippets are taken from this file, line for line.
import (
	"database/sql"

	"github.com/idemkit/idem/idemmysql"
)

// openMySQL opens a pool on a MySQL or MariaDB database and creates idem's
// tables in it, as a service does once when it starts. Importing idemmysql
// registers go-sql-driver/mysql as "mysql".
func openMySQL(ctx context.Context, dsn string) (*sql.DB, error) {
	db, err := sql.Open("mysql", dsn) // e.g. "app:secret@tcp(127.0.0.1:3306)/shop"
	if err != nil {
		return nil, err
	}
	if err := idemmysql.Migrate(ctx, db); err != nil { // creates idem's tables, or does nothing if they are up to date
		db.Close()
		return nil, err
	}
	return db, nil
}

// signUpMySQL signs user up for activity once per form key: a resubmission
// gets the first sign-up's id back.
func signUpMySQL(ctx context.Context, db *sql.DB, user, activity int64, formKey string) (int64, error) {
	res, err := idemmysql.Do(ctx, db, idem.Key{Scope: fmt.Sprintf("user:%d", user), ID: formKey},
		func(ctx context.Context, tx *sql.Tx) (int64, error) {
			r, err := tx.ExecContext(ctx, `INSERT INTO signups (user_id, activity_id) VALUES (?, ?)`, user, activity)
			if err != nil {
				return 0, err
			}
			return r.LastInsertId()
		})
	return res.Value, err
}

// The README's snippets, run: a sign-up and its resubmission leave one row
// in a table without a unique key, and both get its id.
func TestReadmeSnippetsRun(t *testing.T) {
	ctx := context.Background()
	fresh := openDB(t) // a fresh database, for its DSN
	var name string
	require.NoError(t, fresh.QueryRow(`SELECT DATABASE()`).Scan(&name))
	db, err := openMySQL(ctx, dsnOf(t, name))
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	_, err = db.Exec(`CREATE TABLE signups (id BIGINT AUTO_INCREMENT PRIMARY KEY, user_id BIGINT, activity_id BIGINT)`)
	require.NoError(t, err)

	first, err := signUpMySQL(ctx, db, 42, 7, "form-1")
	require.NoError(t, err)
	again, err := signUpMySQL(ctx, db, 42, 7, "form-1")
	require.NoError(t, err)
	require.Equal(t, first, again)
	var rows int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM signups`).Scan(&rows))
	require.Equal(t, 1, rows)
}
