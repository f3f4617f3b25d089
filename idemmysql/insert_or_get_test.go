package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// signupTable is the seed's signup_record: a surrogate id and the business
// key (user, activity) as a unique key.
func signupTable(t *testing.T, db *sql.DB) {
	t.Helper()
	_, err := db.Exec(`CREATE TABLE signup_record (
		id BIGINT AUTO_INCREMENT PRIMARY KEY,
		user_id BIGINT NOT NULL,
		activity_id BIGINT NOT NULL,
		note VARCHAR(64) NOT NULL,
		UNIQUE KEY uk_user_activity (user_id, activity_id)) ENGINE = InnoDB`)
	require.NoError(t, err)
}

// The seed's sign-up statements: a plain INSERT (with RETURNING where the
// server has it) and a locking lookup by the business key.
var (
	signupInsert          = `INSERT INTO signup_record (user_id, activity_id, note) VALUES (?, ?, ?)`
	signupInsertReturning = signupInsert + ` RETURNING id, note`
	signupLookup          = `SELECT id, note FROM signup_record WHERE user_id = ? AND activity_id = ? LOCK IN SHARE MODE`
	signupLookupPlain     = `SELECT id, note FROM signup_record WHERE user_id = ? AND activity_id = ?`
)

func signup(user, activity int64, note string, returning bool) (insert, lookup idem.Query) {
	insert = idem.Query{SQL: signupInsert, Args: []any{user, activity, note}}
	if returning {
		insert.SQL = signupInsertReturning
	}
	return insert, idem.Query{SQL: signupLookup, Args: []any{user, activity}}
}

func rowCount(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM `+table).Scan(&n))
	return n
}

// A second sign-up gets the first one's row: on a pool and in the caller's
// transaction, with and without RETURNING. The caller's SQL runs as
// written (? placeholders, a '$1' in a literal).
func TestInsertOrGet(t *testing.T) {
	for _, returning := range []bool{true, false} {
		name := map[bool]string{true: "returning", false: "insert-then-lookup"}[returning]
		t.Run(name, func(t *testing.T) {
			db := openDB(t)
			signupTable(t, db)
			ctx := context.Background()

			var id1, id2 int64
			var note1, note2 string
			ins, look := signup(1, 7, "first costs $1", returning)
			created, err := idemmysql.InsertOrGet(ctx, db, ins, look, &id1, &note1)
			require.NoError(t, err)
			require.True(t, created)
			require.NotZero(t, id1)
			require.Equal(t, "first costs $1", note1)

			ins, look = signup(1, 7, "second", returning)
			created, err = idemmysql.InsertOrGet(ctx, db, ins, look, &id2, &note2)
			require.NoError(t, err)
			require.False(t, created)
			require.Equal(t, id1, id2)
			require.Equal(t, "first costs $1", note2, "the existing row, not the duplicate's values")

			// In the caller's transaction: the duplicate's 1062 rolls back
			// the INSERT alone, and the transaction's other writes commit.
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer tx.Rollback()
			require.NoError(t, insertEffect(ctx, tx, "before", 1))
			var id3 int64
			var note3 string
			ins, look = signup(1, 7, "third", returning)
			created, err = idemmysql.InsertOrGet(ctx, tx, ins, look, &id3, &note3)
			require.NoError(t, err)
			require.False(t, created)
			require.Equal(t, id1, id3)
			ins, look = signup(2, 7, "other user", returning)
			created, err = idemmysql.InsertOrGet(ctx, tx, ins, look, &id3, &note3)
			require.NoError(t, err)
			require.True(t, created)
			require.NotEqual(t, id1, id3)
			require.NoError(t, insertEffect(ctx, tx, "after", 1))
			require.NoError(t, tx.Commit())
			require.Equal(t, 1, effects(t, db, "before"))
			require.Equal(t, 1, effects(t, db, "after"))
			require.Equal(t, 2, rowCount(t, db, "signup_record"))
		})
	}
}

// A thousand-a-second sign-up page in miniature: 40 submissions of one
// sign-up at once, each in its own REPEATABLE READ transaction that read
// the table before (its snapshot predates the winner's commit), each
// writing an effect only when it created the row. One row, one effect,
// every caller the same id, and no deadlock: the lookup's shared lock goes
// with the one the duplicate's 1062 left.
func TestInsertOrGetStorm(t *testing.T) {
	db := openDB(t)
	signupTable(t, db)
	ctx := context.Background()
	const callers = 40
	ids := make([]int64, callers)
	errs := make([]error, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	before := deadlocks(t, db)
	for i := range callers {
		wg.Go(func() {
			errs[i] = func() error {
				tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
				if err != nil {
					return err
				}
				defer tx.Rollback()
				var n int
				if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM signup_record`).Scan(&n); err != nil {
					return err
				}
				<-start
				var note string
				ins, look := signup(9, 9, "storm", i%2 == 0)
				created, err := idemmysql.InsertOrGet(ctx, tx, ins, look, &ids[i], &note)
				if err != nil {
					return err
				}
				if created {
					if err := insertEffect(ctx, tx, "signup-9-9", i); err != nil {
						return err
					}
				}
				return tx.Commit()
			}()
		})
	}
	close(start)
	wg.Wait()
	for i := range callers {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, ids[0], ids[i])
	}
	require.Equal(t, 1, rowCount(t, db, "signup_record"))
	require.Equal(t, 1, effects(t, db, "signup-9-9"))
	require.Equal(t, before, deadlocks(t, db), "deadlocks")
}

