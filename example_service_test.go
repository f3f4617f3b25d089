package idem_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/migrations"
)

// The pieces of a service that README.md shows, with the imports it shows;
// docs/guide.md's are in example_guide_test.go. Example_service and the
// package's examples run them.

// submit signs user 42 up to activity 8 three times with one key.
func submit(ctx context.Context, pool *pgxpool.Pool) {
	type receipt struct {
		SignupID int64  `json:"signup_id"`
		Message  string `json:"message"`
	}
	key := idem.Key{Scope: "user:42", ID: "form-0b1d2e"} // the user, and the key the form made when it opened

	for range 3 { // a double click, then a retry after a timeout
		res, err := idem.Do(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) (receipt, error) {
			var id int64
			err := tx.QueryRow(ctx, `INSERT INTO signups (user_id, activity_id) VALUES (42, 8) RETURNING id`).Scan(&id)
			return receipt{SignupID: id, Message: "you are in"}, err // recorded in the same COMMIT
		})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%+v replayed=%v\n", res.Value, res.Replayed) // the same receipt every time
	}
}

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
