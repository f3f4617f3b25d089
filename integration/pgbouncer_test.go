package integration_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// sqlRecorder is a pgx tracer that keeps the text of every statement sent,
// alone or in a batch.
type sqlRecorder struct {
	mu  sync.Mutex
	sql []string
}

func (r *sqlRecorder) add(sql string) {
	r.mu.Lock()
	r.sql = append(r.sql, sql)
	r.mu.Unlock()
}

func (r *sqlRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.add(d.SQL)
	return ctx
}
func (r *sqlRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *sqlRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		r.add(q.SQL)
	}
	return ctx
}
func (r *sqlRecorder) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *sqlRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (r *sqlRecorder) statements() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, sql := range r.sql {
		for _, st := range strings.Split(sql, ";") {
			st = strings.ToLower(strings.Join(strings.Fields(st), " "))
			if st != "" {
				out = append(out, st)
			}
		}
	}
	return out
}

var (
	setConfigCall  = regexp.MustCompile(`set_config\s*\(`)
	setConfigLocal = regexp.MustCompile(`set_config\s*\(\s*'[a-z_.]+'\s*,\s*[^,()]+,\s*true\s*\)`)
	sessionLock    = regexp.MustCompile(`pg_(try_)?advisory_(un)?lock(_shared|_all)?\s*\(`)
)

// sessionStateProblem says what session state a statement would leave on a
// server connection that a transaction pooler then hands to another client,
// or "" when it leaves none.
func sessionStateProblem(st string) string {
	switch {
	case (strings.HasPrefix(st, "set ") && !strings.HasPrefix(st, "set local ") && !strings.HasPrefix(st, "set transaction ")) ||
		strings.HasPrefix(st, "reset "):
		return "a session-level SET"
	case setConfigCall.MatchString(st) && !setConfigLocal.MatchString(st):
		return "set_config without is_local = true"
	case sessionLock.MatchString(st):
		return "a session advisory lock"
	case strings.HasPrefix(st, "prepare ") || strings.HasPrefix(st, "deallocate "):
		return "a named prepared statement"
	case strings.HasPrefix(st, "listen ") || strings.HasPrefix(st, "unlisten "):
		return "LISTEN"
	case strings.HasPrefix(st, "declare ") && strings.Contains(st, " with hold"):
		return "a cursor WITH HOLD"
	case strings.HasPrefix(st, "create temp"):
		return "a temporary table"
	}
	return ""
}

func TestSessionStateProblemClassifier(t *testing.T) {
	for st, bad := range map[string]bool{
		"set lock_timeout = '50ms'":                    true,
		"set session statement_timeout = 0":            true,
		"reset lock_timeout":                           true,
		"select set_config('lock_timeout', $1, false)": true,
		"select pg_advisory_lock($1)":                  true,
		"select pg_try_advisory_lock_shared(1)":        true,
		"select pg_advisory_unlock_all()":              true,
		"prepare s as select 1":                        true,
		"create temporary table x (a int)":             true,
		"listen ch":                                    true,
		"set local lock_timeout = '50ms'":              false,
		"set transaction isolation level serializable": false,
		"select set_config('lock_timeout', $1, true)":  false,
		"select pg_advisory_xact_lock(1)":              false,
		"update t set status = $1 where key = $2":      false,
		"savepoint idem_fn":                            false,
	} {
		require.Equal(t, bad, sessionStateProblem(st) != "", st)
	}
}

