package idem

import (
	"context"
	"log/slog"
	"time"

	"github.com/idemkit/idem/internal/protocol"
)

// EventKind says what happened to a key. See Hooks.
type EventKind uint8

const (
	// EventExecuted: fn ran and its outcome (a result, or a Permanent
	// error) was recorded in the caller's or Do's transaction. For Claim it
	// is a first claim of the key: the lease is held.
	EventExecuted EventKind = iota + 1
	// EventReplayed: the key had finished; its recorded outcome was
	// returned and fn did not run.
	EventReplayed
	// EventInProgress: another caller holds the key; the call returned
	// ErrInProgress.
	EventInProgress
	// EventKeyReused: the key was first used with another fingerprint; the
	// call returned ErrKeyReused.
	EventKeyReused
	// EventTakeover: an expired record, or a lease that ran out, was
	// claimed again (Attempt is the new fencing token in lease mode). For
	// WithIdempotency and Do it is reported when the claim takes the record
	// over, inside the transaction: if that transaction then rolls back (fn
	// failed, a 40001 retried), the takeover does not last and a retry may
	// report another.
	EventTakeover
	// EventLeaseLost: a lease's holder found its lease taken over or
	// finished by another (ErrLeaseLost).
	EventLeaseLost
	// EventPurged: a Purge call deleted Rows rows (Key is zero); a call
	// that deleted nothing reports no event.
	EventPurged
)

var eventNames = [...]string{"", "executed", "replayed", "in_progress", "key_reused", "takeover", "lease_lost", "purged"}

// String is the kind's name in snake case ("in_progress"), as metrics and
// logs use it.
func (k EventKind) String() string {
	if int(k) < len(eventNames) && k != 0 {
		return eventNames[k]
	}
	return "unknown"
}

// Event is one thing idem did, handed to Hooks.
type Event struct {
	// Kind says what happened.
	Kind EventKind
	// Op is the entry point: "WithIdempotency", "Do", "Claim", "Extend",
	// "KeepAlive", "Checkpoint", "Complete", "Fail", "Release" or "Purge".
	Op string
	// Key is the key concerned, zero for EventPurged. It holds the caller's
	// key in clear: hash it before logging it (Key.LogValue does).
	Key Key
	// Attempt is the lease's fencing token for lease-mode events, else 0.
	Attempt int32
	// Duration is the time from the start of the call to the event. It is
	// 0 for events that happen inside a call rather than end it: the
	// takeover events of WithIdempotency and Do, and lease_lost.
	Duration time.Duration
	// Rows is how many rows EventPurged deleted.
	Rows int64
	// Err is the error the call returns with the event (ErrInProgress,
	// ErrKeyReused, ErrLeaseLost, a replayed Permanent error), or nil.
	Err error
}

// Hooks receive idem's events, for logs, metrics and traces. Event is
// called synchronously on the caller's goroutine, after the fact and
// possibly concurrently from many goroutines; it must be quick and must
// not block (hand slow work to another goroutine). An event inside a
// caller's transaction (WithIdempotency) is reported before that
// transaction commits: the caller may still roll it back.
//
// With no hooks set (the default), idem builds no Event and allocates
// nothing for them.
type Hooks interface {
	Event(ctx context.Context, e Event)
}

// WithHooks sends the call's events to h. A nil interface leaves hooks off;
// a nil pointer of a type that implements Hooks is not nil and is called.
// Pass the same option to every call, or wrap it once in a slice of
// options.
func WithHooks(h Hooks) KeyOption {
	return keyOpt(func(c *config) {
		c.Hooks = nil
		if h != nil {
			c.Hooks = hooksAdapter{h}
		}
	})
}

// hooksAdapter hands the protocol's events to Hooks as Events.
type hooksAdapter struct{ h Hooks }

func (a hooksAdapter) Emit(ctx context.Context, e protocol.Event) {
	a.h.Event(ctx, Event{Kind: EventKind(e.Kind), Op: e.Op, Key: Key(e.Key), Attempt: e.Attempt, Duration: e.Duration, Rows: e.Rows, Err: e.Err})
}

// emit reports an event when hooks are set; with none it costs a nil check.
// A zero start reports no duration.
func emit(c *config, ctx context.Context, kind EventKind, op string, key Key, attempt int32, start time.Time, err error) {
	c.Emit(ctx, protocol.EventKind(kind), op, protocol.Key(key), attempt, start, err)
}

// report emits the event that a call's outcome stands for (see
// protocol.Config.Report).
func report(c *config, ctx context.Context, op string, key Key, start time.Time, replayed bool, err error) {
	c.Report(ctx, op, protocol.Key(key), start, replayed, err)
}

// SlogHooks logs events with log/slog. The zero value logs to
// slog.Default() with keys hashed.
type SlogHooks struct {
	// Logger receives the records. It defaults to slog.Default().
	Logger *slog.Logger
	// Level gives each kind's level. It defaults to Debug for executed and
	// replayed (one per call), Warn for key_reused and lease_lost, and Info
	// for the rest.
	Level func(EventKind) slog.Level
	// ClearKeys logs scopes and keys as they are. By default each is
	// replaced by "sha256:" and 12 hex digits of its SHA-256 (see
	// Key.LogValue), so logs never hold a caller's key.
	ClearKeys bool
}

// defaultEventLevel is SlogHooks' default Level.
func defaultEventLevel(k EventKind) slog.Level {
	switch k {
	case EventExecuted, EventReplayed:
		return slog.LevelDebug
	case EventKeyReused, EventLeaseLost:
		return slog.LevelWarn
	default:
		return slog.LevelInfo
	}
}

// Event logs e as "idem <kind>" with the op, the key (hashed unless
// ClearKeys), the attempt, the duration, the rows and the error where they
// apply.
func (h SlogHooks) Event(ctx context.Context, e Event) {
	l := h.Logger
	if l == nil {
		l = slog.Default()
	}
	level := defaultEventLevel(e.Kind)
	if h.Level != nil {
		level = h.Level(e.Kind)
	}
	if !l.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 6)
	attrs = append(attrs, slog.String("op", e.Op))
	if e.Kind != EventPurged {
		if h.ClearKeys {
			attrs = append(attrs, slog.Group("key", slog.String("scope", e.Key.Scope), slog.String("id", e.Key.ID)))
		} else {
			attrs = append(attrs, slog.Any("key", e.Key))
		}
	}
	if e.Attempt != 0 {
		attrs = append(attrs, slog.Int("attempt", int(e.Attempt)))
	}
	attrs = append(attrs, slog.Duration("duration", e.Duration))
	if e.Kind == EventPurged {
		attrs = append(attrs, slog.Int64("rows", e.Rows))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	l.LogAttrs(ctx, level, "idem "+e.Kind.String(), attrs...)
}
