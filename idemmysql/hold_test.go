package idemmysql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// sessionBounds reads the session settings the hold timeout lowers, and the
// connection's id, on q.
func sessionBounds(t *testing.T, ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (idle int, stmt float64, conn int64) {
	t.Helper()
	require.NoError(t, q.QueryRowContext(ctx, `SELECT @@SESSION.idle_transaction_timeout, @@SESSION.max_statement_time, CONNECTION_ID()`).Scan(&idle, &stmt, &conn))
	return idle, stmt, conn
}

// A holder that hangs idle in its transaction is ended by the server within
// the hold timeout: the duplicate waiting for the key takes it and runs
// once, and the holder's writes are gone with its session.
func TestHoldTimeoutFreesAHungHolder(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	key := idem.Key{Scope: "hold", ID: "hung"}
	claimed, wake := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(wake) })
	held := make(chan error, 1)
	go func() {
		_, err := idemmysql.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (string, error) {
			if err := insertEffect(ctx, tx, key.ID, 1); err != nil {
				return "", err
			}
			close(claimed)
			<-wake // idle in the transaction, holding the key
			return "holder", insertEffect(ctx, tx, key.ID, 2)
		}, idem.WithHoldTimeout(time.Second))
		held <- err
	}()
	<-claimed

	// Only the server can free the key: the holder stays hung until the
	// duplicate has run.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := idemmysql.Do(wctx, db, key, func(ctx context.Context, tx *sql.Tx) (string, error) {
		return "duplicate", insertEffect(ctx, tx, key.ID, 3)
	})
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, "duplicate", res.Value)

	once.Do(func() { close(wake) })
	err = <-held
	// The server ended the session: go-sql-driver reports the connection
	// bad (it has no error of the server's to tell why).
	require.True(t, errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn), "%T %v", err, err)
	require.NotErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.Equal(t, 1, effects(t, db, key.ID))
	again, err := idemmysql.Do(ctx, db, key, func(context.Context, *sql.Tx) (string, error) { return "again", nil })
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, "duplicate", again.Value)
}

// A statement of fn's that runs past the hold timeout is interrupted
// (max_statement_time): fn returns its error, Do rolls back, and the key is
// free for the next call.
func TestHoldTimeoutInterruptsAStatement(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	key := idem.Key{Scope: "hold", ID: "slow"}
	_, err := idemmysql.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
		if err := insertEffect(ctx, tx, key.ID, 1); err != nil {
			return 0, err
		}
		var n int
		return n, tx.QueryRowContext(ctx, `SELECT SLEEP(30)`).Scan(&n)
	}, idem.WithHoldTimeout(time.Second))
	require.Error(t, err)
	require.Equal(t, 0, effects(t, db, key.ID))
	res, err := idemmysql.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
		return 2, insertEffect(ctx, tx, key.ID, 2)
	})
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 1, effects(t, db, key.ID))
}

// The bounds are the session's, so Do puts them back on its connection
// once the transaction ends, however it ends, and the pool gets the
// connection back as it was: the same connection (not a discarded one),
// with the settings it had, a lower one kept throughout.
func TestHoldTimeoutPutsTheSessionBack(t *testing.T) {
	db := openDB(t, "max_statement_time=1.5")
	db.SetMaxOpenConns(1) // every call on the one connection
	ctx := context.Background()
	idle0, stmt0, conn0 := sessionBounds(t, ctx, db)
	require.Equal(t, 0, idle0)
	require.Equal(t, 1.5, stmt0)

	hold := idem.WithHoldTimeout(20 * time.Second)
	inside := func(ctx context.Context, tx *sql.Tx) (int, error) {
		idle, stmt, _ := sessionBounds(t, ctx, tx)
		require.Equal(t, 20, idle, "the idle bound, in seconds")
		require.Equal(t, 1.5, stmt, "the session's lower statement bound is kept")
		return 1, nil
	}
	cancelled, cancel := context.WithCancel(ctx)
	cases := []struct {
		name string
		ctx  context.Context
		key  string
		fn   func(ctx context.Context, tx *sql.Tx) (int, error)
	}{
		{"committed", ctx, "k1", inside},
		{"replayed", ctx, "k1", inside}, // the bounds are not applied
		{"fn failed", ctx, "k2", func(ctx context.Context, tx *sql.Tx) (int, error) {
			_, err := inside(ctx, tx)
			return 0, errors.Join(err, errors.New("declined"))
		}},
		{"ctx cancelled in fn", cancelled, "k3", func(ctx context.Context, tx *sql.Tx) (int, error) {
			_, err := inside(ctx, tx)
			cancel()
			return 0, err
		}},
	}
	for _, c := range cases {
		_, _ = idemmysql.Do(c.ctx, db, idem.Key{Scope: "hold", ID: c.key}, c.fn, hold)
		idle, stmt, conn := sessionBounds(t, ctx, db)
		require.Equal(t, idle0, idle, c.name)
		require.Equal(t, stmt0, stmt, c.name)
		require.Equal(t, conn0, conn, "%s: the connection went back to the pool", c.name)
	}
	var ran int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM idempotent_record WHERE status = 'succeeded'`).Scan(&ran))
	require.Equal(t, 1, ran)
}

// Where the bounds cannot be put back (the caller's transaction, a server
// without them), the hold timeout is refused before any SQL.
func TestHoldTimeoutRefused(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	hold := idem.WithHoldTimeout(time.Second)
	fn := func(ctx context.Context, tx *sql.Tx) (int, error) { return 1, insertEffect(ctx, tx, "refused", 1) }
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = idemmysql.WithIdempotency(ctx, tx, idem.Key{Scope: "hold", ID: "tx"}, fn, hold)
	require.ErrorIs(t, err, idem.ErrInvalidOption)
	require.NoError(t, tx.Rollback())

	t.Cleanup(idemmysql.UseMySQL8())
	_, err = idemmysql.Do(ctx, db, idem.Key{Scope: "hold", ID: "mysql8"}, fn, hold)
	require.ErrorIs(t, err, idem.ErrInvalidOption)
	require.Equal(t, 0, effects(t, db, "refused"))
}
