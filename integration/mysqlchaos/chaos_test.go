//go:build chaos

package mysqlchaos_test

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/internal/cutproxy"
)

var (
	duration = flag.Duration("chaos.duration", 20*time.Second, "how long workers send new requests")
	restart  = flag.Bool("chaos.restart", true, "restart the test's MariaDB (SIGTERM, then SIGKILL) during the soak")
	perPath  = flag.Int("chaos.workers", 2, "workers per path (Do and WithIdempotency with prepared and interpolated statements, ConsumeOnce); the hot-key paths have two more")
)

// TestMain silences go-sql-driver's log of the connections the soak
// breaks (hundreds of "unexpected EOF" and "invalid connection" lines); the
// same errors reach the workers, which count them by kind.
func TestMain(m *testing.M) {
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	os.Exit(m.Run())
}

// settleBudget bounds how long one request may retry before the client gives
// up on it; a restart takes a few seconds.
const settleBudget = 60 * time.Second

// workerUser is the MariaDB account the workers connect as, through the
// proxy; the chaos loop kills its connections and no others.
const workerUser = "soak"

// answer is what an acknowledged attempt was told.
type answer struct {
	value    string // fn's value; "" for ConsumeOnce, which records none
	replayed bool   // a replay, or a redelivery that did not run fn
}

// path is one way a client reaches idemmysql. try makes one attempt for
// key; fn's runs note the values they write in runs. The path's workers
// pick keys among its last window keys (or a new one).
type path struct {
	name    string
	try     func(ctx context.Context, key idem.Key, runs *runLog) (answer, error)
	window  int
	workers int
}

// runLog holds the values fn wrote during one attempt, committed or not.
type runLog struct {
	mu     sync.Mutex
	values []string
}

func (r *runLog) add(v string) {
	r.mu.Lock()
	r.values = append(r.values, v)
	r.mu.Unlock()
}

// errAmbiguous marks a failed COMMIT the client issued itself (the
// WithIdempotency and ConsumeOnce paths): it may have committed.
var errAmbiguous = errors.New("commit outcome unknown")

// outcome sorts an attempt's error for the report. Only "ambiguous" may
// have committed.
func outcome(err error) string {
	var me *mysql.MySQLError
	switch {
	case errors.Is(err, idem.ErrOutcomeUnknown), errors.Is(err, errAmbiguous):
		return "ambiguous"
	case errors.Is(err, idem.ErrInProgress):
		return "in progress"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	case errors.As(err, new(*idemmysql.TxAbortedError)), idem.IsRetryable(err):
		return "rolled back by the server (TxAbortedError)"
	case errors.As(err, &me):
		return fmt.Sprintf("server error %d", me.Number)
	default:
		return "connection"
	}
}

// ref names a key in the ledger (idem.Key is not comparable).
type ref struct{ scope, id string }

func refOf(k idem.Key) ref { return ref{k.Scope, k.ID} }

func (r ref) String() string { return r.scope + "/" + r.id }

// ledger is what the clients were told.
type ledger struct {
	mu        sync.Mutex
	requested map[ref]bool
	acked     map[ref]string
	conflicts []string // a key acknowledged with two different values
	gaveUp    []ref
	ambiguous int               // ambiguous answers
	settled   int               // ambiguous answers followed by an acknowledgement
	failed    map[string]ref    // values fn wrote in attempts that failed with a definite error
	attempts  map[string]int    // per path and outcome
	samples   map[string]string // the first error of each outcome
}

func (l *ledger) attempt(p, result string) {
	l.mu.Lock()
	l.attempts[p+"\t"+result]++
	l.mu.Unlock()
}

// failure counts a failed attempt and keeps the first error of its kind
// for each call (Do, WithIdempotency, ConsumeOnce).
func (l *ledger) failure(p, result string, err error) {
	call, _, _ := strings.Cut(p, "/")
	l.mu.Lock()
	l.attempts[p+"\t"+result]++
	if _, ok := l.samples[call+"\t"+result]; !ok {
		l.samples[call+"\t"+result] = err.Error()
	}
	l.mu.Unlock()
}

func (l *ledger) ack(key idem.Key, value string, ambiguous int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := refOf(key)
	if prev, ok := l.acked[k]; ok && prev != value {
		l.conflicts = append(l.conflicts, fmt.Sprintf("%s: acknowledged %q, then %q", k, prev, value))
	}
	if _, ok := l.acked[k]; !ok {
		l.acked[k] = value
	}
	l.settled += ambiguous
}

