package protocol

import (
	"context"
	"errors"
	"fmt"
)

// The sentinel errors. The root package exports each under its own name
// (idem.ErrInProgress is ErrInProgress), with the documentation users read;
// every driver returns these values, so errors.Is works the same on all.
var (
	ErrInProgress     = errors.New("idem: key is in progress")
	ErrKeyReused      = errors.New("idem: key reused with a different fingerprint")
	ErrInvalidKey     = errors.New("idem: invalid key")
	ErrInvalidOption  = errors.New("idem: invalid option")
	ErrLeaseLost      = errors.New("idem: lease lost")
	ErrOutcomeUnknown = errors.New("idem: commit outcome unknown")
	ErrHoldTimeout    = errors.New("idem: key held idle past its hold timeout; the server ended the transaction")
	ErrNotFound       = errors.New("idem: not found")
	ErrResultTooLarge = errors.New("idem: encoded result too large to record")

	ErrTokenRejected   = errors.New("idem: token rejected")
	ErrTokenUnknown    = errors.New("idem: token unknown")
	ErrTokenExpired    = errors.New("idem: token expired")
	ErrTokenOtherScope = errors.New("idem: token issued for another scope")
)

// PermanentError is idem.PermanentError: fn's business outcome, recorded
// and replayed.
type PermanentError struct {
	// Err is the business error. On a replay it is a *RecordedError carrying
	// the first error's message.
	Err error
}

// Error returns the business error's message.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns the business error.
func (e *PermanentError) Unwrap() error { return e.Err }

// RecordedError is idem.RecordedError: the business error of a replayed
// permanent failure, of which only the message was kept.
type RecordedError struct {
	// Message is the recorded error's text (Error() of the original).
	Message string
}

// Error returns the recorded message.
func (e *RecordedError) Error() string { return e.Message }

// IsPermanent reports whether err is, or wraps, a *PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// TokenError is idem.TokenError: why RequireIssued refused a token.
type TokenError struct {
	Problem error // ErrTokenUnknown, ErrTokenExpired or ErrTokenOtherScope
}

// Error describes the problem.
func (e *TokenError) Error() string { return e.Problem.Error() }

// Is matches ErrTokenRejected and the problem.
func (e *TokenError) Is(target error) bool {
	return target == ErrTokenRejected || target == e.Problem
}

// CheckToken turns what a token claim found into an error, or nil when the
// record may be handled as usual (replayed, in progress, taken over).
func CheckToken(found bool, rec *Record) error {
	switch {
	case !found:
		return &TokenError{Problem: ErrTokenUnknown}
	case rec.Expired:
		return &TokenError{Problem: ErrTokenExpired}
	}
	return nil
}

// WithContextErr makes an error that a done ctx caused match ctx.Err(),
// whichever driver reported it: pgx returns the context's error, lib/pq the
// server's "canceling statement due to user request" (SQLSTATE 57014).
func WithContextErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", cerr, err)
	}
	return err
}

// HoldError makes an error that the hold timeout's idle bound caused match
// ErrHoldTimeout: the server ended the session of a transaction that sat
// idle too long (the dialect's IdleTimeout; PostgreSQL's 25P03), so nothing
// of it committed. A statement the bound cancelled (PostgreSQL's 57014) is
// left as it is: the same error comes from other cancellations, and it does
// not end the transaction. A Permanent error was recorded, so it is not
// one.
func (c *Config) HoldError(err error) error {
	if err == nil || c.HoldTimeout == 0 || IsPermanent(err) || !c.D.IdleTimeout(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrHoldTimeout, err)
}

// ExplainMissingTable adds to *errp, when a statement failed because a
// table the call names does not exist (the dialect's MissingTable), how to
// create it. Other errors, a missing table of the caller's own, and an
// error already explained (by an idem call nested in fn) stay as they are.
func (c *Config) ExplainMissingTable(errp *error) {
	err := *errp
	var done *missingTableError
	if err == nil || c.D == nil || errors.As(err, &done) {
		return
	}
	for _, t := range []Table{c.Table, c.InboxTable} {
		if c.D.MissingTable(err, t) {
			*errp = &missingTableError{table: t.String(), err: err}
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

// ClosedHandle gives an error that a closed handle caused idem's context,
// when the driver recognises it (Errors.Closed): a pool the application
// closed, or a transaction already committed or rolled back, which is an
// ErrInvalidOption too. Other errors, and one already explained, are
// returned as they are.
func ClosedHandle(op string, err error, closed func(error) (what string, invalid bool)) error {
	var done *closedHandleError
	if err == nil || errors.As(err, &done) || closed == nil {
		return err
	}
	if what, invalid := closed(err); what != "" {
		return &closedHandleError{op: op, what: what, err: err, invalid: invalid}
	}
	return err
}

// closedHandleError is ClosedHandle's error.
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

// The "what" of ClosedHandle for the two kinds of closed handle.
const (
	PoolClosed = "the pool was closed"
	TxEnded    = "the transaction was already committed or rolled back"
)

// NotSentError is what Own.Commit returns for a COMMIT it did not send (the
// connection had closed, or the context had ended): nothing committed. The
// protocol returns Err as it is, without "idem: commit:".
type NotSentError struct{ Err error }

func (e *NotSentError) Error() string { return e.Err.Error() }

func (e *NotSentError) Unwrap() error { return e.Err }

// Unavailable marks err as a failure of an attempt of Do that committed
// nothing because the database was unavailable (unreachable, not the
// primary, or ending the session): Do runs another attempt on a fresh
// connection while Retry.Outage allows. A commit whose outcome is unknown is
// never marked: it may have committed.
func Unavailable(err error) error {
	if err == nil || errors.Is(err, ErrOutcomeUnknown) {
		return err
	}
	var u *unavailableError
	if errors.As(err, &u) {
		return err
	}
	return &unavailableError{err: err}
}

// unavailableError is Unavailable's mark. Do returns the error it carries,
// never the mark itself.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// unmark returns err without Unavailable's mark, and whether it had one.
func unmark(err error) (error, bool) {
	if u, ok := err.(*unavailableError); ok {
		return u.err, true
	}
	return err, false
}
