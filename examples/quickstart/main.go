// Command quickstart replays the launch of a popular activity sign-up against
// a real database, PostgreSQL or MySQL/MariaDB: 500 users send about 2,000
// submissions in a burst (double clicks, responses lost on the way back and
// retried with the same key, late resubmits from a reloaded page), and every
// sign-up goes through idem's WithIdempotency into a table that has no
// unique constraint. It prints what happened and checks that the table
// holds exactly one row per user.
//
//	DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' go run ./examples/quickstart
//	DATABASE_URL='mysql://root@127.0.0.1:3306/test' go run ./examples/quickstart
//
// It connects with DATABASE_URL (and says what to set when it is unset),
// whose scheme picks the driver: pgx and idem.WithIdempotency for
// postgres://, database/sql with go-sql-driver/mysql and
// idemmysql.WithIdempotency for mysql://. It keeps its table and idem's
// apart, in the schema quickstart_example on PostgreSQL, in the database
// quickstart_example on MySQL, created if missing, applies idem's
// migrations there, and can be run again and again: each run opens a new
// activity. DROP SCHEMA quickstart_example CASCADE (PostgreSQL) or DROP
// DATABASE quickstart_example (MySQL) removes all it made.
//
// The sign-up itself is written once (server.submit); the SQL that differs
// between the two databases is in store_postgres.go and store_mysql.go.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/exampledb"
)

// schema holds the quickstart's table and idem's: the schema of that name
// on PostgreSQL (the pool's search_path is set to it, so the unqualified
// names resolve there), the database of that name on MySQL.
const schema = "quickstart_example"

