package idemsql

import (
	"context"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// Lease is a committed claim on a key, for work that cannot sit inside one
// database transaction (a call to a payment gateway, an e-mail, a call to
// another service), as idem.Lease is on pgx: Claim returns it. While the
// lease is live, other Claims of the key get idem.ErrInProgress; when it
// runs out, another worker may take the key over, which increments the
// attempt number and fences this holder out: its Extend, Checkpoint,
// Complete, Fail and Release then return idem.ErrLeaseLost.
//
// Its calls take a DBTX: a *sql.DB, a *sql.Conn, or a *sql.Tx to run in the
// caller's transaction (Complete and Fail normally take the transaction that
// writes the work's business rows). A Lease is not safe for concurrent use,
// except KeepAlive's renewals alongside the holder's other calls. Its calls
// refuse a nil db, a nil Lease and one not made by Claim with
// idem.ErrInvalidOption before any SQL; a closed *sql.DB, or a *sql.Tx
// already committed or rolled back, fails with an error that says so (the
// latter matching idem.ErrInvalidOption).
type Lease[T any] struct {
	l *protocol.Lease[T] // nil for a Lease not made by Claim
}

// p is the protocol's lease behind l, or nil.
func (l *Lease[T]) p() *protocol.Lease[T] {
	if l == nil {
		return nil
	}
	return l.l
}

// use checks a lease call's receiver and database before any SQL, and
// returns the protocol's lease and what runs db's statements.
func (l *Lease[T]) use(db DBTX) (*protocol.Lease[T], protocol.Querier, error) {
	p := l.p()
	if err := p.Usable(db); err != nil {
		return nil, nil, err
	}
	return p, querierOf(db), nil
}

// Claim claims key for work outside a transaction and commits the claim, as
// idem.Claim does on pgx: a processing record whose lease runs for lease
// (measured by the database clock) unless extended.
//
// Outcomes:
//   - a *Lease and a zero Result: this call holds the key, new or taken over
//     from a holder whose lease ran out (Attempt incremented; RecoveryPoint
//     set if that holder checkpointed);
//   - no Lease and the recorded Result (Replayed true): the key finished;
//     or the recorded idem.PermanentError;
//   - idem.ErrInProgress, at once, while another holder's lease is live
//     (Claim never waits for it);
//   - idem.ErrKeyReused for another fingerprint; idem.ErrInvalidKey or
//     idem.ErrInvalidOption before any SQL (a nil db, a lease that is not
//     positive, a rejected option); with idem.RequireIssued, an
//     *idem.TokenError for a key IssueToken did not hand out.
//
// db should be a *sql.DB or a *sql.Conn: the claim then runs in a
// transaction of its own (BEGIN, a lock_timeout of 100ms, the claim, the
// read of the record, COMMIT), so that it commits at once and Claim waits at
// most 100ms for a row another transaction holds. With a *sql.Tx the claim
// commits with that transaction, which also keeps the record's row locked
// until it ends, even when Claim did not take the key (the holder's lease
// calls then wait for it).
//
// Fencing: Extend, Checkpoint, Complete, Fail and Release check the attempt
// number, and answer idem.ErrLeaseLost once another worker took the key
// over. Inside a REPEATABLE READ or SERIALIZABLE transaction, a change
// committed after its snapshot (another holder's renewal, say) fails them
// with SQLSTATE 40001 instead; the transaction must roll back either way.
func Claim[T any](ctx context.Context, db DBTX, key idem.Key, lease time.Duration, opts ...idem.KeyOption) (_ *Lease[T], _ idem.Result[T], err error) {
	var zero idem.Result[T]
	cfg, err := protocol.NewCall(dialect, "Claim", protocol.Key(key), key.Validate(), !handle.Missing(db) && lease > 0, "a database and a positive lease", opts)
	if err != nil {
		return nil, zero, err
	}
	defer cfg.ExplainMissingTable(&err)
	pl, v, replayed, err := protocol.Claim[T](ctx, sqlErrors{}, querierOf(db), protocol.Key(key), lease, &cfg)
	if pl == nil {
		return nil, idem.Result[T]{Value: v, Replayed: replayed}, err
	}
	return &Lease[T]{l: pl}, zero, err
}

// Key is the claimed key, or a zero Key for a nil Lease.
func (l *Lease[T]) Key() idem.Key { return idem.Key(l.p().Key()) }

// Attempt is the fencing token: 1 for the first holder, incremented by every
// takeover (0 for a nil Lease). Pass it to the downstream service with the
// key, so that it can refuse a request from a holder that was fenced out (a
// lower attempt than one it has seen).
func (l *Lease[T]) Attempt() int32 { return l.p().Attempt() }

// RecoveryPoint is the last checkpoint a previous holder stored, or "" when
// the work starts from the beginning.
func (l *Lease[T]) RecoveryPoint() string { return l.p().RecoveryPoint() }

// RecoveryData decodes the data stored with the last checkpoint into v, with
// the call's codec (idem.WithCodec). It returns idem.ErrNotFound when there
// is none.
func (l *Lease[T]) RecoveryData(v any) error { return l.p().RecoveryData(v) }

// Extend renews the lease for its full duration from now, by the database
// clock: the heartbeat. It returns idem.ErrLeaseLost if another worker took
// the key over.
func (l *Lease[T]) Extend(ctx context.Context, db DBTX) error {
	p, q, err := l.use(db)
	if err != nil {
		return err
	}
	return p.Extend(ctx, q)
}

// KeepAlive renews the lease in the background every third of its duration:
// the watchdog. It returns a context derived from ctx that is cancelled, with
// a cause matching idem.ErrLeaseLost, when the lease is lost: a renewal found
// it taken over, or no renewal succeeded within a lease duration of the last
// one sent, by KeepAlive or by the holder's own Extend and Checkpoint calls
// (a renewal that hangs counts as failed when the lease it would extend has
// run out). Use that context for the work the lease protects.
//
// stop ends the renewals and returns why they ended early (nil if they did
// not, or if ctx ended them). Renewals stop once Complete, Fail or Release is
// called. KeepAlive uses db concurrently with the holder's own calls, so db
// should be a *sql.DB (a renewal inside a *sql.Tx would not count until that
// transaction commits).
// When the lease or db is refused (idem.ErrInvalidOption), the returned
// context is already cancelled with that error as its cause, and stop
// returns it.
func (l *Lease[T]) KeepAlive(ctx context.Context, db DBTX) (context.Context, func() error) {
	p, q, err := l.use(db)
	if err != nil {
		return protocol.KeepAliveRefused(ctx, err)
	}
	return p.KeepAlive(ctx, q)
}

// Checkpoint stores a recovery point and its data (encoded like results)
// and renews the lease. A worker that takes the key over after this holder
// stopped reads them with RecoveryPoint and RecoveryData and resumes from
// there instead of starting again. point must not be empty. It returns
// idem.ErrLeaseLost if another worker took the key over.
func (l *Lease[T]) Checkpoint(ctx context.Context, db DBTX, point string, data any) error {
	p, q, err := l.use(db)
	if err != nil {
		return err
	}
	return p.Checkpoint(ctx, q, point, data)
}

// Complete records v as the key's result, normally inside the *sql.Tx that
// writes the work's business rows, so that both commit together. It returns
// idem.ErrLeaseLost if another worker took the key over: that transaction
// must then roll back. A v whose encoding exceeds idem.WithMaxResultSize
// returns idem.ErrResultTooLarge before any SQL, and so does a v whose
// encoding does not decode (see idem.Codec) with an error of its own; the
// lease is still held.
func (l *Lease[T]) Complete(ctx context.Context, db DBTX, v T) error {
	p, q, err := l.use(db)
	if err != nil {
		return err
	}
	return p.Complete(ctx, q, v)
}

// Fail records a permanent failure, normally inside the *sql.Tx that undoes
// or records the work's business rows: later Claims of the key return it as
// an *idem.PermanentError. cause must not be nil. It returns
// idem.ErrLeaseLost if another worker took the key over.
func (l *Lease[T]) Fail(ctx context.Context, db DBTX, cause error) error {
	p, q, err := l.use(db)
	if err != nil {
		return err
	}
	return p.Fail(ctx, q, cause)
}

// Release gives the key up without finishing: the lease ends now, so the
// next Claim takes the key over at once (resuming from the last checkpoint).
// It returns idem.ErrLeaseLost if another worker took the key over already.
func (l *Lease[T]) Release(ctx context.Context, db DBTX) error {
	p, q, err := l.use(db)
	if err != nil {
		return err
	}
	return p.Release(ctx, q)
}
