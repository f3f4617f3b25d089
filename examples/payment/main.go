// Command payment charges a card through a payment gateway exactly once,
// although the worker doing it stops half-way and another takes over.
//
//	go run ./examples/payment
//
// The gateway is a fake (an httptest server in this process) that creates a
// new charge for every request, as a naive gateway would, but refuses
// requests that carry a fencing token lower than one it has already seen for
// the payment. The workers use idem's lease mode (Claim, Checkpoint,
// Complete):
//
//  1. worker A claims the payment (attempt 1), checkpoints "charging",
//     charges the card, and stops before recording anything else (a crash,
//     a long GC pause);
//  2. A's lease runs out; worker B claims the payment (attempt 2), finds the
//     checkpoint "charging", and asks the gateway whether a charge exists
//     before making one: it does, so B records it and completes;
//  3. A wakes up and carries on: the gateway refuses its stale token, and
//     its Complete fails with ErrLeaseLost, so its transaction rolls back.
//
// The program ends by checking that the gateway holds exactly one charge and
// the database one payment. It connects with DATABASE_URL (and says what to
// set when it is unset) and keeps its tables and idem's in the schema
// payment_example, created if missing (DROP SCHEMA payment_example CASCADE
// removes them).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/migrations"
)

const schema = "payment_example"

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "payment:", err)
		os.Exit(1)
	}
}

// gateway is the fake payment gateway.
type gateway struct {
	mu      sync.Mutex
	charges []gatewayCharge
	fence   map[string]int32 // highest fencing token seen per payment reference
}

type gatewayCharge struct {
	ID     string `json:"id"`
	Ref    string `json:"ref"`
	Amount int64  `json:"amount"`
}

type gatewayRequest struct {
	Ref    string `json:"ref"`
	Fence  int32  `json:"fence"`
	Amount int64  `json:"amount"`
}

// admit records the fencing token and reports whether it is current.
func (g *gateway) admit(ref string, fence int32) bool {
	if fence < g.fence[ref] {
		return false
	}
	g.fence[ref] = fence
	return true
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req gatewayRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.admit(req.Ref, req.Fence) {
		http.Error(w, fmt.Sprintf("stale fencing token %d for %s (seen %d)", req.Fence, req.Ref, g.fence[req.Ref]), http.StatusConflict)
		return
	}
	switch r.URL.Path {
	case "/charges": // create a charge, every time
		c := gatewayCharge{ID: fmt.Sprintf("ch_%d", len(g.charges)+1), Ref: req.Ref, Amount: req.Amount}
		g.charges = append(g.charges, c)
		_ = json.NewEncoder(w).Encode(c)
	case "/charges/lookup": // find a charge by reference
		for _, c := range g.charges {
			if c.Ref == req.Ref {
				_ = json.NewEncoder(w).Encode(c)
				return
			}
		}
		http.Error(w, "no charge", http.StatusNotFound)
	default:
		http.NotFound(w, r)
	}
}

var errNoCharge = errors.New("no charge with this reference")

func callGateway(ctx context.Context, url string, req gatewayRequest) (gatewayCharge, error) {
	body, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return gatewayCharge{}, err
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		return gatewayCharge{}, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		var c gatewayCharge
		return c, json.NewDecoder(resp.Body).Decode(&c)
	case http.StatusNotFound:
		return gatewayCharge{}, errNoCharge
	default:
		var msg bytes.Buffer
		_, _ = msg.ReadFrom(resp.Body)
		return gatewayCharge{}, fmt.Errorf("gateway: %s: %s", resp.Status, bytes.TrimSpace(msg.Bytes()))
	}
}

// receipt is the payment's recorded result.
type receipt struct {
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
}

// worker pays one order through the gateway under a lease.
type worker struct {
	name    string
	pool    *pgxpool.Pool
	gateway string
	out     *bytes.Buffer
	mu      *sync.Mutex
}

func (w worker) logf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(w.out, "%-8s "+format+"\n", append([]any{w.name}, args...)...)
}

// charge runs the payment's phases from wherever the previous holder
// stopped. crashAfterCharge makes the worker stop right after the gateway
// charged the card, before it records anything.
func (w worker) charge(ctx context.Context, l *idem.Lease[receipt], amount int64, crashAfterCharge bool) (receipt, error) {
	ref := l.Key().ID
	var c gatewayCharge
	switch l.RecoveryPoint() {
	case "":
		if err := l.Checkpoint(ctx, w.pool, "charging", nil); err != nil {
			return receipt{}, err
		}
		w.logf("checkpoint %q, charging the card (fencing token %d)", "charging", l.Attempt())
		var err error
		c, err = callGateway(ctx, w.gateway+"/charges", gatewayRequest{Ref: ref, Fence: l.Attempt(), Amount: amount})
		if err != nil {
			return receipt{}, err
		}
		w.logf("gateway created %s", c.ID)
		if crashAfterCharge {
			return receipt{}, errCrashed
		}
	case "charging":
		// The previous holder may or may not have charged: ask first.
		w.logf("resuming from checkpoint %q: looking the charge up (fencing token %d)", "charging", l.Attempt())
		var err error
		c, err = callGateway(ctx, w.gateway+"/charges/lookup", gatewayRequest{Ref: ref, Fence: l.Attempt()})
		switch {
		case errors.Is(err, errNoCharge):
			w.logf("no charge yet: charging")
			c, err = callGateway(ctx, w.gateway+"/charges", gatewayRequest{Ref: ref, Fence: l.Attempt(), Amount: amount})
			if err != nil {
				return receipt{}, err
			}
		case err != nil:
			return receipt{}, err
		default:
			w.logf("found %s: not charging again", c.ID)
		}
	case "charged":
		var r receipt
		if err := l.RecoveryData(&r); err != nil {
			return receipt{}, err
		}
		return r, nil
	}
	r := receipt{ChargeID: c.ID, Amount: c.Amount}
	if err := l.Checkpoint(ctx, w.pool, "charged", r); err != nil {
		return receipt{}, err
	}
	return r, nil
}

