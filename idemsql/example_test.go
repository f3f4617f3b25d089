package idemsql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/migrations"
)

// The examples run against TEST_DATABASE_URL (see TestMain) through pgx's
// stdlib driver, registered as "pgx" by the import above; lib/pq
// (import _ "github.com/lib/pq") registers "postgres" and works the same.

// Do runs fn once per key on a *sql.DB; fn writes through the *sql.Tx.
func ExampleDo() {
	ctx := context.Background()
	// A fresh schema holding idem's record table and a signups table with
	// no unique constraint; dsn has search_path set to it.
	dsn, cleanup := exampleSchema("do",
		`CREATE TABLE signups (id bigint GENERATED ALWAYS AS IDENTITY, user_id bigint, activity_id bigint)`)
	defer cleanup()

	db, err := sql.Open("pgx", dsn)
	if err != nil {
		panic(err)
	}
	defer db.Close()

	key := idem.Key{Scope: "user:42", ID: "signup-7f3a"}
	signUp := func(ctx context.Context, tx *sql.Tx) (int64, error) {
		var id int64
		err := tx.QueryRowContext(ctx,
			`INSERT INTO signups (user_id, activity_id) VALUES ($1, $2) RETURNING id`, 42, 7).Scan(&id)
		return id, err
	}
	for range 2 { // a double click: the second request replays the first
		res, err := idemsql.Do(ctx, db, key, signUp)
		if err != nil {
			panic(err)
		}
		fmt.Println("signup", res.Value, "replayed:", res.Replayed)
	}
	var rows int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM signups`).Scan(&rows); err != nil {
		panic(err)
	}
	fmt.Println("rows:", rows)
	// Output:
	// signup 1 replayed: false
	// signup 1 replayed: true
	// rows: 1
}

// WithIdempotency works inside the caller's own *sql.Tx.
func ExampleWithIdempotency() {
	ctx := context.Background()
	dsn, cleanup := exampleSchema("withidempotency",
		`CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, payments int NOT NULL DEFAULT 0)`,
		`INSERT INTO orders (id, status) VALUES (91, 'PENDING')`)
	defer cleanup()

	db, err := sql.Open("pgx", dsn)
	if err != nil {
		panic(err)
	}
	defer db.Close()

	key := idem.Key{Scope: "user:42", ID: "order-91"}
	pay := func(ctx context.Context, tx *sql.Tx) (string, error) {
		_, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'PAID', payments = payments + 1 WHERE id = $1`, 91)
		return "paid", err
	}
	for range 2 { // the request, then its retry with the same key
		stx, err := db.BeginTx(ctx, nil)
		if err != nil {
			panic(err)
		}
		res, err := idemsql.WithIdempotency(ctx, stx, key, pay)
		if err != nil {
			_ = stx.Rollback()
			panic(err)
		}
		// ... more writes in stx ...
		if err := stx.Commit(); err != nil {
			panic(err)
		}
		fmt.Println(res.Value, "replayed:", res.Replayed)
	}
	var status string
	var payments int
	if err := db.QueryRowContext(ctx, `SELECT status, payments FROM orders WHERE id = 91`).Scan(&status, &payments); err != nil {
		panic(err)
	}
	fmt.Println("order 91:", status, "payments:", payments)
	// Output:
	// paid replayed: false
	// paid replayed: true
	// order 91: PAID payments: 1
}

// exampleSchema creates a schema of its own (named after name, with a random
// suffix so that concurrent runs do not meet) on TEST_DATABASE_URL, migrates
// idem's record table into it, runs setup there, and returns the connection
// string with search_path set to the schema, and a function that drops it.
func exampleSchema(name string, setup ...string) (dsn string, cleanup func()) {
	ctx := context.Background()
	base := os.Getenv("TEST_DATABASE_URL")
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "idemsql_example_" + name + "_" + hex.EncodeToString(b)

	pool, err := pgxpool.New(ctx, base)
	if err != nil {
		panic(err)
	}
	drop := func() {
		_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
	}
	fail := func(err error) {
		drop()
		panic(err)
	}
	// Creates the schema, and the record table as schema.idempotent_record,
	// which idem finds through the search_path.
	if err := migrations.Up(ctx, pool, migrations.WithTable(schema, idem.DefaultTable)); err != nil {
		fail(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, schema); err != nil {
			return err
		}
		for _, q := range setup {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		fail(err)
	}

	// pgx sends a connection string's unknown parameters, search_path
	// here, to the server as run-time parameters.
	if u, err := url.Parse(base); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		dsn = u.String()
	} else {
		dsn = strings.TrimSpace(base) + " search_path=" + schema
	}
	return dsn, drop
}
