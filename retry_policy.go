package idem

import (
	"time"

	"github.com/idemkit/idem/internal/protocol"
)

// RetryPolicy bounds the retries of serialization failures (40001) and
// deadlocks (40P01) that Do (WithRetry) and Purge (PurgeParams.Retry) make,
// and how long Do rides out an unavailable database (Outage). Retry n (from
// 1) sleeps a random duration between zero and min(MaxDelay, BaseDelay *
// 2^n) (full jitter). The zero value means the defaults.
type RetryPolicy struct {
	// MaxAttempts is the total number of attempts. It defaults to 10; 1
	// disables retries.
	MaxAttempts int
	// BaseDelay scales the backoff: retry n waits up to BaseDelay * 2^n. It
	// defaults to 2ms.
	BaseDelay time.Duration
	// MaxDelay caps the backoff. It defaults to 250ms.
	MaxDelay time.Duration
	// Outage is how long Do keeps retrying, each time on a fresh connection
	// of its pool, attempts that failed because the database could not
	// serve them and that provably committed nothing: no connection could
	// be made (refused, timed out, or no host of a multi-host DSN with
	// target_session_attrs=read-write was a primary yet), or the server
	// ended the session (57P01, 57P02), was starting or stopping (57P03) or
	// was read-only (25006) before COMMIT was sent. It is counted from the
	// first such failure in a row, with the backoff above, and ends sooner
	// with ctx. It defaults to 15s, long enough for a failover of a Patroni
	// cluster with ttl 10s; set it to the failover time your cluster
	// measures. A negative Outage returns these failures at once. A COMMIT
	// whose answer was lost is never retried: it is ErrOutcomeUnknown, since
	// it may have committed. Purge ignores Outage, and Do on a *pgx.Conn or a
	// pgx.Tx, which has no other connection to retry on, does not retry
	// these, nor does idemmysql.Do.
	Outage time.Duration
}

// WithRetry sets how Do retries serialization failures, deadlocks and an
// unavailable database. Negative values but Outage's are an
// ErrInvalidOption.
func WithRetry(p RetryPolicy) DoOption {
	return doOpt(func(c *config) {
		if !p.valid() {
			c.Fail("WithRetry(%+v): values must not be negative", p)
			return
		}
		c.Retry = protocol.Retry(p)
	})
}

// valid reports whether no value but Outage is negative.
func (p RetryPolicy) valid() bool { return protocol.Retry(p).Valid() }

func (p RetryPolicy) withDefaults() RetryPolicy {
	return RetryPolicy(protocol.Retry(p).WithDefaults())
}

// backoff is how long retry n waits.
func (p RetryPolicy) backoff(retry int) time.Duration {
	return protocol.Retry(p).Backoff(retry)
}
