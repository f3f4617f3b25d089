package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemkit/idem/internal/protocol"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/pgerr"
)

// claimLockTimeout bounds how long Claim may wait for a row another
// transaction holds (a holder completing, a purge batch) before answering
// ErrInProgress.
const claimLockTimeout = "100ms"

// Lease is a committed claim on a key, for work that cannot sit inside one
// database transaction: a call to a payment gateway, an e-mail, a call to
// another service. Claim returns it. While the lease is live, other Claims of
// the key get ErrInProgress; when it runs out, another worker may take the
// key over, which increments the attempt number and fences this holder out:
// its Extend, Checkpoint, Complete, Fail and Release then return
// ErrLeaseLost. A Lease is not safe for concurrent use, except KeepAlive's
// renewals alongside the holder's other calls. Its calls that take a db
// refuse a nil one, a nil Lease and one not made by Claim with
// ErrInvalidOption before any SQL.
type Lease[T any] struct {
	key      Key
	attempt  int32
	point    string
	data     []byte
	duration time.Duration
	cfg      config
	// renewed is when the request behind the lease's latest known renewal
	// (the claim, an Extend, a Checkpoint) was sent, as monoSince reads it:
	// the lease runs from about then.
	renewed  atomic.Int64
	finished atomic.Bool // Complete, Fail or Release was called: stop renewing
}

// monoBase anchors the monotonic times a Lease keeps in an atomic.Int64.
var monoBase = time.Now()

// monoSince is the monotonic time elapsed since monoBase.
func monoSince() time.Duration { return time.Since(monoBase) }

// renewedAt records that a renewal sent at sent succeeded, unless a later one
// is already known (KeepAlive's renewals and the holder's own calls may
// overlap).
func (l *Lease[T]) renewedAt(sent time.Duration) {
	for {
		prev := l.renewed.Load()
		if int64(sent) <= prev || l.renewed.CompareAndSwap(prev, int64(sent)) {
			return
		}
	}
}

// Claim claims key for work outside a transaction and commits the claim: a
// processing record whose lease runs for lease (measured by the database
// clock) unless extended.
//
// Outcomes:
//   - a *Lease and a zero Result: this call holds the key, new or taken over
//     from a holder whose lease ran out (Attempt incremented; RecoveryPoint
//     set if that holder checkpointed);
//   - no Lease and the recorded Result (Replayed true): the key finished;
//     or the recorded Permanent error;
//   - ErrInProgress, at once, while another holder's lease is live (Claim
//     never waits for it);
//   - ErrKeyReused for another fingerprint; ErrInvalidKey or
//     ErrInvalidOption before any SQL; with RequireIssued, a *TokenError for
//     a key IssueToken did not hand out.
//
// db should be a pool or a connection, so that the claim commits at once
// and Claim waits at most 100ms for a row another transaction holds. With a
// pgx.Tx the claim commits with that transaction, which also keeps the
// record's row locked until it ends, even when Claim did not take the key
// (the holder's lease calls then wait for it).
//
// Fencing: Extend, Checkpoint, Complete, Fail and Release check the attempt
// number, and answer ErrLeaseLost once another worker took the key over.
// Inside a REPEATABLE READ or SERIALIZABLE transaction, a change committed
// after its snapshot (another holder's renewal, say) fails them with SQLSTATE
// 40001 instead; the transaction must roll back either way.
func Claim[T any](ctx context.Context, db DBTX, key Key, lease time.Duration, opts ...KeyOption) (_ *Lease[T], _ Result[T], err error) {
	var zero Result[T]
	cfg, err := newCall("Claim", key, !handle.Missing(db) && lease > 0, "a database and a positive lease", opts)
	if err != nil {
		return nil, zero, err
	}
	defer cfg.ExplainMissingTable(&err)
	start := time.Now()
	l, res, err := claim[T](ctx, db, key, lease, &cfg)
	switch {
	case l != nil && l.attempt > 1:
		emit(&cfg, ctx, EventTakeover, "Claim", key, l.attempt, start, nil)
	case l != nil:
		emit(&cfg, ctx, EventExecuted, "Claim", key, l.attempt, start, nil)
	default:
		report(&cfg, ctx, "Claim", key, start, res.Replayed, err)
	}
	return l, res, protocol.WithContextErr(ctx, err)
}

