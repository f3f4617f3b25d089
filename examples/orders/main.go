// Command orders is a small order service built on idem:
//
//   - POST /orders creates an order once per Idempotency-Key
//     (idem.WithIdempotency): a retry gets the first response back, marked
//     Idempotent-Replayed: true; the same key with another body is a 422;
//     the key is read as idemhttp.ParseKey reads it and a body over 1 MiB
//     is a 413, as idemhttp's middleware does;
//   - POST /orders/{id}/pay|ship|cancel|refund moves the order through a
//     state machine (idem.StateMachine) with a history table; a repeated
//     call is a no-op, an illegal one a 409 that names the current state;
//   - POST /events/payment is the payment gateway's event delivery: each
//     event is consumed once (idem.ConsumeOnce) and pays its order, so a
//     redelivered event is acknowledged without a second payment;
//   - GET /orders/{id} shows the order and its history.
//
// Errors are RFC 9457 problem details (application/problem+json), in the
// form idemhttp's middleware answers its own.
//
// Run it with
//
//	go run ./examples/orders
//
// It connects with DATABASE_URL (and says what to set when it is unset),
// keeps its tables and idem's in the schema orders_example, created if
// missing (DROP SCHEMA orders_example CASCADE removes them), and listens on
// 127.0.0.1:8080 (-addr). Interrupted (Ctrl-C), it finishes the requests in
// flight and exits.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/migrations"
)

const schema = "orders_example"

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run serves the example on addr until ctx is done. It binds addr before
// anything else, and says where it listens only once it does: a second
// instance fails with "address already in use" without announcing itself.
func run(ctx context.Context, addr string, stdout io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close() // a no-op once Serve has closed it
	pool, err := connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	svc, err := setup(ctx, pool)
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String() // the bound port, also when addr asks for port 0
	fmt.Fprintf(stdout, "orders example listening on %s\n", url)
	fmt.Fprintln(stdout, exampledb.Where(pool, schema))
	fmt.Fprintf(stdout, "try: curl -i -X POST %s/orders -H 'Idempotency-Key: k1' -H 'X-User: alice' -d '{\"amount_cents\": 1999}'\n", url)

	srv := &http.Server{Handler: svc.routes(), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
		// Let the requests in flight finish (for up to 10s) before the pool
		// closes.
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return srv.Shutdown(shutdownCtx)
	}
}

func connect(ctx context.Context) (*pgxpool.Pool, error) {
	return exampledb.Connect(ctx, os.Getenv("DATABASE_URL"), schema)
}

// service holds the database and the order state machine.
type service struct {
	pool   *pgxpool.Pool
	orders *idem.StateMachine
}

// setup creates idem's tables and the example's in the schema, which
// connect made.
func setup(ctx context.Context, pool *pgxpool.Pool) (*service, error) {
	if err := migrations.Up(ctx, pool, migrations.WithTable(schema, idem.DefaultTable)); err != nil {
		return nil, err
	}
	orders, err := idem.NewStateMachine(idem.StateMachineConfig{
		Schema:      schema,
		Table:       "orders",
		IDColumn:    "id",
		StateColumn: "status",
		States:      []string{"PENDING", "PAID", "SHIPPED", "CANCELLED", "REFUNDED"},
		Transitions: map[string][]string{
			"PENDING": {"PAID", "CANCELLED"},
			"PAID":    {"SHIPPED", "REFUNDED"},
			"SHIPPED": {"REFUNDED"},
		},
		VersionColumn: "version",
		HistoryTable:  "order_history",
	})
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+schema+`.orders (
		id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		user_id      text NOT NULL,
		amount_cents bigint NOT NULL CHECK (amount_cents > 0),
		status       text NOT NULL DEFAULT 'PENDING',
		version      bigint NOT NULL DEFAULT 0,
		paid_at      timestamptz,
		payment_ref  text,
		created_at   timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, orders.HistoryTableDDL("bigint")); err != nil {
		return nil, err
	}
	return &service{pool: pool, orders: orders}, nil
}

func (s *service) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", s.createOrder)
	mux.HandleFunc("POST /orders/{id}/{action}", s.transition)
	mux.HandleFunc("POST /events/payment", s.paymentEvent)
	mux.HandleFunc("GET /orders/{id}", s.getOrder)
	return mux
}

// order is the API's view of an order.
type order struct {
	ID          int64      `json:"id"`
	UserID      string     `json:"user_id"`
	AmountCents int64      `json:"amount_cents"`
	Status      string     `json:"status"`
	Version     int64      `json:"version"`
	PaidAt      *time.Time `json:"paid_at,omitempty"`
	PaymentRef  *string    `json:"payment_ref,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// internalError logs err and answers a 500 that quotes none of it: SQL text
// and table names are for the server's log, not for clients.
func internalError(w http.ResponseWriter, r *http.Request, err error) {
	log.Printf("%s %s: %v", r.Method, r.URL.Path, err)
	writeProblem(w, http.StatusInternalServerError, "internal", "Something went wrong on our side; please try again.")
}

// problem is an RFC 9457 problem details object, in the form idemhttp's
// middleware answers its own errors: Code names the error for programs,
// Detail explains it to people.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
	// State is the order's current state, when a transition is refused.
	State string `json:"state,omitempty"`
}