// Under REPEATABLE READ a plain SELECT reads the caller's snapshot, which
// predates the existing row: the conflict is reported as retryable rather
// than answered with nothing or a fresh row. The locking lookup reads the
// row itself.
func TestInsertOrGetReadsThroughTheSnapshot(t *testing.T) {
	db := openDB(t)
	signupTable(t, db)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback()
	var n int
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM signup_record`).Scan(&n)) // the snapshot
	var id0 int64
	var note string
	ins, look := signup(3, 4, "committed after the snapshot", false)
	created, err := idemmysql.InsertOrGet(ctx, db, ins, look, &id0, &note)
	require.NoError(t, err)
	require.True(t, created)

	var id int64
	ins, _ = signup(3, 4, "late", false)
	_, err = idemmysql.InsertOrGet(ctx, tx, ins, idem.Query{SQL: signupLookupPlain, Args: []any{3, 4}}, &id, &note)
	require.Error(t, err)
	require.True(t, idem.IsRetryable(err), "%v", err)

	ins, look = signup(3, 4, "late", false)
	created, err = idemmysql.InsertOrGet(ctx, tx, ins, look, &id, &note)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, id0, id)
	require.Equal(t, "committed after the snapshot", note)
	require.NoError(t, tx.Commit())
	require.Equal(t, 1, rowCount(t, db, "signup_record"))
}

// Bad input is refused before any SQL; an insert's own error (not a
// duplicate) comes back as it is.
func TestInsertOrGetErrors(t *testing.T) {
	ctx := context.Background()
	ins, look := signup(1, 1, "x", false)
	for _, c := range []struct {
		name         string
		db           idemmysql.DBTX
		insert, look idem.Query
	}{
		{"nil db", nil, ins, look},
		{"nil *sql.DB", (*sql.DB)(nil), ins, look},
		{"no insert", &sql.DB{}, idem.Query{}, look},
		{"no lookup", &sql.DB{}, ins, idem.Query{}},
	} {
		_, err := idemmysql.InsertOrGet(ctx, c.db, c.insert, c.look)
		require.ErrorIs(t, err, idem.ErrInvalidOption, c.name)
	}

	db := openDB(t)
	signupTable(t, db)
	var id int64
	_, err := idemmysql.InsertOrGet(ctx, db, idem.Query{SQL: `INSERT INTO signup_record (user_id) VALUES (?)`, Args: []any{1}}, look, &id)
	require.Error(t, err) // activity_id has no default
	require.False(t, errors.Is(err, idem.ErrInvalidOption))
	require.Equal(t, 0, rowCount(t, db, "signup_record"))
}
