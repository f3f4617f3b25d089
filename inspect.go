package idem

import (
	"context"
	"time"

	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// Stats describes a record table: what the idem CLI's stats command shows.
type Stats struct {
	// Statuses counts the records by status.
	Statuses map[string]int64
	// Expired counts the records Purge would delete now.
	Expired int64
	// StuckLeases counts lease-mode records still processing whose lease
	// ran out (see Stuck).
	StuckLeases int64
	// Oldest is the creation time of the oldest record, or nil when the
	// table is empty.
	Oldest *time.Time
	// TableBytes and IndexBytes are the on-disk sizes of the table (with
	// its TOAST data) and of its indexes.
	TableBytes, IndexBytes int64
}

// opsQuerier is db to the protocol, or nil when db is missing (nil, or a
// typed nil): the calls of Purge and inspection refuse it.
func opsQuerier(db DBTX) protocol.Querier {
	if handle.Missing(db) {
		return nil
	}
	return pgxQuerier{db: db}
}

// Lookup returns the record of a key, expired or not, or ErrNotFound. An
// uncommitted claim is invisible to it. scope and id are validated like a
// Key's (ErrInvalidKey). WithTable names the table.
func Lookup(ctx context.Context, db DBTX, scope, id string, opts ...TableOption) (*Record, error) {
	r, err := protocol.Lookup(ctx, dialect, opsQuerier(db), pgxErrors{}, scope, id, Key{Scope: scope, ID: id}.Validate(), opts)
	return (*Record)(r), err
}

// Stuck lists lease-mode records still processing whose lease ran out, the
// longest-expired first, at most limit of them (limit must be positive).
// Such a key is taken over by the next Claim of the same request; until
// then its work is neither finished nor abandoned. A lease given up with
// Release is listed too, until the key is claimed again. No index covers
// locked_until, so it reads the whole table: on a large table, run it from
// a replica or off-peak. WithTable names the table.
func Stuck(ctx context.Context, db DBTX, limit int, opts ...TableOption) ([]Record, error) {
	rs, err := protocol.Stuck(ctx, dialect, opsQuerier(db), pgxErrors{}, limit, opts)
	return storedRecords(rs), err
}

// storedRecords converts the protocol's records, keeping nil as nil.
func storedRecords(rs []protocol.StoredRecord) []Record {
	if rs == nil {
		return nil
	}
	out := make([]Record, len(rs))
	for i, r := range rs {
		out[i] = Record(r)
	}
	return out
}

// CountExpired counts what Purge would delete now: the expired records
// (never a lease record still processing, as Purge) and, when
// inboxRetention is positive, the inbox rows consumed longer ago than that.
// It reads through the expires_at and consumed_at indexes rather than the
// whole tables. WithTable and WithInboxTable name the tables.
func CountExpired(ctx context.Context, db DBTX, inboxRetention time.Duration, opts ...TableOption) (records, inbox int64, err error) {
	return protocol.CountExpired(ctx, dialect, opsQuerier(db), pgxErrors{}, inboxRetention, opts)
}

// TableStats counts a record table's rows by status and reports its oldest
// record and its size, in one statement (one snapshot). It reads the whole
// table (a sequential scan): on a large table, run it from a replica or
// off-peak. WithTable names the table.
func TableStats(ctx context.Context, db DBTX, opts ...TableOption) (*Stats, error) {
	st, err := protocol.TableStats(ctx, dialect, opsQuerier(db), pgxErrors{}, opts)
	return (*Stats)(st), err
}