// fail notes the values of an attempt that failed with an error that says
// nothing committed: none of them may be in the effects table.
func (l *ledger) fail(key idem.Key, runs *runLog) {
	runs.mu.Lock()
	defer runs.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range runs.values {
		l.failed[v] = refOf(key)
	}
}

// inflight holds the cancel functions of the attempts running now, for the
// chaos loop to pick from.
type inflight struct {
	mu   sync.Mutex
	next int
	m    map[int]context.CancelFunc
}

func (f *inflight) add(c context.CancelFunc) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	f.m[f.next] = c
	return f.next
}

func (f *inflight) done(id int) {
	f.mu.Lock()
	delete(f.m, id)
	f.mu.Unlock()
}

func (f *inflight) cancelSome(n int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	cancelled := 0
	for id, c := range f.m { // map order is random enough
		if cancelled == n {
			break
		}
		c()
		delete(f.m, id)
		cancelled++
	}
	return cancelled
}

func newValue() string { return fmt.Sprintf("%016x", rand.Uint64()) }

// addEffect is fn's business write: one row in a table without a unique
// key, so that a second effect of a key shows.
func addEffect(ctx context.Context, tx *sql.Tx, key idem.Key, runs *runLog) (string, error) {
	v := newValue()
	runs.add(v)
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (scope, k, v) VALUES (?, ?, ?)`, key.Scope, key.ID, v)
	return v, err
}

func TestChaosSoak(t *testing.T) {
	m := startMariaDB(t)
	direct := setUp(t, m)

	// The workers go through a proxy that can cut a connection at COMMIT;
	// half the cuts forward the COMMIT first (it commits), half do not (it
	// rolls back), and the client cannot tell which.
	proxy, err := cutproxy.NewMySQL(m.addr())
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	proxy.SetDropRate(0.5)
	// idemmysql's own statements are prepared statements of the pool;
	// with interpolateParams the driver sends every statement as text.
	prepared := workerDB(t, proxy.Addr(), false, 3**perPath+2*hotWorkers()+2)
	interpolated := workerDB(t, proxy.Addr(), true, 2**perPath+2)

	doPath := func(db *sql.DB) func(context.Context, idem.Key, *runLog) (answer, error) {
		return func(ctx context.Context, key idem.Key, runs *runLog) (answer, error) {
			res, err := idemmysql.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (string, error) {
				return addEffect(ctx, tx, key, runs)
			})
			return answer{res.Value, res.Replayed}, err
		}
	}
	withIdempotencyPath := func(db *sql.DB) func(context.Context, idem.Key, *runLog) (answer, error) {
		return func(ctx context.Context, key idem.Key, runs *runLog) (answer, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return answer{}, err
			}
			defer tx.Rollback() //nolint:errcheck
			res, err := idemmysql.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx *sql.Tx) (string, error) {
				return addEffect(ctx, tx, key, runs)
			})
			if err != nil {
				return answer{}, err
			}
			if err := tx.Commit(); err != nil {
				return answer{}, fmt.Errorf("%w: %w", errAmbiguous, err)
			}
			return answer{res.Value, res.Replayed}, nil
		}
	}
	paths := []path{
		{"Do", doPath(prepared), 40, *perPath},
		{"WithIdempotency", withIdempotencyPath(prepared), 40, *perPath},
		{"Do/interpolated", doPath(interpolated), 40, *perPath},
		{"WithIdempotency/interpolated", withIdempotencyPath(interpolated), 40, *perPath},
		// Hot keys: several workers on the same few keys, so that a COMMIT
		// cut before forwarding rolls back a first execution with
		// duplicates queued behind its row lock, which InnoDB then ends
		// with deadlocks (Do retries them; WithIdempotency returns
		// *idemmysql.TxAbortedError and the client retries).
		{"Do/hot", doPath(prepared), 3, hotWorkers()},
		{"WithIdempotency/hot", withIdempotencyPath(prepared), 3, hotWorkers()},
		// A queue consumer: the key's ID is the message's, redelivered
		// until a delivery is acknowledged.
		{"ConsumeOnce", func(ctx context.Context, key idem.Key, runs *runLog) (answer, error) {
			tx, err := prepared.BeginTx(ctx, nil)
			if err != nil {
				return answer{}, err
			}
			defer tx.Rollback() //nolint:errcheck
			ran, err := idemmysql.ConsumeOnce(ctx, tx, "soak", key.ID, func(ctx context.Context, tx *sql.Tx) error {
				_, err := addEffect(ctx, tx, key, runs)
				return err
			})
			if err != nil {
				return answer{}, err
			}
			if err := tx.Commit(); err != nil {
				return answer{}, fmt.Errorf("%w: %w", errAmbiguous, err)
			}
			return answer{replayed: !ran}, nil
		}, 40, *perPath},
	}

	book := &ledger{requested: map[ref]bool{}, acked: map[ref]string{}, failed: map[string]ref{}, attempts: map[string]int{}, samples: map[string]string{}}
	running := &inflight{m: map[int]context.CancelFunc{}}
	stop := time.Now().Add(*duration)

	var wg sync.WaitGroup
	for _, p := range paths {
		var issued atomic.Int64
		for range p.workers {
			wg.Go(func() {
				for time.Now().Before(stop) {
					key := pickKey(p.name, p.window, &issued)
					book.mu.Lock()
					book.requested[refOf(key)] = true
					book.mu.Unlock()
					request(p, key, book, running)
				}
			})
		}
	}

	stats := chaosLoop(t, m, direct, proxy, running, stop)
	wg.Wait()
	proxy.SetCutRate(0)
	stats.deadlocks += deadlocks(direct)

	report := check(t, direct, book)
	t.Logf("server: %s, started by the test in %s; workers per path: %d; duration: %v", m.version, m.dir, *perPath, *duration)
	t.Logf("chaos: %s; the proxy cut %d connections at COMMIT, %d of them after forwarding it, %d before",
		stats, proxy.Cuts(), proxy.Cuts()-proxy.Drops(), proxy.Drops())
	t.Logf("attempts by path and outcome:\n%s", attemptsTable(book))
	t.Logf("the first error of each kind:\n%s", samplesTable(book))
	t.Logf("checker:\n%s", report.String())
	require.Empty(t, report.lost, "lost acknowledged writes")
	require.Empty(t, report.duplicates, "duplicate effects")
	require.Empty(t, report.unexpected, "unexpected effects")
	require.Empty(t, report.misreported, "effects of attempts that failed with an error saying nothing committed")
	require.Empty(t, book.conflicts, "a key acknowledged with two values")
	require.Empty(t, book.gaveUp, "requests never settled within %s", settleBudget)
	require.Equal(t, report.ambiguous, report.settled, "every ambiguous answer settled by a retry with the same key")
	require.NotZero(t, report.acked, "requests acknowledged")
	require.NotZero(t, stats.killed, "the chaos loop killed connections")
	require.NotZero(t, stats.cancelled, "the chaos loop cancelled contexts")
	require.NotZero(t, proxy.Cuts()-proxy.Drops(), "the proxy cut connections after forwarding COMMIT")
	require.NotZero(t, proxy.Drops(), "the proxy cut connections instead of forwarding COMMIT")
	if *restart {
		require.Equal(t, 2, stats.restarts, "MariaDB restarted after SIGTERM and after SIGKILL")
	}
}

// setUp creates the soak's database, idem's tables, the effects table and
// the workers' account, and returns a root pool on that database that
// reaches the server directly.
func setUp(t *testing.T, m *mariadb) *sql.DB {
	ctx := context.Background()
	root := m.rootDB("")
	defer root.Close()
	for _, stmt := range []string{
		`CREATE DATABASE soak`,
		`CREATE USER '` + workerUser + `'@'127.0.0.1'`,
		`GRANT ALL ON soak.* TO '` + workerUser + `'@'127.0.0.1'`,
	} {
		_, err := root.ExecContext(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	direct := m.rootDB("soak")
	t.Cleanup(func() { direct.Close() })
	require.NoError(t, idemmysql.Migrate(ctx, direct))
	// The business table: no unique key on (scope, k).
	_, err := direct.ExecContext(ctx, `CREATE TABLE effects (
		id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
		scope VARBINARY(255) NOT NULL, k VARBINARY(255) NOT NULL, v VARCHAR(32) NOT NULL) ENGINE = InnoDB`)
	require.NoError(t, err)
	return direct
}

// workerDB opens a pool of the workers' account on the soak's database
// through the proxy at addr.
func workerDB(t *testing.T, addr string, interpolate bool, conns int) *sql.DB {
	cfg := mysql.NewConfig()
	cfg.User = workerUser
	cfg.Net = "tcp"
	cfg.Addr = addr
	cfg.DBName = "soak"
	cfg.Timeout = 5 * time.Second
	cfg.InterpolateParams = interpolate
	c, err := mysql.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	t.Cleanup(func() { db.Close() })
	return db
}

// hotWorkers is the number of workers of each hot-key path.
func hotWorkers() int { return *perPath + 2 }

// pickKey returns a new key about a third of the time and otherwise one of
// the path's last window keys, so most requests repeat a key, some
// concurrently.
func pickKey(scope string, window int, issued *atomic.Int64) idem.Key {
	n := issued.Load()
	if n == 0 || rand.IntN(3) == 0 {
		n = issued.Add(1)
		return idem.Key{Scope: scope, ID: fmt.Sprintf("k%d", n)}
	}
	lo := max(1, n-int64(window-1))
	return idem.Key{Scope: scope, ID: fmt.Sprintf("k%d", lo+rand.Int64N(n-lo+1))}
}

// request sends one client request and retries it with the same key until
// it is acknowledged or settleBudget runs out.
func request(p path, key idem.Key, book *ledger, running *inflight) {
	deadline := time.Now().Add(settleBudget)
	ambiguous := 0
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		id := running.add(cancel)
		runs := &runLog{}
		a, err := p.try(actx, key, runs)
		running.done(id)
		cancel()
		if err == nil {
			if a.replayed {
				book.attempt(p.name, "acknowledged, replayed")
			} else {
				book.attempt(p.name, "acknowledged, ran")
			}
			book.ack(key, a.value, ambiguous)
			return
		}
		class := outcome(err)
		book.failure(p.name, class, err)
		if class == "ambiguous" {
			ambiguous++
			book.mu.Lock()
			book.ambiguous++
			book.mu.Unlock()
		} else {
			book.fail(key, runs)
		}
		// Full jitter, growing to half a second.
		time.Sleep(time.Duration(rand.Int64N(int64(min(500*time.Millisecond, 10*time.Millisecond<<min(attempt, 6))) + 1)))
	}
	book.mu.Lock()
	book.gaveUp = append(book.gaveUp, refOf(key))
	book.mu.Unlock()
}

type chaosStats struct {
	killed, cancelled, cutWindows, restarts int
	downtime                                []string
	// deadlocks is the server's Innodb_deadlocks, summed over its runs
	// (the counter starts from 0 at each start), each read just before the
	// server stops.
	deadlocks int
}

func (s chaosStats) String() string {
	return fmt.Sprintf("%d connections killed, %d contexts cancelled, %d COMMIT-cutting windows, %d restarts (%s); the server dealt %d deadlocks",
		s.killed, s.cancelled, s.cutWindows, s.restarts, strings.Join(s.downtime, ", "), s.deadlocks)
}

// deadlocks is the server's count of deadlocks since it started, or 0 when
// it does not answer.
func deadlocks(db *sql.DB) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var name string
	var n int
	if err := db.QueryRowContext(ctx, `SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'`).Scan(&name, &n); err != nil {
		return 0
	}
	return n
}

