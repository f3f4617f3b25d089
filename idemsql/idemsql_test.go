package idemsql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
)

var key = idem.Key{Scope: "unit", ID: "k-1"}

func noRetry() idem.DoOption {
	return idem.WithRetry(idem.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Microsecond, MaxDelay: time.Microsecond})
}

// A COMMIT that may have reached the server is ErrOutcomeUnknown; one that
// failed with a SQLSTATE did not commit, whichever driver reported it.
func TestDoClassifiesCommitErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		unknown   bool
		retryable bool
	}{
		{name: "bad connection", err: driver.ErrBadConn, unknown: true},
		{name: "network", err: &net.OpError{Op: "read", Net: "tcp", Err: io.ErrUnexpectedEOF}, unknown: true},
		{name: "EOF", err: io.ErrUnexpectedEOF, unknown: true},
		{name: "unique violation", err: &sqlStateError{code: "23505"}},
		{name: "serialization failure", err: &sqlStateError{code: "40001"}, retryable: true},
		{name: "pgx commit turned rollback", err: pgx.ErrTxCommitRollback},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &fakeDriver{commitErr: tc.err}
			db := idemsql.Wrap(openFake(t, d))
			_, err := idem.Do(context.Background(), db, key, func(context.Context, pgx.Tx) (string, error) {
				return "v", nil
			}, noRetry())
			require.ErrorIs(t, err, tc.err)
			require.Equal(t, tc.unknown, errors.Is(err, idem.ErrOutcomeUnknown), "%v", err)
			require.Equal(t, tc.retryable, idem.IsRetryable(err))
			if tc.retryable {
				require.EqualValues(t, 2, d.commits.Load(), "Do retries a 40001")
			} else {
				require.EqualValues(t, 1, d.commits.Load())
			}
			_, unique := idem.UniqueViolation(err)
			require.Equal(t, tc.name == "unique violation", unique)
		})
	}
}

// A transaction whose context ended is rolled back by database/sql; its
// Commit never reaches the server, and says so.
func TestCommitAfterContextEndedIsNotSent(t *testing.T) {
	db := idemsql.Wrap(openFake(t, &fakeDriver{}))
	ctx, cancel := context.WithCancel(context.Background())
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	cancel()
	err = tx.Commit(context.Background())
	require.Error(t, err)
	require.True(t, pgconn.SafeToRetry(err), "%v", err)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, tx.Rollback(context.Background()), pgx.ErrTxClosed)
}

// fn reaches the *sql.Tx through idem's guard while it runs, and no longer
// once it returned.
func TestSQLTxThroughTheGuard(t *testing.T) {
	d := &fakeDriver{}
	db := idemsql.Wrap(openFake(t, d))
	var leaked pgx.Tx
	res, err := idem.Do(context.Background(), db, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
		stx, ok := idemsql.SQLTx(tx)
		require.True(t, ok)
		_, err := stx.ExecContext(ctx, "INSERT INTO effects VALUES (1)")
		require.NoError(t, err)
		sp, err := tx.Begin(ctx) // a savepoint, behind the guard too
		require.NoError(t, err)
		inner, ok := idemsql.SQLTx(sp)
		require.True(t, ok)
		require.Same(t, stx, inner)
		require.NoError(t, sp.Commit(ctx))
		leaked = tx
		return "v", nil
	})
	require.NoError(t, err)
	require.Equal(t, "v", res.Value)
	_, ok := idemsql.SQLTx(leaked)
	require.False(t, ok, "the guard unwraps only while fn runs")
	require.Contains(t, d.logged(), "INSERT INTO effects VALUES (1)")
	require.Contains(t, d.logged(), "SAVEPOINT sp_1")
	require.Contains(t, d.logged(), "RELEASE SAVEPOINT sp_1")
	require.EqualValues(t, 1, d.commits.Load())

	_, ok = idemsql.SQLTx(nil)
	require.False(t, ok)
	require.Nil(t, idemsql.WrapTx(nil))
}

