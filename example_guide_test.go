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
)

// The pieces of a service that docs/guide.md shows, with the imports it
// shows. Example_service and the package's examples run them.

// keyOf is the idempotency key of a request from the user userID.
func keyOf(r *http.Request, userID string) (idem.Key, error) {
	id, err := idemhttp.ParseKey(r.Header) // the Idempotency-Key header the client made when the form opened
	return idem.Key{
		Scope: "user:" + userID, // whose key it is: one user's key never replays another user's result
		ID:    id,
	}, err
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

// consume handles message m-1 of the sign-up events once, however often
// the broker delivers it, and reports whether this delivery processed it.
func consume(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit

	ran, err := idem.ConsumeOnce(ctx, tx, "signup-events", "m-1", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO signups (user_id, activity_id) VALUES (42, 9)`)
		return err
	})
	if err != nil {
		return false, err
	}
	return ran, tx.Commit(ctx) // a redelivery: ran is false, and the broker is acked
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
