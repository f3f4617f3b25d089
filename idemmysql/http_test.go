package idemmysql_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemhttp"
)

// The HTTP middleware on MySQL: a repeat replays, twenty at once with one
// key run the handler once, a duplicate in flight is a 409, and a 5xx
// records nothing.
func TestHTTPMiddleware(t *testing.T) {
	db := openDB(t)
	var runs, fail atomic.Int64
	gate := make(chan struct{})
	var gated atomic.Bool
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		tx := idemhttp.SQLTx(r.Context())
		body, _ := io.ReadAll(r.Body)
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO effects (k, v) VALUES (?, ?)`, string(body), n); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if gated.Load() {
			<-gate
		}
		if fail.Add(-1) >= 0 {
			http.Error(w, "try later", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "run-%d", n)
	})
	serve := func(wait bool) string {
		mw, err := idemhttp.New(idemhttp.MySQL(db), idemhttp.Config{
			Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
			Wait:  wait,
		})
		require.NoError(t, err)
		srv := httptest.NewServer(mw(h))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	post := func(url, user, key, body string) (int, string, http.Header) {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-User", user)
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	url := serve(false)
	status, first, _ := post(url, "ann", "k1", "k1")
	require.Equal(t, http.StatusCreated, status, first)
	status, again, header := post(url, "ann", "k1", "k1")
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, first, again)
	require.Equal(t, "true", header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, 1, effects(t, db, "k1"))

	wurl := serve(true)
	before := runs.Load()
	var wg sync.WaitGroup
	bodies := make([]string, 20)
	for i := range bodies {
		wg.Go(func() {
			status, body, _ := post(wurl, "bob", "storm", "storm")
			require.Equal(t, http.StatusCreated, status, body)
			bodies[i] = body
		})
	}
	wg.Wait()
	for _, b := range bodies {
		require.Equal(t, bodies[0], b)
	}
	require.EqualValues(t, 1, runs.Load()-before)
	require.Equal(t, 1, effects(t, db, "storm"))

	gated.Store(true)
	done := make(chan int)
	before = runs.Load()
	go func() { s, _, _ := post(url, "cat", "k409", "k409"); done <- s }()
	require.Eventually(t, func() bool { return runs.Load() == before+1 }, 10*time.Second, 5*time.Millisecond)
	status, _, _ = post(url, "cat", "k409", "k409")
	require.Equal(t, http.StatusConflict, status)
	close(gate)
	require.Equal(t, http.StatusCreated, <-done)
	gated.Store(false)

	fail.Store(1)
	status, _, _ = post(url, "dan", "k5", "k5")
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Zero(t, effects(t, db, "k5"))
	status, _, _ = post(url, "dan", "k5", "k5")
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, 1, effects(t, db, "k5"))
}
