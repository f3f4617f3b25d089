package protocol

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/idem/internal/backoff"
)

// Fn is the function a call runs once per key, in its driver's transaction
// type.
type Fn[TTx, T any] func(ctx context.Context, tx TTx) (T, error)

// holder is what holds a claimed execution: savepoints in the caller's
// transaction (inTx), or the protocol's own transaction (own).
type holder[TTx any] interface {
	// fn returns what fn receives and what ends it.
	fn() (TTx, func())
	// complete records the outcome (status, data) and ends the hold: it
	// releases the savepoints, or commits. cause is the permanent failure
	// being recorded, or nil. On failure the execution is undone.
	complete(ctx context.Context, status string, data []byte, attempt int32, cause error) error
	// dropFn rolls back fn's writes before a permanent failure is recorded.
	// again reports that the claim went with them, so that the failure is
	// recorded under a new claim.
	dropFn(ctx context.Context, attempt int32, cause error) (again bool, err error)
	// undo rolls back fn's writes and the claim.
	undo(ctx context.Context, attempt int32) error
}

// execution runs fn in a claimed execution, then records the outcome or
// undoes it: the one place that does so, for the caller's transaction and
// the protocol's own.
type execution[TTx, T any] struct {
	cfg *Config
	fn  Fn[TTx, T]
	// failure is a permanent error of fn's whose transaction was rolled
	// back with its claim: the next claim records it without running fn.
	failure error
}

// run runs the execution claimed with attempt in h. It returns fn's value
// (decoded as a replay will decode it) and nil, a recorded Permanent error,
// or an error after which nothing is recorded. again reports that the
// execution must be claimed again to record a permanent failure (own).
func (x *execution[TTx, T]) run(ctx context.Context, h holder[TTx], attempt int32) (v T, again bool, err error) {
	var zero T
	if x.failure != nil {
		if err := h.complete(ctx, StatusFailed, FailureMessage(x.cfg, x.failure), attempt, x.failure); err != nil {
			return zero, false, err
		}
		return zero, false, x.failure
	}
	tx, end := h.fn()
	v, fnErr, panicked := CallFn(ctx, tx, x.fn)
	end()
	switch {
	case panicked != nil:
		_ = h.undo(ctx, attempt)
		panic(panicked)
	case fnErr == nil:
		data, decoded, err := RecordResult(x.cfg, v)
		if err != nil {
			return zero, false, joinUndo(err, h.undo(ctx, attempt))
		}
		if err := h.complete(ctx, StatusSucceeded, data, attempt, nil); err != nil {
			return zero, false, err
		}
		return decoded, false, nil
	case IsPermanent(fnErr):
		again, err := h.dropFn(ctx, attempt, fnErr)
		if err != nil || again {
			if again {
				x.failure = fnErr
			}
			return zero, again, err
		}
		if err := h.complete(ctx, StatusFailed, FailureMessage(x.cfg, fnErr), attempt, fnErr); err != nil {
			return zero, false, err
		}
		return zero, false, fnErr
	case x.cfg.D.TxAborted(fnErr):
		// The server rolled the whole transaction back: nothing is left
		// to undo, and no statement may follow on it.
		return zero, false, fnErr
	default:
		return zero, false, joinUndo(fnErr, h.undo(ctx, attempt))
	}
}

// joinUndo adds the error of undoing an execution, if any, to err.
func joinUndo(err, undoErr error) error {
	if undoErr != nil {
		return errors.Join(err, undoErr)
	}
	return err
}

// CallFn runs fn, turning a panic into a value so the caller can clean up
// before re-raising it.
func CallFn[TTx, T any](ctx context.Context, tx TTx, fn Fn[TTx, T]) (v T, err error, panicked any) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
		}
	}()
	v, err = fn(ctx, tx)
	return v, err, nil
}

