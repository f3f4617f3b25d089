package integration_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
	"github.com/idemkit/idem/internal/knobs"
)

// On a connection in pgx's default mode without a tracer, the claim and the
// completion go below pgx.Batch, through pgconn's Batch, as statements
// prepared with pgx's Conn.Prepare. These tests check that path (which the
// rest of the suite takes without PgBouncer) against the other one.

// countingConn counts the client's writes: one per round trip, since pgx and
// pgconn send each request in one write.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// directConn connects straight to PostgreSQL (never through PgBouncer) in
// pgx's default mode, counting round trips in writes.
func directConn(t *testing.T, writes *atomic.Int64, configure ...func(*pgx.ConnConfig)) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: writes}, nil
	}
	for _, f := range configure {
		f(cfg)
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// preparedStatements lists the text of the statements prepared on conn.
func preparedStatements(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `SELECT statement FROM pg_prepared_statements`, pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func containsStatement(stmts []string, part string) bool {
	for _, s := range stmts {
		if strings.Contains(strings.ToLower(s), part) {
			return true
		}
	}
	return false
}

// TestRoundTripsBelowPgxBatch is TestDoCostsTheRoundTripsOfABareTransaction
// on the path below pgx.Batch (no tracer), counting writes: Do costs the
// round trips of a bare transaction, a replay two, and WithIdempotency two
// more than the caller's own statements.
func TestRoundTripsBelowPgxBatch(t *testing.T) {
	s := pgtest.NewSchema(t, pgtest.Pool(t))
	var writes atomic.Int64
	conn := directConn(t, &writes)
	ctx := context.Background()
	insert, bare := oneInsert(t, conn, s)
	withIdem := func(id string, opts ...idem.Option) idem.Result[int] {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		res, err := idem.WithIdempotency(ctx, tx, idem.Key{Scope: "s", ID: id}, insert, append(opts, s.Opt)...)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		return res
	}
	// Prepare everything first.
	bare()
	for _, opts := range [][]idem.Option{nil, {idem.NoWait()}} {
		for range 2 {
			_, err := idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "warm-do"}, insert, append(opts, s.Opt)...)
			require.NoError(t, err)
			withIdem("warm-wi", opts...)
		}
	}
	stmts := preparedStatements(t, conn)
	require.True(t, containsStatement(stmts, "on conflict (scope, key) do nothing"), "the claim is a prepared statement: %q", stmts)
	require.True(t, containsStatement(stmts, "with done as"), "the completion is a prepared statement: %q", stmts)

	count := func(f func()) int64 {
		writes.Store(0)
		f()
		return writes.Load()
	}
	bareTrips := count(bare)
	require.EqualValues(t, 3, bareTrips)
	for _, opts := range [][]idem.Option{nil, {idem.NoWait()}} {
		id := "k" + strings.Repeat("-nowait", len(opts))
		var res idem.Result[int]
		var err error
		require.Equal(t, bareTrips, count(func() {
			res, err = idem.Do(ctx, conn, idem.Key{Scope: "s", ID: id}, insert, append(opts, s.Opt)...)
		}), "a first execution costs what a bare transaction costs (%d options)", len(opts))
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.EqualValues(t, 2, count(func() {
			res, err = idem.Do(ctx, conn, idem.Key{Scope: "s", ID: id}, insert, append(opts, s.Opt)...)
		}), "a replay costs two round trips")
		require.NoError(t, err)
		require.True(t, res.Replayed)

		require.Equal(t, bareTrips+2, count(func() { res = withIdem("wi-"+id, opts...) }),
			"WithIdempotency adds the claim's round trip and the completion's")
		require.False(t, res.Replayed)
		require.Equal(t, bareTrips+1, count(func() { res = withIdem("wi-"+id, opts...) }),
			"a replay in the caller's transaction replaces fn's statement with the read")
		require.True(t, res.Replayed)
	}
	// Every first execution left one effect, and no replay did: two bare
	// transactions, three through Do and three through WithIdempotency.
	var effects int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM `+s.Effects).Scan(&effects))
	require.Equal(t, 8, effects)
}

// TestFewerAllocationsBelowPgxBatch checks that the claim and the completion
// really take the path below pgx.Batch on a plain connection: a
// WithIdempotency call allocates far less there than through pgx.Batch (the
// path knobs.PgxBatch forces, and every connection with a tracer takes).
func TestFewerAllocationsBelowPgxBatch(t *testing.T) {
	s := pgtest.NewSchema(t, pgtest.Pool(t))
	var writes atomic.Int64
	conn := directConn(t, &writes)
	ctx := context.Background()
	fn := func(context.Context, pgx.Tx) (int, error) { return 1, nil }
	n := 0
	call := func() {
		n++
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = idem.WithIdempotency(ctx, tx, idem.Key{Scope: "s", ID: strconv.Itoa(n)}, fn, s.Opt)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}
	below := testing.AllocsPerRun(50, call)
	knobs.PgxBatch.Store(true)
	through := testing.AllocsPerRun(50, call)
	knobs.PgxBatch.Store(false)
	t.Logf("allocations per call: %.0f below pgx.Batch, %.0f through it", below, through)
	require.Less(t, below+30, through, "below pgx.Batch: %.0f allocations, through it: %.0f", below, through)
	var records int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM `+s.Records+` WHERE status = 'succeeded'`).Scan(&records))
	require.Equal(t, n, records)
}

