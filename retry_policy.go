package idem

import (
	"time"

	"github.com/idemkit/idem/internal/protocol"
)

// RetryPolicy bounds the retries of serialization failures (40001) and
// deadlocks (40P01) that Do (WithRetry) and Purge (PurgeParams.Retry) make.
// Retry n (from 1) sleeps a random duration between zero and
// min(MaxDelay, BaseDelay * 2^n) (full jitter). The zero value means the
// defaults.
type RetryPolicy struct {
	// MaxAttempts is the total number of attempts. It defaults to 10; 1
	// disables retries.
	MaxAttempts int
	// BaseDelay scales the backoff: retry n waits up to BaseDelay * 2^n. It
	// defaults to 2ms.
	BaseDelay time.Duration
	// MaxDelay caps the backoff. It defaults to 250ms.
	MaxDelay time.Duration
}

// WithRetry sets how Do retries serialization failures and deadlocks.
// Negative values are an ErrInvalidOption.
func WithRetry(p RetryPolicy) DoOption {
	return doOpt(func(c *config) {
		if !p.valid() {
			c.Fail("WithRetry(%+v): values must not be negative", p)
			return
		}
		c.Retry = protocol.Retry(p)
	})
}

// valid reports whether no value is negative.
func (p RetryPolicy) valid() bool { return protocol.Retry(p).Valid() }

func (p RetryPolicy) withDefaults() RetryPolicy {
	return RetryPolicy(protocol.Retry(p).WithDefaults())
}

// backoff is how long retry n waits.
func (p RetryPolicy) backoff(retry int) time.Duration {
	return protocol.Retry(p).Backoff(retry)
}