// InTx runs fn at most once per key inside the caller's transaction tx
// (WithIdempotency), without the checks and the event: the front makes
// those.
func InTx[TTx, T any](ctx context.Context, e Errors, tx Tx[TTx], key Key, fn Fn[TTx, T], c *Config) (v T, replayed bool, err error) {
	var zero T
	s := &inTx[TTx]{tx: tx, e: e, cfg: c, key: key}
	rec, err := claimKey(ctx, s, e, key, c)
	if err != nil {
		return zero, false, err
	}
	if !rec.Claimed {
		return Replay[T](rec, c)
	}
	if c.HoldTimeout > 0 {
		if err := s.bound(ctx, c.HoldTimeout); err != nil {
			return zero, false, errors.Join(err, s.undo(ctx, rec.Attempt))
		}
	}
	x := &execution[TTx, T]{cfg: c, fn: fn}
	v, _, err = x.run(ctx, s, rec.Attempt)
	return v, false, err
}

// Do runs fn at most once per key in transactions of the protocol's own on
// db, retrying serialization failures and deadlocks (Retried).
func Do[TTx, T any](ctx context.Context, e Errors, db Beginner[TTx], key Key, fn Fn[TTx, T], c *Config) (v T, replayed bool, err error) {
	x := &execution[TTx, T]{cfg: c, fn: fn}
	return Retried(ctx, e, key, c, true, func() (T, bool, error) { return doOnce(ctx, e, db, key, x, c) })
}

// Retried makes the attempts of a Do: it reports each attempt's outcome as
// an event, and runs attempt again, while retry is set, after a
// serialization failure or a deadlock, with the backoff of c.Retry while
// attempts are left, and after an attempt marked Unavailable while
// c.Retry.Outage allows, counted from the first such failure in a row. An
// error that a done ctx caused matches ctx.Err().
func Retried[T any](ctx context.Context, e Errors, key Key, c *Config, retry bool, attempt func() (T, bool, error)) (v T, replayed bool, err error) {
	start := time.Now()
	var outage time.Time // when the current run of unavailable attempts began
	for n, down := 1, 0; ; {
		v, replayed, err = attempt()
		var unavailable bool
		err, unavailable = unmark(err)
		c.Report(ctx, c.Op, key, start, replayed, err)
		err = c.HoldError(err)
		if errors.Is(err, ErrHoldTimeout) {
			// The server ended the session because fn held the key too
			// long: running fn again would hold it as long.
			unavailable = false
		}
		if err == nil || !retry || ctx.Err() != nil {
			return v, replayed, WithContextErr(ctx, err)
		}
		var wait time.Duration
		switch {
		case unavailable && c.Retry.Outage > 0:
			if down == 0 {
				outage = time.Now()
			}
			down++
			wait = c.Retry.Backoff(down)
			if time.Since(outage)+wait > c.Retry.Outage {
				return v, replayed, err
			}
		case !unavailable && e.Retryable(err) && n < c.Retry.MaxAttempts:
			down = 0
			wait = c.Retry.Backoff(n)
			n++
		default:
			return v, replayed, WithContextErr(ctx, err)
		}
		if err := backoff.Sleep(ctx, wait); err != nil {
			return v, false, err
		}
	}
}

// doOnce is one attempt of Do, on one connection: claim, run, commit; and,
// when fn failed permanently, claim again to record the failure.
func doOnce[TTx, T any](ctx context.Context, e Errors, db Beginner[TTx], key Key, x *execution[TTx, T], c *Config) (v T, replayed bool, err error) {
	var zero T
	conn, release, err := db.Acquire(ctx)
	if err != nil {
		if u, down := unmark(err); down {
			return zero, false, Unavailable(ClosedHandle(c.Op, u, e.Closed))
		}
		return zero, false, ClosedHandle(c.Op, err, e.Closed)
	}
	defer func() { err = release(err) }()
	s := &own[TTx]{conn: conn, e: e, cfg: c, key: key}
	defer s.end(ctx) // every path that does not commit ends the transaction
	for {
		rec, err := claimKey(ctx, s, e, key, c)
		if err != nil {
			return zero, false, err
		}
		if !rec.Claimed {
			return Replay[T](rec, c)
		}
		v, again, err := x.run(ctx, s, rec.Attempt)
		if !again {
			return v, false, err
		}
	}
}
