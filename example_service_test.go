package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/migrations"
)

// The pieces of a small service, as the README shows them: Example_service
// runs them.

// open connects to the database and creates idem's tables, as a service
// does once when it starts.
func open(ctx context.Context, databaseURL string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	if err := migrations.Up(ctx, pool); err != nil { // creates idem's tables, or does nothing if they are up to date
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// keyOf is the idempotency key of a request from the user userID.
func keyOf(r *http.Request, userID string) (idem.Key, error) {
	id, err := idemhttp.ParseKey(r.Header) // the Idempotency-Key header the client made when the form opened
	return idem.Key{
		Scope: "user:" + userID, // whose key it is: one user's key never replays another user's result
		ID:    id,
	}, err
}

// signUp signs user 42 up to activity 7, once per key, in a transaction of
// the caller's making that other work could share.
func signUp(ctx context.Context, pool *pgxpool.Pool, key idem.Key) (idem.Result[int64], error) {
	signup := func(ctx context.Context, tx pgx.Tx) (int64, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO signups (user_id, activity_id) VALUES (42, 7) RETURNING id`).Scan(&id)
		return id, err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return idem.Result[int64]{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	res, err := idem.WithIdempotency(ctx, tx, key, signup) // signup runs in a savepoint, once per key
	if err != nil {
		return res, err // fn's error, or idem's: the deferred Rollback undoes everything
	}
	return res, tx.Commit(ctx) // the sign-up and its record commit together
}

// charge pays for the order key names once, outside any transaction, under
// a lease.
func charge(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
	lease, res, err := idem.Claim[string](ctx, pool, key, 30*time.Second)
	switch {
	case err != nil:
		return err // idem.ErrInProgress: another worker holds a live lease, answer 409
	case lease == nil: // finished before: the recorded result
		fmt.Println("replayed:", res.Value)
		return nil
	}
	workCtx, stop := lease.KeepAlive(ctx, pool) // renews the lease; workCtx ends if it is lost
	if lease.RecoveryPoint() == "" {            // a takeover resumes from the last checkpoint
		if err := lease.Checkpoint(workCtx, pool, "charging", nil); err != nil {
			stop()
			return err
		}
	}
	// ... call the payment gateway with key.ID and lease.Attempt(), the fencing token ...
	fmt.Println("charging with fencing token", lease.Attempt())
	err = lease.Complete(workCtx, pool, "ch_123") // ErrLeaseLost if another worker took over
	if serr := stop(); err == nil {
		err = serr
	}
	return err
}

// routes serves POST /signups once per (user, Idempotency-Key).
func routes(pool *pgxpool.Pool) (*http.ServeMux, error) {
	mw, err := idemhttp.Middleware(pool, idemhttp.Config{
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }, // the authenticated user
	})
	if err != nil {
		return nil, err
	}
	signup := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id int64
		activity, _ := io.ReadAll(r.Body)
		err := idemhttp.Tx(r.Context()).QueryRow(r.Context(), // the request's transaction
			`INSERT INTO signups (user_id, activity_id) VALUES ($1, $2) RETURNING id`,
			r.Header.Get("X-User"), string(activity)).Scan(&id)
		if err != nil {
			http.Error(w, "database", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "sign-up %d", id)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /signups", mw(signup)) // runs once per (user, key)
	return mux, nil
}

// order posts an order to url, retrying a lost answer or a 503 with the
// same key.
func order(url string) (*http.Response, error) {
	client := &http.Client{Transport: &idemhttp.Transport{
		NewKey: func() string { return "key-1" }, // random by default
	}}
	return client.Post(url, "text/plain", strings.NewReader("order"))
}
