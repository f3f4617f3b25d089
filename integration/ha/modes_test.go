//go:build ha

package ha_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// mode is one way of calling idem that the soak's workers drive through
// the failovers, each on keys of its own (their IDs start with its name).
type mode struct {
	name   string
	issued atomic.Int64
	// call sends one request for key: the value acknowledged and whether
	// it was a replay, or the error the caller saw.
	call func(ctx context.Context, key idem.Key) (value string, replayed bool, err error)
}

// newModes returns the soak's modes: idem.Do; idem.WithIdempotency in the
// caller's own transaction; the HTTP middleware (over idem.Do) behind a
// loopback server; and lease mode (Claim, a call to a downstream service
// that checks the fencing token, Complete in the business transaction).
func newModes(t *testing.T, pool *pgxpool.Pool, fn func(idem.Key) func(context.Context, pgx.Tx) (string, error), book *ledger) []*mode {
	t.Helper()
	mw, err := idemhttp.Middleware(pool, idemhttp.Config{
		Scope: func(*http.Request) (string, error) { return "ha", nil },
		Wait:  true,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := idem.Key{Scope: "ha", ID: r.Header.Get("Idempotency-Key")}
		v, err := fn(key)(r.Context(), idemhttp.Tx(r.Context()))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, v)
	})))
	t.Cleanup(srv.Close)
	client := &http.Client{Timeout: 30 * time.Second}

	lease := &mode{name: "lease"}
	lease.call = func(ctx context.Context, key idem.Key) (string, bool, error) {
		return leaseCall(ctx, pool, lease, key, book)
	}
	return []*mode{
		{name: "do", call: func(ctx context.Context, key idem.Key) (string, bool, error) {
			res, err := idem.Do(ctx, pool, key, fn(key))
			return res.Value, res.Replayed, err
		}},
		{name: "tx", call: func(ctx context.Context, key idem.Key) (string, bool, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return "", false, err
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			res, err := idem.WithIdempotency(ctx, tx, key, fn(key))
			if err != nil {
				return "", false, err
			}
			if err := tx.Commit(ctx); err != nil {
				// The caller's own COMMIT: its answer lost, it may have
				// committed, as idem.Do would say.
				return "", false, fmt.Errorf("%w: the caller's commit: %w", idem.ErrOutcomeUnknown, err)
			}
			return res.Value, res.Replayed, nil
		}},
		{name: "http", call: func(ctx context.Context, key idem.Key) (string, bool, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"n":1}`))
			if err != nil {
				return "", false, err
			}
			req.Header.Set("Idempotency-Key", key.ID)
			resp, err := client.Do(req)
			if err != nil {
				return "", false, err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return "", false, err
			}
			switch {
			case resp.StatusCode == http.StatusOK:
				return string(body), resp.Header.Get(idemhttp.ReplayedHeader) == "true", nil
			case resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body), "outcome"):
				return "", false, fmt.Errorf("%w: HTTP 503: %s", idem.ErrOutcomeUnknown, body)
			case resp.StatusCode == http.StatusConflict:
				return "", false, fmt.Errorf("%w: HTTP 409: %s", idem.ErrInProgress, body)
			}
			return "", false, fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
		}},
		lease,
	}
}

// errFenced is the downstream service refusing a holder whose fencing
// token is below one it has seen for the key.
var errFenced = errors.New("downstream: fenced out (a later attempt was seen)")

// leaseCall is one request in lease mode: Claim the key with a short
// lease, call the downstream service with the fencing token, then write
// the business row and Complete in one transaction. One holder in twenty
// stalls past its lease before its call, so that another request takes
// the key over and the stalled one is fenced out, by the downstream
// service or by Complete.
func leaseCall(ctx context.Context, pool *pgxpool.Pool, m *mode, key idem.Key, book *ledger) (string, bool, error) {
	l, res, err := idem.Claim[string](ctx, pool, key, leaseFor)
	if err != nil {
		return "", false, err
	}
	if l == nil {
		return res.Value, true, nil
	}
	attempt := l.Attempt()
	book.fence.claim(key.ID, attempt)
	if rand.IntN(20) == 0 {
		// Stalled before its call: a second client of the key arrives
		// meanwhile, and takes the key over once the lease has run out.
		book.rivals.Go(func() { request(m, key, book) })
		time.Sleep(leaseFor + 300*time.Millisecond)
	}
	if !book.fence.accept(key.ID, attempt) {
		return "", false, errFenced
	}
	v := fmt.Sprintf("%016x", rand.Uint64())
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", false, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `INSERT INTO `+effectsTable+` (scope, key, value) VALUES ($1, $2, $3)`, key.Scope, key.ID, v); err != nil {
		return "", false, err
	}
	before := time.Now()
	if err := l.Complete(ctx, tx, v); err != nil {
		return "", false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return "", false, fmt.Errorf("%w: the lease's commit: %w", idem.ErrOutcomeUnknown, err)
	}
	book.fence.completed(key.ID, attempt, before)
	return v, false, nil
}

// claimed is an attempt Claim handed out, and when it returned.
type claimed struct {
	attempt int32
	at      time.Time
}

// fenceBook is what the lease-mode holders were handed and did, and what
// the downstream service accepted.
type fenceBook struct {
	mu       sync.Mutex
	claims   map[string][]claimed
	accepted map[string]int32 // the highest attempt the downstream saw, by key
	// takeovers are claims of an attempt above 1; refused are downstream
	// refusals; completions are Completes that committed.
	takeovers, refused, completions int
	// broken lists completions of attempt n that began after attempt n+1
	// had been claimed; backwards lists claims of an attempt not above
	// the key's previous one; refusedCompleted lists completions by a
	// holder the downstream had refused (none can: it returns first).
	broken, backwards, refusedCompleted []string
}

func (f *fenceBook) claim(key string, attempt int32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cs := f.claims[key]; len(cs) > 0 && cs[len(cs)-1].attempt >= attempt {
		f.backwards = append(f.backwards, fmt.Sprintf("%s: attempt %d claimed after %d", key, attempt, cs[len(cs)-1].attempt))
	}
	f.claims[key] = append(f.claims[key], claimed{attempt, time.Now()})
	if attempt > 1 {
		f.takeovers++
	}
}

// accept is the downstream service: it refuses a token below the highest
// it has seen for the key.
func (f *fenceBook) accept(key string, attempt int32) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if attempt < f.accepted[key] {
		f.refused++
		return false
	}
	f.accepted[key] = attempt
	return true
}

func (f *fenceBook) completed(key string, attempt int32, began time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.completions++
	for _, c := range f.claims[key] {
		if c.attempt > attempt && c.at.Before(began) {
			f.broken = append(f.broken, fmt.Sprintf("%s: attempt %d completed after attempt %d was claimed", key, attempt, c.attempt))
		}
	}
	if attempt < f.accepted[key] {
		f.refusedCompleted = append(f.refusedCompleted, fmt.Sprintf("%s: attempt %d", key, attempt))
	}
}

func (f *fenceBook) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("%d claims of %d keys, %d takeovers (attempt > 1), %d completions, %d downstream refusals of a stale token; "+
		"completions after a later claim: %d, tokens gone backwards: %d", f.count(), len(f.claims), f.takeovers, f.completions, f.refused,
		len(f.broken), len(f.backwards))
}

func (f *fenceBook) count() int {
	n := 0
	for _, cs := range f.claims {
		n += len(cs)
	}
	return n
}

// doErrors lists the errors the do and http modes' callers got other than
// ErrOutcomeUnknown (and the middleware's 409 for a key in flight, which
// Wait makes rare): what a failover must not surface from Do.
func (l *ledger) doErrors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for msg, n := range l.errs {
		mode, rest, _ := strings.Cut(msg, " ")
		if (mode == "do" || mode == "http") && !strings.HasPrefix(rest, "[ErrOutcomeUnknown") && !strings.HasPrefix(rest, "[ErrInProgress") {
			out = append(out, fmt.Sprintf("%dx %s", n, msg))
		}
	}
	slices.Sort(out)
	return out
}

func (l *ledger) ackedByMode() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.byMode)
}
