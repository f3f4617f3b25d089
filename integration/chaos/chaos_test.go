//go:build chaos

package chaos_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"slices"
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
	"github.com/idemkit/idem/internal/cutproxy"
)

var (
	duration = flag.Duration("chaos.duration", 60*time.Second, "how long workers send new requests")
	restart  = flag.Bool("chaos.restart", true, "restart the local PostgreSQL cluster (fast, then immediate) during the soak")
	perPath  = flag.Int("chaos.workers", 2, "workers per path (Do and WithIdempotency in two query modes, lease, HTTP)")
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// settleBudget bounds how long one request may retry before the client gives
// up on it; a restart takes a few seconds, a lost lease two.
const settleBudget = 60 * time.Second

const leaseDuration = 2 * time.Second

// path is one way a client reaches idem. try makes one attempt for key and
// returns the acknowledged value, or an error after which the client retries
// with the same key; ambiguous reports an error after which the client cannot
// know whether the attempt committed.
type path struct {
	name string
	try  func(ctx context.Context, key idem.Key) (value string, err error)
}

// outcome sorts an attempt's error for the report.
func outcome(err error) string {
	var pe interface{ SQLState() string }
	switch {
	case errors.Is(err, idem.ErrOutcomeUnknown), errors.Is(err, errAmbiguous):
		return "ambiguous"
	case errors.Is(err, idem.ErrInProgress):
		return "in progress"
	case errors.Is(err, idem.ErrLeaseLost):
		return "lease lost"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	case idem.IsRetryable(err):
		return "40001/40P01"
	case errors.As(err, &pe):
		return "sqlstate " + pe.SQLState()
	default:
		return "connection"
	}
}

// errAmbiguous marks a failed COMMIT issued by the client itself (the
// WithIdempotency and lease paths), or an HTTP 503 outcome-unknown answer.
var errAmbiguous = errors.New("commit outcome unknown")

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
	settled   int            // ambiguous answers followed by an acknowledgement
	attempts  map[string]int // per path and outcome
}

func (l *ledger) attempt(p, result string) { l.count(p, result, 1) }

