package idemotel_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
	"github.com/idemkit/idem/migrations"
)

var databaseURL string

func TestMain(m *testing.M) {
	databaseURL = os.Getenv("TEST_DATABASE_URL")
	if databaseURL == "" {
		fmt.Fprintln(os.Stderr, "idemotel tests need a PostgreSQL: set TEST_DATABASE_URL, e.g.\n"+
			"    TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

type telemetry struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	hooks  *idemotel.Hooks
}

func newTelemetry(t *testing.T, opts ...idemotel.Option) *telemetry {
	tel := &telemetry{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tel.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(tel.reader))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	h, err := idemotel.New(append([]idemotel.Option{idemotel.WithTracerProvider(tp), idemotel.WithMeterProvider(mp)}, opts...)...)
	require.NoError(t, err)
	tel.hooks = h
	return tel
}

// counts returns the idem.events counter by "event/op".
func (tel *telemetry) counts(t *testing.T) map[string]int64 {
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case idemotel.EventsMetric:
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					ev, _ := dp.Attributes.Value(idemotel.AttrEvent)
					op, _ := dp.Attributes.Value(idemotel.AttrOp)
					out[ev.AsString()+"/"+op.AsString()] += dp.Value
				}
			case idemotel.PurgedMetric:
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					out["purged rows"] += dp.Value
				}
			}
		}
	}
	return out
}

func attr(attrs []attribute.KeyValue, k attribute.Key) string {
	for _, a := range attrs {
		if a.Key == k {
			return a.Value.Emit()
		}
	}
	return ""
}

func TestEventsBecomeMetricsAndSpans(t *testing.T) {
	tel := newTelemetry(t)
	start := time.Now()
	tel.hooks.Event(context.Background(), idem.Event{Kind: idem.EventKeyReused, Op: "Do",
		Key: idem.Key{Scope: "user-1", ID: "secret-key"}, Duration: 30 * time.Millisecond, Err: idem.ErrKeyReused})
	tel.hooks.Event(context.Background(), idem.Event{Kind: idem.EventPurged, Op: "Purge", Rows: 42})

	require.Equal(t, map[string]int64{"key_reused/Do": 1, "purged/Purge": 1, "purged rows": 42}, tel.counts(t))
	spans := tel.spans.Ended()
	require.Len(t, spans, 2)
	s := spans[0]
	require.Equal(t, "idem.Do", s.Name())
	require.Equal(t, "key_reused", attr(s.Attributes(), idemotel.AttrEvent))
	require.Equal(t, codes.Error, s.Status().Code)
	require.InDelta(t, 30*time.Millisecond, s.EndTime().Sub(s.StartTime()), float64(5*time.Millisecond))
	require.False(t, s.StartTime().Before(start.Add(-40*time.Millisecond)))
	for _, a := range s.Attributes() {
		require.NotContains(t, a.Value.Emit(), "secret-key", "keys are hashed by default")
		require.NotContains(t, a.Value.Emit(), "user-1")
	}
	require.Regexp(t, `^sha256:[0-9a-f]{12}$`, attr(s.Attributes(), idemotel.AttrKey))
	require.Equal(t, "42", attr(spans[1].Attributes(), idemotel.AttrRows))
}

func TestClearKeysAndNoSpans(t *testing.T) {
	tel := newTelemetry(t, idemotel.WithClearKeys())
	tel.hooks.Event(context.Background(), idem.Event{Kind: idem.EventReplayed, Op: "Do", Key: idem.Key{Scope: "u", ID: "k"}})
	require.Equal(t, "k", attr(tel.spans.Ended()[0].Attributes(), idemotel.AttrKey))

	quiet := newTelemetry(t, idemotel.WithoutSpans())
	quiet.hooks.Event(context.Background(), idem.Event{Kind: idem.EventReplayed, Op: "Do", Key: idem.Key{Scope: "u", ID: "k"}})
	require.Empty(t, quiet.spans.Ended())
	require.Equal(t, map[string]int64{"replayed/Do": 1}, quiet.counts(t))
}

// TestThroughIdem wires the hooks into real calls against PostgreSQL.
func TestThroughIdem(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "idem_otel_" + hex.EncodeToString(b)
	require.NoError(t, migrations.Up(ctx, pool, migrations.WithTable(schema, idem.DefaultTable)))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})

	tel := newTelemetry(t)
	opts := []idem.DoOption{idem.WithTable(schema, idem.DefaultTable), idem.WithHooks(tel.hooks)}
	key := idem.Key{Scope: "s", ID: "order-1", Fingerprint: []byte("a")}
	fn := func(context.Context, pgx.Tx) (int, error) { return 7, nil }
	for range 3 {
		_, err := idem.Do(ctx, pool, key, fn, opts...)
		require.NoError(t, err)
	}
	key.Fingerprint = []byte("b")
	_, err = idem.Do(ctx, pool, key, fn, opts...)
	require.ErrorIs(t, err, idem.ErrKeyReused)

	require.Equal(t, map[string]int64{"executed/Do": 1, "replayed/Do": 2, "key_reused/Do": 1}, tel.counts(t))
	require.Len(t, tel.spans.Ended(), 4)
}
