// Package idemotel reports idem's events to OpenTelemetry: a counter of
// events, a histogram of call durations, and a span per event. It is its own
// module, so the core never pulls OpenTelemetry in.
//
//	hooks, err := idemotel.New() // the global providers, keys hashed
//	...
//	idem.Do(ctx, pool, key, fn, idem.WithHooks(hooks))
package idemotel

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/idemkit/idem/idemotel"

// Metric names.
const (
	// EventsMetric counts events, with the attributes idem.event and
	// idem.op.
	EventsMetric = "idem.events"
	// DurationMetric records, in seconds, how long calls took until their
	// event, with the same attributes.
	DurationMetric = "idem.call.duration"
	// PurgedMetric counts the rows Purge deleted.
	PurgedMetric = "idem.purged.rows"
)

// Attribute keys.
const (
	AttrEvent   = attribute.Key("idem.event")
	AttrOp      = attribute.Key("idem.op")
	AttrScope   = attribute.Key("idem.scope")
	AttrKey     = attribute.Key("idem.key")
	AttrAttempt = attribute.Key("idem.attempt")
	AttrRows    = attribute.Key("idem.rows")
)

// Option configures New.
type Option func(*Hooks)

// WithTracerProvider sets where spans go. It defaults to otel's global
// provider.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(h *Hooks) { h.tp = tp }
}

// WithMeterProvider sets where metrics go. It defaults to otel's global
// provider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(h *Hooks) { h.mp = mp }
}

// WithClearKeys puts scopes and keys on spans as they are. By default each
// is replaced by idem.KeyDigest ("sha256:" and 12 hex digits of its SHA-256),
// as in idem's logs. Metrics never
// carry keys (they would explode the series count).
func WithClearKeys() Option {
	return func(h *Hooks) { h.clearKeys = true }
}

// WithoutSpans turns spans off, keeping the metrics.
func WithoutSpans() Option {
	return func(h *Hooks) { h.noSpans = true }
}

// Hooks implements idem.Hooks. Build it with New; it is safe for concurrent
// use.
type Hooks struct {
	tp        trace.TracerProvider
	mp        metric.MeterProvider
	clearKeys bool
	noSpans   bool

	tracer   trace.Tracer
	events   metric.Int64Counter
	duration metric.Float64Histogram
	purged   metric.Int64Counter
}

var _ idem.Hooks = (*Hooks)(nil)

// New creates the instruments. It fails only when the meter provider
// refuses one.
func New(opts ...Option) (*Hooks, error) {
	h := &Hooks{}
	for _, o := range opts {
		o(h)
	}
	if h.tp == nil {
		h.tp = otel.GetTracerProvider()
	}
	if h.mp == nil {
		h.mp = otel.GetMeterProvider()
	}
	h.tracer = h.tp.Tracer(ScopeName)
	meter := h.mp.Meter(ScopeName)
	var err error
	if h.events, err = meter.Int64Counter(EventsMetric, metric.WithDescription("idem events by kind and entry point")); err != nil {
		return nil, fmt.Errorf("idemotel: %w", err)
	}
	if h.duration, err = meter.Float64Histogram(DurationMetric, metric.WithUnit("s"),
		metric.WithDescription("time from the start of an idem call to its event")); err != nil {
		return nil, fmt.Errorf("idemotel: %w", err)
	}
	if h.purged, err = meter.Int64Counter(PurgedMetric, metric.WithDescription("expired records deleted by Purge")); err != nil {
		return nil, fmt.Errorf("idemotel: %w", err)
	}
	return h, nil
}

// Event records e: the counter and the histogram, and a span named
// "idem.<Op>" covering the call (it starts Duration before now, under the
// span in ctx). Errors other than a replayed business outcome mark the span
// as failed.
func (h *Hooks) Event(ctx context.Context, e idem.Event) {
	set := metric.WithAttributes(AttrEvent.String(e.Kind.String()), AttrOp.String(e.Op))
	h.events.Add(ctx, 1, set)
	if e.Duration > 0 {
		// Events inside a call (takeover, lease_lost) carry no duration.
		h.duration.Record(ctx, e.Duration.Seconds(), set)
	}
	if e.Kind == idem.EventPurged {
		h.purged.Add(ctx, e.Rows)
	}
	if h.noSpans {
		return
	}
	end := time.Now()
	_, span := h.tracer.Start(ctx, "idem."+e.Op, trace.WithTimestamp(end.Add(-e.Duration)), trace.WithSpanKind(trace.SpanKindInternal))
	attrs := []attribute.KeyValue{AttrEvent.String(e.Kind.String()), AttrOp.String(e.Op)}
	if e.Kind != idem.EventPurged {
		attrs = append(attrs, AttrScope.String(h.keyPart(e.Key.Scope)), AttrKey.String(h.keyPart(e.Key.ID)))
	} else {
		attrs = append(attrs, AttrRows.Int64(e.Rows))
	}
	if e.Attempt != 0 {
		attrs = append(attrs, AttrAttempt.Int(int(e.Attempt)))
	}
	span.SetAttributes(attrs...)
	if e.Err != nil && e.Kind != idem.EventReplayed && e.Kind != idem.EventExecuted {
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

func (h *Hooks) keyPart(s string) string {
	if h.clearKeys {
		return s
	}
	return idem.KeyDigest(s)
}
