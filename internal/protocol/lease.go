package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/handle"
)

// Lease mode (idem.Claim and idem.Lease): a claim that commits at once, for
// work that cannot sit inside one database transaction.
//
// Claim runs, in one group, the claiming statement (LeaseClaim, or
// LeaseClaimIssued with RequireIssued), which inserts a processing record
// with a lease or takes over one whose lease ran out, and the read of the
// record, which the claim judges when it claimed nothing. Outside a
// transaction of the caller's, the group begins with the dialect's
// ClaimLockTimeout setting: the group runs as one transaction of its own
// (pgx: a batch's implicit transaction; database/sql: BEGIN and COMMIT
// around it), so the setting ends with it. Claim never waits for a live lease: it answers
// ErrInProgress.
//
// The lease's other statements are guarded by the attempt number the claim
// returned: one that matches no row means another worker took the key over
// (ErrLeaseLost).

// LeaseClaimWait bounds how long a lease claim outside the caller's
// transaction waits for a row another transaction holds, where the dialect
// bounds waits with a ClaimPrefix (PostgreSQL's is ClaimLockTimeout).
const LeaseClaimWait = 100 * time.Millisecond

// Lease is the state of a committed claim on a key (idem.Lease's): the key,
// the attempt that fences out other holders, the recovery point and its
// data, and the clock of its renewals. It is not safe for concurrent use,
// except KeepAlive's renewals alongside the holder's other calls. Its calls
// that take a Querier expect the front to have checked Usable first.
type Lease[T any] struct {
	key      Key
	attempt  int32
	point    string
	data     []byte
	duration time.Duration
	cfg      Config
	e        Errors // the driver's, for the handles it finds closed
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

// Claim claims key on q for lease-mode work and commits the claim (unless q
// is a transaction of the caller's): idem.Claim after its checks. It returns
// the Lease when this call holds the key, else the replayed value (replayed
// true) or the recorded Permanent error; errors are ErrInProgress,
// ErrKeyReused, a *TokenError (RequireIssued) and database errors. It
// reports the call's event, and makes an error that a done ctx caused match
// ctx.Err().
func Claim[T any](ctx context.Context, e Errors, q Querier, key Key, lease time.Duration, c *Config) (*Lease[T], T, bool, error) {
	start := time.Now()
	l, v, replayed, err := claimLease[T](ctx, e, q, key, lease, c)
	switch {
	case l != nil && l.attempt > 1:
		c.Emit(ctx, EventTakeover, c.Op, key, l.attempt, start, nil)
	case l != nil:
		c.Emit(ctx, EventExecuted, c.Op, key, l.attempt, start, nil)
	default:
		c.Report(ctx, c.Op, key, start, replayed, err)
	}
	return l, v, replayed, WithContextErr(ctx, err)
}

// claimLease is Claim without the event.
func claimLease[T any](ctx context.Context, e Errors, q Querier, key Key, lease time.Duration, c *Config) (*Lease[T], T, bool, error) {
	var zero T
	claimSQL := c.Q.LeaseClaim
	if c.RequireIssued {
		claimSQL = c.Q.LeaseClaimIssued
	}
	inTx := q.InTx()
	args := []any{key.Scope, key.ID, NonNilFingerprint(key.Fingerprint), c.TTL.Microseconds(), lease.Microseconds()}
	var token []byte
	if c.Q.Tokens {
		token = NewClaimToken()
		args = append(args, token)
	}
	if !inTx && c.D.ClaimPrefix != nil {
		claimSQL = c.D.ClaimPrefix(false, LeaseClaimWait) + claimSQL
	}
	for range MaxClaimTries {
		l := &Lease[T]{key: key, duration: lease, cfg: *c, e: e}
		l.renewed.Store(int64(monoSince()))
		var (
			rec                   Record
			claimed, found, owned bool
			holder                []byte
		)
		stmts := make([]Stmt, 0, 4)
		if !inTx && c.D.ClaimPrefix == nil {
			// The group runs as one transaction of its own: the setting
			// ends with it.
			stmts = append(stmts, Stmt{SQL: c.D.ClaimLockTimeout})
		}
		if c.Q.Tokens {
			stmts = append(stmts, Stmt{SQL: claimSQL, Args: args},
				Stmt{SQL: c.Q.LeaseRead, Args: args, Dest: []any{&holder, &l.attempt, &l.point, &l.data}, Found: &owned})
		} else {
			stmts = append(stmts, Stmt{SQL: claimSQL, Args: args, Dest: []any{&l.attempt, &l.point, &l.data}, Found: &claimed})
		}
		stmts = append(stmts, c.Q.ReadStmt(key, &rec, &found))
		if err := q.Run(ctx, stmts...); err != nil {
			if !inTx && e.LockTimeout(err) {
				return nil, zero, false, ErrInProgress
			}
			return nil, zero, false, ClosedHandle(c.Op, err, e.Closed)
		}
		if c.Q.Tokens {
			claimed = owned && bytes.Equal(holder, token)
		}
		if claimed {
			return l, zero, false, nil
		}
		if c.RequireIssued {
			if err := CheckToken(found, &rec); err != nil {
				return nil, zero, false, err
			}
		}
		switch {
		case !found:
			continue // purged between the statements: claim again
		case !rec.FingerprintMatches(key.Fingerprint):
			return nil, zero, false, ErrKeyReused
		case rec.Status == StatusProcessing:
			// A live lease, or a claim another transaction holds right now.
			return nil, zero, false, ErrInProgress
		case rec.Expired || rec.Status == StatusIssued:
			continue // expired, or a token freed, between the statements: claim again
		}
		v, replayed, err := Replay[T](rec, c)
		return nil, v, replayed, err
	}
	return nil, zero, false, fmt.Errorf("idem: could not claim the key after %d tries", MaxClaimTries)
}

// Key is the claimed key; zero for a nil Lease.
func (l *Lease[T]) Key() Key {
	if l == nil {
		return Key{}
	}
	return l.key
}

// Attempt is the fencing token; 0 for a nil Lease.
func (l *Lease[T]) Attempt() int32 {
	if l == nil {
		return 0
	}
	return l.attempt
}

// RecoveryPoint is the last checkpoint stored; "" for a nil Lease.
func (l *Lease[T]) RecoveryPoint() string {
	if l == nil {
		return ""
	}
	return l.point
}

// RecoveryData decodes the data stored with the last checkpoint into v, or
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

// Usable checks a lease call's receiver and database before any SQL: db is
// the handle as the caller passed it (a nil or typed-nil one is refused), l
// the lease behind the front's (nil when the front's is nil or zero).
func (l *Lease[T]) Usable(db any) error {
	if handle.Missing(db) {
		return fmt.Errorf("%w: a lease call needs a database, not a nil %T", ErrInvalidOption, db)
	}
	if l == nil || l.cfg.Q == nil {
		return fmt.Errorf("%w: the Lease is nil or was not made by Claim (Claim returns no Lease when it replays a result)", ErrInvalidOption)
	}
	return nil
}

// guarded runs one of the lease's guarded statements and turns "no row" into
// ErrLeaseLost. Its callers have checked Usable.
func (l *Lease[T]) guarded(ctx context.Context, q Querier, op, sql string, args ...any) error {
	var n int64
	st := Stmt{SQL: sql, Args: append([]any{l.key.Scope, l.key.ID, l.attempt}, args...), Affected: &n}
	if err := q.Run(ctx, st); err != nil {
		return ClosedHandle(op, err, l.e.Closed)
	}
	if n != 1 {
		// The key itself stays out of the message, which may be logged.
		err := fmt.Errorf("%w: the key is no longer held at attempt %d", ErrLeaseLost, l.attempt)
		l.cfg.Emit(ctx, EventLeaseLost, op, l.key, l.attempt, time.Time{}, err)
		return err
	}
	return nil
}

// Extend renews the lease for its full duration from now, by the database
// clock.
func (l *Lease[T]) Extend(ctx context.Context, q Querier) error {
	sent := monoSince()
	if err := l.guarded(ctx, q, "Extend", l.cfg.Q.LeaseUpdate, l.duration.Microseconds()); err != nil {
		return err
	}
	l.renewedAt(sent)
	return nil
}

// KeepAliveRefused is what KeepAlive returns for a call that Usable refused
// with err: a context already cancelled with err as its cause, and a stop
// that returns err.
func KeepAliveRefused(ctx context.Context, err error) (context.Context, func() error) {
	workCtx, cancel := context.WithCancelCause(ctx)
	cancel(err)
	return workCtx, func() error { return err }
}

// KeepAlive renews the lease on q in the background every third of its
// duration (idem.Lease.KeepAlive, whose documentation says when the
// returned context is cancelled and what stop returns).
func (l *Lease[T]) KeepAlive(ctx context.Context, q Querier) (context.Context, func() error) {
	workCtx, cancel := context.WithCancelCause(ctx)
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
				l.cfg.Emit(ctx, EventLeaseLost, "KeepAlive", l.key, l.attempt, time.Time{}, lost)
				cancel(lost)
				return
			}
			extCtx, cancelExt := context.WithTimeout(workCtx, left)
			err := l.Extend(extCtx, q)
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
// and renews the lease.
func (l *Lease[T]) Checkpoint(ctx context.Context, q Querier, point string, data any) error {
	if point == "" {
		return fmt.Errorf("%w: Checkpoint needs a non-empty point", ErrInvalidOption)
	}
	enc, err := EncodeResult[any](&l.cfg, data)
	if err != nil {
		return err
	}
	sent := monoSince()
	if err := l.guarded(ctx, q, "Checkpoint", l.cfg.Q.LeaseCheckpoint, point, enc, l.duration.Microseconds()); err != nil {
		return err
	}
	l.renewedAt(sent)
	l.point, l.data = point, enc
	return nil
}

// Complete records v as the key's result. A v that is too large, or whose
// encoding does not decode, is refused before any SQL and the lease is
// still held.
func (l *Lease[T]) Complete(ctx context.Context, q Querier, v T) error {
	data, _, err := RecordResult(&l.cfg, v)
	if err != nil {
		return err
	}
	l.finished.Store(true)
	return l.guarded(ctx, q, "Complete", l.cfg.Q.LeaseFinish, StatusSucceeded, data, l.cfg.TTL.Microseconds())
}

// Fail records a permanent failure with cause's message.
func (l *Lease[T]) Fail(ctx context.Context, q Querier, cause error) error {
	if cause == nil {
		return fmt.Errorf("%w: Fail needs an error", ErrInvalidOption)
	}
	l.finished.Store(true)
	return l.guarded(ctx, q, "Fail", l.cfg.Q.LeaseFinish, StatusFailed, FailureMessage(&l.cfg, cause), l.cfg.TTL.Microseconds())
}

// Release gives the key up without finishing: the lease ends now.
func (l *Lease[T]) Release(ctx context.Context, q Querier) error {
	l.finished.Store(true)
	return l.guarded(ctx, q, "Release", l.cfg.Q.LeaseRelease)
}

// IssueToken makes a token for scope (NewToken) and records it on q with
// status issued for ttl, by the database clock: idem.IssueToken after its
// checks.
func IssueToken(ctx context.Context, e Errors, q Querier, scope string, ttl time.Duration, c *Config) (string, error) {
	token, err := NewToken(scope)
	if err != nil {
		return "", err
	}
	if err := q.Run(ctx, Stmt{SQL: c.Q.Issue, Args: []any{scope, token, ttl.Microseconds()}}); err != nil {
		return "", ClosedHandle("IssueToken", err, e.Closed)
	}
	return token, nil
}
