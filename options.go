package idem

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/ident"
	"github.com/idemkit/idem/internal/protocol"
)

// DefaultTTL is how long a record is kept, and replayed, unless WithTTL says
// otherwise.
const DefaultTTL = protocol.DefaultTTL

// DefaultMaxResultSize is the largest encoded result, in bytes, that is
// recorded unless WithMaxResultSize says otherwise: 1 MiB.
const DefaultMaxResultSize = protocol.DefaultMaxResult

// Options are scoped to the calls they affect, so that a combination that
// could not apply does not compile. From the narrowest to the widest:
//
//   - DoOption configures Do alone: WithTxOptions, WithRetry.
//   - Option configures WithIdempotency and Do: NoWait, WithHoldTimeout.
//   - KeyOption configures every call that claims a key (WithIdempotency,
//     Do, Claim): WithTTL, WithCodec, WithMaxResultSize, RequireIssued,
//     WithHooks.
//   - TableOption names idem's tables for every call: WithTable,
//     WithInboxTable.
//
// Each kind is also one of the kinds above it, so Do takes them all and
// Lookup only TableOptions.

// DoOption configures a call of Do. Every Option is one.
type DoOption interface {
	apply(*config)
	doOption()
}

// Option configures a call of WithIdempotency or Do. Every KeyOption is one.
type Option interface {
	DoOption
	txOption()
}

// KeyOption configures a call that claims a key: WithIdempotency, Do and
// Claim. Every TableOption is one.
type KeyOption interface {
	Option
	keyOption()
}

// TableOption names the tables idem works on. Every call that reads or
// writes them takes it and uses the names of the tables it touches, so one
// set of TableOptions serves every call of an application.
type TableOption interface {
	KeyOption
	tableOption()
}

// The concrete option kinds: each implements its interface and those above.
type (
	doOpt    func(*config)
	txOpt    func(*config)
	keyOpt   func(*config)
	tableOpt func(*config)
)

func (o doOpt) apply(c *config)    { o(c) }
func (o txOpt) apply(c *config)    { o(c) }
func (o keyOpt) apply(c *config)   { o(c) }
func (o tableOpt) apply(c *config) { o(c) }

func (doOpt) doOption()    {}
func (txOpt) doOption()    {}
func (keyOpt) doOption()   {}
func (tableOpt) doOption() {}

func (txOpt) txOption()    {}
func (keyOpt) txOption()   {}
func (tableOpt) txOption() {}

func (keyOpt) keyOption()   {}
func (tableOpt) keyOption() {}

func (tableOpt) tableOption() {}

// Configure applies the option to the protocol's Config: what other
// packages of the module (idemsql) apply idem's options with.
func (o doOpt) Configure(c *protocol.Config)    { o(c) }
func (o txOpt) Configure(c *protocol.Config)    { o(c) }
func (o keyOpt) Configure(c *protocol.Config)   { o(c) }
func (o tableOpt) Configure(c *protocol.Config) { o(c) }

// config is what a call's options set: the protocol's Config.
type config = protocol.Config

func newConfig[O DoOption](opts []O) (config, error) {
	return protocol.NewConfig(dialect, opts)
}

// newCall checks the arguments of a call that claims a key, before any SQL:
// the key (ErrInvalidKey), the rest of its arguments (complete, else
// ErrInvalidOption saying what op needs), its options, and with
// RequireIssued the token's shape. It returns the call's config.
func newCall[O DoOption](op string, key Key, complete bool, needs string, opts []O) (config, error) {
	return protocol.NewCall(dialect, op, protocol.Key(key), key.Validate(), complete, needs, opts)
}

// WithTTL sets how long the record of a first execution is kept and replayed;
// after it the key is treated as unused and the next call runs fn again. It
// defaults to DefaultTTL (24h). ttl must be positive; the expiry is computed
// with the database clock.
func WithTTL(ttl time.Duration) KeyOption {
	return keyOpt(func(c *config) {
		if ttl <= 0 {
			c.Fail("WithTTL(%v): the TTL must be positive", ttl)
			return
		}
		c.TTL = ttl
	})
}

// NoWait makes a call that finds the key held by a transaction that has not
// committed yet return ErrInProgress (an HTTP 409) after at most 50ms,
// instead of waiting for that transaction to finish and replaying its
// result. The caller's transaction stays usable and its lock_timeout is left
// as it was. Only the wait for the key's holder is bounded: a lock on the
// whole record table (DDL, LOCK TABLE) is waited for under the caller's
// lock_timeout. By default the call waits. (Claim never waits.)
func NoWait() Option {
	return txOpt(func(c *config) { c.NoWait = true })
}

// WithCodec sets how results (and a lease's checkpoint data) are stored. By
// default values are JSON, and []byte and json.RawMessage results are stored
// as they are. A nil codec restores the default.
func WithCodec(codec Codec) KeyOption {
	return keyOpt(func(c *config) { c.Codec = codec })
}

// WithMaxResultSize caps the size, in bytes, of what a record stores: fn's
// encoded result (WithIdempotency, Do, Lease.Complete) and a lease's
// checkpoint data. It defaults to DefaultMaxResultSize (1 MiB); 0 means the
// default and a negative n is an ErrInvalidOption.
//
// A result over the cap is not recorded: the call returns an error matching
// ErrResultTooLarge, fn's writes and the claim are rolled back as for any
// error fn returns, and the caller's transaction stays usable. The message
// of a Permanent error is stored cut to at most n bytes (at a UTF-8
// boundary); the caller of the first execution still gets the whole error.
func WithMaxResultSize(n int) KeyOption {
	return keyOpt(func(c *config) {
		switch {
		case n < 0:
			c.Fail("WithMaxResultSize(%d): the size must not be negative", n)
		case n == 0:
			c.MaxResult = DefaultMaxResultSize
		default:
			c.MaxResult = n
		}
	})
}

// WithTable names the record table. It defaults to DefaultTable
// ("idempotent_record") in the connection's search_path; schema may be
// empty. Names must be plain identifiers (letters, digits and underscores,
// not starting with a digit; table at most 48 bytes, schema at most 63),
// else the call fails with ErrInvalidOption before any SQL. They are always
// quoted in SQL. migrations.Up creates the table under the same names.
func WithTable(schema, table string) TableOption {
	if err := ident.ValidateTable(schema, table); err != nil {
		return errOption(err)
	}
	t := protocol.Table{Schema: schema, Name: table}
	return tableOpt(func(c *config) { c.Table = t })
}

// WithInboxTable names the consume-once table (ConsumeOnce, and Purge's
// InboxRetention). It defaults to DefaultInboxTable ("idem_inbox") in the
// search_path; names follow WithTable's rules.
func WithInboxTable(schema, table string) TableOption {
	if err := ident.ValidateTable(schema, table); err != nil {
		return errOption(err)
	}
	t := protocol.Table{Schema: schema, Name: table}
	return tableOpt(func(c *config) { c.InboxTable = t })
}

// errOption is a TableOption that only reports err, for an option whose
// arguments were rejected when it was made.
func errOption(err error) TableOption {
	return tableOpt(func(c *config) {
		if c.Err == nil {
			c.Err = fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
	})
}

// WithTxOptions sets the options of the transaction Do begins (isolation
// level, access mode). It defaults to the zero pgx.TxOptions: the server's
// default isolation, usually READ COMMITTED.
func WithTxOptions(opts pgx.TxOptions) DoOption {
	return doOpt(func(c *config) { c.TxOptions = opts })
}
