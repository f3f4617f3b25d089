package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/migrations"
)

// open connects to the database and creates idem's tables, as a service
// does once when it starts.
func open(ctx context.Context, databaseURL string) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	if err := migrations.Up(ctx, pool); err != nil { // creates idem's tables, or does nothing if they are up to date
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// keyOf is the idempotency key of a request from the user userID.
func keyOf(r *http.Request, userID string) (idem.Key, error) {
	id, err := idemhttp.ParseKey(r.Header) // the Idempotency-Key header the client made when the form opened
	return idem.Key{
		Scope: "user:" + userID, // whose key it is: one user's key never replays another user's result
		ID:    id,
	}, err
}

// A service opens its pool and migrates once, then makes a Key of each
// request's header and the user who sent it.
func Example_setup() {
	ctx := context.Background()
	// The example's own schema, dropped after the run.
	schema := "idem_example_setup"
	setup, err := pgx.Connect(ctx, os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer setup.Close(ctx)
	if _, err := setup.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
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

	r := httptest.NewRequest(http.MethodPost, "/signups", nil)
	r.Header.Set(idemhttp.HeaderName, `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
	key, err := keyOf(r, "42")
	fmt.Printf("%s %s %v\n", key.Scope, key.ID, err)
	// Output:
	// migrated to version 2 <nil>
	// user:42 8e03978e-40d5-43e8-bc93-6894a57f9324 <nil>
}
