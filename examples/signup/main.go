// Command signup is the flash activity sign-up of the scenarios, with idem
// underneath: the page asks the server for a submission token when it opens
// (idem.IssueToken), the button cannot fire twice, a retry after a timeout
// reuses the token, the server accepts only tokens it issued
// (idem.RequireIssued behind idemhttp.Middleware), answers 409 while the
// first submission is in flight, replays the first answer to repeats, and
// the business key (user, activity) turns a second sign-up from another
// device into "already signed up" (idem.InsertOrGet on PostgreSQL; an INSERT
// and, on a duplicate key, a locking read of the existing row on MySQL)
// instead of an error.
//
//	DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' go run ./examples/signup
//	DATABASE_URL='mysql://root@127.0.0.1:3306/test' go run ./examples/signup
//
// and open the URL it prints.
//
// The page shows every request it sends, with its key, its status and its
// Idempotent-Replayed header, and has two switches for network trouble: one
// asks the server to commit the next sign-up and then drop the connection
// without answering (see pagekit.DropResponses), the other keeps the page offline
// for a few seconds. Either way the page resends with the same token, and
// the answer comes from the record.
//
// It connects with DATABASE_URL (and says what to set when it is unset),
// whose scheme picks the driver: pgx for postgres://, database/sql with
// go-sql-driver/mysql for mysql:// (MySQL 8 or MariaDB; idemhttp.MySQL and
// idemmysql.IssueToken). It keeps its tables and idem's in the schema
// signup_example on PostgreSQL, in the database signup_example on MySQL,
// created if missing (DROP SCHEMA signup_example CASCADE, or DROP DATABASE
// signup_example, removes them), and seeds users 1 to 5 (open /?user=2 to
// be user 2) and, at each start, a new activity with all its seats free.
//
// The handlers are written once; the SQL that differs between the two
// databases is behind the store interface, in store_postgres.go and
// store_mysql.go.
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

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/examples/internal/pagekit"
	"github.com/idemkit/idem/idemhttp"
)

// schema holds the example's tables and idem's: a schema on PostgreSQL, a
// database on MySQL.
const schema = "signup_example"

//go:embed static
var static embed.FS

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, os.Getenv("DATABASE_URL"), schema, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run serves the example on addr until ctx is done, with its tables under
// name. It binds addr before it touches the database, so that a start that
// cannot serve (the port is taken) fails without writing anything, and
// says where to go only once the address is bound.
func run(ctx context.Context, addr, databaseURL, name string, out io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	db, err := connect(ctx, databaseURL, name)
	if err != nil {
		return err
	}
	defer db.Close()
	app, err := newApp(ctx, db, name)
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
	fmt.Fprintln(out, db.Where())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return <-shutdown
}

// connect opens the database of url with the tables under name. On MySQL
// the activity's start scans into a time.Time (parseTime).
func connect(ctx context.Context, url, name string) (*exampledb.DB, error) {
	return exampledb.Open(ctx, url, name, exampledb.Options{ParseTime: true})
}

// store is the sign-up's SQL, one implementation per database: pgStore
// (PostgreSQL through pgx) and mysqlStore (MySQL and MariaDB through
// database/sql). The methods marked "in the request's transaction" run in
// the transaction of the idempotency middleware, which they find in ctx.
type store interface {
	// setUp applies idem's migrations and creates the tables if they are
	// missing, with the demo's users.
	setUp(ctx context.Context) error
	// addActivity adds an activity three days ahead with all its seats
	// free.
	addActivity(ctx context.Context, title, place string, seats int) (int64, error)
	// activity reads the activity and what user holds of it (user 0, or
	// an unknown one, holds nothing).
	activity(ctx context.Context, activityID, user int64) (activityView, error)
	// issueToken hands out a submission token in scope.
	issueToken(ctx context.Context, scope string, ttl time.Duration) (string, error)
	// middleware is idem's HTTP middleware on this database.
	middleware(cfg idemhttp.Config) (func(http.Handler) http.Handler, error)

	// lockActivity locks the activity's row, in the request's
	// transaction, and returns its free seats; found is false when there
	// is no such activity.
	lockActivity(ctx context.Context, activityID int64) (seatsLeft int, found bool, err error)
	// insertOrGet creates user's sign-up to the activity, in the
	// request's transaction, or returns the existing one (created false):
	// the unique business key (user, activity) decides, and a duplicate is
	// never an error.
	insertOrGet(ctx context.Context, user, activityID int64) (id int64, created bool, err error)
	// findSignup returns user's sign-up to the activity, in the request's
	// transaction, if there is one.
	findSignup(ctx context.Context, user, activityID int64) (id int64, found bool, err error)
	// takeSeat counts one more seat taken, in the request's transaction.
	takeSeat(ctx context.Context, activityID int64) error
}

