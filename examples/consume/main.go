// Command consume is the message consume log of the sign-up scenario, with
// idem underneath: a queue delivers each "order paid" message at least once
// (twice, three times, two copies at the same moment, and a delivery whose
// handler fails and is redelivered), and the consumer credits loyalty
// points for each order exactly once. Each delivery runs in a transaction
// of its own: idem's ConsumeOnce writes the message's row in idem's inbox
// and the points row in that same transaction, so a redelivery finds the
// inbox row and is acknowledged without crediting again, and a failed
// delivery leaves neither row behind. The points table has no unique key:
// a second credit would show as a second row. It prints what happened and
// checks that the table holds one row per message.
//
//	DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' go run ./examples/consume
//	DATABASE_URL='mysql://root@127.0.0.1:3306/test' go run ./examples/consume
//
// It connects with DATABASE_URL (and says what to set when it is unset),
// whose scheme picks the driver: pgx and idem.ConsumeOnce for postgres://,
// database/sql with go-sql-driver/mysql and idemmysql.ConsumeOnce for
// mysql://. It keeps its table and idem's in the schema consume_example on
// PostgreSQL, in the database consume_example on MySQL, created if missing
// (DROP SCHEMA consume_example CASCADE, or DROP DATABASE consume_example,
// removes them), and can be run again and again: each run sends a new
// batch of messages.
//
// The consumer is written once (consume); the SQL that differs between the
// two databases is in store_postgres.go and store_mysql.go.
package main

import (
	"context"
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

// schema holds the example's table and idem's: a schema on PostgreSQL, a
// database on MySQL.
const schema = "consume_example"

// consumer names this consumer in idem's inbox: another consumer of the
// same messages (say, one that sends the receipt e-mail) keeps rows of its
// own, and processes each message once too.
const consumer = "loyalty-points"

func main() {
	messages := flag.Int("messages", 200, "messages the queue sends")
	flag.Parse()
	if err := run(context.Background(), *messages, os.Getenv("DATABASE_URL"), schema, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "consume:", err)
		os.Exit(1)
	}
}

// message is an "order paid" event as the queue carries it.
type message struct {
	ID      string // the message ID the producer gave it, the same on every delivery
	Batch   int64
	OrderID int64
	UserID  int64
	Points  int
}

// store is the consumer's SQL, one implementation per database: pgStore
// (PostgreSQL through pgx) and mysqlStore (MySQL and MariaDB through
// database/sql).
type store interface {
	// setUp applies idem's migrations, creates the points table if it is
	// missing and returns the next batch's number.
	setUp(ctx context.Context) (batch int64, err error)
	// consumeOnce runs credit for m at most once per consumer, with idem's
	// ConsumeOnce in a transaction of its own that it commits, and reports
	// whether credit ran. credit gets the transaction's credit function.
	consumeOnce(ctx context.Context, m message, credit func(ctx context.Context, insert creditFunc) error) (bool, error)
	// count counts the batch's rows in the points table and the distinct
	// orders among them.
	count(ctx context.Context, batch int64) (rows, orders int, err error)
}

// creditFunc writes one points row in the delivery's transaction.
type creditFunc func(ctx context.Context, m message) error

// errTransient is the failure of a delivery's handler that the queue
// redelivers (a downstream timeout, say).
var errTransient = errors.New("transient failure: the delivery is not acknowledged")

// consumerStats counts what the consumer did.
type consumerStats struct {
	deliveries, processed, duplicates, failed atomic.Int64
}

// consume handles one delivery: it credits the order's points once per
// message, and acknowledges duplicates without crediting again. failFirst
// reports whether this delivery's handler is to fail (the simulated
// downstream timeout); its writes then roll back with the inbox row.
func consume(ctx context.Context, st store, m message, failFirst func(message) bool, stats *consumerStats) error {
	stats.deliveries.Add(1)
	ran, err := st.consumeOnce(ctx, m, func(ctx context.Context, insert creditFunc) error {
		if err := insert(ctx, m); err != nil {
			return err
		}
		if failFirst(m) {
			return errTransient // after the write: it must roll back with the inbox row
		}
		return nil
	})
	switch {
	case err != nil:
		stats.failed.Add(1)
		return err
	case ran:
		stats.processed.Add(1)
	default:
		stats.duplicates.Add(1) // a redelivery: acknowledge it
	}
	return nil
}