// claim is Claim after the checks, without the event.
func claim[T any](ctx context.Context, db DBTX, key Key, lease time.Duration, cfg *config) (*Lease[T], Result[T], error) {
	var zero Result[T]
	claimSQL := cfg.Q.LeaseClaim
	if cfg.RequireIssued {
		claimSQL = cfg.Q.LeaseClaimIssued
	}
	_, inTx := db.(pgx.Tx)

	for range protocol.MaxClaimTries {
		l := &Lease[T]{key: key, duration: lease, cfg: *cfg}
		l.renewed.Store(int64(monoSince()))
		var rec protocol.Record
		claimed, found := false, false
		b := &pgx.Batch{}
		if !inTx {
			// The batch runs as one implicit transaction: the setting ends
			// with it.
			b.Queue(`SELECT set_config('lock_timeout', $1, true)`, claimLockTimeout)
		}
		b.Queue(claimSQL, key.Scope, key.ID, protocol.NonNilFingerprint(key.Fingerprint), cfg.TTL.Microseconds(), lease.Microseconds()).
			QueryRow(func(r pgx.Row) error {
				err := r.Scan(&l.attempt, &l.point, &l.data)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil
				}
				claimed = err == nil
				return err
			})
		read := cfg.Q.ReadStmt(protocol.Key(key), &rec, &found)
		queueStmt(b, &read)
		if err := db.SendBatch(ctx, b).Close(); err != nil {
			if pgerr.Code(err) == pgerr.LockNotAvailable && !inTx {
				return nil, zero, ErrInProgress
			}
			return nil, zero, closedHandle("Claim", err)
		}
		if claimed {
			return l, zero, nil
		}
		if cfg.RequireIssued {
			if err := protocol.CheckToken(found, &rec); err != nil {
				return nil, zero, err
			}
		}
		switch {
		case !found:
			continue // purged between the statements: claim again
		case !rec.FingerprintMatches(key.Fingerprint):
			return nil, zero, ErrKeyReused
		case rec.Status == StatusProcessing:
			// A live lease, or a claim another transaction holds right now.
			return nil, zero, ErrInProgress
		case rec.Expired || rec.Status == StatusIssued:
			continue // expired, or a token freed, between the statements: claim again
		}
		v, replayed, err := protocol.Replay[T](rec, cfg)
		return nil, Result[T]{Value: v, Replayed: replayed}, err
	}
	return nil, zero, fmt.Errorf("idem: could not claim the key after %d tries", protocol.MaxClaimTries)
}

// Key is the claimed key.
func (l *Lease[T]) Key() Key {
	if l == nil {
		return Key{}
	}
	return l.key
}

// Attempt is the fencing token: 1 for the first holder, incremented by every
// takeover. Pass it to the downstream service with the key, so that it can
// refuse a request from a holder that was fenced out (a lower attempt than
// one it has seen).
func (l *Lease[T]) Attempt() int32 {
	if l == nil {
		return 0
	}
	return l.attempt
}

// RecoveryPoint is the last checkpoint a previous holder stored, or "" when
// the work starts from the beginning.
func (l *Lease[T]) RecoveryPoint() string {
	if l == nil {
		return ""
	}
	return l.point
}

// RecoveryData decodes the data stored with the last checkpoint into v. It
// returns ErrNotFound when there is none.
func (l *Lease[T]) RecoveryData(v any) error {
	if l == nil || l.point == "" || l.data == nil {
		return fmt.Errorf("%w: no checkpoint data", ErrNotFound)
	}
	if b, ok := v.(*[]byte); ok && l.cfg.Codec == nil {
		*b = append((*b)[:0], l.data...)
		return nil
	}
	if l.cfg.Codec == nil {
		return json.Unmarshal(l.data, v)
	}
	return l.cfg.Codec.Unmarshal(l.data, v)
}

// usable checks a lease call's receiver and database before any SQL.
func (l *Lease[T]) usable(db DBTX) error {
	if handle.Missing(db) {
		return fmt.Errorf("%w: a lease call needs a database, not a nil %T", ErrInvalidOption, db)
	}
	if l == nil || l.cfg.Q == nil {
		return fmt.Errorf("%w: the Lease is nil or was not made by Claim (Claim returns no Lease when it replays a result)", ErrInvalidOption)
	}
	return nil
}

// guarded runs one of the lease's guarded statements and turns "no row" into
// ErrLeaseLost. Its callers have checked usable.
func (l *Lease[T]) guarded(ctx context.Context, db DBTX, op, sql string, args ...any) error {
	tag, err := db.Exec(ctx, sql, append([]any{l.key.Scope, l.key.ID, l.attempt}, args...)...)
	if err != nil {
		return closedHandle(op, err)
	}
	if tag.RowsAffected() != 1 {
		// The key itself stays out of the message, which may be logged.
		err := fmt.Errorf("%w: the key is no longer held at attempt %d", ErrLeaseLost, l.attempt)
		emit(&l.cfg, ctx, EventLeaseLost, op, l.key, l.attempt, time.Time{}, err)
		return err
	}
	return nil
}

// Extend renews the lease for its full duration from now, by the database
// clock: the heartbeat. It returns ErrLeaseLost if another worker took the
// key over.
func (l *Lease[T]) Extend(ctx context.Context, db DBTX) error {
	if err := l.usable(db); err != nil {
		return err
	}
	sent := monoSince()
	if err := l.guarded(ctx, db, "Extend", l.cfg.Q.LeaseUpdate, l.duration.Microseconds()); err != nil {
		return err
	}
	l.renewedAt(sent)
	return nil
}

