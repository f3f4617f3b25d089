package integration_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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

// sqlSignupServer is signupServer for a database/sql application: it writes
// its effect with the request's *sql.Tx.
type sqlSignupServer struct {
	s    *pgtest.Schema
	runs atomic.Int64
	gate chan struct{} // when set, the handler waits on it
	fail atomic.Int64  // answer 503 this many times first
}

func (h *sqlSignupServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.runs.Add(1)
	tx := idemhttp.SQLTx(r.Context())
	if tx == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	body, _ := io.ReadAll(r.Body)
	value := fmt.Sprintf("run-%d-%d", n, time.Now().UnixNano())
	if _, err := tx.ExecContext(r.Context(), `INSERT INTO `+h.s.Effects+` (scope, key, value) VALUES ($1, $2, $3)`,
		r.Header.Get("X-User"), string(body), value); err != nil {
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
	w.Header().Set("Location", "/signups/"+value)
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, value)
}

// The middleware serves a database/sql application as it serves a pgx one:
// a repeat replays, twenty concurrent requests with one key run the handler
// once, a duplicate in flight is a 409, and a 5xx records nothing.
func TestHTTPOnDatabaseSQL(t *testing.T) {
	for _, driverName := range []string{"pgx", "postgres"} {
		t.Run(driverName, func(t *testing.T) {
			pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
			s := pgtest.NewSchema(t, pool)
			sdb := openSQLDB(t, driverName, pgtest.ClientURL(), 24)
			serve := func(h http.Handler) string {
				mw, err := idemhttp.New(idemhttp.SQL(sdb), idemhttp.Config{
					Scope:   func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
					Options: []idem.DoOption{s.Opt},
				})
				require.NoError(t, err)
				srv := httptest.NewServer(mw(h))
				t.Cleanup(srv.Close)
				return srv.URL
			}

			h := &sqlSignupServer{s: s}
			srvURL := serve(h)
			first := post(t, srvURL, "ann", `"k1"`, "k1")
			require.Equal(t, http.StatusCreated, first.status, first.body)
			again := post(t, srvURL, "ann", `"k1"`, "k1")
			require.Equal(t, http.StatusCreated, again.status)
			require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
			require.Equal(t, first.body, again.body)
			require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
			require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "ann", ID: "k1"}))

			// Twenty at once with one key (Wait: each waits for the first,
			// then replays it).
			wh := &sqlSignupServer{s: s}
			mw, err := idemhttp.New(idemhttp.SQL(sdb), idemhttp.Config{
				Scope:   func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
				Options: []idem.DoOption{s.Opt}, Wait: true,
			})
			require.NoError(t, err)
			wsrv := httptest.NewServer(mw(wh))
			t.Cleanup(wsrv.Close)
			var wg sync.WaitGroup
			bodies := make([]string, 20)
			for i := range bodies {
				wg.Go(func() {
					r := post(t, wsrv.URL, "bob", `"storm"`, "storm")
					if r.status == http.StatusCreated {
						bodies[i] = r.body
					}
				})
			}
			wg.Wait()
			for _, b := range bodies {
				require.Equal(t, bodies[0], b, "every request got the one execution's answer")
			}
			require.EqualValues(t, 1, wh.runs.Load())
			require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "bob", ID: "storm"}))

			// A duplicate in flight is answered 409 at once.
			gated := &sqlSignupServer{s: s, gate: make(chan struct{})}
			gurl := serve(gated)
			done := make(chan httpReply)
			go func() { done <- post(t, gurl, "cat", `"k409"`, "k409") }()
			require.Eventually(t, func() bool { return gated.runs.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
			dup := post(t, gurl, "cat", `"k409"`, "k409")
			require.Equal(t, http.StatusConflict, dup.status)
			close(gated.gate)
			require.Equal(t, http.StatusCreated, (<-done).status)

			// A 5xx rolls back and records nothing: the retry runs again.
			failing := &sqlSignupServer{s: s}
			failing.fail.Store(1)
			furl := serve(failing)
			require.Equal(t, http.StatusServiceUnavailable, post(t, furl, "dan", `"k5"`, "k5").status)
			require.Zero(t, s.CountEffects(t, pool, idem.Key{Scope: "dan", ID: "k5"}))
			require.Equal(t, http.StatusCreated, post(t, furl, "dan", `"k5"`, "k5").status)
			require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "dan", ID: "k5"}))
			require.EqualValues(t, 2, failing.runs.Load())

			// Without a key the request passes through, with no transaction.
			resp, err := http.Get(srvURL)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusNoContent, resp.StatusCode)
		})
	}
}
