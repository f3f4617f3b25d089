package idemmysql

import (
	dialects "github.com/idemkit/idem/internal/dialect/mysql"
)

// UseClaimRead makes the calls read the claim's answer with SELECT ... FOR
// UPDATE, MySQL 8's way, on MariaDB (which also has RETURNING), until the
// returned function puts back the server's own dialect.
func UseClaimRead() (restore func()) {
	prev := server.Load()
	server.Store(dialects.New(dialects.Server{SetStatement: true}))
	return func() { server.Store(prev) }
}

// UseMySQL8 makes the calls use MySQL 8's dialect on MariaDB (no
// RETURNING, no SET STATEMENT, no session bounds), until the returned
// function puts back the server's own dialect.
func UseMySQL8() (restore func()) {
	prev := server.Load()
	server.Store(dialects.MySQL8)
	return func() { server.Store(prev) }
}
