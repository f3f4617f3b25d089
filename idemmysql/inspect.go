package idemmysql

import (
	"context"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/protocol"
)

// The inspection calls read idem's tables for operators, as their idem
// namesakes do. Each takes a DBTX: a *sql.DB, a *sql.Conn, or a *sql.Tx to
// read in the caller's transaction. Times come back in UTC, whether or not
// the DSN has parseTime. A nil db is an idem.ErrInvalidOption before any
// SQL; a missing table is explained with how to create it.

// Lookup returns the record of a key, expired or not, or idem.ErrNotFound,
// as idem.Lookup does. scope and id are validated like a Key's
// (idem.ErrInvalidKey). idem.WithTable names the table.
func Lookup(ctx context.Context, db DBTX, scope, id string, opts ...idem.TableOption) (*idem.Record, error) {
	keyErr := idem.Key{Scope: scope, ID: id}.Validate()
	if keyErr != nil {
		return nil, keyErr
	}
	q, d, err := opsQuerier(ctx, "Lookup", db)
	if err != nil {
		return nil, err
	}
	r, err := protocol.Lookup(ctx, d, q, mysqlErrors{}, scope, id, nil, opts)
	return (*idem.Record)(r), err
}

// Stuck lists lease-mode records still processing whose lease ran out, the
// longest-expired first, at most limit of them (limit must be positive), as
// idem.Stuck does. No index covers locked_until, so it reads the whole
// table. idem.WithTable names the table.
func Stuck(ctx context.Context, db DBTX, limit int, opts ...idem.TableOption) ([]idem.Record, error) {
	q, d, err := opsQuerier(ctx, "Stuck", db)
	if err != nil {
		return nil, err
	}
	rs, err := protocol.Stuck(ctx, d, q, mysqlErrors{}, limit, opts)
	if rs == nil {
		return nil, err
	}
	out := make([]idem.Record, len(rs))
	for i, r := range rs {
		out[i] = idem.Record(r)
	}
	return out, err
}

// TableStats counts a record table's rows by status and reports its oldest
// record and its size (InnoDB's estimates, from information_schema), in one
// statement, as idem.TableStats does. It reads the whole table.
// idem.WithTable names the table.
func TableStats(ctx context.Context, db DBTX, opts ...idem.TableOption) (*idem.Stats, error) {
	q, d, err := opsQuerier(ctx, "TableStats", db)
	if err != nil {
		return nil, err
	}
	st, err := protocol.TableStats(ctx, d, q, mysqlErrors{}, opts)
	return (*idem.Stats)(st), err
}
