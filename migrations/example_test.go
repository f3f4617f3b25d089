package migrations_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/migrations"
)

// Up creates the record table (here in a schema of its own) and is a no-op
// when it is up to date; Version tells where it stands.
func ExampleUp() {
	ctx := context.Background()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		fmt.Println("set TEST_DATABASE_URL to run this example")
		return
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	table := migrations.WithTable("idem_migrations_example", idem.DefaultTable)
	for range 2 {
		if err := migrations.Up(ctx, pool, table); err != nil {
			panic(err)
		}
	}
	version, dirty, err := migrations.Version(ctx, pool, table)
	fmt.Println("version", version, "dirty", dirty, err)
	if err := migrations.Down(ctx, pool, table); err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `DROP SCHEMA idem_migrations_example CASCADE`)
	// Output:
	// version 2 dirty false <nil>
}