func (l *ledger) count(p, result string, n int) {
	l.mu.Lock()
	l.attempts[p+"\t"+result] += n
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

func TestChaosSoak(t *testing.T) {
	ctx := context.Background()
	// The checker and the chaos loop talk to PostgreSQL directly.
	direct := pgtest.Pool(t, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["application_name"] = "idem-chaos-checker"
	})
	s := pgtest.NewSchema(t, direct)
	cluster := localCluster(t, direct)

	// The workers go through a proxy that can cut a connection at COMMIT.
	proxy, err := cutproxy.New(pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	// Half the cuts drop the COMMIT (the transaction rolls back), half
	// forward it first (it commits): a client that took an unclear answer
	// for a commit would lose writes, one that took it for a rollback and
	// wrote again elsewhere would duplicate them.
	proxy.SetDropRate(0.5)
	cfg, err := pgxpool.ParseConfig(proxy.URL())
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.ConnConfig.RuntimeParams["application_name"] = "idem-chaos-worker"
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	cfg.MaxConns = int32(4**perPath + 2)
	workers, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(workers.Close)
	// A second pool in pgx's default mode (named prepared statements),
	// whose COMMITs the proxy recognises by the statements' names.
	pcfg := cfg.Copy()
	pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	pcfg.MaxConns = int32(2**perPath + 2)
	prepared, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(prepared.Close)

	addEffect := func(ctx context.Context, tx pgx.Tx, key idem.Key) (string, error) {
		v := newValue()
		return v, s.AddEffect(ctx, tx, key, v)
	}

	server := httpServer(t, workers, s.Opt, addEffect)
	// The Transport retries a 503 outcome-unknown itself; count them below it.
	client := &http.Client{Transport: &idemhttp.Transport{
		Base:        countingTransport{},
		MaxAttempts: 3, MaxElapsed: 5 * time.Second, BaseDelay: 20 * time.Millisecond, MaxDelay: 500 * time.Millisecond,
	}}

	doPath := func(db *pgxpool.Pool) func(context.Context, idem.Key) (string, error) {
		return func(ctx context.Context, key idem.Key) (string, error) {
			res, err := idem.Do(ctx, db, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
				return addEffect(ctx, tx, key)
			}, s.Opt)
			return res.Value, err
		}
	}
	withIdempotencyPath := func(db *pgxpool.Pool) func(context.Context, idem.Key) (string, error) {
		return func(ctx context.Context, key idem.Key) (string, error) {
			tx, err := db.Begin(ctx)
			if err != nil {
				return "", err
			}
			defer tx.Rollback(context.Background()) //nolint:errcheck
			res, err := idem.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
				return addEffect(ctx, tx, key)
			}, s.Opt)
			if err != nil {
				return "", err
			}
			if err := tx.Commit(ctx); err != nil {
				return "", fmt.Errorf("%w: %w", errAmbiguous, err)
			}
			return res.Value, nil
		}
	}
	paths := []path{
		{"Do", doPath(workers)},
		{"WithIdempotency", withIdempotencyPath(workers)},
		// The same in pgx's default mode, where idem's statements go below
		// pgx.Batch as prepared statements.
		{"Do/prepared", doPath(prepared)},
		{"WithIdempotency/prepared", withIdempotencyPath(prepared)},
		{"lease", func(ctx context.Context, key idem.Key) (string, error) {
			lease, res, err := idem.Claim[string](ctx, workers, key, leaseDuration, s.Opt)
			if err != nil {
				return "", err
			}
			if lease == nil {
				return res.Value, nil
			}
			v, err := completeLease(ctx, workers, lease, addEffect)
			if err != nil && !errors.Is(err, errAmbiguous) {
				// A known failure: give the key up so the retry need
				// not wait for the lease to run out.
				rctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_ = lease.Release(rctx, workers)
				cancel()
			}
			return v, err
		}},
		{"HTTP", func(ctx context.Context, key idem.Key) (string, error) {
			return postHTTP(ctx, client, server.URL, key)
		}},
	}

	book := &ledger{requested: map[ref]bool{}, acked: map[ref]string{}, attempts: map[string]int{}}
	running := &inflight{m: map[int]context.CancelFunc{}}
	stop := time.Now().Add(*duration)

	var wg sync.WaitGroup
	for _, p := range paths {
		var issued atomic.Int64
		for range *perPath {
			wg.Go(func() {
				for time.Now().Before(stop) {
					key := pickKey(p.name, &issued)
					book.mu.Lock()
					book.requested[refOf(key)] = true
					book.mu.Unlock()
					request(p, key, book, running)
				}
			})
		}
	}

	stats := chaosLoop(t, direct, proxy, running, cluster, stop)
	wg.Wait()
	proxy.SetCutRate(0)

	report := check(t, direct, s, book)
	t.Logf("chaos: %s; the proxy cut %d connections at COMMIT, %d of them before forwarding it", stats, proxy.Cuts(), proxy.Drops())
	t.Logf("attempts by path and outcome:\n%s", attemptsTable(book))
	t.Logf("checker:\n%s", report.String())
	require.Empty(t, report.lost, "lost acknowledged writes")
	require.Empty(t, report.duplicates, "duplicate effects")
	require.Empty(t, report.unexpected, "unexpected effects")
	require.Empty(t, book.conflicts, "a key acknowledged with two values")
	require.Empty(t, book.gaveUp, "requests never settled within %s", settleBudget)
	require.NotZero(t, stats.terminated, "the chaos loop terminated backends")
	require.NotZero(t, stats.cancelled, "the chaos loop cancelled contexts")
	require.NotZero(t, proxy.Cuts()-proxy.Drops(), "the proxy cut connections after forwarding COMMIT")
	require.NotZero(t, proxy.Drops(), "the proxy cut connections instead of forwarding COMMIT")
	if cluster != nil {
		require.Equal(t, 2, stats.restarts, "PostgreSQL restarted fast and immediate")
	}
}

// pickKey returns a new key about a third of the time and otherwise one of
// the path's last 40 keys, so most requests repeat a key, some concurrently.
func pickKey(scope string, issued *atomic.Int64) idem.Key {
	n := issued.Load()
	if n == 0 || rand.IntN(3) == 0 {
		n = issued.Add(1)
		return idem.Key{Scope: scope, ID: fmt.Sprintf("k%d", n)}
	}
	lo := max(1, n-40)
	return idem.Key{Scope: scope, ID: fmt.Sprintf("k%d", lo+rand.Int64N(n-lo+1))}
}

// request sends one client request and retries it with the same key until
// it is acknowledged or settleBudget runs out.
func request(p path, key idem.Key, book *ledger, running *inflight) {
	deadline := time.Now().Add(settleBudget)
	ambiguous := 0
	var retried atomic.Int64 // ambiguous answers retried below the client
	rctx := context.WithValue(context.Background(), ambiguityKey{}, &retried)
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		actx, cancel := context.WithTimeout(rctx, 10*time.Second)
		id := running.add(cancel)
		v, err := p.try(actx, key)
		running.done(id)
		cancel()
		if n := retried.Swap(0); n > 0 {
			ambiguous += int(n)
			book.count(p.name, "ambiguous, retried by idemhttp.Transport", int(n))
		}
		if err == nil {
			book.attempt(p.name, "acknowledged")
			book.ack(key, v, ambiguous)
			return
		}
		class := outcome(err)
		book.attempt(p.name, class)
		if class == "ambiguous" {
			ambiguous++
		}
		// Full jitter, growing to half a second.
		time.Sleep(time.Duration(rand.Int64N(int64(min(500*time.Millisecond, 10*time.Millisecond<<min(attempt, 6))) + 1)))
	}
	book.mu.Lock()
	book.gaveUp = append(book.gaveUp, refOf(key))
	book.mu.Unlock()
}

