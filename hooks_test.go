package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// With no hooks set, reporting an outcome allocates nothing.
func TestHooksOffAllocateNothing(t *testing.T) {
	cfg, err := newConfig([]Option(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := Key{Scope: "s", ID: "k"}
	start := time.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		report(&cfg, ctx, "Do", key, start, false, nil)
		report(&cfg, ctx, "Do", key, start, false, ErrInProgress)
		emit(&cfg, ctx, EventTakeover, "Do", key, 2, start, nil)
	})
	if allocs != 0 {
		t.Fatalf("hooks off: %v allocations per call, want 0", allocs)
	}
}

type recorder struct{ events []Event }

func (r *recorder) Event(_ context.Context, e Event) { r.events = append(r.events, e) }

func TestReportClassifiesOutcomes(t *testing.T) {
	rec := &recorder{}
	cfg, err := newConfig([]Option{WithHooks(rec)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := Key{Scope: "s", ID: "k"}
	start := time.Now().Add(-time.Second)
	cases := []struct {
		replayed bool
		err      error
		want     EventKind
	}{
		{false, nil, EventExecuted},
		{false, Permanent(errors.New("card declined")), EventExecuted},
		{true, nil, EventReplayed},
		{true, Permanent(errors.New("card declined")), EventReplayed},
		{false, ErrInProgress, EventInProgress},
		{false, ErrKeyReused, EventKeyReused},
		{false, ErrLeaseLost, EventLeaseLost},
		{false, errors.New("connection reset"), 0}, // the caller's to log
	}
	for _, c := range cases {
		rec.events = nil
		report(&cfg, ctx, "Do", key, start, c.replayed, c.err)
		if c.want == 0 {
			if len(rec.events) != 0 {
				t.Errorf("%v: got %v, want no event", c.err, rec.events)
			}
			continue
		}
		if len(rec.events) != 1 || rec.events[0].Kind != c.want || rec.events[0].Op != "Do" || rec.events[0].Duration < time.Second {
			t.Errorf("replayed=%v err=%v: got %+v, want one %v event", c.replayed, c.err, rec.events, c.want)
		}
	}
}

func TestSlogHooks(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx := context.Background()
	key := Key{Scope: "tenant-9", ID: "pay-secret-123"}
	SlogHooks{Logger: l}.Event(ctx, Event{Kind: EventTakeover, Op: "Claim", Key: key, Attempt: 3, Duration: time.Millisecond})
	SlogHooks{Logger: l, ClearKeys: true}.Event(ctx, Event{Kind: EventKeyReused, Op: "Do", Key: key, Err: ErrKeyReused})
	SlogHooks{Logger: l}.Event(ctx, Event{Kind: EventPurged, Op: "Purge", Rows: 10})
	quiet := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	SlogHooks{Logger: quiet}.Event(ctx, Event{Kind: EventReplayed, Op: "Do", Key: key}) // Debug: dropped

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("got %d lines, want 3:\n%s", len(lines), buf.String())
	}
	var first, second, third map[string]any
	for i, v := range []*map[string]any{&first, &second, &third} {
		if err := json.Unmarshal([]byte(lines[i]), v); err != nil {
			t.Fatal(err)
		}
	}
	if first["msg"] != "idem takeover" || first["level"] != "INFO" || first["attempt"] != 3.0 || first["op"] != "Claim" {
		t.Errorf("takeover line: %v", first)
	}
	if strings.Contains(lines[0], "pay-secret-123") || strings.Contains(lines[0], "tenant-9") ||
		!strings.Contains(lines[0], `"id":"sha256:`) {
		t.Errorf("the key must be hashed by default: %s", lines[0])
	}
	if second["level"] != "WARN" || !strings.Contains(lines[1], `"id":"pay-secret-123"`) || second["error"] == nil {
		t.Errorf("ClearKeys line: %s", lines[1])
	}
	if third["rows"] != 10.0 || third["key"] != nil {
		t.Errorf("purge line: %s", lines[2])
	}
}
