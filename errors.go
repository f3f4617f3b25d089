package idem

import (
	"fmt"

	"github.com/idemkit/idem/internal/pgerr"
	"github.com/idemkit/idem/internal/protocol"
)

// Sentinel errors. Match them with errors.Is; the errors idem returns wrap them
// with context.
var (
	// ErrInProgress means another execution holds the key: a transaction that
	// has not committed yet (in no-wait mode) or a live lease. Retry later; an
	// HTTP layer answers 409.
	ErrInProgress = protocol.ErrInProgress

	// ErrKeyReused means the key was first used with another fingerprint, that
	// is, for a different request. fn does not run. An HTTP layer answers 422.
	ErrKeyReused = protocol.ErrKeyReused

	// ErrInvalidKey means Key.Scope or Key.ID is malformed. It is returned
	// before any SQL runs. The error is an *InvalidKeyError.
	ErrInvalidKey = protocol.ErrInvalidKey

	// ErrInvalidOption means an argument or an Option is unusable: a nil
	// database handle, also a typed nil such as a *pgxpool.Pool declared and
	// never assigned; a non-positive TTL; an unsafe table name. It is
	// returned before any SQL runs. A transaction the caller already
	// committed or rolled back matches it too, from the call's first
	// statement.
	ErrInvalidOption = protocol.ErrInvalidOption

	// ErrLeaseLost means a worker's lease was taken over by another worker
	// (its attempt number no longer matches): its transaction must roll back.
	ErrLeaseLost = protocol.ErrLeaseLost

	// ErrOutcomeUnknown means the connection failed while COMMIT was in
	// flight, or the server ended the session as it answered (SQLSTATE
	// 57P01 or 57P02: a switchover or shutdown stopping its backends, which
	// may commit first), so the transaction may or may not have committed.
	// Calling Do again with the same key settles it: it replays the
	// committed result, or runs fn once if nothing was committed.
	ErrOutcomeUnknown = protocol.ErrOutcomeUnknown

	// ErrHoldTimeout means the call held its key idle in its transaction
	// (fn waiting on something outside the database, say) for longer than
	// WithHoldTimeout allows, and PostgreSQL ended the session: nothing of
	// the transaction committed and the key is free (a waiting duplicate
	// may have taken it over already). Retrying with the same key replays
	// what committed since, or runs fn once.
	ErrHoldTimeout = protocol.ErrHoldTimeout

	// ErrNotFound means the row or record asked for does not exist.
	ErrNotFound = protocol.ErrNotFound

	// ErrInvalidTransition means a state machine was asked for a transition
	// its rules do not allow from the row's current state.
	ErrInvalidTransition = protocol.ErrInvalidTransition

	// ErrResultTooLarge means fn's encoded result (or a lease's checkpoint
	// data) is larger than the limit WithMaxResultSize sets. Nothing is
	// recorded: the call fails as if fn had returned this error, so fn's
	// writes and the claim are rolled back and a retry runs fn again.
	ErrResultTooLarge = protocol.ErrResultTooLarge
)

// InvalidKeyError describes why a Key was rejected. It matches ErrInvalidKey.
type InvalidKeyError struct {
	Field  string // "Scope" or "ID" (or "consumer", "message ID" for ConsumeOnce)
	Reason string // human-readable cause, e.g. "is empty"
}

// Error describes the rejected field and why.
func (e *InvalidKeyError) Error() string {
	return fmt.Sprintf("idem: invalid key: %s %s", e.Field, e.Reason)
}

// Is reports whether target is ErrInvalidKey.
func (e *InvalidKeyError) Is(target error) bool { return target == ErrInvalidKey }

// PermanentError marks an error returned by fn as a business outcome: it is
// recorded with the key and returned again to every later call with the same
// key, instead of letting a retry run fn again. Create one with Permanent.
// Its field Err is the business error; on a replay it is a *RecordedError
// carrying the first error's message.
type PermanentError = protocol.PermanentError

// Permanent wraps err so that WithIdempotency and Do record it as the key's
// outcome (status failed): fn's writes are rolled back, the error is stored,
// and later calls with the same key return it without running fn. A nil err
// returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// RecordedError is the business error of a replayed permanent failure: the
// original error value is gone; its field Message is what was recorded (the
// original's Error()).
type RecordedError = protocol.RecordedError

// IsPermanent reports whether err is, or wraps, a *PermanentError: a business
// outcome that was recorded (or replayed) rather than a transient failure.
func IsPermanent(err error) bool { return protocol.IsPermanent(err) }

// IsRetryable reports whether err is a serialization failure (SQLSTATE 40001)
// or a detected deadlock (40P01), from pgx (*pgconn.PgError) or from any
// driver whose error has a SQLState method, such as lib/pq's *pq.Error
// through database/sql. Both abort the transaction; the remedy is to
// run the whole transaction again, which Do does on its own. Under REPEATABLE
// READ or SERIALIZABLE, WithIdempotency returns such errors unchanged when a
// concurrent transaction with the same key commits first.
func IsRetryable(err error) bool {
	code := pgerr.Code(err)
	return code == pgerr.SerializationFailure || code == pgerr.DeadlockDetected
}
