//go:build ha

package ha_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/migrations"
)

var (
	duration  = flag.Duration("ha.duration", 30*time.Second, "how long workers send new requests at least (the failovers may stretch it)")
	failovers = flag.Int("ha.failovers", 3, "how many times the primary is failed over, cycling through postmaster kill, node crash and switchover")
	workerN   = flag.Int("ha.workers", 8, "concurrent workers, spread over the ways of calling idem (modes)")
	kindsFlag = flag.String("ha.kinds", "kill-primary,crash-primary,switchover", "the failover kinds the soak cycles through, as cluster.sh names them")
	syncMode  = flag.Bool("ha.sync", true, "Patroni's synchronous_mode; with false, acknowledged writes may be lost in a failover, and the soak checks that each loss is whole and that a retry of a lost key runs it once")
)

// settleBudget bounds how long one request may retry before the client gives
// up on it; a node crash keeps writes away for about the leader lease (10 s).
const settleBudget = 60 * time.Second

// leaseFor is the lease of the lease-mode workers: short, so that a
// holder cut off by a failover is taken over within the run.
const leaseFor = time.Second

const effectsTable = "ha_effects"

func TestFailoverSoak(t *testing.T) {
	requirePackages(t)
	require.Positive(t, *failovers, "-ha.failovers")
	require.Positive(t, *workerN, "-ha.workers")
	c := startCluster(t)
	ctx := context.Background()

	cfg, err := pgxpool.ParseConfig(c.dsn)
	require.NoError(t, err)
	cfg.MaxConns = int32(*workerN + 2)
	cfg.ConnConfig.RuntimeParams["application_name"] = "idem-ha-worker"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	require.NoError(t, migrations.Up(ctx, pool))
	// No unique constraint on the key, so that a duplicate would show; a
	// plain index for the checks.
	_, err = pool.Exec(ctx, `CREATE TABLE `+effectsTable+` (id bigserial PRIMARY KEY, scope text NOT NULL, key text NOT NULL, value text NOT NULL);
		CREATE INDEX ON `+effectsTable+` (scope, key)`)
	require.NoError(t, err)

	book := &ledger{requested: map[string]bool{}, acked: map[string]string{}, errs: map[string]int{},
		inflight: map[string]int{}, starts: map[string]int{}, byMode: map[string]int{},
		fence: fenceBook{claims: map[string][]claimed{}, accepted: map[string]int32{}}}
	fn := func(key idem.Key) func(context.Context, pgx.Tx) (string, error) {
		return func(ctx context.Context, tx pgx.Tx) (string, error) {
			v := fmt.Sprintf("%016x", rand.Uint64())
			_, err := tx.Exec(ctx, `INSERT INTO `+effectsTable+` (scope, key, value) VALUES ($1, $2, $3)`, key.Scope, key.ID, v)
			return v, err
		}
	}

	kinds := strings.Split(*kindsFlag, ",")
	modes := newModes(t, pool, fn, book)
	start := time.Now()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range *workerN {
		m := modes[i%len(modes)]
		wg.Go(func() {
			for !stop.Load() {
				request(m, pickKey(m), book)
			}
		})
	}

	// Fail the primary over, spread over the run, each time once the
	// cluster is whole again (the old primary streaming as a replica).
	var events []failover
	for i := range *failovers {
		at := start.Add(*duration * time.Duration(i+1) / time.Duration(*failovers+1))
		time.Sleep(time.Until(at))
		events = append(events, c.failOver(t, kinds[i%len(kinds)]))
	}
	c.waitHealthy(t)
	// Keep writing a little on the final primary, then stop.
	time.Sleep(max(time.Until(start.Add(*duration)), 2*time.Second))
	stop.Store(true)
	wg.Wait()
	book.rivals.Wait()
	elapsed := time.Since(start)

	r := check(t, pool, book)
	acks := book.ackTimes()
	byKind := map[string]int{}
	var lines []string
	for _, e := range events {
		byKind[e.kind]++
		lines = append(lines, fmt.Sprintf("  %-15s pg%d -> pg%d at +%.1fs: longest gap without an acknowledgement %s, cluster whole again after %s",
			e.kind, e.from, e.to, e.at.Sub(start).Seconds(), gapAround(acks, e.at, e.at.Add(e.whole)).Round(time.Millisecond), e.whole.Round(time.Millisecond)))
	}
	t.Logf("run: %s, %d workers, failovers by kind %v:\n%s", elapsed.Round(time.Millisecond), *workerN, byKind, strings.Join(lines, "\n"))
	t.Logf("write outage callers saw: longest gap without an acknowledgement %s", longestGap(acks).Round(time.Millisecond))
	t.Logf("checker (on the final primary, pg%d):\n%s", c.primary(t), r)
	t.Logf("requests acknowledged by mode: %v", book.ackedByMode())
	t.Logf("errors callers got, by mode and count:\n%s", book.errorTable())
	t.Logf("lease mode: %s", book.fence.String())
	t.Logf("definite (not ErrOutcomeUnknown) failures whose attempt had in fact committed: %d %v", len(book.committedAnyway), book.committedAnyway)

	require.Len(t, events, *failovers, "failovers done")
	for _, e := range events {
		require.NotEqual(t, e.from, e.to, "%s moved the primary", e.kind)
	}
	require.NotZero(t, r.acked, "acknowledged writes")
	// Record and business rows commit together, so a failover loses both
	// or neither: no record without its row, no row without its record.
	orphans := wholeness(t, pool)
	t.Logf("records without their effect: %d, effects without their record: %d", orphans[0], orphans[1])
	require.Equal(t, [2]int{}, orphans, "lost writes must be whole")
	if *syncMode {
		require.Empty(t, r.lost, "lost acknowledged writes")
		require.Empty(t, r.rerun, "acknowledged writes lost and run again")
	} else {
		// Asynchronous replication may lose acknowledged commits: a
		// client's retry of such a key finds no record and runs it once.
		// Some were retried during the run already (a later request of
		// the key ran it again, once, and was acknowledged with the new
		// value: rerun); the rest are retried now.
		reran := retryLost(t, pool, r.lost, fn)
		t.Logf("asynchronous mode: %d acknowledged writes lost in the failovers: %d run again, once each, by a later request of the key during the run; "+
			"of the other %d, retried now with the same key, %d ran again and now have one effect each", len(r.lost)+len(r.rerun), len(r.rerun), len(r.lost), reran)
		require.Equal(t, len(r.lost), reran, "a retry of each lost key runs it")
	}
	require.Empty(t, r.duplicates, "duplicate effects")
	require.Empty(t, r.unexpected, "unexpected effects")
	// A key acknowledged with two values had its first acknowledged write
	// lost (asynchronous mode only): each must be a rerun the checker saw.
	rerun := map[string]bool{}
	for _, x := range r.rerun {
		id, _, _ := strings.Cut(x, " ")
		rerun[id] = true
	}
	var conflicts []string
	for _, c := range book.conflicts {
		if id, _, _ := strings.Cut(c, ":"); *syncMode || !rerun[id] {
			conflicts = append(conflicts, c)
		}
	}
	require.Empty(t, conflicts, "a key acknowledged with two values (other than a lost write run again, in asynchronous mode)")
	require.Empty(t, book.gaveUp, "requests never acknowledged within %s", settleBudget)
	require.Empty(t, book.committedAnyway, "a failure idem reported as definite had committed")
	// Do rides out the failovers: its callers (and the middleware's) see
	// nothing but ErrOutcomeUnknown, which a retry settles.
	require.Empty(t, book.doErrors(), "errors other than ErrOutcomeUnknown from Do")
	require.Empty(t, book.fence.broken, "a holder completed after a later attempt was claimed")
	if *syncMode {
		require.Empty(t, book.fence.backwards, "a fencing token went backwards")
	}
	require.Empty(t, book.fence.refusedCompleted, "a holder the downstream fenced out completed")
}