// TestTracersSeeEveryStatement checks that a connection with a pgx tracer
// keeps idem's statements on pgx.Batch, where the tracer sees them, and that
// a connection in another query mode gets no statement prepared by idem.
func TestTracersSeeEveryStatement(t *testing.T) {
	s := pgtest.NewSchema(t, pgtest.Pool(t))
	ctx := context.Background()
	var writes atomic.Int64
	rec := &sqlRecorder{}
	traced := directConn(t, &writes, func(c *pgx.ConnConfig) { c.Tracer = rec })
	execMode := directConn(t, &writes, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = pgx.QueryExecModeExec })
	for _, conn := range []*pgx.Conn{traced, execMode} {
		for _, opts := range [][]idem.Option{{s.Opt}, {s.Opt, idem.NoWait()}} {
			for range 2 { // an execution, then a replay
				_, err := idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "do"}, func(context.Context, pgx.Tx) (int, error) { return 1, nil }, opts...)
				require.NoError(t, err)
				tx, err := conn.Begin(ctx)
				require.NoError(t, err)
				_, err = idem.WithIdempotency(ctx, tx, idem.Key{Scope: "s", ID: "wi"}, func(context.Context, pgx.Tx) (int, error) { return 1, nil }, opts...)
				require.NoError(t, err)
				require.NoError(t, tx.Commit(ctx))
			}
		}
	}
	seen := rec.statements()
	for _, part := range []string{"on conflict (scope, key) do nothing", "with done as", "savepoint idem_fn", "release savepoint idem_fn", "savepoint idem_claim", "release savepoint idem_claim", "select attempt, status"} {
		require.True(t, containsStatement(seen, part), "the tracer saw no statement with %q", part)
	}
	for _, st := range preparedStatements(t, execMode) {
		require.NotContains(t, st, s.Records, "idem prepared a statement on a connection in QueryExecModeExec")
	}
}

// TestStatementsPreparedAgainAfterDiscard checks that when the server drops
// the prepared statements behind pgx's back (DISCARD ALL), the call that
// meets the missing statement fails with its error, and the next one
// prepares the statements again and works.
func TestStatementsPreparedAgainAfterDiscard(t *testing.T) {
	s := pgtest.NewSchema(t, pgtest.Pool(t))
	ctx := context.Background()
	var writes atomic.Int64
	conn := directConn(t, &writes)
	fn := func(context.Context, pgx.Tx) (int, error) { return 7, nil }
	call := func(id string) (idem.Result[int], error) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		res, err := idem.WithIdempotency(ctx, tx, idem.Key{Scope: "s", ID: id}, fn, s.Opt)
		if err != nil {
			return res, err
		}
		return res, tx.Commit(ctx)
	}
	_, err := call("a")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "DISCARD ALL", pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)

	_, err = call("b")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "26000", pgErr.Code, "the missing prepared statement")

	res, err := call("b")
	require.NoError(t, err)
	require.Equal(t, idem.Result[int]{Value: 7}, res)
	res, err = call("a")
	require.NoError(t, err)
	require.Equal(t, idem.Result[int]{Value: 7, Replayed: true}, res)
}

