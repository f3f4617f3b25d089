package integration_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// holdBound is the hold timeout of the tests whose holder hangs. The holder
// hangs until the test lets it go, so the bound only has to be longer than
// the gaps between a healthy holder's own statements on a loaded machine.
const holdBound = 2 * time.Second

// waitBound caps how long a test waits for the server to free a hung
// holder's key: far past holdBound, so that only a missing bound fails it.
const waitBound = time.Minute

// hungHolder is fn for a holder that claims the key, writes its effect, says
// so on claimed, and hangs until wake is closed; then, with query set, it
// runs a statement before answering.
func hungHolder(s *pgtest.Schema, key idem.Key, claimed, wake chan struct{}, query bool) func(context.Context, stx) (string, error) {
	return func(ctx context.Context, tx stx) (string, error) {
		_, err := tx.Exec(ctx, `INSERT INTO `+s.Effects+` (scope, key, value) VALUES ($1, $2, $3)`, key.Scope, key.ID, "holder")
		close(claimed)
		if err != nil {
			return "", err
		}
		<-wake
		if query {
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				return "", err
			}
		}
		return "holder", nil
	}
}

// A holder that hangs with its connection open frees its key within the
// hold timeout: the server ends its transaction, the waiting duplicate runs
// fn once, and the holder gets ErrHoldTimeout when it wakes, whether it then
// answers at once or first runs a statement.
func TestHoldTimeoutFreesAHungHolder(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
	stdlib := openSQLDB(t, "pgx", pgtest.ClientURL(), 8)
	libpq := openSQLDB(t, "postgres", pgtest.ClientURL(), 8)
	cases := []struct {
		name  string
		query bool
		hold  func(key idem.Key, fn func(context.Context, stx) (string, error), opts ...idem.Option) error
		// lostConn: what the holder gets when it wakes is ErrHoldTimeout,
		// except through lib/pq, which drops the server's FATAL and its
		// SQLSTATE: it reports driver.ErrBadConn, or the network error
		// of the statement fn ran on the closed connection.
		lostConn bool
	}{
		{name: "Do", hold: func(key idem.Key, fn func(context.Context, stx) (string, error), opts ...idem.Option) error {
			_, err := envDo(ctx, pool, key, fn, doOpts(opts)...)
			return err
		}},
		{name: "Do/database-sql-stdlib", hold: func(key idem.Key, fn func(context.Context, stx) (string, error), opts ...idem.Option) error {
			_, err := envDo(ctx, stdlib, key, fn, doOpts(opts)...)
			return err
		}},
		{name: "Do/database-sql-libpq", hold: func(key idem.Key, fn func(context.Context, stx) (string, error), opts ...idem.Option) error {
			_, err := envDo(ctx, libpq, key, fn, doOpts(opts)...)
			return err
		}, lostConn: true},
		{name: "WithIdempotency", hold: func(key idem.Key, fn func(context.Context, stx) (string, error), opts ...idem.Option) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			if _, err := envWith(ctx, stx{pgx: tx}, key, fn, opts...); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}},
	}
	for _, tc := range cases {
		for _, query := range []bool{false, true} {
			name := tc.name + "/answers"
			if query {
				name = tc.name + "/queries"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel() // each waits out the bound on a schema of its own
				s := pgtest.NewSchema(t, pool)
				c := &counter{s: s}
				key := idem.Key{Scope: "user-1", ID: t.Name()}
				claimed, wake := make(chan struct{}), make(chan struct{})
				var once sync.Once
				defer once.Do(func() { close(wake) })
				held := make(chan error, 1)
				go func() {
					held <- tc.hold(key, hungHolder(s, key, claimed, wake, query), s.Opt, idem.WithHoldTimeout(holdBound))
				}()
				<-claimed

				// The duplicate waits for the holder, which stays hung
				// throughout: only the server can free the key.
				wctx, cancel := context.WithTimeout(ctx, waitBound)
				defer cancel()
				res, err := idem.Do(wctx, pool, key, c.fn(key), s.Opt)
				require.NoError(t, err)
				require.False(t, res.Replayed)
				require.EqualValues(t, 1, c.runs.Load())

				once.Do(func() { close(wake) })
				err = <-held
				if tc.lostConn {
					var netErr net.Error
					require.True(t, errors.Is(err, driver.ErrBadConn) || errors.As(err, &netErr), "%T %v", err, err)
				} else {
					require.ErrorIs(t, err, idem.ErrHoldTimeout)
				}
				require.NotErrorIs(t, err, idem.ErrOutcomeUnknown)

				require.Equal(t, 1, s.CountEffects(t, pool, key))
				rec := s.ReadRecord(t, pool, key)
				require.NotNil(t, rec)
				require.Equal(t, idem.StatusSucceeded, rec.Status)
				again, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt)
				require.NoError(t, err)
				require.True(t, again.Replayed)
				require.Equal(t, res.Value, again.Value)
			})
		}
	}
}