// completeLease writes the effect and completes the lease in one
// transaction.
func completeLease(ctx context.Context, db *pgxpool.Pool, lease *idem.Lease[string],
	addEffect func(context.Context, pgx.Tx, idem.Key) (string, error)) (string, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	v, err := addEffect(ctx, tx, lease.Key())
	if err != nil {
		return "", err
	}
	if err := lease.Complete(ctx, tx, v); err != nil {
		return "", err
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("%w: %w", errAmbiguous, err)
	}
	return v, nil
}

// httpServer serves POST /signup through the middleware; the handler writes
// one effect and answers 201 with its value.
func httpServer(t *testing.T, db *pgxpool.Pool, opt idem.Option,
	addEffect func(context.Context, pgx.Tx, idem.Key) (string, error)) *httptest.Server {
	mw, err := idemhttp.Middleware(db, idemhttp.Config{
		Scope:   func(*http.Request) (string, error) { return "HTTP", nil },
		Options: []idem.DoOption{opt},
	})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		v, err := addEffect(r.Context(), idemhttp.Tx(r.Context()), idem.Key{Scope: "HTTP", ID: string(body)})
		if err != nil {
			http.Error(w, "database", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, v)
	})))
	t.Cleanup(srv.Close)
	return srv
}

// countingTransport counts, in the request's ambiguity counter, the 503
// answers (the middleware's outcome-unknown) that idemhttp.Transport then
// retries by itself.
type countingTransport struct{}

func (countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if n, ok := r.Context().Value(ambiguityKey{}).(*atomic.Int64); ok && err == nil && resp.StatusCode == http.StatusServiceUnavailable {
		n.Add(1)
	}
	return resp, err
}

// ambiguityKey carries a request's count of ambiguous answers that a
// transport retried before the attempt returned.
type ambiguityKey struct{}

func postHTTP(ctx context.Context, client *http.Client, base string, key idem.Key) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/signup", strings.NewReader(key.ID))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", idemhttp.FormatKey(key.ID))
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	switch {
	case resp.StatusCode == http.StatusCreated:
		return string(body), nil
	case resp.StatusCode == http.StatusServiceUnavailable && bytes.Contains(body, []byte("outcome-unknown")):
		return "", errAmbiguous
	case resp.StatusCode == http.StatusConflict:
		return "", idem.ErrInProgress
	default:
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(body))
	}
}

// cluster is the machine's PostgreSQL cluster that the test restarts.
type cluster struct{ version, name string }

// localCluster returns the cluster to restart, or nil with -chaos.restart=false.
// It fails the test when restarts are asked for but the database is not a
// cluster pg_ctlcluster manages on this machine.
func localCluster(t *testing.T, db *pgxpool.Pool) *cluster {
	if !*restart {
		t.Log("-chaos.restart=false: PostgreSQL is not restarted")
		return nil
	}
	var dataDir string
	require.NoError(t, db.QueryRow(context.Background(), `SELECT current_setting('data_directory')`).Scan(&dataDir))
	versions, _ := os.ReadDir("/etc/postgresql")
	for _, v := range versions {
		clusters, _ := os.ReadDir("/etc/postgresql/" + v.Name())
		for _, c := range clusters {
			out, err := exec.Command("pg_conftool", v.Name(), c.Name(), "show", "-s", "data_directory").Output()
			if err == nil && strings.TrimSpace(string(out)) == dataDir {
				return &cluster{v.Name(), c.Name()}
			}
		}
	}
	t.Fatalf("the chaos soak restarts PostgreSQL, but the database's data directory %s belongs to no cluster pg_ctlcluster manages here; "+
		"point TEST_DATABASE_URL at the machine's cluster or pass -chaos.restart=false", dataDir)
	return nil
}

