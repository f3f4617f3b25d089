package integration_test

import (
	"bytes"
	"compress/gzip"
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

	"github.com/jackc/pgx/v5"
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

func newHTTPServer(t *testing.T, pool idem.TxBeginner, h http.Handler, cfg idemhttp.Config) *httptest.Server {
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
			srv := newHTTPServer(t, pool, h, idemhttp.Config{Wait: wait, Options: []idem.DoOption{s.Opt}})
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
	srv := newHTTPServer(t, pool, h, idemhttp.Config{Options: []idem.DoOption{s.Opt}})

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
	unknown := post(t, srv.URL, "", `"k"`, "x")
	require.Equal(t, http.StatusUnauthorized, unknown.status)
	require.NotContains(t, unknown.body, "no X-User", "the scope function's error stays on the server")
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
	gsrv := newHTTPServer(t, pool, gated, idemhttp.Config{Options: []idem.DoOption{s.Opt}})
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
	srv := newHTTPServer(t, pool, h, idemhttp.Config{Options: []idem.DoOption{s.Opt}})
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
	srv := newHTTPServer(t, pool, h, idemhttp.Config{MaxResponseBody: 100, Options: []idem.DoOption{s.Opt}})
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
	srv := newHTTPServer(t, pool, h, idemhttp.Config{Options: []idem.DoOption{s.Opt}})
	a := post(t, srv.URL, "erin", `"same"`, "same")
	b := post(t, srv.URL, "frank", `"same"`, "same")
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, http.StatusCreated, b.status)
	require.Empty(t, b.header.Get(idemhttp.ReplayedHeader), "another caller's key never replays")
	require.NotEqual(t, a.body, b.body)
	require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "erin", ID: "same"}))
	require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "frank", ID: "same"}))

	// Optional mode lets key-less requests through without a transaction.
	osrv := newHTTPServer(t, pool, h, idemhttp.Config{Optional: true, Options: []idem.DoOption{s.Opt}})
	require.Equal(t, http.StatusNoContent, post(t, osrv.URL, "erin", "", "x").status)
}

// The server commits, then drops the first two connections before answering;
// the client Transport retries with the same key and receives the original
// response, with exactly one effect.
func TestHTTPTransportAgainstDroppedResponses(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	h := &signupServer{s: s}
	cfg := idemhttp.Config{Options: []idem.DoOption{s.Opt}, Scope: func(r *http.Request) (string, error) { return "gina", nil }}
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
	srv := newHTTPServer(t, pool, handler, idemhttp.Config{Options: []idem.DoOption{s.Opt}})
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

// A handler whose statement fails (aborting the transaction) and that then
// rejects the request gets its own answer through, with nothing recorded; one
// that answers success after the failure gets a 500, since none of its
// writes committed.
func TestHTTPAnswerAfterAFailedStatement(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	var status atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := idemhttp.Tx(r.Context())
		body, _ := io.ReadAll(r.Body)
		key := idem.Key{Scope: r.Header.Get("X-User"), ID: string(body)}
		if err := s.AddEffect(r.Context(), tx, key, "written"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := tx.Exec(r.Context(), `SELECT 1/0`); err == nil {
			t.Error("1/0 succeeded")
		}
		w.Header().Set("X-Reason", "division")
		w.WriteHeader(int(status.Load()))
		_, _ = io.WriteString(w, "rejected after a failed statement")
	})
	// Through a pool, the middleware sees the aborted transaction on the
	// connection; through a transaction without Conn (a database/sql
	// adapter, say), the completion's SQLSTATE 25P02 tells it.
	for name, db := range map[string]idem.TxBeginner{"pool": pool, "no Conn": noConnDB{pool}} {
		srv := newHTTPServer(t, db, h, idemhttp.Config{Options: []idem.DoOption{s.Opt}})

		status.Store(http.StatusUnprocessableEntity)
		r := post(t, srv.URL, "gina", `"k-422-`+name+`"`, "k-422-"+name)
		require.Equal(t, http.StatusUnprocessableEntity, r.status, name)
		require.Equal(t, "rejected after a failed statement", r.body, name)
		require.Equal(t, "division", r.header.Get("X-Reason"), name)
		key := idem.Key{Scope: "gina", ID: "k-422-" + name}
		require.Nil(t, s.ReadRecord(t, pool, key), "nothing can be recorded in an aborted transaction")
		require.Equal(t, 0, s.CountEffects(t, pool, key))

		status.Store(http.StatusCreated)
		r = post(t, srv.URL, "gina", `"k-201-`+name+`"`, "k-201-"+name)
		require.Equal(t, http.StatusInternalServerError, r.status, name)
		require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), name)
		require.Contains(t, r.body, "handler-transaction-failed", name)
		key = idem.Key{Scope: "gina", ID: "k-201-" + name}
		require.Nil(t, s.ReadRecord(t, pool, key))
		require.Equal(t, 0, s.CountEffects(t, pool, key))
	}
}

