package backoff

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

// Full stays within [0, maxDelay] for any policy, including bounds at the
// edge of time.Duration, and grows with the retry until the cap.
func TestFullBounds(t *testing.T) {
	for _, p := range []struct{ base, maxDelay time.Duration }{
		{time.Millisecond, 50 * time.Millisecond},
		{time.Hour, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64},
		{3 * time.Second, time.Minute},
		{0, 0},
		{time.Millisecond, -1},
	} {
		for retry := -1; retry < 70; retry++ {
			d := Full(p.base, p.maxDelay, retry)
			if d < 0 || d > max(p.maxDelay, 0) {
				t.Fatalf("Full(%v, %v, %d) = %v", p.base, p.maxDelay, retry, d)
			}
		}
	}
	// The bound doubles: over many draws, retry 3 reaches past retry 1's
	// bound of base*2, and never past base*8.
	var most time.Duration
	for range 2000 {
		most = max(most, Full(time.Millisecond, time.Second, 3))
	}
	if most <= 2*time.Millisecond || most > 8*time.Millisecond {
		t.Fatalf("retry 3 with a 1ms base drew at most %v; want within (2ms, 8ms]", most)
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep on a done context: %v", err)
	}
	if err := Sleep(context.Background(), time.Microsecond); err != nil {
		t.Fatal(err)
	}
}
