package idem

import (
	"time"

	"github.com/idemkit/idem/internal/protocol"
)

// Record statuses, as stored in the status column.
const (
	// StatusProcessing: claimed, not finished. Inside a transaction the row is
	// invisible to others until commit; in lease mode it is committed with a
	// lease (locked_until).
	StatusProcessing = protocol.StatusProcessing
	// StatusSucceeded: fn returned a value; response holds it encoded.
	StatusSucceeded = protocol.StatusSucceeded
	// StatusFailed: fn returned a Permanent error; response holds its message.
	StatusFailed = protocol.StatusFailed
	// StatusIssued: a token IssueToken handed out, not used yet.
	StatusIssued = protocol.StatusIssued
)

// Record is a record row as operators see it: what Lookup and Stuck return.
type Record struct {
	// Scope and ID name the key.
	Scope, ID string
	// Status is StatusProcessing, StatusSucceeded, StatusFailed or
	// StatusIssued.
	Status string
	// Attempt is the fencing token of lease mode: 1 for the first holder,
	// incremented by every takeover. Tokens not yet used have 0.
	Attempt int32
	// Fingerprint is the request digest the key was first used with (nil
	// when none was given).
	Fingerprint []byte
	// Response is the encoded result (or, for StatusFailed, the recorded
	// error message; for a lease still processing, its checkpoint data).
	Response []byte
	// LockedUntil is the end of a lease-mode record's lease, or nil.
	LockedUntil *time.Time
	// RecoveryPoint is the last checkpoint of a lease, or "".
	RecoveryPoint string
	// CreatedAt, UpdatedAt and ExpiresAt are by the database clock. After
	// ExpiresAt the key counts as unused and Purge may delete the record.
	CreatedAt, UpdatedAt, ExpiresAt time.Time
}

// DefaultTable is the record table's name unless WithTable says otherwise.
const DefaultTable = protocol.DefaultTable
