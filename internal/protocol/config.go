// Package protocol is idem's claim protocol, written once over a small
// driver interface: claim a key, read and judge its record, take it over,
// run fn, then complete or undo the execution, in the caller's transaction
// or in one of the driver's own; and lease mode, tokens, the inbox,
// create-once, state machines, Purge and the inspect calls beside it. The
// root package (pgx) and idemsql (database/sql) are fronts on it; each
// supplies its driver: the interfaces of driver.go.
//
// The protocol knows no driver and no database. What it needs of a driver
// is in driver.go: how a group of statements runs (pgx sends it as one
// batch, database/sql one statement after the other), how a transaction of
// its own begins and ends, what fn receives, what a failed COMMIT means, and
// how the driver's errors are classified (Errors). What it needs of a
// database is its Dialect (dialect.go): every statement, with the
// database's quoting and clock, and the classification of the database's
// errors (SQLErrors). internal/dialect/postgres is PostgreSQL's.
package protocol

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/backoff"
)

// Key is idem.Key, field for field, so that each converts to the other.
type Key struct {
	Scope       string
	ID          string
	Fingerprint []byte
}

// Codec is idem.Codec.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// Retry is idem.RetryPolicy, field for field.
type Retry struct {
	MaxAttempts int
	BaseDelay   time.Duration
	MaxDelay    time.Duration
	Outage      time.Duration
}

// The defaults of a zero Retry.
const (
	DefaultMaxAttempts = 10
	DefaultBaseDelay   = 2 * time.Millisecond
	DefaultMaxDelay    = 250 * time.Millisecond
	DefaultOutage      = 15 * time.Second
)

// Valid reports whether no value is negative but Outage, which may be.
func (p Retry) Valid() bool {
	return p.MaxAttempts >= 0 && p.BaseDelay >= 0 && p.MaxDelay >= 0
}

// WithDefaults fills the zero fields with the defaults.
func (p Retry) WithDefaults() Retry {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.BaseDelay == 0 {
		p.BaseDelay = DefaultBaseDelay
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	if p.Outage == 0 {
		p.Outage = DefaultOutage
	}
	return p
}

// Backoff is how long retry n (from 1) waits.
func (p Retry) Backoff(retry int) time.Duration {
	return backoff.Full(p.BaseDelay, p.MaxDelay, retry)
}

// EventKind is idem.EventKind, value for value.
type EventKind uint8

// The event kinds, in idem's order.
const (
	EventExecuted EventKind = iota + 1
	EventReplayed
	EventInProgress
	EventKeyReused
	EventTakeover
	EventLeaseLost
	EventPurged
)

// Event is idem.Event with the protocol's types.
type Event struct {
	Kind     EventKind
	Op       string
	Key      Key
	Attempt  int32
	Duration time.Duration
	Rows     int64
	Err      error
}

// Hooks receives events; the root package adapts idem.Hooks to it.
type Hooks interface {
	Emit(ctx context.Context, e Event)
}

// Config is what a call's options set. The root package's options set its
// fields; every front builds one with NewConfig.
type Config struct {
	TTL    time.Duration
	NoWait bool
	// RequireIssued accepts only tokens from IssueToken.
	RequireIssued bool
	Codec         Codec
	// Table and InboxTable name the record and inbox tables; NewConfig
	// resolves them to their statements in the call's dialect.
	Table, InboxTable Table
	D                 *Dialect      // the call's dialect
	Q                 *Queries      // the record table's statements
	Inbox             *InboxQueries // the inbox table's statements
	// TxOptions are the driver's options for the transactions Do begins
	// (pgx.TxOptions), or nil.
	TxOptions   any
	Retry       Retry
	MaxResult   int           // the largest encoded result recorded, in bytes
	HoldTimeout time.Duration // 0: no bound of idem's own (WithHoldTimeout)
	Hooks       Hooks         // nil: no events
	// Op names the entry point in events: "WithIdempotency", "Do", "Claim".
	Op  string
	Err error
}

// The defaults of a Config.
const (
	DefaultTTL       = 24 * time.Hour
	DefaultMaxResult = 1 << 20
)

// Option is what the root package's options are to the protocol: a change
// of the call's Config.
type Option interface {
	Configure(*Config)
}

// NewConfig is the Config of a call in dialect d with opts applied to the
// defaults. A nil option is skipped; one that is not an Option (none of
// idem's) is an ErrInvalidOption.
func NewConfig[O any](d *Dialect, opts []O) (Config, error) {
	c := Config{TTL: DefaultTTL, Table: DefaultRecords, InboxTable: DefaultInbox, D: d, MaxResult: DefaultMaxResult}
	for _, o := range opts {
		switch o := any(o).(type) {
		case nil:
		case Option:
			o.Configure(&c)
		default:
			c.Fail("%T is not an option of idem's", o)
		}
	}
	c.Retry = c.Retry.WithDefaults()
	if c.HoldTimeout > 0 && d.HoldSet == "" {
		c.Fail("WithHoldTimeout is not supported on %s", d.Name)
	}
	if c.NoWait && d.NoWaitSet == "" && d.ClaimPrefix == nil {
		c.Fail("NoWait is not supported on %s", d.Name)
	}
	c.Q, c.Inbox = d.RecordsOf(c.Table), d.InboxOf(c.InboxTable)
	return c, c.Err
}

// Fail records the first invalid option; the call returns it before any SQL.
func (c *Config) Fail(format string, args ...any) {
	if c.Err == nil {
		c.Err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
}

// Emit reports an event when hooks are set; with none it costs a nil check.
// A zero start reports no duration.
func (c *Config) Emit(ctx context.Context, kind EventKind, op string, key Key, attempt int32, start time.Time, err error) {
	if c.Hooks == nil {
		return
	}
	var d time.Duration
	if !start.IsZero() {
		d = time.Since(start)
	}
	c.Hooks.Emit(ctx, Event{Kind: kind, Op: op, Key: key, Attempt: attempt, Duration: d, Err: err})
}

// Report emits the event that a call's outcome stands for: executed (a
// result or a recorded Permanent error), replayed, in progress, key reused
// or lease lost. Other failures are the caller's to log.
func (c *Config) Report(ctx context.Context, op string, key Key, start time.Time, replayed bool, err error) {
	if c.Hooks == nil {
		return
	}
	var kind EventKind
	switch {
	case replayed:
		kind = EventReplayed
	case err == nil || IsPermanent(err):
		kind = EventExecuted
	case errors.Is(err, ErrInProgress):
		kind = EventInProgress
	case errors.Is(err, ErrKeyReused):
		kind = EventKeyReused
	case errors.Is(err, ErrLeaseLost):
		kind = EventLeaseLost
	default:
		return
	}
	c.Hooks.Emit(ctx, Event{Kind: kind, Op: op, Key: key, Duration: time.Since(start), Err: err})
}
