package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// signupServer is a handler that writes one effect in the request's
// transaction and answers 201 with the effect's value.
type signupServer struct {
	s     *pgtest.Schema
	runs  atomic.Int64
	gate  chan struct{} // when set, the handler waits on it
	fail  atomic.Int64  // answer 503 this many times first
	large bool
}

func (h *signupServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.runs.Add(1)
	tx := idemhttp.Tx(r.Context())
	if tx == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	body, _ := io.ReadAll(r.Body)
	value := fmt.Sprintf("run-%d-%d", n, time.Now().UnixNano())
	key := idem.Key{Scope: r.Header.Get("X-User"), ID: string(body)}
	if err := h.s.AddEffect(r.Context(), tx, key, value); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if h.gate != nil {
		<-h.gate
	}
	if h.fail.Add(-1) >= 0 {
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/signups/"+value)
	w.Header().Set("X-Not-Recorded", "1")
	w.WriteHeader(http.StatusCreated)
	if h.large {
		_, _ = w.Write(bytes.Repeat([]byte("x"), 300))
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"value": value})
}

func newHTTPServer(t *testing.T, pool *pgxpool.Pool, h http.Handler, cfg idemhttp.Config) *httptest.Server {
	t.Helper()
	cfg.Scope = func(r *http.Request) (string, error) {
		if u := r.Header.Get("X-User"); u != "" {
			return u, nil
		}
		return "", errors.New("no X-User")
	}
	mw, err := idemhttp.Middleware(pool, cfg)
	require.NoError(t, err)
	srv := httptest.NewServer(mw(h))
	t.Cleanup(srv.Close)
	return srv
}

type httpReply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, user, key, body string, extra ...string) httpReply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	if user != "" {
		req.Header.Set("X-User", user)
	}
	if key != "" {
		req.Header.Set(idemhttp.HeaderName, key)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Add(extra[i], extra[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return httpReply{resp.StatusCode, resp.Header, string(b)}
}

func TestHTTPConcurrentIdenticalPosts(t *testing.T) {
	for _, wait := range []bool{true, false} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 30 })
			s := pgtest.NewSchema(t, pool)
			h := &signupServer{s: s}
			srv := newHTTPServer(t, pool, h, idemhttp.Config{Wait: wait, Options: []idem.Option{s.Opt}})
			var wg sync.WaitGroup
			var mu sync.Mutex
			replies := []httpReply{}
			for range 100 {
				wg.Go(func() {
					r := post(t, srv.URL, "alice", `"k-1"`, "k-1")
					mu.Lock()
					replies = append(replies, r)
					mu.Unlock()
				})
			}
			wg.Wait()
			bodies := map[string]int{}
			replayed, conflicts := 0, 0
			for _, r := range replies {
				switch r.status {
				case http.StatusCreated:
					bodies[r.body]++
					if r.header.Get(idemhttp.ReplayedHeader) == "true" {
						replayed++
					}
					require.NotEmpty(t, r.header.Get("Location"), "allow-listed headers are replayed")
				case http.StatusConflict:
					conflicts++
					require.NotEmpty(t, r.header.Get("Retry-After"))
					require.Equal(t, "application/problem+json", r.header.Get("Content-Type"))
				default:
					t.Fatalf("status %d: %s", r.status, r.body)
				}
			}
			require.Len(t, bodies, 1, "identical bodies")
			require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "alice", ID: "k-1"}))
			created := 100 - conflicts
			require.Equal(t, created-1, replayed, "the replay header on all but the first")
			if wait {
				require.Zero(t, conflicts)
			}
			t.Logf("wait=%v: %d created (%d replayed), %d conflicts", wait, created, replayed, conflicts)
		})
	}
}