// chaosLoop disturbs the workers until stop: every few hundred
// milliseconds it kills connections of the workers' account (KILL from a
// connection straight to the server), cancels attempts, or opens a window
// in which the proxy cuts a third of the COMMITs (half of them before the
// COMMIT reaches the server); at a third and two thirds of the run it
// restarts MariaDB, stopped with SIGTERM and then with SIGKILL.
func chaosLoop(t *testing.T, m *mariadb, direct *sql.DB, proxy *cutproxy.Proxy, running *inflight, stop time.Time) chaosStats {
	var st chaosStats
	total := time.Until(stop)
	restarts := []struct {
		at   time.Time
		sig  syscall.Signal
		name string
	}{{stop.Add(-total * 2 / 3), syscall.SIGTERM, "SIGTERM"}, {stop.Add(-total / 3), syscall.SIGKILL, "SIGKILL"}}
	if !*restart {
		t.Log("-chaos.restart=false: MariaDB is not restarted")
		restarts = nil
	}
	for time.Now().Before(stop) {
		time.Sleep(time.Duration(150+rand.IntN(350)) * time.Millisecond)
		if len(restarts) > 0 && time.Now().After(restarts[0].at) {
			st.deadlocks += deadlocks(direct)
			d := m.restart(restarts[0].sig)
			st.downtime = append(st.downtime, fmt.Sprintf("%s: back after %v", restarts[0].name, d.Round(time.Millisecond)))
			st.restarts++
			restarts = restarts[1:]
			continue
		}
		switch rand.IntN(3) {
		case 0:
			st.killed += killSome(direct, 1+rand.IntN(2))
		case 1:
			st.cancelled += running.cancelSome(1 + rand.IntN(3))
		case 2:
			st.cutWindows++
			proxy.SetCutRate(0.3)
			time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
			proxy.SetCutRate(0)
		}
	}
	return st
}

