package protocol

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// retryErrors treats errSerialization as retryable.
type retryErrors struct{ leaseErrors }

var errSerialization = errors.New("serialization failure")

func (retryErrors) Retryable(err error) bool { return errors.Is(err, errSerialization) }

// attempts runs Retried with an attempt that fails with errs in turn, then
// succeeds, and returns how many attempts ran and what Retried returned.
func attempts(t *testing.T, ctx context.Context, r Retry, retry bool, errs ...error) (int, error) {
	t.Helper()
	c := &Config{Op: "Do", Retry: r.WithDefaults()}
	c.Retry.BaseDelay, c.Retry.MaxDelay = time.Microsecond, time.Microsecond
	n := 0
	_, _, err := Retried(ctx, retryErrors{}, Key{Scope: "s", ID: "k"}, c, retry, func() (int, bool, error) {
		n++
		if n <= len(errs) {
			return 0, false, errs[n-1]
		}
		return 1, false, nil
	})
	return n, err
}

func TestRetriedRidesOutAnOutage(t *testing.T) {
	down := errors.New("connection refused")
	many := make([]error, 50) // beyond MaxAttempts: an outage is bounded by time, not count
	for i := range many {
		many[i] = Unavailable(down)
	}
	n, err := attempts(t, context.Background(), Retry{}, true, many...)
	if err != nil || n != 51 {
		t.Fatalf("after 50 unavailable attempts: %d attempts, %v; want 51, nil", n, err)
	}

	// Bounded by Outage: the last failure is returned without the mark.
	n, err = attempts(t, context.Background(), Retry{Outage: time.Nanosecond}, true, many...)
	if !errors.Is(err, down) || n != 1 {
		t.Fatalf("Outage 1ns: %d attempts, %v; want 1, %v", n, err, down)
	}
	if _, marked := err.(*unavailableError); marked {
		t.Fatalf("Do returned the mark itself: %T", err)
	}
	// Off: a negative Outage returns the first.
	if n, err = attempts(t, context.Background(), Retry{Outage: -1}, true, many...); n != 1 || !errors.Is(err, down) {
		t.Fatalf("Outage -1: %d attempts, %v", n, err)
	}
	// Off where the caller's transaction cannot be retried.
	if n, err = attempts(t, context.Background(), Retry{}, false, many...); n != 1 || !errors.Is(err, down) {
		t.Fatalf("retry false: %d attempts, %v", n, err)
	}
	// Unmarked failures are not retried as outages.
	if n, err = attempts(t, context.Background(), Retry{}, true, down); n != 1 || !errors.Is(err, down) {
		t.Fatalf("unmarked: %d attempts, %v", n, err)
	}
}

func TestRetriedNeverRetriesAnUnknownOutcome(t *testing.T) {
	unknown := fmt.Errorf("%w: %w", ErrOutcomeUnknown, errors.New("EOF"))
	if Unavailable(unknown) != unknown {
		t.Fatal("Unavailable marked a commit whose outcome is unknown")
	}
	n, err := attempts(t, context.Background(), Retry{}, true, Unavailable(unknown))
	if n != 1 || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("%d attempts, %v; want 1, ErrOutcomeUnknown", n, err)
	}
}

func TestRetriedKeepsSerializationRetriesCounted(t *testing.T) {
	serial := make([]error, 20)
	for i := range serial {
		serial[i] = errSerialization
	}
	n, err := attempts(t, context.Background(), Retry{MaxAttempts: 3}, true, serial...)
	if n != 3 || !errors.Is(err, errSerialization) {
		t.Fatalf("%d attempts, %v; want 3, the serialization failure", n, err)
	}
	// An outage in between does not use up the serialization attempts.
	mixed := []error{errSerialization, Unavailable(errors.New("refused")), Unavailable(errors.New("refused")), errSerialization}
	if n, err = attempts(t, context.Background(), Retry{MaxAttempts: 3}, true, mixed...); n != 5 || err != nil {
		t.Fatalf("mixed: %d attempts, %v; want 5, nil", n, err)
	}
}

func TestRetriedStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n, err := attempts(t, ctx, Retry{}, true, Unavailable(errors.New("refused")))
	if n != 1 || !errors.Is(err, context.Canceled) {
		t.Fatalf("%d attempts, %v; want 1, context.Canceled", n, err)
	}
}

func TestRetryOutageDefault(t *testing.T) {
	if got := (Retry{}).WithDefaults().Outage; got != DefaultOutage {
		t.Fatalf("default Outage %v, want %v", got, DefaultOutage)
	}
	if !(Retry{Outage: -1}).Valid() || (Retry{MaxDelay: -1}).Valid() {
		t.Fatal("Valid: a negative Outage is allowed, other negative values are not")
	}
}