func TestHTTPErrorPaths(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	h := &signupServer{s: s}
	srv := newHTTPServer(t, pool, h, idemhttp.Config{Options: []idem.Option{s.Opt}})

	for name, r := range map[string]httpReply{
		"missing":  post(t, srv.URL, "bob", "", "x"),
		"invalid":  post(t, srv.URL, "bob", `"unterminated`, "x"),
		"repeated": post(t, srv.URL, "bob", `"a"`, "x", idemhttp.HeaderName, `"b"`),
		"list":     post(t, srv.URL, "bob", `"a", "b"`, "x"),
	} {
		require.Equal(t, http.StatusBadRequest, r.status, name)
		require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), name)
		var p map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.body), &p), name)
		require.EqualValues(t, 400, p["status"])
	}
	require.Equal(t, http.StatusUnauthorized, post(t, srv.URL, "", `"k"`, "x").status)
	require.Zero(t, h.runs.Load(), "the handler never ran")

	// GET passes through untouched.
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)

	// 422: the same key for another body.
	first := post(t, srv.URL, "bob", `"k-422"`, "body-A")
	require.Equal(t, http.StatusCreated, first.status)
	r := post(t, srv.URL, "bob", `"k-422"`, "body-B")
	require.Equal(t, http.StatusUnprocessableEntity, r.status)

	// 409 while the first is in flight.
	gated := &signupServer{s: s, gate: make(chan struct{})}
	gsrv := newHTTPServer(t, pool, gated, idemhttp.Config{Options: []idem.Option{s.Opt}})
	done := make(chan httpReply)
	go func() { done <- post(t, gsrv.URL, "bob", `"k-409"`, "k-409") }()
	require.Eventually(t, func() bool { return gated.runs.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	r = post(t, gsrv.URL, "bob", `"k-409"`, "k-409")
	require.Equal(t, http.StatusConflict, r.status)
	require.Equal(t, "1", r.header.Get("Retry-After"))
	close(gated.gate)
	require.Equal(t, http.StatusCreated, (<-done).status)
}

func TestHTTP5xxIsNotRecorded(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	h := &signupServer{s: s}
	h.fail.Store(1)
	srv := newHTTPServer(t, pool, h, idemhttp.Config{Options: []idem.Option{s.Opt}})
	key := idem.Key{Scope: "carol", ID: "k5"}
	r := post(t, srv.URL, "carol", `"k5"`, "k5")
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Equal(t, 0, s.CountEffects(t, pool, key), "the 5xx rolled the handler's writes back")
	require.Nil(t, s.ReadRecord(t, pool, key))
	r = post(t, srv.URL, "carol", `"k5"`, "k5")
	require.Equal(t, http.StatusCreated, r.status, "the retry runs the handler")
	require.Empty(t, r.header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, "1", r.header.Get("X-Not-Recorded"), "the first answer carries every header")
	require.Equal(t, 1, s.CountEffects(t, pool, key))
	again := post(t, srv.URL, "carol", `"k5"`, "k5")
	require.Equal(t, r.body, again.body)
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
	require.Empty(t, again.header.Get("X-Not-Recorded"), "only allow-listed headers are recorded")
}

func TestHTTPResponseOverTheCap(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	h := &signupServer{s: s, large: true}
	srv := newHTTPServer(t, pool, h, idemhttp.Config{MaxResponseBody: 100, Options: []idem.Option{s.Opt}})
	r := post(t, srv.URL, "dave", `"big"`, "big")
	require.Equal(t, http.StatusInternalServerError, r.status)
	require.Contains(t, r.body, "exceeds the 100 bytes")
	key := idem.Key{Scope: "dave", ID: "big"}
	require.Nil(t, s.ReadRecord(t, pool, key))
	require.Equal(t, 0, s.CountEffects(t, pool, key))
}

func TestHTTPScopeIsolation(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	h := &signupServer{s: s}
	srv := newHTTPServer(t, pool, h, idemhttp.Config{Options: []idem.Option{s.Opt}})
	a := post(t, srv.URL, "erin", `"same"`, "same")
	b := post(t, srv.URL, "frank", `"same"`, "same")
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, http.StatusCreated, b.status)
	require.Empty(t, b.header.Get(idemhttp.ReplayedHeader), "another caller's key never replays")
	require.NotEqual(t, a.body, b.body)
	require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "erin", ID: "same"}))
	require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "frank", ID: "same"}))

	// Optional mode lets key-less requests through without a transaction.
	osrv := newHTTPServer(t, pool, h, idemhttp.Config{Optional: true, Options: []idem.Option{s.Opt}})
	require.Equal(t, http.StatusNoContent, post(t, osrv.URL, "erin", "", "x").status)
}

// The server commits, then drops the first two connections before answering;
// the client Transport retries with the same key and receives the original
// response, with exactly one effect.
func TestHTTPTransportAgainstDroppedResponses(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	h := &signupServer{s: s}
	cfg := idemhttp.Config{Options: []idem.Option{s.Opt}, Scope: func(r *http.Request) (string, error) { return "gina", nil }}
	mw, err := idemhttp.Middleware(pool, cfg)
	require.NoError(t, err)
	inner := mw(h)
	var drops atomic.Int64
	drops.Store(2)
	var firstBody atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, r) // the handler's transaction commits here
		if firstBody.Load() == nil {
			firstBody.Store(rec.Body.String())
		}
		if drops.Add(-1) >= 0 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close() // the answer is lost on the way back
			}
			return
		}
		for k, vs := range rec.Header() {
			w.Header()[k] = vs
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	defer srv.Close()

	client := &http.Client{Transport: &idemhttp.Transport{BaseDelay: 5 * time.Millisecond, MaxAttempts: 5}}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL, strings.NewReader("payload"))
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, firstBody.Load(), string(body), "the client receives the original response")
	require.EqualValues(t, 1, h.runs.Load(), "the handler ran once")
	key := idemhttp.KeyOf(resp)
	require.Len(t, key, 32)
	require.Empty(t, req.Header.Get(idemhttp.HeaderName), "the caller's request is not modified")
	var effects int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+s.Effects).Scan(&effects))
	require.Equal(t, 1, effects)
	require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "", ID: "payload"}))
}

// A panicking handler records nothing and its writes roll back; the retry
// runs the handler.
func TestHTTPPanicRecordsNothing(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	var panicked atomic.Bool
	h := &signupServer{s: s}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !panicked.Swap(true) {
			tx := idemhttp.Tx(r.Context())
			_ = s.AddEffect(r.Context(), tx, idem.Key{Scope: "hank", ID: "p"}, "doomed")
			panic(http.ErrAbortHandler) // net/http closes the connection quietly
		}
		h.ServeHTTP(w, r)
	})
	srv := newHTTPServer(t, pool, handler, idemhttp.Config{Options: []idem.Option{s.Opt}})
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("p"))
	require.NoError(t, err)
	req.Header.Set("X-User", "hank")
	req.Header.Set(idemhttp.HeaderName, `"p"`)
	_, err = http.DefaultClient.Do(req)
	require.Error(t, err, "the panic dropped the connection")
	key := idem.Key{Scope: "hank", ID: "p"}
	require.Nil(t, s.ReadRecord(t, pool, key))
	require.Equal(t, 0, s.CountEffects(t, pool, key))
	r := post(t, srv.URL, "hank", `"p"`, "p")
	require.Equal(t, http.StatusCreated, r.status)
	require.Equal(t, 1, s.CountEffects(t, pool, key))
}