// killSome kills up to n connections of the workers' account, picked at
// random, and returns how many it killed.
func killSome(db *sql.DB, n int) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, `SELECT id FROM information_schema.PROCESSLIST WHERE user = ? ORDER BY RAND() LIMIT ?`, workerUser, n)
	if err != nil {
		return 0
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if rows.Scan(&id) == nil {
			ids = append(ids, id)
		}
	}
	rows.Close()
	killed := 0
	for _, id := range ids {
		// Gone already (unknown thread, 1094) is not counted.
		if _, err := db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err == nil {
			killed++
		}
	}
	return killed
}

type report struct {
	keys, effects, acked                      int
	lost, duplicates, unexpected, misreported []string
	ambiguous, settled, requestedNotAcked     int
}

func (r report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  keys requested: %d, acknowledged: %d, effect rows: %d\n", r.keys, r.acked, r.effects)
	fmt.Fprintf(&b, "  lost acknowledged writes: %d %v\n", len(r.lost), r.lost)
	fmt.Fprintf(&b, "  duplicate effects: %d %v\n", len(r.duplicates), r.duplicates)
	fmt.Fprintf(&b, "  unexpected effects: %d %v\n", len(r.unexpected), r.unexpected)
	fmt.Fprintf(&b, "  effects of attempts that failed with an error saying nothing committed: %d %v\n", len(r.misreported), r.misreported)
	fmt.Fprintf(&b, "  ambiguous answers (ErrOutcomeUnknown, a failed COMMIT of the caller's): %d, settled by a retry with the same key: %d\n", r.ambiguous, r.settled)
	fmt.Fprintf(&b, "  keys requested but never acknowledged: %d", r.requestedNotAcked)
	return b.String()
}

