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
// The page shows every request it sends, with its key, its status and its
// Idempotent-Replayed header, and has two switches for network trouble: one
// asks the server to commit the next sign-up and then drop the connection
// without answering (see pagekit.DropResponses), the other keeps the page offline
// for a few seconds. Either way the page resends with the same token, and
// the answer comes from the record.
//
// It connects with DATABASE_URL (and says what to set when it is unset),
// keeps its tables and idem's in the schema signup_example, created if
// missing (DROP SCHEMA signup_example CASCADE removes them), and seeds users
// 1 to 5 (open /?user=2 to be user 2) and, at each start, a new activity
// with all its seats free.
package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/examples/internal/pagekit"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/migrations"
)

const schema = "signup_example"

//go:embed static
var static embed.FS

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, os.Getenv("DATABASE_URL"), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run serves the example on addr until ctx is done. It binds addr before it
// touches the database, so that a start that cannot serve (the port is
// taken) fails without writing anything, and says where to go only once the
// address is bound.
func run(ctx context.Context, addr, databaseURL string, out io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	pool, err := connect(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	app, err := newApp(ctx, pool)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: app.routes(), ReadHeaderTimeout: 5 * time.Second}
	// Once ctx is done, stop taking requests and let those in flight finish
	// (for up to 10s) before the pool closes: an answer cut off here is
	// exactly the lost response the page guards against.
	shutdown := make(chan error, 1)
	stopServing := context.AfterFunc(ctx, func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shutdown <- srv.Shutdown(c)
	})
	defer stopServing()
	fmt.Fprintf(out, "sign-up example: listening on http://%s/?user=1 (users 1-5, activity %d)\n", ln.Addr(), app.activityID)
	fmt.Fprintln(out, exampledb.Where(pool, schema))
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return <-shutdown
}

func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return exampledb.Connect(ctx, url, schema)
}

// app is the sign-up service.
type app struct {
	pool       *pgxpool.Pool
	activityID int64
}