// TestEndedTransactionsAreRefused checks that a transaction that has ended
// (committed, a released savepoint, a pool transaction whose connection
// went back to the pool and to another caller) gets pgx.ErrTxClosed on both
// paths, and that nothing reaches the connection's new owner.
func TestEndedTransactionsAreRefused(t *testing.T) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	s := pgtest.NewSchema(t, pgtest.Pool(t))
	ctx := context.Background()
	fn := func(context.Context, pgx.Tx) (int, error) { return 7, nil }
	for _, throughPgx := range []bool{false, true} {
		knobs.PgxBatch.Store(throughPgx)
		prefix := strconv.FormatBool(throughPgx) + "-"

		conn := pgtest.Conn(t)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		_, err = idem.WithIdempotency(ctx, tx, idem.Key{Scope: "s", ID: prefix + "committed"}, fn, s.Opt)
		require.ErrorIs(t, err, pgx.ErrTxClosed, "a committed transaction")

		tx, err = conn.Begin(ctx)
		require.NoError(t, err)
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, sp.Commit(ctx))
		_, err = idem.WithIdempotency(ctx, sp, idem.Key{Scope: "s", ID: prefix + "released"}, fn, s.Opt)
		require.ErrorIs(t, err, pgx.ErrTxClosed, "a released savepoint")
		require.NoError(t, tx.Commit(ctx))

		stale, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, stale.Commit(ctx))
		other, err := pool.Begin(ctx) // the same connection, another owner
		require.NoError(t, err)
		_, err = idem.WithIdempotency(ctx, stale, idem.Key{Scope: "s", ID: prefix + "stale"}, fn, s.Opt)
		require.ErrorIs(t, err, pgx.ErrTxClosed, "a pool transaction after its commit")
		require.NoError(t, other.Commit(ctx))
	}
	knobs.PgxBatch.Store(false)
	var records int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+s.Records).Scan(&records))
	require.Zero(t, records, "no record reached a transaction that had ended, nor the connection's next owner")
}

// After a DISCARD ALL, Do and Claim recover too: Do's first round trip goes
// through pgx.Batch, which picks up the statements idem prepared on the
// connection (named after their text); its failure forgets them as the wire
// path's does, and Claim's read has a text of its own.
func TestDoAndClaimRecoverAfterDiscard(t *testing.T) {
	s := pgtest.NewSchema(t, pgtest.Pool(t))
	ctx := context.Background()
	var writes atomic.Int64
	conn := directConn(t, &writes)
	fn := func(context.Context, pgx.Tx) (int, error) { return 7, nil }
	withIdem := func(id string) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		_, err = idem.WithIdempotency(ctx, tx, idem.Key{Scope: "s", ID: id}, fn, s.Opt)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}
	withIdem("a")
	withIdem("a") // the replay prepares the read as well

	_, err := conn.Exec(ctx, "DISCARD ALL", pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)
	_, _, err = idem.Claim[int](ctx, conn, idem.Key{Scope: "s", ID: "lease-0"}, time.Minute, s.Opt)
	require.NoError(t, err, "Claim does not use the statements idem prepared")
	_, err = idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "b"}, fn, s.Opt)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "26000", pgErr.Code, "the missing prepared statement")
	for i := range 3 {
		res, err := idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "b"}, fn, s.Opt)
		require.NoError(t, err, "call %d after the failing one", i)
		require.Equal(t, i > 0, res.Replayed)
		_, _, err = idem.Claim[int](ctx, conn, idem.Key{Scope: "s", ID: "lease-" + strconv.Itoa(i+1)}, time.Minute, s.Opt)
		require.NoError(t, err)
	}
	res, err := idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "a"}, fn, s.Opt)
	require.NoError(t, err)
	require.Equal(t, idem.Result[int]{Value: 7, Replayed: true}, res)
}
