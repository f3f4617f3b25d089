package idemsql

import (
	"context"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/protocol"
)

// The inspection calls read idem's tables for operators, as their pgx
// namesakes do. Each takes a DBTX: a *sql.DB, a *sql.Conn, or a *sql.Tx to
// read in the caller's transaction (its snapshot). A nil db is an
// idem.ErrInvalidOption before any SQL; a missing table is explained with
// how to create it.

// Lookup returns the record of a key, expired or not, or idem.ErrNotFound,
// as idem.Lookup does. An uncommitted claim is invisible to it. scope and id
// are validated like a Key's (idem.ErrInvalidKey). idem.WithTable names the
// table.
func Lookup(ctx context.Context, db DBTX, scope, id string, opts ...idem.TableOption) (*idem.Record, error) {
	r, err := protocol.Lookup(ctx, dialect, opsQuerier(db), sqlErrors{}, scope, id, idem.Key{Scope: scope, ID: id}.Validate(), opts)
	return (*idem.Record)(r), err
}

// Stuck lists lease-mode records still processing whose lease ran out, the
// longest-expired first, at most limit of them (limit must be positive), as
// idem.Stuck does. Such a key is taken over by the next Claim of the same
// request. No index covers locked_until, so it reads the whole table: on a
// large table, run it from a replica or off-peak. idem.WithTable names the
// table.
func Stuck(ctx context.Context, db DBTX, limit int, opts ...idem.TableOption) ([]idem.Record, error) {
	rs, err := protocol.Stuck(ctx, dialect, opsQuerier(db), sqlErrors{}, limit, opts)
	if rs == nil {
		return nil, err
	}
	out := make([]idem.Record, len(rs))
	for i, r := range rs {
		out[i] = idem.Record(r)
	}
	return out, err
}

// CountExpired counts what Purge would delete now, as idem.CountExpired
// does: the expired records (never a lease record still processing) and,
// when inboxRetention is positive, the inbox rows consumed longer ago than
// that. It reads through the expires_at and consumed_at indexes.
// idem.WithTable and idem.WithInboxTable name the tables.
func CountExpired(ctx context.Context, db DBTX, inboxRetention time.Duration, opts ...idem.TableOption) (records, inbox int64, err error) {
	return protocol.CountExpired(ctx, dialect, opsQuerier(db), sqlErrors{}, inboxRetention, opts)
}

// TableStats counts a record table's rows by status and reports its oldest
// record and its size, in one statement (one snapshot), as idem.TableStats
// does. It reads the whole table: on a large table, run it from a replica
// or off-peak. idem.WithTable names the table.
func TableStats(ctx context.Context, db DBTX, opts ...idem.TableOption) (*idem.Stats, error) {
	st, err := protocol.TableStats(ctx, dialect, opsQuerier(db), sqlErrors{}, opts)
	return (*idem.Stats)(st), err
}