func newApp(ctx context.Context, pool *pgxpool.Pool) (*app, error) {
	if err := migrations.Up(ctx, pool, migrations.WithTable(schema, idem.DefaultTable)); err != nil {
		return nil, err
	}
	// The unique business key is the last gate: one sign-up per user and
	// activity, whatever the tokens say.
	if _, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS activities (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			title text NOT NULL,
			place text NOT NULL DEFAULT '',
			starts_at timestamptz NOT NULL DEFAULT now(),
			seats int NOT NULL DEFAULT 12,
			taken int NOT NULL DEFAULT 0);
		-- An earlier version of this example made activities without these.
		ALTER TABLE activities
			ADD COLUMN IF NOT EXISTS place text NOT NULL DEFAULT '',
			ADD COLUMN IF NOT EXISTS starts_at timestamptz NOT NULL DEFAULT now(),
			ADD COLUMN IF NOT EXISTS seats int NOT NULL DEFAULT 12,
			ADD COLUMN IF NOT EXISTS taken int NOT NULL DEFAULT 0;
		CREATE TABLE IF NOT EXISTS users (id bigint PRIMARY KEY, name text NOT NULL);
		INSERT INTO users (id, name) VALUES
			(1, 'Ada Lovelace'), (2, 'Grace Hopper'), (3, 'Alan Turing'),
			(4, 'Katherine Johnson'), (5, 'Edsger Dijkstra')
		ON CONFLICT (id) DO UPDATE SET name = excluded.name;
		CREATE TABLE IF NOT EXISTS signups (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			user_id bigint NOT NULL REFERENCES users,
			activity_id bigint NOT NULL REFERENCES activities,
			created_at timestamptz NOT NULL DEFAULT now(),
			UNIQUE (user_id, activity_id))`); err != nil {
		return nil, err
	}
	// Each start adds an activity, three days ahead, with all its seats free.
	a := &app{pool: pool}
	if err := pool.QueryRow(ctx, `
		INSERT INTO activities (title, place, starts_at, seats)
		VALUES ('Sunrise trail run', 'Riverside Park, north gate', date_trunc('day', now()) + interval '3 days 7 hours', 12)
		RETURNING id`).Scan(&a.activityID); err != nil {
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

func scopeOf(user int64) string { return "user:" + strconv.FormatInt(user, 10) }

func (a *app) routes() http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(static, "static")
	mux.Handle("GET /", http.FileServerFS(sub))
	mux.Handle("GET "+pagekit.Prefix, pagekit.Handler()) // the stylesheet and panel.js, shared with the other page
	mux.HandleFunc("GET /api/activity", a.activity)
	mux.HandleFunc("GET /api/idem-token", a.issueToken)
	mw, err := idemhttp.Middleware(a.pool, idemhttp.Config{
		Scope: func(r *http.Request) (string, error) {
			id, err := userOf(r)
			return scopeOf(id), err
		},
		Options: []idem.DoOption{idem.RequireIssued()},
	})
	if err != nil {
		panic(err) // a static configuration: a programming error
	}
	mux.Handle("POST /api/signup", pagekit.DropResponses(mw(http.HandlerFunc(a.signup))))
	return mux
}

// internalError logs err and answers 500 without its text, which may quote
// SQL or name tables. idemhttp records no 5xx: the page may retry.
func internalError(w http.ResponseWriter, r *http.Request, err error) {
	log.Printf("%s %s: %v", r.Method, r.URL.Path, err)
	pagekit.Problem(w, http.StatusInternalServerError, "internal", "Something went wrong on our side; please try again.")
}

// unknownUser answers a request from a user the demo does not know.
func unknownUser(w http.ResponseWriter, r *http.Request) {
	pagekit.Problem(w, http.StatusUnauthorized, "unknown-user",
		fmt.Sprintf("There is no user %q in this demo: open the page as user 1 to 5 (?user=1).", r.Header.Get("X-User")))
}

// activity tells the page what it shows when it opens and after each
// answer: the activity and its free seats, for anyone, and, for a known
// user, who they are and whether they hold a seat, so that a reload after
// signing up says so.
func (a *app) activity(w http.ResponseWriter, r *http.Request) {
	user, _ := userOf(r) // 0, no user, when unknown
	type activity struct {
		ID        int64     `json:"id"`
		Title     string    `json:"title"`
		Place     string    `json:"place"`
		StartsAt  time.Time `json:"startsAt"`
		Seats     int       `json:"seats"`
		SeatsLeft int       `json:"seatsLeft"`
	}
	type person struct {
		ID   int64  `json:"id"`
		Name string `json:"name"`
	}
	var resp struct {
		Activity activity `json:"activity"`
		User     *person  `json:"user"` // null for an unknown user
		// SignupID is the user's sign-up, if any.
		SignupID *int64 `json:"signupId"`
		// Rows counts the user's rows in signups for the activity: the
		// number the page shows to prove that resends added none.
		Rows int `json:"rows"`
	}
	act := &resp.Activity
	var userID *int64
	var name *string
	err := a.pool.QueryRow(r.Context(), `
		SELECT a.id, a.title, a.place, a.starts_at, a.seats, a.seats - a.taken,
		       u.id, u.name,
		       (SELECT min(s.id) FROM signups s WHERE s.activity_id = a.id AND s.user_id = u.id),
		       (SELECT count(*) FROM signups s WHERE s.activity_id = a.id AND s.user_id = u.id)
		FROM activities a LEFT JOIN users u ON u.id = $2
		WHERE a.id = $1`, a.activityID, user).Scan(
		&act.ID, &act.Title, &act.Place, &act.StartsAt, &act.Seats, &act.SeatsLeft,
		&userID, &name, &resp.SignupID, &resp.Rows)
	if err != nil {
		internalError(w, r, err)
		return
	}
	if userID != nil {
		resp.User = &person{ID: *userID, Name: *name}
	}
	pagekit.JSON(w, http.StatusOK, resp)
}

// issueToken hands the page a submission token when it opens.
func (a *app) issueToken(w http.ResponseWriter, r *http.Request) {
	user, err := userOf(r)
	if err != nil {
		unknownUser(w, r)
		return
	}
	token, err := idem.IssueToken(r.Context(), a.pool, scopeOf(user), 30*time.Minute)
	if err != nil {
		internalError(w, r, err)
		return
	}
	pagekit.JSON(w, http.StatusOK, map[string]string{"token": token})
}

// signup runs once per token, inside the request's transaction: its writes
// and its answer commit together, and a repeat of the token gets this
// answer again without running it.
func (a *app) signup(w http.ResponseWriter, r *http.Request) {
	user, _ := userOf(r) // the middleware checked it
	var req struct {
		ActivityID int64 `json:"activityId"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ActivityID <= 0 {
		pagekit.Problem(w, http.StatusBadRequest, "bad-request", `Send {"activityId": N}.`)
		return
	}
	ctx, tx := r.Context(), idemhttp.Tx(r.Context())

	// Lock the activity's row: sign-ups to it queue here. Each sign-up counts
	// its seat in that row (taken), so the next one in the queue reads the
	// count its predecessor committed: a FOR UPDATE that waited reads the
	// row's new version (at REPEATABLE READ or above it fails with 40001
	// instead, which the middleware's Do retries). Counting the signups rows
	// here would not do: their count is read before the wait. A missing
	// activity is a 404 here, rather than a foreign key error later.
	var seatsLeft int
	err := tx.QueryRow(ctx, `SELECT seats - taken FROM activities WHERE id = $1 FOR UPDATE`, req.ActivityID).Scan(&seatsLeft)
	if errors.Is(err, pgx.ErrNoRows) {
		pagekit.Problem(w, http.StatusNotFound, "activity-not-found", fmt.Sprintf("There is no activity %d.", req.ActivityID))
		return
	}
	if err != nil {
		internalError(w, r, err)
		return
	}

	var id int64
	created := false
	lookup := idem.Query{SQL: `SELECT id FROM signups WHERE user_id = $1 AND activity_id = $2`, Args: []any{user, req.ActivityID}}
	if seatsLeft > 0 {
		// The business key decides: a second device (another token) gets
		// the existing sign-up, not an error.
		created, err = idem.InsertOrGet(ctx, tx,
			idem.Query{SQL: `INSERT INTO signups (user_id, activity_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING id`, Args: []any{user, req.ActivityID}},
			lookup, &id)
	} else {
		// Full, unless this user already holds one of the seats.
		err = tx.QueryRow(ctx, lookup.SQL, lookup.Args...).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			// 422, not 409: idemhttp records the answer, and a resend of
			// this token gets it again. (A 409 is left unrecorded for the
			// client to retry.)
			pagekit.Problem(w, http.StatusUnprocessableEntity, "activity-full", "Sorry, every seat is taken.")
			return
		}
	}
	if err != nil {
		internalError(w, r, err)
		return
	}
	if !created {
		pagekit.JSON(w, http.StatusOK, map[string]any{"ok": true, "already": true, "signupId": id, "message": "You are already signed up."})
		return
	}
	if _, err := tx.Exec(ctx, `UPDATE activities SET taken = taken + 1 WHERE id = $1`, req.ActivityID); err != nil {
		internalError(w, r, err)
		return
	}
	pagekit.JSON(w, http.StatusCreated, map[string]any{"ok": true, "signupId": id, "seatsLeft": seatsLeft - 1, "message": "Signed up! See you at the start."})
}
