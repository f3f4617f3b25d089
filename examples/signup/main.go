// Command signup is the flash activity sign-up of the scenarios, with idem
// underneath: the page asks the server for a submission token when it opens
// (idem.IssueToken), the button cannot fire twice, a retry after a timeout
// reuses the token, the server accepts only tokens it issued
// (idem.RequireIssued behind idemhttp.Middleware), answers 409 while the
// first submission is in flight, replays the first answer to repeats, and
// the business key (user, activity) turns a second sign-up from another
// device into "already signed up" (idem.InsertOrGet) instead of an error.
//
//	go run ./examples/signup            # then open the URL it prints
//
// It connects with DATABASE_URL or the PG* defaults, keeps its tables in the
// schema signup_example, and seeds an activity and users 1 to 5 (open
// /?user=2 to be user 2).
package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/migrations"
)

const schema = "signup_example"

//go:embed static
var static embed.FS

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address")
	flag.Parse()
	ctx := context.Background()
	pool, err := connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	app, err := newApp(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("sign-up example: open http://%s/?user=1 (users 1-5, activity %d)\n", *addr, app.activityID)
	srv := &http.Server{Addr: *addr, Handler: app.routes(), ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return exampledb.Connect(ctx, url, schema)
}

// app is the sign-up service.
type app struct {
	pool       *pgxpool.Pool
	activityID int64
	// dropFirst, when positive, makes the server commit a sign-up and then
	// drop the connection without answering, that many times, after
	// dropDelay: the lost response of a mobile network, for the tests.
	dropFirst atomic.Int64
	dropDelay time.Duration
}

func newApp(ctx context.Context, pool *pgxpool.Pool) (*app, error) {
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema); err != nil {
		return nil, err
	}
	if err := migrations.Up(ctx, pool, migrations.WithTable(schema, idem.DefaultTable)); err != nil {
		return nil, err
	}
	// The unique business key is the last gate: one sign-up per user and
	// activity, whatever the tokens say.
	if _, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS activities (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, title text NOT NULL);
		CREATE TABLE IF NOT EXISTS users (id bigint PRIMARY KEY, name text NOT NULL);
		INSERT INTO users (id, name) SELECT g, 'user ' || g FROM generate_series(1, 5) g ON CONFLICT DO NOTHING;
		CREATE TABLE IF NOT EXISTS signups (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			user_id bigint NOT NULL REFERENCES users,
			activity_id bigint NOT NULL REFERENCES activities,
			created_at timestamptz NOT NULL DEFAULT now(),
			UNIQUE (user_id, activity_id))`); err != nil {
		return nil, err
	}
	a := &app{pool: pool}
	if err := pool.QueryRow(ctx, `INSERT INTO activities (title) VALUES ('Launch day') RETURNING id`).Scan(&a.activityID); err != nil {
		return nil, err
	}
	return a, nil
}

// userOf is the demo's authentication: the X-User header the page sends.
func userOf(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.Header.Get("X-User"), 10, 64)
	if err != nil || id < 1 || id > 5 {
		return 0, errors.New("unknown user (1-5)")
	}
	return id, nil
}

func (a *app) routes() http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(static, "static")
	mux.Handle("GET /", http.FileServerFS(sub))
	mux.HandleFunc("GET /api/activity", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"activityId": a.activityID})
	})
	mux.HandleFunc("GET /api/idem-token", a.issueToken)
	mw, err := idemhttp.Middleware(a.pool, idemhttp.Config{
		Scope: func(r *http.Request) (string, error) {
			id, err := userOf(r)
			return "user:" + strconv.FormatInt(id, 10), err
		},
		Options: []idem.DoOption{idem.RequireIssued()},
	})
	if err != nil {
		panic(err) // a static configuration: a programming error
	}
	mux.Handle("POST /api/signup", a.dropping(mw(http.HandlerFunc(a.signup))))
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// issueToken hands the page a submission token when it opens.
func (a *app) issueToken(w http.ResponseWriter, r *http.Request) {
	user, err := userOf(r)
	if err != nil {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"message": err.Error()})
		return
	}
	token, err := idem.IssueToken(r.Context(), a.pool, "user:"+strconv.FormatInt(user, 10), 30*time.Minute)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"message": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"token": token})
}

// signup runs once per token, inside the request's transaction.
func (a *app) signup(w http.ResponseWriter, r *http.Request) {
	user, _ := userOf(r) // the middleware checked it
	var req struct {
		ActivityID int64 `json:"activityId"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ActivityID == 0 {
		writeJSON(w, http.StatusBadRequest, map[string]any{"ok": false, "message": "want {\"activityId\": N}"})
		return
	}
	var id int64
	created, err := idem.InsertOrGet(r.Context(), idemhttp.Tx(r.Context()),
		idem.Query{SQL: `INSERT INTO signups (user_id, activity_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING id`, Args: []any{user, req.ActivityID}},
		idem.Query{SQL: `SELECT id FROM signups WHERE user_id = $1 AND activity_id = $2`, Args: []any{user, req.ActivityID}},
		&id)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false, "message": err.Error()})
		return
	}
	if !created {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "already": true, "signupId": id, "message": "You are already signed up."})
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"ok": true, "signupId": id, "message": "Signed up!"})
}

// dropping commits the sign-up, then, for the first dropFirst requests,
// waits dropDelay and drops the connection instead of answering.
func (a *app) dropping(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.dropFirst.Load() <= 0 {
			next.ServeHTTP(w, r)
			return
		}
		rec := &bufferedWriter{header: http.Header{}}
		next.ServeHTTP(rec, r) // committed here
		if rec.status < 300 && a.dropFirst.Add(-1) >= 0 {
			time.Sleep(a.dropDelay)
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		for k, vs := range rec.header {
			w.Header()[k] = vs
		}
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body)
	})
}

type bufferedWriter struct {
	header http.Header
	status int
	body   []byte
}

func (b *bufferedWriter) Header() http.Header { return b.header }
func (b *bufferedWriter) WriteHeader(s int) {
	if b.status == 0 {
		b.status = s
	}
}
func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	b.body = append(b.body, p...)
	return len(p), nil
}