// Through the middleware: a handler that hangs holding its key is ended by
// the server within Config.HoldTimeout; the client's retry with the same key
// runs the handler once and gets 201, and the hung request answers 503
// (hold-timeout) when its handler wakes.
func TestHTTPHoldTimeout(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	claimed, wake := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(wake) })
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := idemhttp.Tx(r.Context())
		key := idem.Key{Scope: r.Header.Get("X-User"), ID: r.Header.Get(idemhttp.HeaderName)}
		n := runs.Add(1)
		value := fmt.Sprintf("run-%d", n)
		if err := s.AddEffect(r.Context(), tx, key, value); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if n == 1 {
			close(claimed)
			<-wake
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(value))
	})
	srv := newHTTPServer(t, pool, h, idemhttp.Config{Wait: true, HoldTimeout: holdBound, Options: []idem.DoOption{s.Opt}})

	first := make(chan httpReply, 1)
	go func() { first <- post(t, srv.URL, "user-1", "hung", "body") }()
	<-claimed
	retry := post(t, srv.URL, "user-1", "hung", "body")
	require.Equal(t, http.StatusCreated, retry.status)
	require.Equal(t, "run-2", retry.body)
	require.Empty(t, retry.header.Get(idemhttp.ReplayedHeader))

	once.Do(func() { close(wake) })
	hung := <-first
	require.Equal(t, http.StatusServiceUnavailable, hung.status, hung.body)
	require.Contains(t, hung.body, "hold-timeout")
	require.NotEmpty(t, hung.header.Get("Retry-After"))

	again := post(t, srv.URL, "user-1", "hung", "body")
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "run-2", again.body)
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "user-1", ID: "hung"}))
	require.EqualValues(t, 2, runs.Load())
}

// What the handler's transaction runs under: DefaultHoldTimeout when the
// Config leaves HoldTimeout zero, the Config's value, or no bound of the
// middleware's own when it is negative.
func TestHTTPHoldTimeoutSettings(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	var base [2]string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('statement_timeout')").Scan(&base[0], &base[1]))
	for _, tc := range []struct {
		hold time.Duration
		want [2]string
	}{
		{0, [2]string{"1min", "1min"}},
		{1500 * time.Millisecond, [2]string{"1500ms", "1500ms"}},
		{-1, base},
	} {
		var got [2]string
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			err := idemhttp.Tx(r.Context()).QueryRow(r.Context(),
				"SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('statement_timeout')").Scan(&got[0], &got[1])
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		})
		srv := newHTTPServer(t, pool, h, idemhttp.Config{HoldTimeout: tc.hold, Options: []idem.DoOption{s.Opt}})
		r := post(t, srv.URL, "user-1", fmt.Sprint("settings-", tc.hold), "")
		require.Equal(t, http.StatusNoContent, r.status, r.body)
		require.Equal(t, tc.want, got, "HoldTimeout %v", tc.hold)
	}
}