// TestLibraryLeavesNoSessionState runs every kind of library call, on its
// success and its ErrInProgress paths, through PgBouncer's pool of ONE
// server connection, and after each one checks from another client
// connection (the same PostgreSQL session, as pg_backend_pid shows) that the
// session is as it was: settings, advisory locks, prepared statements,
// cursors, LISTEN, temporary tables (and no transaction left open, or the
// checker would not get the server connection). It also checks the
// text of every statement sent. Without PgBouncer it runs the same calls on
// a pool of one connection, which the checks then share.
func TestLibraryLeavesNoSessionState(t *testing.T) {
	ctx := context.Background()
	s := pgtest.NewSchema(t, pgtest.Pool(t))
	rec := &sqlRecorder{}
	traced := func(c *pgxpool.Config) {
		c.ConnConfig.Tracer = rec
		// The library must work in the mode PgBouncer needs, and must not
		// prepare statements itself.
		c.ConnConfig.DefaultQueryExecMode = pgtest.BouncerExecMode
	}
	var (
		lib     *pgxpool.Pool
		checker interface {
			QueryRow(context.Context, string, ...any) pgx.Row
		}
	)
	if pgtest.ViaPgBouncer() {
		cfg, err := pgxpool.ParseConfig(pgtest.SingleServerURL())
		require.NoError(t, err)
		cfg.MaxConns = 3 // client connections, taking turns on one server connection
		traced(cfg)
		lib, err = pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(lib.Close)
		conn, err := pgx.Connect(ctx, pgtest.SingleServerURL())
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close(context.Background()) })
		checker = conn
	} else {
		lib = pgtest.Pool(t, traced, func(c *pgxpool.Config) { c.MaxConns = 1 })
		checker = lib
	}

	type state struct {
		PID                                                int32
		LockTimeout, StatementTimeout, IdleInTxTimeout     string
		SearchPath, Isolation, AppName, TimeZone           string
		AdvisoryLocks, Prepared, Cursors, Listening, Temps int64
	}
	read := func(label string) state {
		t.Helper()
		// Through PgBouncer, a transaction left open would keep the one
		// server connection from the checker: it times out.
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var st state
		// pg_cursors lists this query's own unnamed portal too.
		err := checker.QueryRow(cctx, `SELECT pg_backend_pid(),
			current_setting('lock_timeout'), current_setting('statement_timeout'),
			current_setting('idle_in_transaction_session_timeout'), current_setting('search_path'),
			current_setting('default_transaction_isolation'), current_setting('application_name'),
			current_setting('TimeZone'),
			(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
			(SELECT count(*) FROM pg_prepared_statements),
			(SELECT count(*) FROM pg_cursors WHERE name <> ''),
			(SELECT count(*) FROM pg_listening_channels()),
			(SELECT count(*) FROM pg_class WHERE relpersistence = 't' AND pg_table_is_visible(oid))`).Scan(&st.PID,
			&st.LockTimeout, &st.StatementTimeout, &st.IdleInTxTimeout, &st.SearchPath,
			&st.Isolation, &st.AppName, &st.TimeZone,
			&st.AdvisoryLocks, &st.Prepared, &st.Cursors, &st.Listening, &st.Temps)
		require.NoError(t, err, "checking the session after %s", label)
		return st
	}
	before := read("nothing")
	require.Zero(t, before.AdvisoryLocks+before.Prepared+before.Cursors+before.Listening+before.Temps, "%+v", before)
	if pgtest.ViaPgBouncer() {
		// Two client connections, one session: what one leaves, the other sees.
		var pid int32
		require.NoError(t, lib.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		require.Equal(t, before.PID, pid, "PgBouncer's single-server pool hands every client the same backend")
	}
	check := func(label string) {
		t.Helper()
		require.Equal(t, before, read(label), "the session after %s", label)
	}

	c := &counter{s: s}
	key := func(id string) idem.Key { return idem.Key{Scope: "session", ID: id} }
	inTx := func(f func(tx pgx.Tx) error) {
		t.Helper()
		tx, err := lib.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		require.NoError(t, f(tx))
		require.NoError(t, tx.Commit(ctx))
	}

	// Do, on the pool and on a connection, first runs and replays, waiting
	// and not.
	for _, noWait := range []bool{false, true} {
		opts := []idem.DoOption{s.Opt}
		if noWait {
			opts = append(opts, idem.NoWait())
		}
		k := key("do-" + map[bool]string{false: "wait", true: "nowait"}[noWait])
		for range 2 {
			_, err := idem.Do(ctx, lib, k, c.fn(k), opts...)
			require.NoError(t, err)
			check("Do")
		}
		pc, err := lib.Acquire(ctx)
		require.NoError(t, err)
		k.ID += "-conn"
		_, err = idem.Do(ctx, pc.Conn(), k, c.fn(k), opts...)
		pc.Release()
		require.NoError(t, err)
		check("Do on a connection")
	}

	// WithIdempotency with NoWait sets lock_timeout for its claim, locally.
	inTx(func(tx pgx.Tx) error {
		_, err := idem.WithIdempotency(ctx, tx, key("wi-nowait"), c.fn(key("wi-nowait")), s.Opt, idem.NoWait())
		return err
	})
	check("WithIdempotency with NoWait")

	// The in-progress paths: a direct connection holds the key's row while
	// the library, under its short lock_timeout, gives up on it.
	holder, err := pgtest.Direct(t).Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck
	held := key("held")
	_, err = idem.WithIdempotency(ctx, holder, held, c.fn(held), s.Opt)
	require.NoError(t, err)
	leased := key("held-lease")
	_, _, err = idem.Claim[string](ctx, holder, leased, time.Minute, s.Opt)
	require.NoError(t, err)

	inTx(func(tx pgx.Tx) error {
		_, err := idem.WithIdempotency(ctx, tx, held, c.fn(held), s.Opt, idem.NoWait())
		if !errors.Is(err, idem.ErrInProgress) {
			return err
		}
		return nil
	})
	check("WithIdempotency meeting a held key with NoWait")
	_, err = idem.Do(ctx, lib, held, c.fn(held), s.Opt, idem.NoWait())
	require.ErrorIs(t, err, idem.ErrInProgress)
	check("Do meeting a held key with NoWait")
	_, _, err = idem.Claim[string](ctx, lib, leased, time.Minute, s.Opt)
	require.ErrorIs(t, err, idem.ErrInProgress)
	check("Claim meeting a held key")
	require.NoError(t, holder.Rollback(ctx))

	// Lease mode: Claim sets lock_timeout in its implicit transaction.
	lease, _, err := idem.Claim[string](ctx, lib, key("lease"), time.Minute, s.Opt)
	require.NoError(t, err)
	require.NotNil(t, lease)
	require.NoError(t, lease.Checkpoint(ctx, lib, "half", map[string]int{"n": 1}))
	require.NoError(t, lease.Extend(ctx, lib))
	inTx(func(tx pgx.Tx) error { return lease.Complete(ctx, tx, "done") })
	check("Claim, Checkpoint, Extend, Complete")

	// Tokens, the inbox, create-once and the state machine.
	token, err := idem.IssueToken(ctx, lib, "session", time.Minute, s.Opt)
	require.NoError(t, err)
	_, err = idem.Do(ctx, lib, idem.Key{Scope: "session", ID: token}, c.fn(key(token)), s.Opt, idem.RequireIssued())
	require.NoError(t, err)
	inTx(func(tx pgx.Tx) error {
		_, err := idem.ConsumeOnce(ctx, tx, "consumer", "m1", func(context.Context, pgx.Tx) error { return nil }, s.InboxOpt)
		return err
	})
	inTx(func(tx pgx.Tx) error {
		var id int64
		_, err := idem.InsertOrGetTx(ctx, tx,
			idem.Query{SQL: `INSERT INTO ` + s.Effects + ` (scope, key, value) VALUES ('c', 'k', 'v') RETURNING id`},
			idem.Query{SQL: `SELECT id FROM ` + s.Effects + ` WHERE scope = 'c' AND key = 'k'`}, &id)
		return err
	})
	m := orderMachine(t, lib, s, "")
	_, err = m.Transition(ctx, lib, newOrder(t, lib, s), "PAID")
	require.NoError(t, err)
	check("IssueToken, ConsumeOnce, InsertOrGetTx, Transition")

	// Purge sets lock_timeout in the implicit transaction of each batch.
	_, err = lib.Exec(ctx, `UPDATE `+s.Records+` SET expires_at = now() - interval '1 hour' WHERE status <> 'processing'`)
	require.NoError(t, err)
	n, err := idem.Purge(ctx, lib, idem.PurgeParams{InboxRetention: time.Nanosecond}, s.Opt, s.InboxOpt)
	require.NoError(t, err)
	require.Positive(t, n)
	check("Purge")

	// What the library sent: nothing that outlives a transaction.
	var localSettings int
	for _, st := range rec.statements() {
		require.Empty(t, sessionStateProblem(st), "the library sent %q", st)
		if setConfigLocal.MatchString(st) {
			localSettings++
		}
	}
	require.Positive(t, localSettings, "the recorder saw the library's local lock_timeout changes")
}
