package idem

import (
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultTTL is how long a record is kept, and replayed, unless WithTTL says
// otherwise.
const DefaultTTL = 24 * time.Hour

// DefaultMaxResultSize is the largest encoded result, in bytes, that is
// recorded unless WithMaxResultSize says otherwise: 1 MiB.
const DefaultMaxResultSize = 1 << 20

// Option configures one call of WithIdempotency or Do. Options that do not
// apply to a call (WithTxOptions for WithIdempotency) are ignored by it.
type Option func(*config)

type config struct {
	ttl    time.Duration
	noWait bool
	// requireIssued accepts only tokens from IssueToken.
	requireIssued bool
	codec         Codec
	q             *queries      // the record table's statements
	inbox         *inboxQueries // the inbox table's statements
	txOptions     pgx.TxOptions
	retry         RetryPolicy
	maxResult     int           // the largest encoded result recorded, in bytes
	holdTimeout   time.Duration // 0: no bound of idem's own (WithHoldTimeout)
	hooks         Hooks         // nil: no events
	// op names the entry point in events ("" for the function's own
	// name); Do sets it for the WithIdempotency it runs.
	op  string
	err error
}

// WithTTL sets how long the record of a first execution is kept and replayed;
// after it the key is treated as unused and the next call runs fn again. It
// defaults to DefaultTTL (24h). ttl must be positive; the expiry is computed
// with the database clock.
func WithTTL(ttl time.Duration) Option {
	return func(c *config) {
		if ttl <= 0 {
			c.fail("WithTTL(%v): the TTL must be positive", ttl)
			return
		}
		c.ttl = ttl
	}
}

// NoWait makes a call that finds the key held by a transaction that has not
// committed yet return ErrInProgress (an HTTP 409) after at most 50ms,
// instead of waiting for that transaction to finish and replaying its
// result. The caller's transaction stays usable and its lock_timeout is left
// as it was. Only the wait for the key's holder is bounded: a lock on the
// whole record table (DDL, LOCK TABLE) is waited for under the caller's
// lock_timeout. By default the call waits.
func NoWait() Option {
	return func(c *config) { c.noWait = true }
}

// WithCodec sets how results are stored. By default values are JSON, and
// []byte and json.RawMessage results are stored as they are. A nil codec
// restores the default.
func WithCodec(codec Codec) Option {
	return func(c *config) { c.codec = codec }
}

// WithMaxResultSize caps the size, in bytes, of what a record stores: fn's
// encoded result (WithIdempotency, Do, Lease.Complete) and a lease's
// checkpoint data. It defaults to DefaultMaxResultSize (1 MiB); 0 means the
// default and a negative n is an ErrInvalidOption. A result over the cap is
// not recorded: the call returns an error matching ErrResultTooLarge, fn's
// writes and the claim are rolled back as for any error fn returns, and the
// caller's transaction stays usable. The message of a Permanent error is
// stored cut to at most n bytes (at a UTF-8 boundary); the caller of the
// first execution still gets the whole error.
func WithMaxResultSize(n int) Option {
	return func(c *config) {
		switch {
		case n < 0:
			c.fail("WithMaxResultSize(%d): the size must not be negative", n)
		case n == 0:
			c.maxResult = DefaultMaxResultSize
		default:
			c.maxResult = n
		}
	}
}

// WithTable names the record table. It defaults to DefaultTable
// ("idempotent_record") in the connection's search_path. schema may be empty.
// Names must be plain identifiers (letters, digits and underscores, not
// starting with a digit; table at most 48 bytes, schema at most 63) and are
// always quoted in SQL. migrations.Up creates the table under the same names.
func WithTable(schema, table string) Option {
	// Validate and build the statements once, not on every call.
	if err := ValidateTableName(schema, table); err != nil {
		return errOption(err)
	}
	q := queriesFor(tableIdent(schema, table))
	return func(c *config) { c.q = q }
}

// WithTxOptions sets the options of the transaction Do begins (isolation
// level, access mode). It defaults to the zero pgx.TxOptions: the server's
// default isolation, usually READ COMMITTED. WithIdempotency ignores it.
func WithTxOptions(opts pgx.TxOptions) Option {
	return func(c *config) { c.txOptions = opts }
}

// WithRetry sets how Do retries serialization failures and deadlocks.
func WithRetry(p RetryPolicy) Option {
	return func(c *config) {
		if p.MaxAttempts < 0 || p.BaseDelay < 0 || p.MaxDelay < 0 {
			c.fail("WithRetry(%+v): values must not be negative", p)
			return
		}
		c.retry = p
	}
}

// RetryPolicy bounds Do's retries of serialization failures (40001) and
// deadlocks (40P01). Retry n (from 1) sleeps a random duration between zero
// and min(MaxDelay, BaseDelay * 2^n) (full jitter).
type RetryPolicy struct {
	// MaxAttempts is the total number of transaction attempts. It defaults
	// to 10; 1 disables retries.
	MaxAttempts int
	// BaseDelay scales the backoff: retry n waits up to BaseDelay * 2^n. It
	// defaults to 2ms.
	BaseDelay time.Duration
	// MaxDelay caps the backoff. It defaults to 250ms.
	MaxDelay time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = 10
	}
	if p.BaseDelay == 0 {
		p.BaseDelay = 2 * time.Millisecond
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = 250 * time.Millisecond
	}
	return p
}

// errOption is an Option that only reports err, for an option whose
// arguments were rejected when it was made.
func errOption(err error) Option {
	return func(c *config) {
		if c.err == nil {
			c.err = err
		}
	}
}

func (c *config) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
}

func newConfig(opts []Option) (config, error) {
	c := config{ttl: DefaultTTL, q: defaultQueries, inbox: defaultInboxQueries, maxResult: DefaultMaxResultSize}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	c.retry = c.retry.withDefaults()
	return c, c.err
}

var defaultQueries = queriesFor(tableIdent("", DefaultTable))

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateTableName reports whether schema and table are acceptable names for
// the record table (see WithTable). schema may be empty. The error matches
// ErrInvalidOption.
func ValidateTableName(schema, table string) error {
	if !identRE.MatchString(table) || len(table) > 48 {
		return fmt.Errorf("%w: table name %q: want letters, digits and underscores, at most 48 bytes", ErrInvalidOption, table)
	}
	if schema != "" && (!identRE.MatchString(schema) || len(schema) > 63) {
		return fmt.Errorf("%w: schema name %q: want letters, digits and underscores, at most 63 bytes", ErrInvalidOption, schema)
	}
	return nil
}