// deliver plays an at-least-once queue: every message is delivered
// copies(i) times, by four workers at once, so that copies of one message
// meet; a delivery that fails with errTransient, or with an error
// idem.IsRetryable reports (a deadlock InnoDB ended), is not acknowledged
// and is delivered again. Any other error stops the queue and is
// returned.
func deliver(ctx context.Context, st store, msgs []message, copies func(i int) int, failFirst func(message) bool, stats *consumerStats) error {
	var queued []message
	for i, m := range msgs {
		for range copies(i) {
			queued = append(queued, m)
		}
	}
	// Copies of a message sit next to each other, so that two workers
	// take them at the same moment.
	work := make(chan message, len(queued))
	var outstanding sync.WaitGroup
	outstanding.Add(len(queued))
	for _, m := range queued {
		work <- m
	}
	var fatal atomic.Pointer[error]
	var workers sync.WaitGroup
	for range 4 {
		workers.Go(func() {
			for m := range work {
				err := consume(ctx, st, m, failFirst, stats)
				if err != nil && (errors.Is(err, errTransient) || idem.IsRetryable(err)) && fatal.Load() == nil {
					outstanding.Add(1)
					work <- m // redelivered
				} else if err != nil {
					fatal.CompareAndSwap(nil, &err)
				}
				outstanding.Done()
			}
		})
	}
	outstanding.Wait()
	close(work)
	workers.Wait()
	if err := fatal.Load(); err != nil {
		return *err
	}
	return nil
}

// batchOf is the batch's messages: order n of the batch, user n%50+1.
func batchOf(batch int64, n int) []message {
	msgs := make([]message, n)
	for i := range msgs {
		msgs[i] = message{
			ID:      fmt.Sprintf("order-paid-%d-%d", batch, i+1),
			Batch:   batch,
			OrderID: batch*1_000_000 + int64(i+1),
			UserID:  int64(i%50 + 1),
			Points:  10 * (i%5 + 1),
		}
	}
	return msgs
}

// copiesOf is how often the queue delivers message i: once, twice (two
// copies at once) or three times.
func copiesOf(i int) int { return i%3 + 1 }

// failingFirst makes the first delivery of every seventh message fail.
func failingFirst() func(message) bool {
	var failed sync.Map
	return func(m message) bool {
		if m.OrderID%7 != 0 {
			return false
		}
		_, already := failed.LoadOrStore(m.ID, true)
		return !already
	}
}

// storeOf is the store of db.
func storeOf(db *exampledb.DB) store {
	if db.SQL != nil {
		return mysqlStore{db: db.SQL}
	}
	return pgStore{pool: db.Pool}
}

// run sends a batch of n messages through the queue on the database at
// databaseURL, with the tables under name, printing to out.
func run(ctx context.Context, n int, databaseURL, name string, out io.Writer) error {
	if n < 1 {
		return fmt.Errorf("-messages must be at least 1")
	}
	db, err := exampledb.Open(ctx, databaseURL, name, exampledb.Options{})
	if err != nil {
		return err
	}
	defer db.Close()
	st := storeOf(db)
	batch, err := st.setUp(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "idem consume: batch %d, %d \"order paid\" messages, consumer %q\n", batch, n, consumer)
	fmt.Fprintln(out, db.Where())
	fmt.Fprintf(out, "the queue delivers each message once, twice (two copies at once) or three times; the first delivery of every seventh fails and is redelivered\n\n")

	var stats consumerStats
	start := time.Now()
	if err := deliver(ctx, st, batchOf(batch, n), copiesOf, failingFirst(), &stats); err != nil {
		return err
	}
	elapsed := time.Since(start)
	rows, orders, err := st.count(ctx, batch)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "deliveries:    %6d\n", stats.deliveries.Load())
	fmt.Fprintf(out, "processed:     %6d (points credited)\n", stats.processed.Load())
	fmt.Fprintf(out, "duplicates:    %6d (found in idem's inbox, acknowledged without crediting)\n", stats.duplicates.Load())
	fmt.Fprintf(out, "failed:        %6d (a failed handler, or a deadlock the server ended: rolled back, inbox row and points with them, and redelivered)\n", stats.failed.Load())
	fmt.Fprintf(out, "rows in loyalty_points for batch %d: %d (orders: %d, messages: %d)\n", batch, rows, orders, n)
	fmt.Fprintf(out, "elapsed:       %v\n", elapsed.Round(time.Millisecond))
	if rows != n || orders != n || stats.processed.Load() != int64(n) {
		return fmt.Errorf("FAIL: %d rows for %d orders, %d processed; want %d of each", rows, orders, stats.processed.Load(), n)
	}
	fmt.Fprintln(out, "OK: points credited once per message, every redelivery acknowledged")
	return nil
}