// A batch runs in order, calls each callback with its statement's result
// (a failed statement's callback gets its error), stops after a failed
// statement and returns the first error, twice.
func TestBatchOnTx(t *testing.T) {
	failure := &sqlStateError{code: "23505"}
	d := &fakeDriver{failOn: "third", failErr: failure}
	sdb := openFake(t, d)
	ctx := context.Background()
	stx, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	tx := idemsql.WrapTx(stx)
	defer tx.Rollback(ctx) //nolint:errcheck

	var got int64
	var tag pgconn.CommandTag
	b := &pgx.Batch{}
	b.Queue("SELECT first").QueryRow(func(r pgx.Row) error { return r.Scan(&got) })
	b.Queue("UPDATE second").Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
	var scanErr error
	b.Queue("SELECT third").QueryRow(func(r pgx.Row) error { scanErr = r.Scan(new(int)); return scanErr })
	b.Queue("SELECT fourth")
	br := tx.SendBatch(ctx, b)
	err = br.Close()
	require.ErrorIs(t, err, failure)
	require.ErrorIs(t, br.Close(), failure)
	require.ErrorIs(t, scanErr, failure, "the failed statement's callback sees its error, as in pgx")
	require.EqualValues(t, 1, got)
	require.Equal(t, "UPDATE 1", tag.String())
	require.EqualValues(t, 1, tag.RowsAffected())
	require.NotContains(t, d.logged(), "SELECT fourth")
	require.Nil(t, br.Tx())
}

// A batch on a DB runs in a transaction of its own: committed without a
// statement error, rolled back with one.
func TestBatchOnDBIsOneTransaction(t *testing.T) {
	d := &fakeDriver{failOn: "bad", failErr: &sqlStateError{code: "55P03"}}
	db := idemsql.Wrap(openFake(t, d))
	ctx := context.Background()

	b := &pgx.Batch{}
	b.Queue("SELECT set_config('lock_timeout', $1, true)", "100ms")
	b.Queue("UPDATE good")
	require.NoError(t, db.SendBatch(ctx, b).Close())
	require.EqualValues(t, 1, d.commits.Load())

	b = &pgx.Batch{}
	b.Queue("UPDATE bad")
	b.Queue("UPDATE never")
	err := db.SendBatch(ctx, b).Close()
	require.Equal(t, "55P03", err.(interface{ SQLState() string }).SQLState())
	require.EqualValues(t, 1, d.commits.Load())
	require.EqualValues(t, 1, d.rollbacks.Load())
	require.NotContains(t, d.logged(), "UPDATE never")

	// A callback's error stops the callbacks, not the statements, which
	// pgx has sent already; no statement failed, so the batch commits.
	b = &pgx.Batch{}
	stop := errors.New("stop")
	b.Queue("SELECT a").QueryRow(func(pgx.Row) error { return stop })
	b.Queue("UPDATE after").Exec(func(pgconn.CommandTag) error { t.Error("callback after an error ran"); return nil })
	require.ErrorIs(t, db.SendBatch(ctx, b).Close(), stop)
	require.Contains(t, d.logged(), "UPDATE after")
	require.EqualValues(t, 2, d.commits.Load())

	b = &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	require.Error(t, db.SendBatch(ctx, b).Close())
}

func TestRowsAndErrors(t *testing.T) {
	db := idemsql.Wrap(openFake(t, &fakeDriver{}))
	ctx := context.Background()
	var n int32
	require.NoError(t, db.QueryRow(ctx, "SELECT v").Scan(&n))
	require.EqualValues(t, 1, n)
	require.NoError(t, db.QueryRow(ctx, "SELECT v").Scan(nil)) // nil skips a column, as in pgx

	rows, err := db.Query(ctx, "SELECT v")
	require.NoError(t, err)
	require.True(t, rows.Next())
	vals, err := rows.Values()
	require.NoError(t, err)
	require.Equal(t, []any{int64(1)}, vals)
	require.Equal(t, "v", rows.FieldDescriptions()[0].Name)
	require.False(t, rows.Next())
	require.NoError(t, rows.Err())
	require.Equal(t, "SELECT 1", rows.CommandTag().String())
	require.NotNil(t, rows.TypeMap())

	tag, err := db.Exec(ctx, "/* c */ -- x\n insert INTO t VALUES (1)")
	require.NoError(t, err)
	require.Equal(t, "INSERT 0 1", tag.String())
	require.True(t, tag.Insert())

	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable, AccessMode: pgx.ReadOnly, DeferrableMode: pgx.Deferrable})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxClosed)
	_, err = tx.Exec(ctx, "SELECT 1")
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	_, err = db.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN PRIORITY HIGH"})
	require.Error(t, err)
	_, err = db.BeginTx(ctx, pgx.TxOptions{IsoLevel: "chaotic"})
	require.Error(t, err)
}

func TestNoRowsIsPgxErrNoRows(t *testing.T) {
	d := &fakeDriver{failOn: "missing", failErr: sql.ErrNoRows}
	db := idemsql.Wrap(openFake(t, d))
	err := db.QueryRow(context.Background(), "SELECT missing").Scan(new(int))
	require.ErrorIs(t, err, pgx.ErrNoRows)
	require.ErrorIs(t, err, sql.ErrNoRows)
}
