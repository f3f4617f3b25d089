// Command quickstart replays the launch of a popular activity sign-up against
// a real PostgreSQL: 500 users send about 2,000 submissions in a burst (double
// clicks, responses lost on the way back and retried with the same key, late
// resubmits from a reloaded page), and every sign-up goes through
// idem.WithIdempotency into a table that has no unique constraint. It prints
// what happened and checks that the table holds exactly one row per user.
//
//	DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' go run ./examples/quickstart
//
// It connects with DATABASE_URL (and says what to set when it is unset),
// keeps its table and idem's in the schema quickstart_example, created if
// missing, applies idem's migrations there, and can be run again and again:
// each run opens a new activity. DROP SCHEMA quickstart_example CASCADE
// removes all it made.
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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/migrations"
)

// schema holds the quickstart's table and idem's: the pool's search_path is
// set to it, so the unqualified names below resolve there.
const schema = "quickstart_example"

func main() {
	users := flag.Int("users", 500, "users signing up")
	flag.Parse()
	if err := run(context.Background(), *users, os.Getenv("DATABASE_URL"), os.Stdout); err != nil {
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

// server is the sign-up backend.
type server struct {
	pool       *pgxpool.Pool
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
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return receipt{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	key := idem.Key{Scope: fmt.Sprintf("user:%d", userID), ID: formKey}
	res, err := idem.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx pgx.Tx) (receipt, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO quickstart_signups (activity_id, user_id) VALUES ($1, $2) RETURNING id`,
			s.activityID, userID).Scan(&id)
		return receipt{SignupID: id, Message: "signed up"}, err
	}, idem.NoWait())
	if errors.Is(err, idem.ErrInProgress) {
		s.inProgress.Add(1)
		return receipt{}, errBusy
	}
	if err != nil {
		return receipt{}, err
	}
	if err := tx.Commit(ctx); err != nil {
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

// run plays the launch with users on the database at databaseURL, printing
// to out.
func run(ctx context.Context, users int, databaseURL string, out io.Writer) error {
	if users < 1 {
		return fmt.Errorf("-users must be at least 1")
	}
	// 32 connections serve the burst (pgxpool's default is 4, or one per CPU).
	pool, err := exampledb.Connect(ctx, databaseURL, schema, func(cfg *pgxpool.Config) { cfg.MaxConns = 32 })
	if err != nil {
		return err
	}
	defer pool.Close()
	// Unqualified, idem's tables go where the quickstart's do: into the first
	// schema of the search_path.
	if err := migrations.Up(ctx, pool); err != nil { // creates idem's tables, or does nothing if they are up to date
		return err
	}
	// The sign-up table deliberately has no unique constraint: a duplicate
	// sign-up would show as a second row.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS quickstart_signups (
		id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		activity_id bigint NOT NULL,
		user_id     bigint NOT NULL,
		created_at  timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	s := &server{pool: pool}
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(activity_id), 0) + 1 FROM quickstart_signups`).Scan(&s.activityID); err != nil {
		return err
	}

	fmt.Fprintf(out, "idem quickstart: the launch of activity %d\n", s.activityID)
	fmt.Fprintln(out, exampledb.Where(pool, schema))
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

	var rows, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT user_id) FROM quickstart_signups WHERE activity_id = $1`,
		s.activityID).Scan(&rows, &distinct); err != nil {
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
