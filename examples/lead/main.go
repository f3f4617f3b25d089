// Command lead is the website lead form of the scenarios, where "submitted"
// must never mean "lost" nor "twice": the page makes its idempotency key when
// the form opens and keeps it across retries; a submission is kept in
// localStorage until the server confirms it, resent when the network comes
// back (the online event, and an interval), and survives a reload; the
// server (idemhttp.Middleware) stores exactly one lead per key and answers
// repeats with the first result.
//
//	go run ./examples/lead            # then open the URL it prints
//
// It connects with DATABASE_URL or the PG* defaults and keeps its tables in
// the schema lead_example.
package main

import (
	"context"
	"embed"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/migrations"
)

const schema = "lead_example"

//go:embed static
var static embed.FS

func main() {
	addr := flag.String("addr", "127.0.0.1:8082", "listen address")
	flag.Parse()
	ctx := context.Background()
	pool, err := connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	h, err := newHandler(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("lead form example: open http://%s/\n", *addr)
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return exampledb.Connect(ctx, url, schema)
}

func newHandler(ctx context.Context, pool *pgxpool.Pool) (http.Handler, error) {
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema); err != nil {
		return nil, err
	}
	if err := migrations.Up(ctx, pool, migrations.WithTable(schema, idem.DefaultTable)); err != nil {
		return nil, err
	}
	// No unique constraint: the key alone keeps a lead from being stored
	// twice, and a duplicate would show.
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS leads (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		name text NOT NULL, email text NOT NULL, message text NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, err
	}
	mw, err := idemhttp.Middleware(pool, idemhttp.Config{
		// The form is public: every visitor's key lives in one scope, and
		// keys are random UUIDs made by the page.
		Scope: func(*http.Request) (string, error) { return "lead-form", nil },
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	sub, _ := fs.Sub(static, "static")
	mux.Handle("GET /", http.FileServerFS(sub))
	mux.Handle("POST /api/leads", mw(http.HandlerFunc(saveLead)))
	return mux, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// saveLead stores the lead in the request's transaction; the middleware
// records the answer with it.
func saveLead(w http.ResponseWriter, r *http.Request) {
	var lead struct {
		Name, Email, Message string
	}
	if err := json.NewDecoder(r.Body).Decode(&lead); err != nil || strings.TrimSpace(lead.Name) == "" || !strings.Contains(lead.Email, "@") {
		writeJSON(w, http.StatusBadRequest, map[string]any{"ok": false, "message": "Please give a name and an e-mail address."})
		return
	}
	var id int64
	if err := idemhttp.Tx(r.Context()).QueryRow(r.Context(),
		`INSERT INTO leads (name, email, message) VALUES ($1, $2, $3) RETURNING id`,
		lead.Name, lead.Email, lead.Message).Scan(&id); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"ok": false, "message": err.Error()})
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"ok": true, "leadId": id, "message": fmt.Sprintf("Thank you, %s! We will be in touch.", lead.Name)})
}
