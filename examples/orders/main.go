// Command orders is a small order service built on idem:
//
//   - POST /orders creates an order once per Idempotency-Key
//     (idem.WithIdempotency): a retry gets the first response back, marked
//     Idempotent-Replayed: true; the same key with another body is a 422;
//   - POST /orders/{id}/pay|ship|cancel|refund moves the order through a
//     state machine (idem.StateMachine) with a history table; a repeated
//     call is a no-op, an illegal one a 409 that names the current state;
//   - POST /events/payment is the payment gateway's event delivery: each
//     event is consumed once (idem.ConsumeOnce) and pays its order, so a
//     redelivered event is acknowledged without a second payment;
//   - GET /orders/{id} shows the order and its history.
//
// Run it with
//
//	go run ./examples/orders
//
// It connects with DATABASE_URL or the PG* defaults, keeps its tables in the
// schema orders_example, and listens on 127.0.0.1:8080 (-addr).
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
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/migrations"
)

const schema = "orders_example"

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	flag.Parse()
	ctx := context.Background()
	pool, err := connect(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	svc, err := setup(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("orders example listening on http://%s (tables in schema %s)\n", *addr, schema)
	fmt.Printf("try: curl -i -X POST http://%s/orders -H 'Idempotency-Key: k1' -H 'X-User: alice' -d '{\"amount_cents\": 1999}'\n", *addr)
	srv := &http.Server{Addr: *addr, Handler: svc.routes(), ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

func connect(ctx context.Context) (*pgxpool.Pool, error) {
	return exampledb.Connect(ctx, os.Getenv("DATABASE_URL"), schema)
}

// service holds the database and the order state machine.
type service struct {
	pool   *pgxpool.Pool
	orders *idem.StateMachine
}

// setup creates the schema, idem's tables and the example's tables.
func setup(ctx context.Context, pool *pgxpool.Pool) (*service, error) {
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema); err != nil {
		return nil, err
	}
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

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// createOrder creates an order once per (user, Idempotency-Key).
func (s *service) createOrder(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		writeError(w, http.StatusBadRequest, "the Idempotency-Key header is required")
		return
	}
	user := r.Header.Get("X-User") // stands in for real authentication
	if user == "" {
		user = "anonymous"
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var req struct {
		AmountCents int64 `json:"amount_cents"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.AmountCents <= 0 {
		writeError(w, http.StatusBadRequest, `want a JSON body like {"amount_cents": 1999}`)
		return
	}
	digest := sha256.Sum256(body)
	ctx := r.Context()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
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
		writeError(w, http.StatusBadRequest, err.Error())
		return
	case errors.Is(err, idem.ErrInProgress):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusConflict, "a request with this Idempotency-Key is still being processed")
		return
	case errors.Is(err, idem.ErrKeyReused):
		writeError(w, http.StatusUnprocessableEntity, "this Idempotency-Key was used with a different body")
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if err := tx.Commit(ctx); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
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
		writeError(w, http.StatusNotFound, "no such order")
		return
	}
	to, ok := actions[r.PathValue("action")]
	if !ok {
		writeError(w, http.StatusNotFound, "actions: pay, ship, cancel, refund")
		return
	}
	var opts []idem.TransitionOption
	if to == "PAID" {
		opts = append(opts, idem.Set("paid_at", time.Now()))
	}
	s.respondTransition(r.Context(), w, s.pool, id, to, opts...)
}

func (s *service) respondTransition(ctx context.Context, w http.ResponseWriter, db idem.DBTX, id int64, to string, opts ...idem.TransitionOption) {
	res, err := s.orders.Transition(ctx, db, id, to, opts...)
	var te *idem.TransitionError
	switch {
	case errors.Is(err, idem.ErrNotFound):
		writeError(w, http.StatusNotFound, "no such order")
	case errors.As(err, &te):
		writeJSON(w, http.StatusConflict, map[string]string{
			"error": fmt.Sprintf("order %d is %s and cannot become %s", id, te.Current, te.Wanted), "status": te.Current})
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
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
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&ev); err != nil || ev.MessageID == "" {
		writeError(w, http.StatusBadRequest, `want {"message_id": "...", "order_id": 1, "payment_ref": "..."}`)
		return
	}
	ctx := r.Context()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
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
		writeError(w, http.StatusBadRequest, err.Error())
		return
	case errors.Is(err, idem.ErrNotFound):
		writeError(w, http.StatusNotFound, "no such order")
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if err := tx.Commit(ctx); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
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
		writeError(w, http.StatusNotFound, "no such order")
		return
	}
	ctx := r.Context()
	var o order
	err = s.pool.QueryRow(ctx, `SELECT id, user_id, amount_cents, status, version, paid_at, payment_ref FROM orders WHERE id = $1`, id).
		Scan(&o.ID, &o.UserID, &o.AmountCents, &o.Status, &o.Version, &o.PaidAt, &o.PaymentRef)
	if errors.Is(err, pgx.ErrNoRows) {
		writeError(w, http.StatusNotFound, "no such order")
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
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
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	history, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (step, error) {
		var s step
		return s, r.Scan(&s.From, &s.To, &s.Version, &s.At)
	})
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"order": o, "history": history})
}