// The bound is the transaction's alone. WithIdempotency puts the caller's
// values back before it returns, on every path; a value lower than the bound
// is kept while fn runs; Do leaves nothing on the connection it used.
func TestHoldTimeoutSettings(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	s := pgtest.NewSchema(t, pool)
	read := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) [2]string {
		var v [2]string
		require.NoError(t, q.QueryRow(ctx, "SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('statement_timeout')").Scan(&v[0], &v[1]))
		return v
	}
	base := read(pool)
	bound := idem.WithHoldTimeout(30 * time.Second)
	permanent := errors.New("sold out")
	fns := map[string]struct {
		err error
		fn  func(*[2]string) func(context.Context, pgx.Tx) (string, error)
	}{
		"succeeds": {nil, func(in *[2]string) func(context.Context, pgx.Tx) (string, error) {
			return func(ctx context.Context, tx pgx.Tx) (string, error) { *in = read(tx); return "ok", nil }
		}},
		"fails": {permanent, func(in *[2]string) func(context.Context, pgx.Tx) (string, error) {
			return func(ctx context.Context, tx pgx.Tx) (string, error) { *in = read(tx); return "", permanent }
		}},
		"fails permanently": {permanent, func(in *[2]string) func(context.Context, pgx.Tx) (string, error) {
			return func(ctx context.Context, tx pgx.Tx) (string, error) {
				*in = read(tx)
				return "", idem.Permanent(permanent)
			}
		}},
	}
	for name, f := range fns {
		for _, caller := range [][2]string{{"0", "0"}, {"10s", "5min"}} {
			t.Run(name+"/"+caller[0]+","+caller[1], func(t *testing.T) {
				want := [2]string{"30s", "30s"}
				if caller[0] == "10s" {
					want[0] = "10s" // lower than the bound: kept
				}
				key := idem.Key{Scope: "user-1", ID: t.Name()}
				for round := range 2 { // then a replay, or a second run
					tx, err := pool.Begin(ctx)
					require.NoError(t, err)
					defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
					_, err = tx.Exec(ctx, "SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('statement_timeout', $2, true)", caller[0], caller[1])
					require.NoError(t, err)
					var in [2]string
					_, err = idem.WithIdempotency(ctx, tx, key, f.fn(&in), s.Opt, bound)
					if round == 1 && idem.IsPermanent(err) {
						require.EqualError(t, err, f.err.Error()) // replayed from the record
					} else {
						require.ErrorIs(t, err, f.err)
					}
					if round == 0 || f.err != nil && !idem.IsPermanent(err) {
						require.Equal(t, want, in, "while fn ran")
					}
					require.Equal(t, caller, read(tx), "after WithIdempotency returned")
					require.NoError(t, tx.Commit(ctx))
				}
				require.Equal(t, base, read(pool), "after the transaction")
			})
		}
	}

	var in [2]string
	_, err := idem.Do(ctx, pool, idem.Key{Scope: "user-1", ID: "do"}, fns["succeeds"].fn(&in), s.Opt, bound)
	require.NoError(t, err)
	require.Equal(t, [2]string{"30s", "30s"}, in)
	require.Equal(t, base, read(pool), "after Do, on the same connection")

	_, err = idem.Do(ctx, pool, idem.Key{Scope: "user-1", ID: "bad"}, fns["succeeds"].fn(&in), idem.WithHoldTimeout(0))
	require.ErrorIs(t, err, idem.ErrInvalidOption)
}

// takeoverTracer runs hook once, just before the first batch that carries
// the takeover of an expired record (an UPDATE ... RETURNING attempt).
type takeoverTracer struct {
	once sync.Once
	hook func()
}

