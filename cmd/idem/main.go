// Command idem operates idem's record table: it applies, reverts, shows
// and forces the migrations' version, purges expired records, shows one
// record (decoding the responses idemhttp's middleware recorded), lists
// stuck leases, prints table statistics and prints its own version.
//
// Install it from a checkout of the repository; from its root, the
// committed go.work builds the command against the checkout's library:
//
//	git clone https://github.com/idemkit/idem
//	cd idem
//	go install ./cmd/idem
//	idem --help
//
// Once a version is tagged, go install github.com/idemkit/idem/cmd/idem@<version>
// works from anywhere. 'idem version' prints the version and the commit the
// build recorded.
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
