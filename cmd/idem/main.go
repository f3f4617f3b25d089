// Command idem operates idem's record table: it applies, reverts, shows
// and forces the migrations' version, purges expired records, shows one
// record, lists stuck leases, prints table statistics and prints its own
// version.
//
//	go run github.com/idemkit/idem/cmd/idem@latest --help
//
// It connects with --database-url, else DATABASE_URL, else the libpq PG*
// variables (PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD, ...).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