var errCrashed = errors.New("worker crashed")

// record writes the payment row and completes the lease in one transaction.
func (w worker) record(ctx context.Context, l *idem.Lease[receipt], orderID int64, r receipt) error {
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, `INSERT INTO `+schema+`.payments (order_id, charge_id, amount) VALUES ($1, $2, $3)`,
		orderID, r.ChargeID, r.Amount); err != nil {
		return err
	}
	if err := l.Complete(ctx, tx, r); err != nil {
		return err // ErrLeaseLost: the deferred rollback undoes the payment row
	}
	return tx.Commit(ctx)
}

func run(ctx context.Context, stdout interface{ Write([]byte) (int, error) }) error {
	pool, err := exampledb.Connect(ctx, os.Getenv("DATABASE_URL"), schema)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Up(ctx, pool, migrations.WithTable(schema, idem.DefaultTable)); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+schema+`.payments (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		order_id bigint NOT NULL, charge_id text NOT NULL, amount bigint NOT NULL)`); err != nil {
		return err
	}
	gw := &gateway{fence: map[string]int32{}}
	srv := httptest.NewServer(gw)
	defer srv.Close()

	var out bytes.Buffer
	var mu sync.Mutex
	defer func() { _, _ = stdout.Write(out.Bytes()) }()
	fmt.Fprintf(&out, "%s\n\n", exampledb.Where(pool, schema))
	opt := idem.WithTable(schema, idem.DefaultTable)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	orderID := time.Now().UnixNano() % 1_000_000_000
	key := idem.Key{Scope: "orders", ID: "pay-" + hex.EncodeToString(b), Fingerprint: []byte(fmt.Sprintf("order %d, 4200", orderID))}
	const lease = 300 * time.Millisecond
	const amount = 4200

	a := worker{name: "worker A", pool: pool, gateway: srv.URL, out: &out, mu: &mu}
	bw := worker{name: "worker B", pool: pool, gateway: srv.URL, out: &out, mu: &mu}

	la, _, err := idem.Claim[receipt](ctx, pool, key, lease, opt)
	if err != nil {
		return err
	}
	a.logf("claimed %s (attempt %d, lease %v)", key.ID, la.Attempt(), lease)
	if _, err := a.charge(ctx, la, amount, true); !errors.Is(err, errCrashed) {
		return fmt.Errorf("worker A was meant to stop: %v", err)
	}
	a.logf("stops before recording anything")

	_, _, err = idem.Claim[receipt](ctx, pool, key, lease, opt)
	bw.logf("claim while A's lease is live: %v", err)
	if !errors.Is(err, idem.ErrInProgress) {
		return fmt.Errorf("want ErrInProgress while A's lease is live, got %v", err)
	}
	time.Sleep(lease + 100*time.Millisecond)

	lb, _, err := idem.Claim[receipt](ctx, pool, key, lease, opt)
	if err != nil {
		return err
	}
	bw.logf("took over %s (attempt %d, checkpoint %q)", key.ID, lb.Attempt(), lb.RecoveryPoint())
	workCtx, stop := lb.KeepAlive(ctx, pool)
	r, err := bw.charge(workCtx, lb, amount, false)
	if err == nil {
		err = bw.record(workCtx, lb, orderID, r)
	}
	if serr := stop(); err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	bw.logf("recorded payment %s and completed", r.ChargeID)

	// A wakes up and carries on as if nothing happened.
	_, err = callGateway(ctx, srv.URL+"/charges", gatewayRequest{Ref: key.ID, Fence: la.Attempt(), Amount: amount})
	a.logf("charges again with fencing token %d: %v", la.Attempt(), err)
	err = a.record(ctx, la, orderID, receipt{ChargeID: "ch_stale", Amount: amount})
	a.logf("records its payment: %v", err)
	if !errors.Is(err, idem.ErrLeaseLost) {
		return fmt.Errorf("want ErrLeaseLost for the stale worker, got %v", err)
	}

	// A client asking again gets the recorded result.
	_, res, err := idem.Claim[receipt](ctx, pool, key, lease, opt)
	if err != nil {
		return err
	}
	fmt.Fprintf(&out, "%-8s replayed=%v %+v\n", "client", res.Replayed, res.Value)

	gw.mu.Lock()
	charges := 0
	for _, c := range gw.charges {
		if c.Ref == key.ID {
			charges++
		}
	}
	gw.mu.Unlock()
	var payments int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.payments WHERE order_id = $1`, orderID).Scan(&payments); err != nil {
		return err
	}
	fmt.Fprintf(&out, "\ncharges at the gateway: %d, payments recorded: %d\n", charges, payments)
	if charges != 1 || payments != 1 || !res.Replayed || res.Value != r {
		return fmt.Errorf("FAIL: want exactly one charge and one payment, replayed")
	}
	fmt.Fprintln(&out, "OK: charged exactly once")
	return nil
}
