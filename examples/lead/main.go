// Command lead is the website lead form of the scenarios, where "submitted"
// must never mean "lost" nor "twice": the page makes its idempotency key when
// the form opens and keeps it across retries; a submission is kept in
// localStorage until the server confirms it, resent when the network comes
// back (the online event, and an interval), and survives a reload; the
// server (idemhttp.Middleware) stores exactly one lead per key and answers
// repeats with the first result.
//
//	DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' go run ./examples/lead
//	DATABASE_URL='mysql://root@127.0.0.1:3306/test' go run ./examples/lead
//
// and open the URL it prints.
//
// The page checks the form before sending, shows every request it sends,
// with its key, its status and its Idempotent-Replayed header, and has two
// switches for network trouble: one asks the server to store the next lead
// and then drop the connection without answering (see pagekit.DropResponses), the
// other keeps the page offline for a few seconds. Either way the page
// resends with the same key, and the answer comes from the record.
//
// It connects with DATABASE_URL (and says what to set when it is unset),
// whose scheme picks the driver: pgx for postgres://, database/sql with
// go-sql-driver/mysql for mysql:// (MySQL 8 or MariaDB, idemhttp.MySQL).
// It keeps its tables and idem's in the schema lead_example on PostgreSQL,
// in the database lead_example on MySQL, created if missing (DROP SCHEMA
// lead_example CASCADE, or DROP DATABASE lead_example, removes them).
//
// The handlers are written once; the SQL that differs between the two
// databases is behind the store interface, in store_postgres.go and
// store_mysql.go.
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

	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/examples/internal/pagekit"
	"github.com/idemkit/idem/idemhttp"
)

// schema holds the example's tables and idem's: a schema on PostgreSQL, a
// database on MySQL.
const schema = "lead_example"

//go:embed static
var static embed.FS

func main() {
	addr := flag.String("addr", "127.0.0.1:8082", "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, os.Getenv("DATABASE_URL"), schema, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run serves the example on addr until ctx is done, with its tables under
// name. It binds addr before it touches the database, so that a start that
// cannot serve (the port is taken) fails without changing anything, and
// says where to go only once the address is bound.
func run(ctx context.Context, addr, databaseURL, name string, out io.Writer) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	db, err := connect(ctx, databaseURL, name)
	if err != nil {
		return err
	}
	defer db.Close()
	h, err := newHandler(ctx, storeOf(db, name))
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
	fmt.Fprintln(out, db.Where())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return <-shutdown
}

func connect(ctx context.Context, url, name string) (*exampledb.DB, error) {
	return exampledb.Open(ctx, url, name, exampledb.Options{})
}

// store is the lead form's SQL, one implementation per database: pgStore
// (PostgreSQL through pgx) and mysqlStore (MySQL and MariaDB through
// database/sql).
type store interface {
	// setUp applies idem's migrations and creates the leads table if it
	// is missing.
	setUp(ctx context.Context) error
	// middleware is idem's HTTP middleware on this database.
	middleware(cfg idemhttp.Config) (func(http.Handler) http.Handler, error)
	// insertLead stores a lead in the request's transaction, which it
	// finds in ctx, and returns its ID.
	insertLead(ctx context.Context, name, email, message, key string) (int64, error)
	// countLeads counts the leads stored under key.
	countLeads(ctx context.Context, key string) (int, error)
}

// storeOf is the store of db, with the tables under name.
func storeOf(db *exampledb.DB, name string) store {
	if db.SQL != nil {
		return mysqlStore{db: db.SQL}
	}
	return pgStore{pool: db.Pool, schema: name}
}

func newHandler(ctx context.Context, st store) (http.Handler, error) {
	if err := st.setUp(ctx); err != nil {
		return nil, err
	}
	mw, err := st.middleware(idemhttp.Config{
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
	mux.Handle("POST /api/leads", pagekit.DropResponses(mw(saveLead(st))))
	mux.Handle("GET /api/leads/count", countLeads(st))
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
func saveLead(st store) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
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
		id, err := st.insertLead(r.Context(), lead.Name, lead.Email, lead.Message, key)
		if err != nil {
			internalError(w, r, err)
			return
		}
		pagekit.JSON(w, http.StatusCreated, map[string]any{"ok": true, "leadId": id, "message": fmt.Sprintf("Thank you, %s! We will be in touch.", lead.Name)})
	}
}

// countLeads counts the leads stored under one key: the number the page
// shows to prove that resends added none. Only the holder of the random key
// can ask.
func countLeads(st store) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n, err := st.countLeads(r.Context(), r.URL.Query().Get("key"))
		if err != nil {
			internalError(w, r, err)
			return
		}
		pagekit.JSON(w, http.StatusOK, map[string]any{"rows": n})
	}
}
