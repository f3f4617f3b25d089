// Package backoff computes jittered exponential backoff and sleeps it.
package backoff

import (
	"context"
	"math"
	"math/rand/v2"
	"time"
)

// Full returns a random duration in [0, min(maxDelay, base * 2^retry)]: full
// jitter. A product that overflows, or a non-positive one, counts as
// maxDelay. It never returns less than zero or more than maxDelay (when
// maxDelay is not negative).
func Full(base, maxDelay time.Duration, retry int) time.Duration {
	if maxDelay <= 0 {
		return 0
	}
	d := base << min(max(retry, 0), 30)
	if d <= 0 || d > maxDelay || d>>min(max(retry, 0), 30) != base {
		d = maxDelay
	}
	if d < math.MaxInt64 {
		d++ // rand.N's bound is exclusive
	}
	return rand.N(d)
}

// Sleep waits for d, or until ctx is done, whose error it then returns.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