func newProblem(status int, code, detail string) problem {
	return problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail, Code: code}
}

func (p problem) write(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	newProblem(status, code, detail).write(w)
}

// maxBody caps a request body, as idemhttp.Config.MaxRequestBody does by
// default.
const maxBody = 1 << 20

// readBody reads r's body whole, or answers 413 and returns false when it is
// over maxBody. A body cut at the limit must not be used: two bodies that
// differ only past the limit would get one fingerprint, and the second would
// be answered with the first one's order.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	// One byte more than the limit tells "too large" from "exactly the limit".
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if len(body) > maxBody {
		writeProblem(w, http.StatusRequestEntityTooLarge, "body-too-large",
			fmt.Sprintf("The request body exceeds %d bytes.", maxBody))
		return nil, false
	}
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "body-unreadable", "The request body could not be read to its end.")
		return nil, false
	}
	return body, true
}

// createOrder creates an order once per (user, Idempotency-Key).
func (s *service) createOrder(w http.ResponseWriter, r *http.Request) {
	// ParseKey refuses what idemhttp's middleware refuses: no key, a
	// malformed one, or several (two headers, or a list in one).
	key, err := idemhttp.ParseKey(r.Header)
	switch {
	case errors.Is(err, idemhttp.ErrNoKey):
		writeProblem(w, http.StatusBadRequest, "idempotency-key-missing", "This request needs an Idempotency-Key header.")
		return
	case err != nil:
		detail := "The Idempotency-Key header is not usable."
		var ke *idemhttp.KeyError
		if errors.As(err, &ke) {
			detail = ke.Detail // in words for the client's developer
		}
		writeProblem(w, http.StatusBadRequest, "idempotency-key-invalid", detail)
		return
	}
	user := r.Header.Get("X-User") // stands in for real authentication
	if user == "" {
		user = "anonymous"
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		AmountCents int64 `json:"amount_cents"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.AmountCents <= 0 {
		writeProblem(w, http.StatusBadRequest, "body-invalid", `The body must be JSON like {"amount_cents": 1999}.`)
		return
	}
	digest := sha256.Sum256(body)
	ctx := r.Context()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		internalError(w, r, err)
		return
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	res, err := idem.WithIdempotency(ctx, tx, idem.Key{Scope: "user:" + user, ID: key, Fingerprint: digest[:]},
		func(ctx context.Context, tx pgx.Tx) (order, error) {
			o := order{UserID: user, AmountCents: req.AmountCents}
			err := tx.QueryRow(ctx, `INSERT INTO orders (user_id, amount_cents) VALUES ($1, $2) RETURNING id, status, version`,
				user, req.AmountCents).Scan(&o.ID, &o.Status, &o.Version)
			return o, err
		}, idem.NoWait())
	switch {
	case errors.Is(err, idem.ErrInvalidKey):
		writeProblem(w, http.StatusBadRequest, "idempotency-key-invalid", "The Idempotency-Key is not a usable key: send 1 to 255 printable ASCII characters.")
		return
	case errors.Is(err, idem.ErrInProgress):
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusConflict, "request-in-progress", "A request with this Idempotency-Key is still being processed; retry later.")
		return
	case errors.Is(err, idem.ErrKeyReused):
		writeProblem(w, http.StatusUnprocessableEntity, "idempotency-key-reused", "This Idempotency-Key was used with a different body.")
		return
	case err != nil:
		internalError(w, r, err)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		internalError(w, r, err)
		return
	}
	if res.Replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeJSON(w, http.StatusCreated, res.Value)
}

var actions = map[string]string{"pay": "PAID", "ship": "SHIPPED", "cancel": "CANCELLED", "refund": "REFUNDED"}

// transition moves an order through the state machine.
func (s *service) transition(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		writeProblem(w, http.StatusNotFound, "order-not-found", "No such order.")
		return
	}
	to, ok := actions[r.PathValue("action")]
	if !ok {
		writeProblem(w, http.StatusNotFound, "action-unknown", "The actions are pay, ship, cancel and refund.")
		return
	}
	var opts []idem.TransitionOption
	if to == "PAID" {
		opts = append(opts, idem.Set("paid_at", time.Now()))
	}
	s.respondTransition(w, r, s.pool, id, to, opts...)
}

func (s *service) respondTransition(w http.ResponseWriter, r *http.Request, db idem.DBTX, id int64, to string, opts ...idem.TransitionOption) {
	res, err := s.orders.Transition(r.Context(), db, id, to, opts...)
	var te *idem.TransitionError
	switch {
	case errors.Is(err, idem.ErrNotFound):
		writeProblem(w, http.StatusNotFound, "order-not-found", "No such order.")
	case errors.As(err, &te):
		p := newProblem(http.StatusConflict, "transition-invalid", fmt.Sprintf("Order %d is %s and cannot become %s.", id, te.Current, te.Wanted))
		p.State = te.Current
		p.write(w)
	case err != nil:
		internalError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "from": res.From, "status": to, "applied": res.Applied, "version": res.Version})
	}
}

// paymentEvent consumes one payment event from the gateway. The gateway
// redelivers until it gets a 2xx, so the same event may arrive many times.
func (s *service) paymentEvent(w http.ResponseWriter, r *http.Request) {
	var ev struct {
		MessageID  string `json:"message_id"`
		OrderID    int64  `json:"order_id"`
		PaymentRef string `json:"payment_ref"`
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := json.Unmarshal(body, &ev); err != nil || ev.MessageID == "" {
		writeProblem(w, http.StatusBadRequest, "body-invalid", `The body must be JSON like {"message_id": "...", "order_id": 1, "payment_ref": "..."}.`)
		return
	}
	ctx := r.Context()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		internalError(w, r, err)
		return
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	var applied bool
	var note string
	processed, err := idem.ConsumeOnce(ctx, tx, "payment-events", ev.MessageID, func(ctx context.Context, tx pgx.Tx) error {
		res, err := s.orders.Transition(ctx, tx, ev.OrderID, "PAID",
			idem.Set("paid_at", time.Now()), idem.Set("payment_ref", ev.PaymentRef))
		var te *idem.TransitionError
		if errors.As(err, &te) {
			// A payment for an order that can no longer be paid (cancelled):
			// the event is consumed, the order left as it is, a refund due.
			note = fmt.Sprintf("order is %s and cannot be paid; refund the payment", te.Current)
			return nil
		}
		applied = res.Applied
		return err
	})
	switch {
	case errors.Is(err, idem.ErrInvalidKey):
		writeProblem(w, http.StatusBadRequest, "message-id-invalid", err.Error())
		return
	case errors.Is(err, idem.ErrNotFound):
		writeProblem(w, http.StatusNotFound, "order-not-found", "No such order.")
		return
	case err != nil:
		internalError(w, r, err)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		internalError(w, r, err)
		return
	}
	resp := map[string]any{"processed": processed, "order_paid_now": applied}
	if note != "" {
		resp["note"] = note
	}
	writeJSON(w, http.StatusOK, resp)
}

// getOrder shows an order and its history.
func (s *service) getOrder(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		writeProblem(w, http.StatusNotFound, "order-not-found", "No such order.")
		return
	}
	ctx := r.Context()
	var o order
	err = s.pool.QueryRow(ctx, `SELECT id, user_id, amount_cents, status, version, paid_at, payment_ref FROM orders WHERE id = $1`, id).
		Scan(&o.ID, &o.UserID, &o.AmountCents, &o.Status, &o.Version, &o.PaidAt, &o.PaymentRef)
	if errors.Is(err, pgx.ErrNoRows) {
		writeProblem(w, http.StatusNotFound, "order-not-found", "No such order.")
		return
	}
	if err != nil {
		internalError(w, r, err)
		return
	}
	type step struct {
		From    string    `json:"from"`
		To      string    `json:"to"`
		Version int64     `json:"version"`
		At      time.Time `json:"at"`
	}
	rows, err := s.pool.Query(ctx, `SELECT from_state, to_state, version, changed_at FROM order_history WHERE entity_id = $1 ORDER BY id`, id)
	if err != nil {
		internalError(w, r, err)
		return
	}
	history, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (step, error) {
		var s step
		return s, r.Scan(&s.From, &s.To, &s.Version, &s.At)
	})
	if err != nil {
		internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"order": o, "history": history})
}