// activityView is what the page shows of the activity, and of the user.
type activityView struct {
	ID        int64     `json:"id"`
	Title     string    `json:"title"`
	Place     string    `json:"place"`
	StartsAt  time.Time `json:"startsAt"`
	Seats     int       `json:"seats"`
	SeatsLeft int       `json:"seatsLeft"`

	// UserID and UserName are the user's, nil for an unknown user.
	UserID   *int64  `json:"-"`
	UserName *string `json:"-"`
	// SignupID is the user's sign-up, if any.
	SignupID *int64 `json:"-"`
	// Rows counts the user's rows in signups for the activity.
	Rows int `json:"-"`
}

// app is the sign-up service.
type app struct {
	db         *exampledb.DB
	store      store
	activityID int64
}

// newApp sets the tables up under name (the schema or database db uses)
// and adds the activity of this start.
func newApp(ctx context.Context, db *exampledb.DB, name string) (*app, error) {
	var st store = pgStore{pool: db.Pool, schema: name}
	if db.SQL != nil {
		st = mysqlStore{db: db.SQL}
	}
	if err := st.setUp(ctx); err != nil {
		return nil, err
	}
	// Each start adds an activity, three days ahead, with all its seats free.
	a := &app{db: db, store: st}
	var err error
	if a.activityID, err = st.addActivity(ctx, "Sunrise trail run", "Riverside Park, north gate", 12); err != nil {
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
	mw, err := a.store.middleware(idemhttp.Config{
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
	type person struct {
		ID   int64  `json:"id"`
		Name string `json:"name"`
	}
	var resp struct {
		Activity activityView `json:"activity"`
		User     *person      `json:"user"` // null for an unknown user
		// SignupID is the user's sign-up, if any.
		SignupID *int64 `json:"signupId"`
		// Rows counts the user's rows in signups for the activity: the
		// number the page shows to prove that resends added none.
		Rows int `json:"rows"`
	}
	act, err := a.store.activity(r.Context(), a.activityID, user)
	if err != nil {
		internalError(w, r, err)
		return
	}
	resp.Activity, resp.SignupID, resp.Rows = act, act.SignupID, act.Rows
	if act.UserID != nil {
		resp.User = &person{ID: *act.UserID, Name: *act.UserName}
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
	token, err := a.store.issueToken(r.Context(), scopeOf(user), 30*time.Minute)
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
	ctx := r.Context()

	// Lock the activity's row: sign-ups to it queue here. Each sign-up counts
	// its seat in that row (taken), so the next one in the queue reads the
	// count its predecessor committed: a locking read that waited reads the
	// row's latest version (on PostgreSQL at REPEATABLE READ or above it
	// fails with 40001 instead, which the middleware's Do retries). Counting
	// the signups rows here would not do: their count may be read before
	// the wait. A missing activity is a 404 here, rather than a foreign key
	// error later.
	seatsLeft, found, err := a.store.lockActivity(ctx, req.ActivityID)
	if err != nil {
		internalError(w, r, err)
		return
	}
	if !found {
		pagekit.Problem(w, http.StatusNotFound, "activity-not-found", fmt.Sprintf("There is no activity %d.", req.ActivityID))
		return
	}

	var id int64
	created := false
	if seatsLeft > 0 {
		// The business key decides: a second device (another token) gets
		// the existing sign-up, not an error.
		id, created, err = a.store.insertOrGet(ctx, user, req.ActivityID)
	} else {
		// Full, unless this user already holds one of the seats.
		var holds bool
		id, holds, err = a.store.findSignup(ctx, user, req.ActivityID)
		if err == nil && !holds {
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
	if err := a.store.takeSeat(ctx, req.ActivityID); err != nil {
		internalError(w, r, err)
		return
	}
	pagekit.JSON(w, http.StatusCreated, map[string]any{"ok": true, "signupId": id, "seatsLeft": seatsLeft - 1, "message": "Signed up! See you at the start."})
}