func (tr *takeoverTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (tr *takeoverTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (tr *takeoverTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		if strings.HasPrefix(q.SQL, "UPDATE") && strings.Contains(q.SQL, "RETURNING attempt") {
			tr.once.Do(tr.hook)
		}
	}
	return ctx
}
func (tr *takeoverTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (tr *takeoverTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// The bound covers the holder, never a wait for another holder: a Do with a
// hold timeout that finds an expired record, and meets another execution
// that took it over first and runs for longer than the bound, waits for it
// and replays its result.
func TestHoldTimeoutDoesNotBoundTheWait(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	key := idem.Key{Scope: "user-1", ID: "expired"}
	_, err := idem.Do(ctx, pool, key, func(context.Context, pgx.Tx) (string, error) { return "old", nil }, s.Opt)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+s.Records+` SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)

	// Just before the waiter's takeover, another execution (no bound of its
	// own) takes the record over and holds it until the waiter has waited
	// for it, by the database clock, twice the waiter's bound.
	const bound = 500 * time.Millisecond
	release := make(chan struct{})
	holder := make(chan error, 1)
	hooked := false
	tr := &takeoverTracer{hook: func() {
		hooked = true
		claimed := make(chan struct{})
		go func() {
			_, err := idem.Do(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
				close(claimed)
				<-release
				return "holder", nil
			}, s.Opt)
			holder <- err
		}()
		<-claimed
	}}
	conn := pgtest.Conn(t, func(c *pgx.ConnConfig) {
		c.Tracer = tr
		c.RuntimeParams["application_name"] = "idem-hold-waiter"
	})
	waiter := make(chan error, 1)
	var res idem.Result[string]
	go func() {
		var err error
		res, err = idem.Do(ctx, conn, key, func(context.Context, pgx.Tx) (string, error) { return "waiter", nil },
			s.Opt, idem.WithHoldTimeout(bound))
		waiter <- err
	}()
	waitErr := awaitBackend(ctx, pgtest.Direct(t), fmt.Sprintf(`application_name = 'idem-hold-waiter'
		AND wait_event_type = 'Lock' AND clock_timestamp() - query_start > interval '%d ms'`, 2*bound.Milliseconds()), "")
	close(release)
	waiterErr := <-waiter
	require.True(t, hooked, "the waiter never tried to take the record over")
	require.NoError(t, <-holder)
	require.NoError(t, waiterErr, "the waiter held nothing, yet was bounded")
	require.NoError(t, waitErr)
	require.True(t, res.Replayed)
	require.Equal(t, "holder", res.Value)
}

// Do's own claim puts the connection's lock_timeout back (NoWait) and
// applies the hold timeout in the claim statement itself: fn sees the
// session's lock_timeout and the bound, on a first claim, on a takeover of
// an expired record and with a token, and the connection keeps its own
// values afterwards.
func TestDoClaimSettings(t *testing.T) {
	ctx := context.Background()
	pgtest.SkipViaPgBouncer(t, "lock_timeout is a startup parameter here, which PgBouncer does not pass on")
	pool := pgtest.Pool(t, func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ConnConfig.RuntimeParams["lock_timeout"] = "7s"
	})
	s := pgtest.NewSchema(t, pool)
	type settings struct{ lock, statement, idle string }
	read := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) settings {
		var v settings
		require.NoError(t, q.QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),
			current_setting('idle_in_transaction_session_timeout')`).Scan(&v.lock, &v.statement, &v.idle))
		return v
	}
	base := read(pool)
	require.Equal(t, "7s", base.lock)
	for _, tc := range []struct {
		name string
		opts []idem.DoOption
		want settings
	}{
		{"NoWait", []idem.DoOption{idem.NoWait()}, base},
		{"WithHoldTimeout", []idem.DoOption{idem.WithHoldTimeout(3 * time.Second)}, settings{"7s", "3s", "3s"}},
		{"NoWait and WithHoldTimeout", []idem.DoOption{idem.NoWait(), idem.WithHoldTimeout(3 * time.Second)}, settings{"7s", "3s", "3s"}},
		{"NoWait, WithHoldTimeout and RequireIssued", []idem.DoOption{idem.NoWait(), idem.WithHoldTimeout(3 * time.Second), idem.RequireIssued()}, settings{"7s", "3s", "3s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := idem.Key{Scope: "s", ID: strings.ReplaceAll(tc.name, " ", "-")}
			if strings.Contains(tc.name, "RequireIssued") {
				token, err := idem.IssueToken(ctx, pool, key.Scope, time.Hour, s.Opt)
				require.NoError(t, err)
				key.ID = token
			}
			opts := append([]idem.DoOption{s.Opt}, tc.opts...)
			var in settings
			fn := func(ctx context.Context, tx pgx.Tx) (int, error) { in = read(tx); return 1, nil }
			res, err := idem.Do(ctx, pool, key, fn, opts...)
			require.NoError(t, err)
			require.False(t, res.Replayed)
			require.Equal(t, tc.want, in, "inside fn, first claim")
			require.Equal(t, base, read(pool), "the connection afterwards")

			// A takeover of the expired record goes by another statement.
			expireRecord(t, pool, s, key)
			in = settings{}
			res, err = idem.Do(ctx, pool, key, fn, opts...)
			if strings.Contains(tc.name, "RequireIssued") {
				// An expired token is refused, not taken over.
				require.ErrorIs(t, err, idem.ErrTokenExpired)
				return
			}
			require.NoError(t, err)
			require.False(t, res.Replayed)
			require.Equal(t, tc.want, in, "inside fn, takeover")
			require.Equal(t, base, read(pool), "the connection afterwards")
		})
	}
}