// restart restarts the cluster in mode and waits until it answers again.
func (c *cluster) restart(t *testing.T, db *pgxpool.Pool, mode string) time.Duration {
	start := time.Now()
	out, err := exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", "-m", mode, c.version, c.name, "restart").CombinedOutput()
	require.NoError(t, err, "pg_ctlcluster restart -m %s: %s", mode, out)
	for time.Since(start) < time.Minute {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = db.Ping(ctx)
		cancel()
		if err == nil {
			return time.Since(start)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("PostgreSQL did not come back within a minute of a %s restart: %v", mode, err)
	return 0
}

type chaosStats struct {
	terminated, cancelled, cutWindows, restarts int
	downtime                                    []time.Duration
}

func (s chaosStats) String() string {
	return fmt.Sprintf("%d backends terminated, %d contexts cancelled, %d COMMIT-cutting windows, %d restarts (back after %v)",
		s.terminated, s.cancelled, s.cutWindows, s.restarts, s.downtime)
}

// chaosLoop disturbs the workers until stop: every few hundred
// milliseconds it terminates backends, cancels attempts or opens a window in
// which the proxy cuts the connections of a third of the COMMITs (half of
// them before the COMMIT reaches the server); at a third and two thirds of
// the run it restarts PostgreSQL, fast and then immediate.
func chaosLoop(t *testing.T, db *pgxpool.Pool, proxy *cutproxy.Proxy, running *inflight, c *cluster, stop time.Time) chaosStats {
	var st chaosStats
	total := time.Until(stop)
	restarts := []struct {
		at   time.Time
		mode string
	}{{stop.Add(-total * 2 / 3), "fast"}, {stop.Add(-total / 3), "immediate"}}
	for time.Now().Before(stop) {
		time.Sleep(time.Duration(150+rand.IntN(350)) * time.Millisecond)
		if c != nil && len(restarts) > 0 && time.Now().After(restarts[0].at) {
			st.downtime = append(st.downtime, c.restart(t, db, restarts[0].mode).Round(time.Millisecond))
			st.restarts++
			restarts = restarts[1:]
			continue
		}
		switch rand.IntN(3) {
		case 0:
			var n int
			err := db.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
				FROM (SELECT pid FROM pg_stat_activity WHERE application_name = 'idem-chaos-worker' ORDER BY random() LIMIT 2) AS victims`).Scan(&n)
			if err == nil {
				st.terminated += n
			}
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

type report struct {
	keys, effects, acked         int
	lost, duplicates, unexpected []string
	settled, requestedNotAcked   int
}

func (r report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  keys requested: %d, acknowledged: %d, effect rows: %d\n", r.keys, r.acked, r.effects)
	fmt.Fprintf(&b, "  lost acknowledged writes: %d %v\n", len(r.lost), r.lost)
	fmt.Fprintf(&b, "  duplicate effects: %d %v\n", len(r.duplicates), r.duplicates)
	fmt.Fprintf(&b, "  unexpected effects: %d %v\n", len(r.unexpected), r.unexpected)
	fmt.Fprintf(&b, "  ambiguous answers (ErrOutcomeUnknown, cut COMMIT, 503 outcome-unknown) settled by a retry: %d\n", r.settled)
	fmt.Fprintf(&b, "  keys requested but never acknowledged: %d", r.requestedNotAcked)
	return b.String()
}

// check compares the effects table with what the clients were told.
func check(t *testing.T, db *pgxpool.Pool, s *pgtest.Schema, book *ledger) report {
	rows, err := db.Query(context.Background(), `SELECT scope, key, count(*), min(value), max(value) FROM `+s.Effects+` GROUP BY scope, key`)
	require.NoError(t, err)
	type effect struct {
		n          int
		value, max string
	}
	effects := map[ref]effect{}
	var total int
	for rows.Next() {
		var k ref
		var e effect
		require.NoError(t, rows.Scan(&k.scope, &k.id, &e.n, &e.value, &e.max))
		effects[k] = e
		total += e.n
	}
	require.NoError(t, rows.Err())

	book.mu.Lock()
	defer book.mu.Unlock()
	r := report{keys: len(book.requested), acked: len(book.acked), effects: total, settled: book.settled}
	for k, e := range effects {
		switch {
		case !book.requested[k]:
			r.unexpected = append(r.unexpected, k.String()+" (never requested)")
		case e.n > 1:
			r.duplicates = append(r.duplicates, fmt.Sprintf("%s x%d", k.String(), e.n))
		case book.acked[k] != "" && book.acked[k] != e.value:
			r.unexpected = append(r.unexpected, fmt.Sprintf("%s (effect %q, acknowledged %q)", k.String(), e.value, book.acked[k]))
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
	for _, l := range [][]string{r.lost, r.duplicates, r.unexpected} {
		slices.Sort(l)
	}
	return r
}

func attemptsTable(book *ledger) string {
	book.mu.Lock()
	defer book.mu.Unlock()
	lines := make([]string, 0, len(book.attempts))
	for k, n := range book.attempts {
		lines = append(lines, fmt.Sprintf("  %-50s %6d", strings.Replace(k, "\t", ": ", 1), n))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
