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
// The page checks the form before sending, shows every request it sends,
// with its key, its status and its Idempotent-Replayed header, and has two
// switches for network trouble: one asks the server to store the next lead
// and then drop the connection without answering (see pagekit.DropResponses), the
// other keeps the page offline for a few seconds. Either way the page
// resends with the same key, and the answer comes from the record.
//
// It connects with DATABASE_URL (and says what to set when it is unset) and
// keeps its tables and idem's in the schema lead_example, created if missing
// (DROP SCHEMA lead_example CASCADE removes them).
package main

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/examples/internal/pagekit"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/migrations"
)

const schema = "lead_example"

//go:embed static
var static embed.FS

func main() {
	addr := flag.String("addr", "127.0.0.1:8082", "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, os.Getenv("DATABASE_URL"), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run serves the example on addr until ctx is done. It binds addr before it
// touches the database, so that a start that cannot serve (the port is
// taken) fails without changing anything, and says where to go only once
// the address is bound.
func run(ctx context.Context, addr, databaseURL string, out io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	pool, err := connect(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	h, err := newHandler(ctx, pool)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	// Once ctx is done, stop taking requests and let those in flight finish
	// (for up to 10s) before the pool closes: an answer cut off here is
	// exactly the lost response the page guards against.
	shutdown := make(chan error, 1)
	stopServing := context.AfterFunc(ctx, func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shutdown <- srv.Shutdown(c)
	})
	defer stopServing()
	fmt.Fprintf(out, "lead form example: listening on http://%s/\n", ln.Addr())
	fmt.Fprintln(out, exampledb.Where(pool, schema))
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return <-shutdown
}

func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return exampledb.Connect(ctx, url, schema)
}

func newHandler(ctx context.Context, pool *pgxpool.Pool) (http.Handler, error) {
	if err := migrations.Up(ctx, pool, migrations.WithTable(schema, idem.DefaultTable)); err != nil {
		return nil, err
	}
	// No unique constraint: the key alone keeps a lead from being stored
	// twice, and a duplicate would show. The key is stored with the lead
	// only so that the page can count a submission's rows; idem does not
	// need it.
	if _, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS leads (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			name text NOT NULL, email text NOT NULL, message text NOT NULL,
			idempotency_key text,
			created_at timestamptz NOT NULL DEFAULT now());
		-- An earlier version of this example made leads without it.
		ALTER TABLE leads ADD COLUMN IF NOT EXISTS idempotency_key text`); err != nil {
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
	mux.Handle("GET "+pagekit.Prefix, pagekit.Handler()) // the stylesheet and panel.js, shared with the other page
	mux.Handle("POST /api/leads", pagekit.DropResponses(mw(http.HandlerFunc(saveLead))))
	mux.Handle("GET /api/leads/count", countLeads(pool))
	return mux, nil
}

// internalError logs err and answers 500 without its text, which may quote
// SQL or name tables. idemhttp records no 5xx: the page resends.
func internalError(w http.ResponseWriter, r *http.Request, err error) {
	log.Printf("%s %s: %v", r.Method, r.URL.Path, err)
	pagekit.Problem(w, http.StatusInternalServerError, "internal", "Something went wrong on our side; your message will be resent.")
}

// emailPattern is the page's check of an e-mail address (lead.js), a loose
// one: something@domain.tld. Only a message that arrives proves an address.
var emailPattern = regexp.MustCompile(`^[^\s@]+@[^\s@]+\.[^\s@]+$`)

// saveLead stores the lead in the request's transaction; the middleware
// records the answer with it. The page checks the form first; the server
// checks again, since a request need not come from the page.
func saveLead(w http.ResponseWriter, r *http.Request) {
	var lead struct {
		Name, Email, Message string
	}
	if err := json.NewDecoder(r.Body).Decode(&lead); err != nil {
		pagekit.Problem(w, http.StatusBadRequest, "bad-request", "Send the form as JSON: name, email, message.")
		return
	}
	lead.Name, lead.Email = strings.TrimSpace(lead.Name), strings.TrimSpace(lead.Email)
	if lead.Name == "" || !emailPattern.MatchString(lead.Email) {
		pagekit.Problem(w, http.StatusUnprocessableEntity, "invalid-lead", "Please give your name and a valid e-mail address.")
		return
	}
	key, _ := idemhttp.ParseKey(r.Header) // the middleware checked it
	var id int64
	if err := idemhttp.Tx(r.Context()).QueryRow(r.Context(),
		`INSERT INTO leads (name, email, message, idempotency_key) VALUES ($1, $2, $3, $4) RETURNING id`,
		lead.Name, lead.Email, lead.Message, key).Scan(&id); err != nil {
		internalError(w, r, err)
		return
	}
	pagekit.JSON(w, http.StatusCreated, map[string]any{"ok": true, "leadId": id, "message": fmt.Sprintf("Thank you, %s! We will be in touch.", lead.Name)})
}

// countLeads counts the leads stored under one key: the number the page
// shows to prove that resends added none. Only the holder of the random key
// can ask.
func countLeads(pool *pgxpool.Pool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Query().Get("key")
		var n int
		if err := pool.QueryRow(r.Context(), `SELECT count(*) FROM leads WHERE idempotency_key = $1`, key).Scan(&n); err != nil {
			internalError(w, r, err)
			return
		}
		pagekit.JSON(w, http.StatusOK, map[string]any{"rows": n})
	}
}