// requirePackages skips the test when Patroni, etcd or PostgreSQL 15 is
// missing, or fails it when the environment variable CI is set.
func requirePackages(t *testing.T) {
	t.Helper()
	var missing []string
	for _, c := range []string{"patroni", "patronictl", "etcd", "etcdctl", "curl", "setpriv"} {
		if _, err := exec.LookPath(c); err != nil {
			missing = append(missing, c)
		}
	}
	if _, err := os.Stat("/usr/lib/postgresql/15/bin/postgres"); err != nil {
		missing = append(missing, "/usr/lib/postgresql/15/bin/postgres")
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("the failover soak needs %s; on Debian 12: apt-get update && DEBIAN_FRONTEND=noninteractive "+
		"apt-get install -y --no-install-recommends patroni etcd-server etcd-client (and postgresql-15)", strings.Join(missing, ", "))
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// cluster is the Patroni cluster cluster.sh runs in dir.
type cluster struct {
	script, dir, dsn string
}

// startCluster starts a cluster in a temporary directory and stops it when
// the test ends.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	script, err := filepath.Abs("cluster.sh")
	require.NoError(t, err)
	dir := t.TempDir()
	if os.Geteuid() == 0 {
		// PostgreSQL runs as the postgres OS user, which must reach the
		// directory; the test's temporary directories are private.
		for _, d := range []string{filepath.Dir(dir), dir} {
			require.NoError(t, os.Chmod(d, 0o755))
		}
	}
	c := &cluster{script: script, dir: filepath.Join(dir, "cluster")}
	t.Cleanup(func() {
		if t.Failed() {
			if out, err := c.run("status"); err == nil {
				t.Logf("cluster at the end:\n%s", out)
			}
		}
		if out, err := c.run("down"); err != nil {
			t.Errorf("cluster.sh down: %v\n%s", err, out)
		}
	})
	began := time.Now()
	out, err := c.run("up")
	require.NoError(t, err, "cluster.sh up:\n%s", out)
	t.Logf("cluster up after %s: %s", time.Since(began).Round(time.Millisecond), strings.TrimSpace(out))
	out, err = c.run("dsn")
	require.NoError(t, err, "cluster.sh dsn: %s", out)
	c.dsn = strings.TrimSpace(out)
	return c
}

func (c *cluster) run(args ...string) (string, error) {
	cmd := exec.Command(c.script, args...)
	cmd.Env = append(os.Environ(), "HA_DIR="+c.dir, fmt.Sprintf("HA_SYNC=%t", *syncMode))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (c *cluster) waitHealthy(t *testing.T) time.Duration {
	t.Helper()
	began := time.Now()
	out, err := c.run("wait-healthy", "120")
	require.NoError(t, err, "cluster.sh wait-healthy: %s", out)
	return time.Since(began)
}

// primary returns the leader's member number, waiting for one for up to a
// minute.
func (c *cluster) primary(t *testing.T) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out, err := c.run("primary")
		if err == nil {
			n, err := strconv.Atoi(strings.TrimSpace(out))
			require.NoError(t, err, "cluster.sh primary: %q", out)
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("no primary for a minute: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// failover is one failover the soak caused.
type failover struct {
	kind     string
	from, to int
	at       time.Time     // when the primary was killed (or the switchover began)
	whole    time.Duration // from at until the old primary streamed again
}

var actedRe = regexp.MustCompile(`member=(\d) kind=(\S+) at_ns=(\d+)`)

// failOver waits until the cluster is whole, fails its primary over in the
// way cmd names, brings a crashed node back, and waits until the old
// primary has rejoined.
func (c *cluster) failOver(t *testing.T, cmd string) failover {
	t.Helper()
	c.waitHealthy(t)
	out, err := c.run(cmd)
	require.NoError(t, err, "cluster.sh %s: %s", cmd, out)
	m := actedRe.FindStringSubmatch(out)
	require.NotNil(t, m, "cluster.sh %s printed no member=... line: %s", cmd, out)
	from, _ := strconv.Atoi(m[1])
	ns, _ := strconv.ParseInt(m[3], 10, 64)
	f := failover{kind: m[2], from: from, at: time.Unix(0, ns)}
	// A new leader, other than the old one.
	deadline := time.Now().Add(time.Minute)
	for {
		if out, err := c.run("primary"); err == nil {
			if n, _ := strconv.Atoi(strings.TrimSpace(out)); n != 0 && n != from {
				f.to = n
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no new primary within a minute", f.kind)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if cmd == "crash-primary" {
		out, err := c.run("start-member", strconv.Itoa(from))
		require.NoError(t, err, "cluster.sh start-member %d: %s", from, out)
	}
	c.waitHealthy(t)
	f.whole = time.Since(f.at)
	return f
}

// pickKey returns a new key of m's about two times in three and otherwise
// one of its last 40, so some requests repeat an acknowledged key (which
// must replay, across failovers too) and some race another worker for one.
// A key's ID starts with its mode's name.
func pickKey(m *mode) idem.Key {
	n := m.issued.Load()
	if n == 0 || rand.IntN(3) != 0 {
		n = m.issued.Add(1)
	} else {
		lo := max(1, n-40)
		n = lo + rand.Int64N(n-lo+1)
	}
	return idem.Key{Scope: "ha", ID: fmt.Sprintf("%s-%d", m.name, n)}
}

// modeOf is the name of the mode whose key key is.
func modeOf(key idem.Key) string {
	name, _, _ := strings.Cut(key.ID, "-")
	return name
}

// ledger is what the clients were told.
type ledger struct {
	mu        sync.Mutex
	requested map[string]bool
	acked     map[string]string
	acks      []time.Time
	conflicts []string
	gaveUp    []string
	settled   int            // ambiguous answers followed by an acknowledgement
	ambiguous int            // ambiguous answers in all
	errs      map[string]int // mode and normalised error text, by count
	byMode    map[string]int // acknowledged keys by mode
	fence     fenceBook
	rivals    sync.WaitGroup // the requests of the lease mode's stalled holders' rivals
	attempts  int
	// inflight counts the requests running per key, starts the requests
	// ever started per key; committedAnyway lists definite failures that
	// a later replay showed to have committed.
	inflight        map[string]int
	starts          map[string]int
	committedAnyway []string
}

// suspect is a definite failure of the only request for a key not yet
// acknowledged: if the same request's retry then replays while no other
// request for the key has started, the failed attempt had committed.
type suspect struct {
	msg    string
	starts int
}

func (l *ledger) ack(key idem.Key, value string, ambiguous int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts++
	l.acks = append(l.acks, time.Now())
	if prev, ok := l.acked[key.ID]; ok && prev != value {
		l.conflicts = append(l.conflicts, fmt.Sprintf("%s: acknowledged %q, then %q", key.ID, prev, value))
	}
	if _, ok := l.acked[key.ID]; !ok {
		l.acked[key.ID] = value
		l.byMode[modeOf(key)]++
	}
	l.settled += ambiguous
}

// fail records a failed attempt for key and returns a suspect when the
// failure claims nothing committed and no other request could make the
// key's next attempt replay.
func (l *ledger) fail(key idem.Key, err error) *suspect {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.attempts++
	msg := describe(err)
	l.errs[modeOf(key)+" "+msg]++
	if errors.Is(err, idem.ErrOutcomeUnknown) {
		l.ambiguous++
		return nil
	}
	if _, acked := l.acked[key.ID]; acked || l.inflight[key.ID] != 1 {
		return nil
	}
	return &suspect{msg: msg, starts: l.starts[key.ID]}
}

// replayed checks a replay that followed the definite failures s, the
// first of which was suspected first.
func (l *ledger) replayed(key idem.Key, s []*suspect) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.starts[key.ID] != s[0].starts {
		return
	}
	msgs := make([]string, len(s))
	for i, x := range s {
		msgs[i] = x.msg
	}
	l.committedAnyway = append(l.committedAnyway, key.ID+": one of "+strings.Join(msgs, " ; "))
}

func (l *ledger) begin(key idem.Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requested[key.ID] = true
	l.inflight[key.ID]++
	l.starts[key.ID]++
}

func (l *ledger) end(key idem.Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight[key.ID]--
}

func (l *ledger) ackTimes() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := slices.Clone(l.acks)
	slices.SortFunc(a, func(x, y time.Time) int { return x.Compare(y) })
	return a
}

func (l *ledger) errorTable() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	type row struct {
		n   int
		msg string
	}
	var rows []row
	total := 0
	for m, n := range l.errs {
		rows = append(rows, row{n, m})
		total += n
	}
	slices.SortFunc(rows, func(a, b row) int {
		if a.n != b.n {
			return b.n - a.n
		}
		return strings.Compare(a.msg, b.msg)
	})
	var b strings.Builder
	fmt.Fprintf(&b, "  %d attempts, %d failed, %d distinct errors\n", l.attempts, total, len(rows))
	for _, r := range rows {
		fmt.Fprintf(&b, "  %6d  %s\n", r.n, r.msg)
	}
	return strings.TrimRight(b.String(), "\n")
}

var (
	memberPortRe = regexp.MustCompile(`127\.0\.0\.1:544[1-3]`)
	clientPortRe = regexp.MustCompile(`127\.0\.0\.1:\d+->`)
	spaceRe      = regexp.MustCompile(`\s+`)
)

// describe classifies an error and normalises its text (the member's port
// becomes 544x), so that equal failures count together.
func describe(err error) string {
	var class []string
	if errors.Is(err, idem.ErrOutcomeUnknown) {
		class = append(class, "ErrOutcomeUnknown")
	}
	if errors.Is(err, idem.ErrInProgress) {
		class = append(class, "ErrInProgress")
	}
	if errors.Is(err, idem.ErrLeaseLost) {
		class = append(class, "ErrLeaseLost")
	}
	if errors.Is(err, errFenced) {
		class = append(class, "fenced")
	}
	if errors.Is(err, context.DeadlineExceeded) {
		class = append(class, "deadline")
	}
	if idem.IsRetryable(err) {
		class = append(class, "IsRetryable")
	}
	var pe interface{ SQLState() string }
	if errors.As(err, &pe) {
		class = append(class, "SQLSTATE "+pe.SQLState())
	}
	if len(class) == 0 {
		class = append(class, "other")
	}
	msg := memberPortRe.ReplaceAllString(err.Error(), "127.0.0.1:544x")
	msg = spaceRe.ReplaceAllString(clientPortRe.ReplaceAllString(msg, "127.0.0.1:N->"), " ")
	if len(msg) > 600 {
		msg = msg[:600] + "..."
	}
	return "[" + strings.Join(class, ", ") + "] " + msg
}

// request sends one request and retries it with the same key until it is
// acknowledged or settleBudget runs out.
func request(m *mode, key idem.Key, book *ledger) {
	book.begin(key)
	defer book.end(key)
	deadline := time.Now().Add(settleBudget)
	ambiguous := 0
	// The definite failures of this request, while no answer of it was
	// ambiguous: a replay after them means one of them had committed.
	var suspected []*suspect
	sawAmbiguous := false
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		// Longer than Do's own retries through an outage (RetryPolicy.Outage).
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		value, replayed, err := m.call(ctx, key)
		cancel()
		if err == nil {
			if replayed && len(suspected) > 0 && !sawAmbiguous {
				book.replayed(key, suspected)
			}
			book.ack(key, value, ambiguous)
			return
		}
		var ce *pgconn.ConnectError
		if s := book.fail(key, err); errors.As(err, &ce) || errors.Is(err, idem.ErrInProgress) || errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, errFenced) {
			// Nothing was sent, another request holds the key, or this
			// one was fenced out: it cannot have committed.
		} else if s != nil {
			suspected = append(suspected, s)
		} else if errors.Is(err, idem.ErrOutcomeUnknown) {
			ambiguous++
			sawAmbiguous = true
		} else if len(suspected) == 0 {
			// A definite failure while another request for the key ran
			// or after it was acknowledged: no inference from here on.
			sawAmbiguous = true
		}
		// Full jitter, growing to half a second.
		time.Sleep(time.Duration(rand.Int64N(int64(min(500*time.Millisecond, 10*time.Millisecond<<min(attempt, 6))) + 1)))
	}
	book.mu.Lock()
	book.gaveUp = append(book.gaveUp, key.ID)
	book.mu.Unlock()
}

// gapAround is the longest gap between two consecutive acknowledgements
// that overlaps the time from..to.
func gapAround(acks []time.Time, from, to time.Time) time.Duration {
	var g time.Duration
	for i := 1; i < len(acks); i++ {
		if acks[i].After(from) && acks[i-1].Before(to) {
			g = max(g, acks[i].Sub(acks[i-1]))
		}
	}
	return g
}

func longestGap(acks []time.Time) time.Duration {
	var g time.Duration
	for i := 1; i < len(acks); i++ {
		g = max(g, acks[i].Sub(acks[i-1]))
	}
	return g
}

type report struct {
	keys, acked, effects, settled, ambiguous, notAcked int
	lost, duplicates, unexpected                       []string
	// rerun are keys whose one effect is not the acknowledged one: the
	// acknowledged write was lost and a later request of the key ran it
	// again (asynchronous replication only).
	rerun []string
}

func (r report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  keys requested: %d, acknowledged: %d, effect rows: %d\n", r.keys, r.acked, r.effects)
	fmt.Fprintf(&b, "  lost acknowledged writes: %d %v\n", len(r.lost), r.lost)
	fmt.Fprintf(&b, "  duplicate effects: %d %v\n", len(r.duplicates), r.duplicates)
	fmt.Fprintf(&b, "  unexpected effects: %d %v\n", len(r.unexpected), r.unexpected)
	fmt.Fprintf(&b, "  effects other than the acknowledged one (the acknowledged write lost, the key run again later): %d %v\n", len(r.rerun), r.rerun)
	fmt.Fprintf(&b, "  ambiguous answers (ErrOutcomeUnknown): %d, settled by a retry: %d\n", r.ambiguous, r.settled)
	fmt.Fprintf(&b, "  keys requested but never acknowledged: %d", r.notAcked)
	return b.String()
}

// check compares the effects table on the primary with what the clients
// were told.
func check(t *testing.T, pool *pgxpool.Pool, book *ledger) report {
	t.Helper()
	type effect struct {
		n     int
		value string
	}
	effects := map[string]effect{}
	total := 0
	var err error
	// The pool may still hold connections cut by the last failover.
	for range 20 {
		clear(effects)
		total = 0
		err = func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rows, err := pool.Query(ctx, `SELECT key, count(*), min(value) FROM `+effectsTable+` GROUP BY key`)
			if err != nil {
				return err
			}
			for rows.Next() {
				var k string
				var e effect
				if err := rows.Scan(&k, &e.n, &e.value); err != nil {
					return err
				}
				effects[k] = e
				total += e.n
			}
			return rows.Err()
		}()
		if err == nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	require.NoError(t, err, "reading the effects")

	book.mu.Lock()
	defer book.mu.Unlock()
	r := report{keys: len(book.requested), acked: len(book.acked), effects: total, settled: book.settled, ambiguous: book.ambiguous}
	for k, e := range effects {
		switch {
		case !book.requested[k]:
			r.unexpected = append(r.unexpected, k+" (never requested)")
		case e.n > 1:
			r.duplicates = append(r.duplicates, fmt.Sprintf("%s x%d", k, e.n))
		case book.acked[k] != "" && book.acked[k] != e.value:
			r.rerun = append(r.rerun, fmt.Sprintf("%s (effect %q, acknowledged %q)", k, e.value, book.acked[k]))
		}
	}
	for k := range book.acked {
		if _, ok := effects[k]; !ok {
			r.lost = append(r.lost, k)
		}
	}
	for k := range book.requested {
		if _, ok := book.acked[k]; !ok {
			r.notAcked++
		}
	}
	for _, l := range [][]string{r.lost, r.duplicates, r.unexpected, r.rerun} {
		slices.Sort(l)
	}
	return r
}

// wholeness counts, on the primary, records without their effect row and
// effect rows without their record.
func wholeness(t *testing.T, pool *pgxpool.Pool) [2]int {
	t.Helper()
	var n [2]int
	var err error
	// The pool may still hold connections cut by the last failover.
	for range 20 {
		if err = wholenessOnce(pool, &n); err == nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	require.NoError(t, err, "counting records and effects without each other")
	return n
}

func wholenessOnce(pool *pgxpool.Pool, n *[2]int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM idempotent_record r WHERE r.scope = 'ha' AND r.status = 'succeeded'
			AND NOT EXISTS (SELECT 1 FROM `+effectsTable+` e WHERE e.scope = r.scope AND e.key = r.key)),
		(SELECT count(*) FROM `+effectsTable+` e
			WHERE NOT EXISTS (SELECT 1 FROM idempotent_record r WHERE r.scope = e.scope AND r.key = e.key))`).Scan(&n[0], &n[1])
}

// retryLost sends each lost key once more, as its client would on
// learning that the write is gone, and returns how many ran fn (rather
// than replaying) and now have exactly one effect.
func retryLost(t *testing.T, pool *pgxpool.Pool, lost []string, fn func(idem.Key) func(context.Context, pgx.Tx) (string, error)) int {
	t.Helper()
	ran := 0
	for _, id := range lost {
		key := idem.Key{Scope: "ha", ID: id}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := idem.Do(ctx, pool, key, fn(key))
		require.NoError(t, err, "retrying the lost key %s", id)
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+effectsTable+` WHERE scope = $1 AND key = $2`, key.Scope, key.ID).Scan(&n))
		cancel()
		if !res.Replayed && n == 1 {
			ran++
		}
	}
	return ran
}
