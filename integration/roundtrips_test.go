package integration_test

import (
	"context"
	"errors"
	"fmt"
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
)

// idem's statements go through pgx.Batch: these tests count the round trips
// they take, check that tracers see them and that no query mode is
// overridden, and that ended transactions and dropped prepared statements
// are handled.

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

// TestRoundTrips counts writes on a direct connection in pgx's default mode:
// Do costs the round trips of a bare transaction, a replay two, and
// WithIdempotency two more than the caller's own statements.
func TestRoundTrips(t *testing.T) {
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
			_, err := idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "warm-do"}, insert, doOpts(opts, s.Opt)...)
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
			res, err = idem.Do(ctx, conn, idem.Key{Scope: "s", ID: id}, insert, doOpts(opts, s.Opt)...)
		}), "a first execution costs what a bare transaction costs (%d options)", len(opts))
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.EqualValues(t, 2, count(func() {
			res, err = idem.Do(ctx, conn, idem.Key{Scope: "s", ID: id}, insert, doOpts(opts, s.Opt)...)
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

// TestTracersSeeEveryStatement checks that a pgx tracer sees every statement
// idem sends, and that a connection in another query mode gets no statement
// prepared by idem.
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
				_, err := idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "do"}, func(context.Context, pgx.Tx) (int, error) { return 1, nil }, doOpts(opts)...)
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

// TestEndedTransactionsAreRefused checks that a transaction that has ended
// (committed, a released savepoint, a pool transaction whose connection
// went back to the pool and to another caller) gets pgx.ErrTxClosed, and
// that nothing reaches the connection's new owner.
func TestEndedTransactionsAreRefused(t *testing.T) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	s := pgtest.NewSchema(t, pgtest.Pool(t))
	ctx := context.Background()
	fn := func(context.Context, pgx.Tx) (int, error) { return 7, nil }
	{
		prefix := ""

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
	var records int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+s.Records).Scan(&records))
	require.Zero(t, records, "no record reached a transaction that had ended, nor the connection's next owner")
}

// TestRecoversAfterDiscard checks what happens when the server drops the
// prepared statements behind pgx's back (DISCARD ALL): a call that meets a
// statement pgx still believes prepared fails with SQLSTATE 26000 and
// nothing else (pgx then forgets that statement and prepares it again on
// its next use), so after at most one failure per statement idem uses every
// call works again, and no call ever ran fn twice or answered wrongly.
func TestRecoversAfterDiscard(t *testing.T) {
	s := pgtest.NewSchema(t, pgtest.Pool(t))
	ctx := context.Background()
	var writes atomic.Int64
	conn := directConn(t, &writes)
	insert := func(id string) func(context.Context, pgx.Tx) (int, error) {
		return func(ctx context.Context, tx pgx.Tx) (int, error) {
			_, err := tx.Exec(ctx, `INSERT INTO `+s.Effects+` (scope, key, value) VALUES ('s', $1, 'v')`, id)
			return 1, err
		}
	}
	withIdem := func(id string) (idem.Result[int], error) {
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		res, err := idem.WithIdempotency(ctx, tx, idem.Key{Scope: "s", ID: id}, insert(id), s.Opt)
		if err != nil {
			return res, err
		}
		return res, tx.Commit(ctx)
	}
	do := func(id string) (idem.Result[int], error) {
		return idem.Do(ctx, conn, idem.Key{Scope: "s", ID: id}, insert(id), s.Opt)
	}
	claim := func(id string) (idem.Result[int], error) {
		_, res, err := idem.Claim[int](ctx, conn, idem.Key{Scope: "s", ID: id}, time.Minute, s.Opt)
		return res, err
	}
	// Every statement idem uses is prepared once: executions and replays
	// of each entry point.
	for i, call := range []func(string) (idem.Result[int], error){withIdem, do, claim} {
		for range 2 {
			_, err := call(fmt.Sprintf("warm-%d", i))
			if !errors.Is(err, idem.ErrInProgress) { // a second Claim of a held key reads it
				require.NoError(t, err)
			}
		}
	}
	prepared := len(preparedStatements(t, conn))
	require.NotZero(t, prepared)

	_, err := conn.Exec(ctx, "DISCARD ALL", pgx.QueryExecModeSimpleProtocol)
	require.NoError(t, err)

	failures := 0
	for name, call := range map[string]func(string) (idem.Result[int], error){"WithIdempotency": withIdem, "Do": do} {
		for _, id := range []string{name + "-a", name + "-a", name + "-b"} {
			for {
				res, err := call(id)
				if err != nil {
					var pgErr *pgconn.PgError
					require.ErrorAs(t, err, &pgErr, "%s(%s)", name, id)
					require.Equal(t, "26000", pgErr.Code, "%s(%s): only the missing statement may fail a call", name, id)
					failures++
					require.LessOrEqual(t, failures, prepared, "more failures than statements pgx had prepared")
					continue
				}
				require.Equal(t, 1, res.Value)
				break
			}
		}
	}
	for i := range 3 {
		for {
			_, err := claim("lease-" + strconv.Itoa(i))
			if err == nil {
				break
			}
			require.Equal(t, "26000", pgCodeOf(err))
			failures++
			require.LessOrEqual(t, failures, prepared, "more failures than statements pgx had prepared")
		}
	}
	t.Logf("%d calls failed with 26000 after DISCARD ALL (%d statements were prepared)", failures, prepared)

	// Each key ran fn once: a failed call left nothing behind, and the
	// repeat of a key replayed.
	for _, id := range []string{"WithIdempotency-a", "WithIdempotency-b", "Do-a", "Do-b"} {
		require.Equal(t, 1, s.CountEffects(t, pgtest.Pool(t), idem.Key{Scope: "s", ID: id}), id)
	}
	res, err := do("WithIdempotency-a")
	require.NoError(t, err)
	require.Equal(t, idem.Result[int]{Value: 1, Replayed: true}, res)
}
