package idem

import (
	"math"
	"testing"
	"time"
)

// backoff stays within [0, MaxDelay] for any policy, including bounds at the
// edge of time.Duration.
func TestBackoffBounds(t *testing.T) {
	for _, p := range []RetryPolicy{
		{BaseDelay: time.Millisecond, MaxDelay: 50 * time.Millisecond},
		{BaseDelay: time.Hour, MaxDelay: math.MaxInt64},
		{BaseDelay: math.MaxInt64, MaxDelay: math.MaxInt64},
		{BaseDelay: 0, MaxDelay: 0},
	} {
		for retry := 0; retry < 70; retry++ {
			if d := backoff(p, retry); d < 0 || d > p.MaxDelay {
				t.Fatalf("backoff(%+v, %d) = %v", p, retry, d)
			}
		}
	}
}
