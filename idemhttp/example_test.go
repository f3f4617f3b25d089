package idemhttp_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/migrations"
)

// databaseExamples are the examples that run against PostgreSQL. The
// package's tests need no database.
var databaseExamples = []string{"ExampleMiddleware"}

// ExampleMiddleware needs a database: TEST_DATABASE_URL. Without it the run
// fails at once, unless -short is set: then the examples that need the
// database are skipped, saying so, and everything else runs.
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv("TEST_DATABASE_URL") == "" {
		if !testing.Short() {
			fmt.Fprintln(os.Stderr, `TEST_DATABASE_URL is not set. The examples of this package run against PostgreSQL:
    TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable go test ./...
go test -short runs only what needs no database.`)
			os.Exit(1)
		}
		skip(databaseExamples)
		fmt.Fprintf(os.Stderr, "-short without TEST_DATABASE_URL: skipping the examples that run against PostgreSQL (%s)\n",
			strings.Join(databaseExamples, ", "))
	}
	os.Exit(m.Run())
}

// skip adds names to -test.skip, keeping the skip pattern the run was given.
func skip(names []string) {
	pattern := "^(" + strings.Join(names, "|") + ")$"
	if own := flag.Lookup("test.skip").Value.String(); own != "" {
		pattern = own + "|" + pattern
	}
	if err := flag.Set("test.skip", pattern); err != nil {
		panic(err)
	}
}

// The handler runs in the request's transaction and its answer is recorded
// with it: the same Idempotency-Key gets the same answer, marked replayed.
func ExampleMiddleware() {
	ctx := context.Background()
	// The example works in a schema of its own, dropped at its end.
	schema := "idemhttp_example"
	cfg, err := pgxpool.ParseConfig(os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE; CREATE SCHEMA `+schema); err != nil {
		panic(err)
	}
	if err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE signups (id int GENERATED ALWAYS AS IDENTITY, name text)`); err != nil {
		panic(err)
	}

	mw, err := idemhttp.Middleware(pool, idemhttp.Config{
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }, // the authenticated user
	})
	if err != nil {
		panic(err)
	}
	signup := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id int
		name, _ := io.ReadAll(r.Body)
		err := idemhttp.Tx(r.Context()).QueryRow(r.Context(), // the request's transaction
			`INSERT INTO signups (name) VALUES ($1) RETURNING id`, string(name)).Scan(&id)
		if err != nil {
			http.Error(w, "database", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "sign-up %d", id)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /signups", mw(signup)) // runs once per (user, key)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/signups", strings.NewReader("ada"))
		req.Header.Set("X-User", "42")
		req.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get(idemhttp.ReplayedHeader) == "true")
	}
	_, _ = pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	// Output:
	// 201 sign-up 1 replayed: false
	// 201 sign-up 1 replayed: true
}

// The client Transport adds one key to a POST and retries it with the same
// key: a lost answer or a 503 costs the server nothing but a replay.
func ExampleTransport() {
	var tries atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tries.Add(1) == 1 {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "created")
	}))
	defer srv.Close()

	client := &http.Client{Transport: &idemhttp.Transport{
		NewKey: func() string { return "key-1" }, // random by default
	}}
	resp, err := client.Post(srv.URL, "text/plain", strings.NewReader("order"))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body), "tries:", tries.Load(), "key:", idemhttp.KeyOf(resp))
	// Output:
	// 201 created tries: 2 key: key-1
}
