package idem_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// A sign-up submitted twice (a double click, a retry after a timeout) is
// written once; the second submission gets the first one's result.
func ExampleWithIdempotency() {
	ctx := context.Background()
	pool := examplePool("with_idempotency")
	defer pool.Close()

	key := idem.Key{Scope: "user:42", ID: "form-7f3c9a"} // made when the form opened
	for range 2 {
		res, err := signUp(ctx, pool, key)
		if err != nil {
			panic(err)
		}
		fmt.Printf("sign-up %d, replayed: %v\n", res.Value, res.Replayed)
	}
	var rows int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM signups`).Scan(&rows)
	fmt.Println("rows:", rows)
	// Output:
	// sign-up 1, replayed: false
	// sign-up 1, replayed: true
	// rows: 1
}

// Do owns the transaction: it begins, claims the key, runs fn, records the
// result and commits, retrying serialization failures.
func ExampleDo() {
	ctx := context.Background()
	pool := examplePool("do")
	defer pool.Close()

	submit(ctx, pool)
	// Output:
	// {SignupID:1 Message:you are in} replayed=false
	// {SignupID:1 Message:you are in} replayed=true
	// {SignupID:1 Message:you are in} replayed=true
}

// A business refusal is recorded with Permanent: repeats get the same answer
// without running fn again.
func ExamplePermanent() {
	ctx := context.Background()
	pool := examplePool("permanent")
	defer pool.Close()

	errFull := errors.New("activity is full")
	key := idem.Key{Scope: "user:43", ID: "form-55aa"}
	for range 2 {
		res, err := idem.Do(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) (int64, error) {
			return 0, idem.Permanent(errFull)
		})
		fmt.Printf("error: %v, permanent: %v, replayed: %v\n", err, idem.IsPermanent(err), res.Replayed)
	}
	// Output:
	// error: activity is full, permanent: true, replayed: false
	// error: activity is full, permanent: true, replayed: true
}

// The guarded UPDATE of the scenarios ("UPDATE orders SET status='PAID'
// WHERE id=? AND status='PENDING'" and a check of the affected rows) as one
// call: a repeated payment notification is a no-op, an illegal one an error.
func ExampleStateMachine_Transition() {
	ctx := context.Background()
	pool := examplePool("transition")
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, paid_at timestamptz);
		INSERT INTO orders (id, status) VALUES (1, 'PENDING')`); err != nil {
		panic(err)
	}
	orders, err := idem.NewStateMachine(idem.StateMachineConfig{
		Table: "orders", IDColumn: "id", StateColumn: "status",
		States: []string{"PENDING", "PAID", "SHIPPED", "CANCELLED"},
		Transitions: map[string][]string{
			"PENDING": {"PAID", "CANCELLED"},
			"PAID":    {"SHIPPED"},
		},
	})
	if err != nil {
		panic(err)
	}
	for range 2 { // the payment gateway notifies twice
		res, err := orders.Transition(ctx, pool, 1, "PAID", idem.Set("paid_at", time.Now()))
		fmt.Printf("applied=%v from=%s err=%v\n", res.Applied, res.From, err)
	}
	_, err = orders.Transition(ctx, pool, 1, "CANCELLED")
	fmt.Println(err, errors.Is(err, idem.ErrInvalidTransition))
	// Output:
	// applied=true from=PENDING err=<nil>
	// applied=false from=PAID err=<nil>
	// idem: row 1 is "PAID", which cannot move to "CANCELLED" true
}

// Lease mode: a call to the outside world happens once, under a committed
// claim whose attempt number fences out a worker that lost its lease.
func ExampleClaim() {
	ctx := context.Background()
	pool := examplePool("claim")
	defer pool.Close()

	key := idem.Key{Scope: "orders", ID: "pay-order-17"}
	for range 2 {
		if err := charge(ctx, pool, key); err != nil {
			panic(err)
		}
	}
	// Output:
	// charging with fencing token 1
	// replayed: ch_123
}

// A message redelivered by the broker is acknowledged without being
// processed twice.
func ExampleConsumeOnce() {
	ctx := context.Background()
	pool := examplePool("consume_once")
	defer pool.Close()

	for range 2 { // the broker delivers message m-1 twice
		ran, err := consume(ctx, pool)
		if err != nil {
			panic(err)
		}
		fmt.Println("processed:", ran)
	}
	// Output:
	// processed: true
	// processed: false
}

// A second sign-up for the same (user, activity) gets the existing row.
func ExampleInsertOrGet() {
	ctx := context.Background()
	pool := examplePool("insert_or_get")
	defer pool.Close()
	if _, err := pool.Exec(ctx, `ALTER TABLE signups ADD UNIQUE (user_id, activity_id)`); err != nil {
		panic(err)
	}
	for range 2 {
		var id int64
		created, err := idem.InsertOrGet(ctx, pool,
			idem.Query{SQL: `INSERT INTO signups (user_id, activity_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING id`, Args: []any{42, 7}},
			idem.Query{SQL: `SELECT id FROM signups WHERE user_id = $1 AND activity_id = $2`, Args: []any{42, 7}},
			&id)
		if err != nil {
			panic(err)
		}
		fmt.Printf("sign-up %d, created: %v\n", id, created)
	}
	// Output:
	// sign-up 1, created: true
	// sign-up 1, created: false
}
