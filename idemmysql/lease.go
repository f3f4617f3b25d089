package idemmysql

import (
	"context"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/protocol"
)

// Lease is a committed claim on a key, for work that cannot sit inside one
// database transaction (a call to a payment gateway, say), as idem.Lease is
// on PostgreSQL: Claim returns it. While the lease is live, other Claims of
// the key get idem.ErrInProgress; once it runs out another worker may take
// the key over, which increments the attempt number (the fencing token) and
// fences this holder out: its Extend, Checkpoint, Complete, Fail and
// Release then return idem.ErrLeaseLost.
//
// Its calls take a DBTX: a *sql.DB, a *sql.Conn, or a *sql.Tx to run in the
// caller's transaction (Complete and Fail normally take the transaction that
// writes the work's business rows). A Lease is not safe for concurrent use,
// except KeepAlive's renewals alongside the holder's other calls. A nil db,
// a nil Lease or one not made by Claim is an idem.ErrInvalidOption before
// any SQL.
type Lease[T any] struct {
	l *protocol.Lease[T] // nil for a Lease not made by Claim
}

// use checks a lease call's receiver and database before any SQL.
func (l *Lease[T]) use(db DBTX) (*protocol.Lease[T], protocol.Querier, error) {
	p := l.p()
	if err := p.Usable(db); err != nil {
		return nil, nil, err
	}
	return p, flavor.Querier(db), nil
}

// Claim claims key for work outside a transaction and commits the claim, as
// idem.Claim does: a processing record whose lease runs for lease (by the
// database clock) unless extended. It returns a *Lease (this call holds the
// key, new or taken over from a holder whose lease ran out, with its
// RecoveryPoint), or no Lease and the recorded Result (Replayed) of a key
// that finished, or idem.ErrInProgress at once while another holder's lease
// is live, idem.ErrKeyReused, or with idem.RequireIssued an
// *idem.TokenError.
//
// On a *sql.DB or *sql.Conn the claim commits at once, in a transaction of
// its own, and waits at most about 100ms for a row another transaction
// holds (on MariaDB; MySQL 8 waits its innodb_lock_wait_timeout). The
// takeover happens inside the claim's upsert, never as a read then an
// update. With a *sql.Tx the claim commits with that transaction.
func Claim[T any](ctx context.Context, db DBTX, key idem.Key, lease time.Duration, opts ...idem.KeyOption) (_ *Lease[T], _ idem.Result[T], err error) {
	var zero idem.Result[T]
	if keyErr := key.Validate(); keyErr != nil || lease <= 0 {
		_, err := protocol.NewCall(nil, "Claim", protocol.Key(key), keyErr, false, "a database and a positive lease", opts)
		return nil, zero, err
	}
	q, d, err := opsQuerier(ctx, "Claim", db)
	if err != nil {
		return nil, zero, err
	}
	cfg, err := protocol.NewCall(d, "Claim", protocol.Key(key), nil, true, "", opts)
	if err != nil {
		return nil, zero, err
	}
	defer cfg.ExplainMissingTable(&err)
	pl, v, replayed, err := protocol.Claim[T](ctx, mysqlErrors{}, q, protocol.Key(key), lease, &cfg)
	if pl == nil {
		return nil, idem.Result[T]{Value: v, Replayed: replayed}, wrap(err)
	}
	return &Lease[T]{l: pl}, zero, wrap(err)
}

func (l *Lease[T]) p() *protocol.Lease[T] {
	if l == nil {
		return nil
	}
	return l.l
}

// Key is the claimed key, or a zero Key for a nil Lease.
func (l *Lease[T]) Key() idem.Key { return idem.Key(l.p().Key()) }

// Attempt is the fencing token: 1 for the first holder, incremented by every
// takeover (0 for a nil Lease). Pass it downstream with the key.
func (l *Lease[T]) Attempt() int32 { return l.p().Attempt() }

// RecoveryPoint is the last checkpoint a previous holder stored, or "".
func (l *Lease[T]) RecoveryPoint() string { return l.p().RecoveryPoint() }

// RecoveryData decodes the data stored with the last checkpoint into v
// (idem.ErrNotFound when there is none).
func (l *Lease[T]) RecoveryData(v any) error { return l.p().RecoveryData(v) }

// Extend renews the lease for its full duration from now, by the database
// clock; idem.ErrLeaseLost once another worker took the key over.
func (l *Lease[T]) Extend(ctx context.Context, db DBTX) error {
	p, q, err := l.use(db)
	if err != nil {
		return err
	}
	return p.Extend(ctx, q)
}

// KeepAlive renews the lease in the background every third of its
// duration, as idem.Lease.KeepAlive does: the returned context is cancelled
// (cause idem.ErrLeaseLost) when the lease is lost; stop ends the renewals.
// db should be a *sql.DB.
func (l *Lease[T]) KeepAlive(ctx context.Context, db DBTX) (context.Context, func() error) {
	p, q, err := l.use(db)
	if err != nil {
		return protocol.KeepAliveRefused(ctx, err)
	}
	return p.KeepAlive(ctx, q)
}

// Checkpoint stores a recovery point and its data and renews the lease: a
// worker that takes the key over resumes from there.
func (l *Lease[T]) Checkpoint(ctx context.Context, db DBTX, point string, data any) error {
	p, q, err := l.use(db)
	if err != nil {
		return err
	}
	return p.Checkpoint(ctx, q, point, data)
}

// Complete records v as the key's result, normally inside the *sql.Tx that
// writes the work's business rows, so that both commit together; on
// idem.ErrLeaseLost that transaction must roll back.
func (l *Lease[T]) Complete(ctx context.Context, db DBTX, v T) error {
	p, q, err := l.use(db)
	if err != nil {
		return err
	}
	return wrap(p.Complete(ctx, q, v))
}

// Fail records a permanent failure: later Claims of the key return it as an
// *idem.PermanentError. cause must not be nil.
func (l *Lease[T]) Fail(ctx context.Context, db DBTX, cause error) error {
	p, q, err := l.use(db)
	if err != nil {
		return err
	}
	return wrap(p.Fail(ctx, q, cause))
}

// Release gives the key up without finishing: the next Claim takes it over
// at once, resuming from the last checkpoint.
func (l *Lease[T]) Release(ctx context.Context, db DBTX) error {
	p, q, err := l.use(db)
	if err != nil {
		return err
	}
	return p.Release(ctx, q)
}