// KeepAlive renews the lease in the background every third of its duration:
// the watchdog. It returns a context derived from ctx that is cancelled, with
// a cause matching ErrLeaseLost, when the lease is lost: a renewal found it
// taken over, or no renewal succeeded within a lease duration of the last
// one sent, by KeepAlive or by the holder's own Extend and Checkpoint calls
// (a renewal that hangs counts as failed when the lease it would extend has
// run out). Use that context for the work the lease protects.
// stop ends the renewals and returns why they ended early (nil if they did
// not, or if ctx ended them). Renewals stop once Complete, Fail or Release is
// called. KeepAlive uses db concurrently with the holder's own calls, so db
// should be a pool. When the lease or db is refused (ErrInvalidOption), the
// returned context is already cancelled with that error as its cause, and
// stop returns it.
func (l *Lease[T]) KeepAlive(ctx context.Context, db DBTX) (context.Context, func() error) {
	workCtx, cancel := context.WithCancelCause(ctx)
	if err := l.usable(db); err != nil {
		cancel(err)
		return workCtx, func() error { return err }
	}
	done := make(chan struct{})
	var once sync.Once
	var lost error
	go func() {
		defer close(done)
		every := max(l.duration/3, time.Millisecond)
		t := time.NewTicker(every)
		defer t.Stop()
		// Time spent on the application clock since a request was sent can
		// only understate how long the server has counted, so the lease is
		// known to hold until the latest renewal's sending + duration at
		// most.
		for {
			select {
			case <-workCtx.Done():
				return
			case <-t.C:
			}
			if l.finished.Load() {
				return
			}
			sent := monoSince()
			left := time.Duration(l.renewed.Load()) + l.duration - sent
			if left <= 0 {
				lost = fmt.Errorf("%w: no renewal succeeded within %v", ErrLeaseLost, l.duration)
				emit(&l.cfg, ctx, EventLeaseLost, "KeepAlive", l.key, l.attempt, time.Time{}, lost)
				cancel(lost)
				return
			}
			extCtx, cancelExt := context.WithTimeout(workCtx, left)
			err := l.Extend(extCtx, db)
			cancelExt()
			switch {
			case l.finished.Load():
				return // completed (or released) meanwhile: not a loss
			case err == nil:
				// Extend recorded the renewal.
			case errors.Is(err, ErrLeaseLost):
				lost = err
				cancel(lost)
				return
			case ctx.Err() != nil:
				return
			}
			// Other errors: try again at the next tick, until the deadline.
		}
	}()
	stop := func() error {
		once.Do(func() { cancel(context.Canceled) })
		<-done
		return lost
	}
	return workCtx, stop
}

// Checkpoint stores a recovery point and its data (encoded like results)
// and renews the lease. A worker that takes the key over after this holder
// stopped reads them with RecoveryPoint and RecoveryData and resumes from
// there instead of starting again. It returns ErrLeaseLost if another worker
// took the key over.
func (l *Lease[T]) Checkpoint(ctx context.Context, db DBTX, point string, data any) error {
	if err := l.usable(db); err != nil {
		return err
	}
	if point == "" {
		return fmt.Errorf("%w: Checkpoint needs a non-empty point", ErrInvalidOption)
	}
	enc, err := protocol.EncodeResult[any](&l.cfg, data)
	if err != nil {
		return err
	}
	sent := monoSince()
	if err := l.guarded(ctx, db, "Checkpoint", l.cfg.Q.LeaseCheckpoint, point, enc, l.duration.Microseconds()); err != nil {
		return err
	}
	l.renewedAt(sent)
	l.point, l.data = point, enc
	return nil
}

// Complete records v as the key's result, normally inside the transaction
// that writes the work's business rows, so that both commit together. It
// returns ErrLeaseLost if another worker took the key over: that transaction
// must then roll back. A v whose encoding exceeds WithMaxResultSize returns
// ErrResultTooLarge before any SQL, and so does a v whose encoding does not
// decode (see Codec) with an error of its own; the lease is still held.
func (l *Lease[T]) Complete(ctx context.Context, db DBTX, v T) error {
	if err := l.usable(db); err != nil {
		return err
	}
	data, _, err := protocol.RecordResult(&l.cfg, v)
	if err != nil {
		return err
	}
	l.finished.Store(true)
	return l.guarded(ctx, db, "Complete", l.cfg.Q.LeaseFinish, StatusSucceeded, data, l.cfg.TTL.Microseconds())
}

// Fail records a permanent failure: later Claims of the key return it as a
// *PermanentError. It returns ErrLeaseLost if another worker took the key
// over.
func (l *Lease[T]) Fail(ctx context.Context, db DBTX, cause error) error {
	if err := l.usable(db); err != nil {
		return err
	}
	if cause == nil {
		return fmt.Errorf("%w: Fail needs an error", ErrInvalidOption)
	}
	l.finished.Store(true)
	return l.guarded(ctx, db, "Fail", l.cfg.Q.LeaseFinish, StatusFailed, protocol.FailureMessage(&l.cfg, cause), l.cfg.TTL.Microseconds())
}

// Release gives the key up without finishing: the lease ends now, so the
// next Claim takes the key over at once (resuming from the last checkpoint).
// It returns ErrLeaseLost if another worker took the key over already.
func (l *Lease[T]) Release(ctx context.Context, db DBTX) error {
	if err := l.usable(db); err != nil {
		return err
	}
	l.finished.Store(true)
	return l.guarded(ctx, db, "Release", l.cfg.Q.LeaseRelease)
}
