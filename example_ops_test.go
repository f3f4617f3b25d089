package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// A page asks for a token when it opens; only tokens the server issued are
// accepted as keys, and a token used twice replays.
func ExampleIssueToken() {
	ctx := context.Background()
	pool := examplePool("issue_token")
	defer pool.Close()

	token, err := idem.IssueToken(ctx, pool, "user:42", 30*time.Minute)
	if err != nil {
		panic(err)
	}
	signup := func(ctx context.Context, tx pgx.Tx) (string, error) { return "signed up", nil }
	for _, id := range []string{token, token, "made-up-by-the-client"} {
		res, err := idem.Do(ctx, pool, idem.Key{Scope: "user:42", ID: id}, signup, idem.RequireIssued())
		fmt.Printf("%q replayed=%v err=%v\n", res.Value, res.Replayed, err)
	}
	// Output:
	// "signed up" replayed=false err=<nil>
	// "signed up" replayed=true err=<nil>
	// "" replayed=false err=idem: token unknown
}

// Purge deletes the records whose TTL ran out; run it from a Purger or a
// cron job.
func ExamplePurge() {
	ctx := context.Background()
	pool := examplePool("purge")
	defer pool.Close()

	for _, ttl := range []time.Duration{time.Millisecond, time.Millisecond, time.Hour} {
		_, err := idem.Do(ctx, pool, idem.Key{Scope: "s", ID: ttl.String() + fmt.Sprint(time.Now().UnixNano())},
			func(context.Context, pgx.Tx) (int, error) { return 1, nil }, idem.WithTTL(ttl))
		if err != nil {
			panic(err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	deleted, err := idem.Purge(ctx, pool, idem.PurgeParams{})
	if err != nil {
		panic(err)
	}
	st, err := idem.TableStats(ctx, pool)
	if err != nil {
		panic(err)
	}
	fmt.Println("deleted:", deleted, "kept:", st.Statuses[idem.StatusSucceeded])
	// Output:
	// deleted: 2 kept: 1
}

// Hooks report what happened to each key; SlogHooks logs it with the key
// hashed.
func ExampleWithHooks() {
	ctx := context.Background()
	pool := examplePool("with_hooks")
	defer pool.Close()

	// A text log without the varying fields, for the example's output.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "duration" {
				return slog.Attr{}
			}
			return a
		},
	}))
	hooks := idem.WithHooks(idem.SlogHooks{Logger: logger})
	key := idem.Key{Scope: "user:42", ID: "form-7f3c9a"}
	for range 2 {
		_, err := idem.Do(ctx, pool, key, func(context.Context, pgx.Tx) (int, error) { return 1, nil }, hooks)
		if err != nil {
			panic(err)
		}
	}
	// Output:
	// level=DEBUG msg="idem executed" op=Do key.scope=sha256:ea3fd43be1e5 key.id=sha256:c8419b443f93
	// level=DEBUG msg="idem replayed" op=Do key.scope=sha256:ea3fd43be1e5 key.id=sha256:c8419b443f93
}

// Lookup shows a key's record, as the idem command's inspect does.
func ExampleLookup() {
	ctx := context.Background()
	pool := examplePool("lookup")
	defer pool.Close()

	key := idem.Key{Scope: "user:42", ID: "form-7f3c9a"}
	_, err := idem.Do(ctx, pool, key, func(context.Context, pgx.Tx) (map[string]int, error) {
		return map[string]int{"signup_id": 7}, nil
	})
	if err != nil {
		panic(err)
	}
	r, err := idem.Lookup(ctx, pool, key.Scope, key.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Status, r.Attempt, string(r.Response), r.ExpiresAt.After(time.Now()))
	_, err = idem.Lookup(ctx, pool, key.Scope, "never-used")
	fmt.Println(err)
	// Output:
	// succeeded 1 {"signup_id":7} true
	// idem: not found
}

// Stuck lists the lease records whose holder stopped renewing: the work a
// crashed worker left, until the next Claim of the key takes it over.
func ExampleStuck() {
	ctx := context.Background()
	pool := examplePool("stuck")
	defer pool.Close()

	lease, _, err := idem.Claim[string](ctx, pool, idem.Key{Scope: "orders", ID: "pay-order-9"}, 10*time.Millisecond)
	if err != nil {
		panic(err)
	}
	if err := lease.Checkpoint(ctx, pool, "gateway-called", nil); err != nil {
		panic(err)
	}
	time.Sleep(50 * time.Millisecond) // the worker died: nobody renews the lease
	stuck, err := idem.Stuck(ctx, pool, 10)
	if err != nil {
		panic(err)
	}
	for _, r := range stuck {
		fmt.Println(r.Scope, r.ID, r.Status, "attempt", r.Attempt, "at", r.RecoveryPoint)
	}
	// Output:
	// orders pay-order-9 processing attempt 1 at gateway-called
}

// A Purger purges on an interval until its context ends.
func ExamplePurger() {
	ctx, cancel := context.WithCancel(context.Background())
	pool := examplePool("purger")
	defer pool.Close()

	_, err := idem.Do(ctx, pool, idem.Key{Scope: "s", ID: "short-lived"},
		func(context.Context, pgx.Tx) (int, error) { return 1, nil }, idem.WithTTL(time.Millisecond))
	if err != nil {
		panic(err)
	}
	purged := make(chan int64, 1)
	p := &idem.Purger{DB: pool, Interval: 20 * time.Millisecond, OnPurge: func(n int64, err error) {
		if n > 0 || err != nil {
			select {
			case purged <- n:
			default:
			}
		}
	}}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	fmt.Println("purged:", <-purged)
	cancel()
	fmt.Println("stopped:", <-done)
	// Output:
	// purged: 1
	// stopped: context canceled
}
