package idemotel_test

import (
	"context"
	"fmt"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemotel"
)

// New builds hooks for idem.WithHooks; here with a manual metric reader to
// show the counter an event increments.
func ExampleNew() {
	reader := sdkmetric.NewManualReader()
	hooks, err := idemotel.New(idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		idemotel.WithoutSpans())
	if err != nil {
		panic(err)
	}
	// idem calls Event itself when given idem.WithHooks(hooks).
	hooks.Event(context.Background(), idem.Event{Kind: idem.EventReplayed, Op: "Do", Duration: time.Millisecond})

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == idemotel.EventsMetric {
			ev, _ := sum.DataPoints[0].Attributes.Value(idemotel.AttrEvent)
			fmt.Println(m.Name, ev.AsString(), sum.DataPoints[0].Value)
		}
	}
	// Output:
	// idem.events replayed 1
}
