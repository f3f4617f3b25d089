package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/migrations"
)

// A small service: it opens its pool and migrates once, serves sign-ups
// once per (user, Idempotency-Key), and makes a Key of a request's header
// and its user; its client retries with the same key.
func Example_service() {
	ctx := context.Background()
	// The example's own schema, dropped after the run.
	schema := "idem_example_service"
	setup, err := pgx.Connect(ctx, os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer setup.Close(ctx)
	if _, err := setup.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema+
		"; CREATE TABLE "+schema+".signups (id bigint GENERATED ALWAYS AS IDENTITY, user_id bigint, activity_id bigint)"); err != nil {
		panic(err)
	}
	exampleSchemasMu.Lock()
	exampleSchemas = append(exampleSchemas, schema)
	exampleSchemasMu.Unlock()
	u, err := url.Parse(os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()

	pool, err := open(ctx, u.String())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	version, _, err := migrations.Version(ctx, pool)
	fmt.Println("migrated to version", version, err)

	mux, err := routes(pool)
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for range 2 { // a double click
		r, _ := http.NewRequest(http.MethodPost, srv.URL+"/signups", strings.NewReader("7"))
		r.Header.Set("X-User", "42")
		r.Header.Set(idemhttp.HeaderName, `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		key, err := keyOf(r, "42")
		fmt.Printf("key %s %s %v\n", key.Scope, key.ID, err)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get(idemhttp.ReplayedHeader) == "true")
	}

	shop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := idemhttp.ParseKey(r.Header) // the key the Transport added
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "order ", key)
	}))
	defer shop.Close()
	resp, err := order(shop.URL)
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))
	// Output:
	// migrated to version 2 <nil>
	// key user:42 8e03978e-40d5-43e8-bc93-6894a57f9324 <nil>
	// 201 sign-up 1 replayed: false
	// key user:42 8e03978e-40d5-43e8-bc93-6894a57f9324 <nil>
	// 201 sign-up 1 replayed: true
	// 201 order key-1
}
