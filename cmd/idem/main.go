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
// It works on PostgreSQL and on MySQL 8 or MariaDB. It connects with
// --database-url, else DATABASE_URL, else the libpq PG* variables (PGHOST,
// PGPORT, PGUSER, PGDATABASE, PGPASSWORD, ...). A postgres:// URL or a libpq
// keyword/value string is PostgreSQL; a mysql:// or mariadb:// URL
// (mysql://user:pass@host:3306/db?param=value, the parameters those of a
// go-sql-driver DSN), or a go-sql-driver DSN with its network written out
// (user:pass@tcp(host:3306)/db), is MySQL. On MySQL --schema names the
// tables' database.
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
