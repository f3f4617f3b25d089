package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
)

// The examples compile but do not run: they need a database and a driver
// registered with database/sql, which this package does not import.

// Do runs fn once per key on a *sql.DB; fn writes through the *sql.Tx.
func ExampleWrap() {
	ctx := context.Background()
	// Import _ "github.com/lib/pq" for "postgres", or
	// _ "github.com/jackc/pgx/v5/stdlib" for "pgx".
	db, err := sql.Open("postgres", os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer db.Close()

	key := idem.Key{Scope: "user:42", ID: "signup-7f3a"}
	res, err := idem.Do(ctx, idemsql.Wrap(db), key, func(ctx context.Context, tx pgx.Tx) (int64, error) {
		stx, _ := idemsql.SQLTx(tx) // the *sql.Tx idem began
		var id int64
		err := stx.QueryRowContext(ctx,
			`INSERT INTO signups (user_id, activity_id) VALUES ($1, $2) RETURNING id`, 42, 7).Scan(&id)
		return id, err
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Value, res.Replayed)
}

// WithIdempotency works inside the caller's own *sql.Tx.
func ExampleWrapTx() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer db.Close()

	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer stx.Rollback() //nolint:errcheck // a no-op after Commit

	key := idem.Key{Scope: "user:42", ID: "order-91"}
	_, err = idem.WithIdempotency(ctx, idemsql.WrapTx(stx), key, func(ctx context.Context, tx pgx.Tx) (string, error) {
		_, err := tx.Exec(ctx, `UPDATE orders SET status = 'PAID' WHERE id = $1`, 91)
		return "paid", err
	})
	if err != nil {
		panic(err)
	}
	// ... more writes in stx ...
	if err := stx.Commit(); err != nil {
		panic(err)
	}
}