// noConnDB begins transactions whose Conn is nil, as a database/sql
// adapter's are.
type noConnDB struct{ pool *pgxpool.Pool }

func (d noConnDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return noConnTx{tx}, nil
}

type noConnTx struct{ pgx.Tx }

func (noConnTx) Conn() *pgx.Conn { return nil }

// Content-Encoding is recorded whatever RecordHeaders says: a replay of a
// compressed body says it is compressed.
func TestHTTPReplayKeepsContentEncoding(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(`{"id":1}`))
	require.NoError(t, zw.Close())
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(gz.Bytes())
	})
	srv := newHTTPServer(t, pool, h, idemhttp.Config{RecordHeaders: []string{"Content-Type"}, Options: []idem.DoOption{s.Opt}})
	// An explicit Accept-Encoding keeps net/http's client from decoding.
	first := post(t, srv.URL, "hana", `"gz"`, "x", "Accept-Encoding", "gzip")
	again := post(t, srv.URL, "hana", `"gz"`, "x", "Accept-Encoding", "gzip")
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, "gzip", first.header.Get("Content-Encoding"))
	require.Equal(t, "gzip", again.header.Get("Content-Encoding"))
	require.Equal(t, first.body, again.body)
	zr, err := gzip.NewReader(strings.NewReader(again.body))
	require.NoError(t, err)
	plain, err := io.ReadAll(zr)
	require.NoError(t, err)
	require.Equal(t, `{"id":1}`, string(plain))
}

// A response that is never recorded goes out whole, over the cap, with its
// Retry-After, so that a client retries it.
func TestHTTPUnrecordedResponseIsNotCapped(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	page := strings.Repeat("maintenance ", 50)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, page)
	})
	srv := newHTTPServer(t, pool, h, idemhttp.Config{MaxResponseBody: 100, Options: []idem.DoOption{s.Opt}})
	r := post(t, srv.URL, "iris", `"k503"`, "x")
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Equal(t, "7", r.header.Get("Retry-After"))
	require.Equal(t, page, r.body)
	require.Nil(t, s.ReadRecord(t, pool, idem.Key{Scope: "iris", ID: "k503"}))
}

// A handler may flush and set deadlines through the recording writer: Flush
// does nothing (the response goes out after the commit), and
// http.ResponseController reaches the real writer's deadlines.
func TestHTTPHandlerFlushesAndSetsDeadlines(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Errorf("SetWriteDeadline: %v", err)
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "part one, ")
		w.(http.Flusher).Flush()
		if err := rc.Flush(); err != nil {
			t.Errorf("ResponseController.Flush: %v", err)
		}
		_, _ = io.WriteString(w, "part two")
	})
	srv := newHTTPServer(t, pool, h, idemhttp.Config{Options: []idem.DoOption{s.Opt}})
	first := post(t, srv.URL, "jack", `"fl"`, "x")
	again := post(t, srv.URL, "jack", `"fl"`, "x")
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "part one, part two", first.body)
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
}

// A handler cannot hijack the connection through http.ResponseController
// while its transaction is open: the client would get an answer that is not
// the one recorded.
func TestHTTPHandlerCannotHijack(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(http.Hijacker); ok {
			t.Error("the recording writer is a Hijacker")
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
			t.Error("Hijack through ResponseController succeeded")
			return
		}
		require.ErrorIs(t, err, http.ErrNotSupported)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created")
	})
	srv := newHTTPServer(t, pool, h, idemhttp.Config{Options: []idem.DoOption{s.Opt}})
	first := post(t, srv.URL, "kim", `"hj"`, "x")
	again := post(t, srv.URL, "kim", `"hj"`, "x")
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "created", first.body)
	require.Equal(t, first.body, again.body)
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
}

// A rejection after a failed statement is never recorded, so it is not
// capped either: it goes out whole.
func TestHTTPRejectionAfterAFailedStatementIsNotCapped(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	page := strings.Repeat("e", 200)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = idemhttp.Tx(r.Context()).Exec(r.Context(), `SELECT 1/0`)
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, page)
	})
	srv := newHTTPServer(t, pool, h, idemhttp.Config{MaxResponseBody: 100, Options: []idem.DoOption{s.Opt}})
	r := post(t, srv.URL, "lee", `"cap"`, "x")
	require.Equal(t, http.StatusUnprocessableEntity, r.status)
	require.Equal(t, page, r.body)
	require.Nil(t, s.ReadRecord(t, pool, idem.Key{Scope: "lee", ID: "cap"}))
}
