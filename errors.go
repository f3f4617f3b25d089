package idem

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/puddle/v2"

	"github.com/idemkit/idem/internal/pgerr"
)

// Sentinel errors. Match them with errors.Is; the errors idem returns wrap them
// with context.
var (
	// ErrInProgress means another execution holds the key: a transaction that
	// has not committed yet (in no-wait mode) or a live lease. Retry later; an
	// HTTP layer answers 409.
	ErrInProgress = errors.New("idem: key is in progress")

	// ErrKeyReused means the key was first used with another fingerprint, that
	// is, for a different request. fn does not run. An HTTP layer answers 422.
	ErrKeyReused = errors.New("idem: key reused with a different fingerprint")

	// ErrInvalidKey means Key.Scope or Key.ID is malformed. It is returned
	// before any SQL runs. The error is an *InvalidKeyError.
	ErrInvalidKey = errors.New("idem: invalid key")

	// ErrInvalidOption means an argument or an Option is unusable: a nil
	// database handle, also a typed nil such as a *pgxpool.Pool declared and
	// never assigned; a non-positive TTL; an unsafe table name. It is
	// returned before any SQL runs. A transaction the caller already
	// committed or rolled back matches it too, from the call's first
	// statement.
	ErrInvalidOption = errors.New("idem: invalid option")

	// ErrLeaseLost means a worker's lease was taken over by another worker
	// (its attempt number no longer matches): its transaction must roll back.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrOutcomeUnknown means the connection failed while COMMIT was in
	// flight, so the transaction may or may not have committed. Calling Do
	// again with the same key settles it: it replays the committed result, or
	// runs fn once if nothing was committed.
	ErrOutcomeUnknown = errors.New("idem: commit outcome unknown")

	// ErrHoldTimeout means the call held its key idle in its transaction
	// (fn waiting on something outside the database, say) for longer than
	// WithHoldTimeout allows, and PostgreSQL ended the session: nothing of
	// the transaction committed and the key is free (a waiting duplicate
	// may have taken it over already). Retrying with the same key replays
	// what committed since, or runs fn once.
	ErrHoldTimeout = errors.New("idem: key held idle past its hold timeout; the server ended the transaction")

	// ErrNotFound means the row or record asked for does not exist.
	ErrNotFound = errors.New("idem: not found")

	// ErrInvalidTransition means a state machine was asked for a transition
	// its rules do not allow from the row's current state.
	ErrInvalidTransition = errors.New("idem: invalid transition")

	// ErrResultTooLarge means fn's encoded result (or a lease's checkpoint
	// data) is larger than the limit WithMaxResultSize sets. Nothing is
	// recorded: the call fails as if fn had returned this error, so fn's
	// writes and the claim are rolled back and a retry runs fn again.
	ErrResultTooLarge = errors.New("idem: encoded result too large to record")
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
type PermanentError struct {
	// Err is the business error. On a replay it is a *RecordedError carrying
	// the first error's message.
	Err error
}

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

// Error returns the business error's message.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns the business error.
func (e *PermanentError) Unwrap() error { return e.Err }

// RecordedError is the business error of a replayed permanent failure: the
// original error value is gone, its message is what was recorded.
type RecordedError struct {
	// Message is the recorded error's text (Error() of the original).
	Message string
}

// Error returns the recorded message.
func (e *RecordedError) Error() string { return e.Message }

// IsPermanent reports whether err is, or wraps, a *PermanentError: a business
// outcome that was recorded (or replayed) rather than a transient failure.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

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

// explainMissingTable adds to *errp, when a statement failed because a table
// the call names does not exist (SQLSTATE 42P01), how to create it. Other
// errors, a missing table of the caller's own, and an error already
// explained (by an idem call nested in fn) stay as they are.
func (c *config) explainMissingTable(errp *error) {
	err := *errp
	var done *missingTableError
	if err == nil || pgerr.Code(err) != pgerr.UndefinedTable || errors.As(err, &done) {
		return
	}
	for _, t := range []string{c.q.table, c.inbox.table} {
		// PostgreSQL names the relation as written, unquoted:
		// relation "schema.table" does not exist.
		name := strings.ReplaceAll(t, `"`, "")
		if strings.Contains(err.Error(), `"`+name+`"`) {
			*errp = &missingTableError{table: name, err: err}
			return
		}
	}
}

// missingTableError is the error of a statement on one of idem's tables that
// does not exist, saying how to create it.
type missingTableError struct {
	table string
	err   error
}

func (e *missingTableError) Error() string {
	return "idem: table " + e.table + " does not exist: create it with migrations.Up (or 'idem migrate up'), naming the same schema and table: " + e.err.Error()
}

func (e *missingTableError) Unwrap() error { return e.err }

// closedHandle gives an error that a closed handle caused idem's context:
// a pool the application closed (pgxpool's "closed pool") or a transaction
// already committed or rolled back (pgx.ErrTxClosed), which is an
// ErrInvalidOption too. Other errors, and one already explained, are
// returned as they are.
func closedHandle(op string, err error) error {
	var done *closedHandleError
	switch {
	case err == nil || errors.As(err, &done):
		return err
	case errors.Is(err, puddle.ErrClosedPool):
		return &closedHandleError{op: op, what: "the pool was closed", err: err}
	case errors.Is(err, pgx.ErrTxClosed):
		return &closedHandleError{op: op, what: "the transaction was already committed or rolled back", err: err, invalid: true}
	}
	return err
}

// closedHandleError is closedHandle's error.
type closedHandleError struct {
	op, what string
	err      error
	invalid  bool // the caller passed a handle that cannot work: ErrInvalidOption
}

func (e *closedHandleError) Error() string {
	return "idem: " + e.op + ": " + e.what + ": " + e.err.Error()
}

func (e *closedHandleError) Unwrap() error { return e.err }

// Is makes a closed transaction match ErrInvalidOption.
func (e *closedHandleError) Is(target error) bool { return e.invalid && target == ErrInvalidOption }