// check compares the effects table with what the clients were told.
func check(t *testing.T, db *sql.DB, book *ledger) report {
	type effect struct {
		n      int
		values []string
	}
	effects := map[ref]*effect{}
	rows, err := db.Query(`SELECT scope, k, v FROM effects ORDER BY id`)
	require.NoError(t, err)
	var total int
	for rows.Next() {
		var k ref
		var v string
		require.NoError(t, rows.Scan(&k.scope, &k.id, &v))
		e := effects[k]
		if e == nil {
			e = &effect{}
			effects[k] = e
		}
		e.n++
		e.values = append(e.values, v)
		total++
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())

	book.mu.Lock()
	defer book.mu.Unlock()
	r := report{keys: len(book.requested), acked: len(book.acked), effects: total, ambiguous: book.ambiguous, settled: book.settled}
	for k, e := range effects {
		switch {
		case !book.requested[k]:
			r.unexpected = append(r.unexpected, k.String()+" (never requested)")
		case e.n > 1:
			r.duplicates = append(r.duplicates, fmt.Sprintf("%s x%d", k.String(), e.n))
		case book.acked[k] != "" && book.acked[k] != e.values[0]:
			r.unexpected = append(r.unexpected, fmt.Sprintf("%s (effect %q, acknowledged %q)", k.String(), e.values[0], book.acked[k]))
		}
		for _, v := range e.values {
			if fk, ok := book.failed[v]; ok {
				r.misreported = append(r.misreported, fmt.Sprintf("%s (value %q)", fk, v))
			}
		}
	}
	for k := range book.acked {
		if _, ok := effects[k]; !ok {
			r.lost = append(r.lost, k.String())
		}
	}
	for k := range book.requested {
		if _, ok := book.acked[k]; !ok {
			r.requestedNotAcked++
		}
	}
	for _, l := range [][]string{r.lost, r.duplicates, r.unexpected, r.misreported} {
		slices.Sort(l)
	}
	return r
}

func attemptsTable(book *ledger) string {
	book.mu.Lock()
	defer book.mu.Unlock()
	lines := make([]string, 0, len(book.attempts))
	for k, n := range book.attempts {
		lines = append(lines, fmt.Sprintf("  %-66s %6d", strings.Replace(k, "\t", ": ", 1), n))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func samplesTable(book *ledger) string {
	book.mu.Lock()
	defer book.mu.Unlock()
	lines := make([]string, 0, len(book.samples))
	for class, msg := range book.samples {
		lines = append(lines, fmt.Sprintf("  %s: %s", strings.Replace(class, "\t", ", ", 1), msg))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