func main() {
	users := flag.Int("users", 500, "users signing up")
	flag.Parse()
	if err := run(context.Background(), *users, os.Getenv("DATABASE_URL"), schema, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// receipt is what the sign-up endpoint answers, and what idem records and
// replays.
type receipt struct {
	SignupID int64  `json:"signup_id"`
	Message  string `json:"message"`
}

// store is the quickstart's SQL, one implementation per database:
// pgStore (PostgreSQL through pgx) and mysqlStore (MySQL and MariaDB
// through database/sql).
type store interface {
	// setUp applies idem's migrations, creates the sign-up table if it is
	// missing and returns the next activity's ID.
	setUp(ctx context.Context) (activityID int64, err error)
	// signUp writes userID's sign-up to activityID at most once per key,
	// in a transaction of its own, with idem's WithIdempotency and
	// idem.NoWait (a duplicate in flight is idem.ErrInProgress), and
	// returns the receipt or its replay.
	signUp(ctx context.Context, key idem.Key, activityID, userID int64) (idem.Result[receipt], error)
	// count counts the activity's rows and distinct users.
	count(ctx context.Context, activityID int64) (rows, users int, err error)
}

// signedUp is the receipt of a sign-up that wrote the row id.
func signedUp(id int64) receipt { return receipt{SignupID: id, Message: "signed up"} }

// server is the sign-up backend.
type server struct {
	store      store
	activityID int64

	requests, executions, replays, inProgress atomic.Int64
}

// errBusy is the 409 answer: the first submission with this key is still
// being processed.
var errBusy = errors.New("409 in progress")

// submit handles POST /api/signup for one user with the key the page made
// when the form opened.
func (s *server) submit(ctx context.Context, userID int64, formKey string) (receipt, error) {
	s.requests.Add(1)
	key := idem.Key{Scope: fmt.Sprintf("user:%d", userID), ID: formKey}
	res, err := s.store.signUp(ctx, key, s.activityID, userID)
	if errors.Is(err, idem.ErrInProgress) {
		s.inProgress.Add(1)
		return receipt{}, errBusy
	}
	if err != nil {
		return receipt{}, err
	}
	if res.Replayed {
		s.replays.Add(1)
	} else {
		s.executions.Add(1)
	}
	return res.Value, nil
}

// send is the page's fetch: on a 409 it waits a little and sends again with
// the same key, as the page would.
func (s *server) send(ctx context.Context, userID int64, formKey string) (receipt, error) {
	for {
		r, err := s.submit(ctx, userID, formKey)
		if !errors.Is(err, errBusy) {
			return r, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// user plays one visitor: the form opens (the key is made), the button is
// clicked twice at once, one response is lost and the page retries with the
// same key, and later the visitor reloads and submits again.
func (s *server) user(ctx context.Context, userID int64) (receipt, error) {
	formKey := newFormKey()
	var wg sync.WaitGroup
	answers := make([]receipt, 2)
	errs := make([]error, 2)
	for i := range 2 { // the double click
		wg.Go(func() { answers[i], errs[i] = s.send(ctx, userID, formKey) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return receipt{}, err
	}
	// The first response was lost on the way back (a mobile network timing
	// out): the page retries with the same key.
	retry, err := s.send(ctx, userID, formKey)
	if err != nil {
		return receipt{}, err
	}
	// The visitor reloads the page, which kept the pending key, and submits
	// once more.
	late, err := s.send(ctx, userID, formKey)
	if err != nil {
		return receipt{}, err
	}
	for _, r := range []receipt{answers[1], retry, late} {
		if r != answers[0] {
			return receipt{}, fmt.Errorf("user %d got two different answers: %+v and %+v", userID, answers[0], r)
		}
	}
	return answers[0], nil
}

func newFormKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// run plays the launch with users on the database at databaseURL, with
// the tables under name (a schema on PostgreSQL, a database on MySQL),
// printing to out.
func run(ctx context.Context, users int, databaseURL, name string, out io.Writer) error {
	if users < 1 {
		return fmt.Errorf("-users must be at least 1")
	}
	// 32 connections serve the burst (pgxpool's default is 4, or one per CPU).
	db, err := exampledb.Open(ctx, databaseURL, name, exampledb.Options{MaxConns: 32})
	if err != nil {
		return err
	}
	defer db.Close()
	var st store = pgStore{db.Pool}
	if db.SQL != nil {
		st = mysqlStore{db.SQL}
	}
	s := &server{store: st}
	if s.activityID, err = st.setUp(ctx); err != nil {
		return err
	}

	fmt.Fprintf(out, "idem quickstart: the launch of activity %d\n", s.activityID)
	fmt.Fprintln(out, db.Where())
	fmt.Fprintf(out, "%d users open the form and submit: a double click, a lost response retried, a late resubmit (%d submissions)\n\n",
		users, 4*users)

	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, users)
	for u := range users {
		wg.Go(func() {
			if _, err := s.user(ctx, int64(u+1)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		return err
	}

	rows, distinct, err := st.count(ctx, s.activityID)
	if err != nil {
		return err
	}
	req := s.requests.Load()
	fmt.Fprintf(out, "requests:      %6d (submissions, with 409 answers resent)\n", req)
	fmt.Fprintf(out, "executions:    %6d (sign-ups written)\n", s.executions.Load())
	fmt.Fprintf(out, "replays:       %6d (answered with the first result)\n", s.replays.Load())
	fmt.Fprintf(out, "in progress:   %6d (409: the first submission was still running)\n", s.inProgress.Load())
	fmt.Fprintf(out, "rows in quickstart_signups for activity %d: %d (users: %d)\n", s.activityID, rows, users)
	fmt.Fprintf(out, "elapsed:       %v, %.0f requests/s\n", elapsed.Round(time.Millisecond), float64(req)/elapsed.Seconds())
	if rows != users || distinct != users || s.executions.Load() != int64(users) {
		return fmt.Errorf("FAIL: %d rows for %d distinct users, %d executions; want %d of each", rows, distinct, s.executions.Load(), users)
	}
	fmt.Fprintln(out, "OK: one sign-up per user, every repeat answered with the first result")
	return nil
}
