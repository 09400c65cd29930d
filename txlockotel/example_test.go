package txlockotel_test

import (
	"context"
	"database/sql"
	"fmt"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/txlockotel"
)

// A service gives its Lockers one Observer: each call then makes a span
// for its wait and one for its hold, children of the caller's span, and
// its metrics go to the global MeterProvider (or WithMeterProvider's).
// Here the spans go to a recorder, in place of an exporter.
func ExampleNew() {
	db, err := sql.Open("pgx", pgtest.ExampleURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	obs, err := txlockotel.New(txlockotel.WithTracerProvider(tp))
	if err != nil {
		fmt.Println(err)
		return
	}
	locks, err := txlock.New(db, txlock.WithObserver(obs))
	if err != nil {
		fmt.Println(err)
		return
	}
	err = locks.WithLock(context.Background(), txlock.NewKeyspace("otelexample-billing").Key("invoice:42"), func(ctx context.Context, tx *sql.Tx) error {
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range spans.Ended() {
		fmt.Println(s.Name(), s.Status().Code)
	}
	// Output:
	// txlock.wait Unset
	// txlock.hold Unset
}

// The txlock.keyspace a call's spans and metrics carry: its keyspace's
// name, or a value that says there is none, or more than one.
func ExampleKeyspaceLabel() {
	billing, stock := txlock.NewKeyspace("billing"), txlock.NewKeyspace("stock")
	fmt.Println(txlockotel.KeyspaceLabel([]txlock.Key{billing.Key("invoice:42"), billing.ID(43)}))
	fmt.Println(txlockotel.KeyspaceLabel([]txlock.Key{txlock.StringKey("nightly")}))
	fmt.Println(txlockotel.KeyspaceLabel([]txlock.Key{billing.Key("a"), stock.Key("b")}))
	// Output:
	// billing
	// none
	// mixed
}

// The metrics go to the service's own MeterProvider; here its reader is
// read by hand, in place of an exporter.
func ExampleWithMeterProvider() {
	db, err := sql.Open("pgx", pgtest.ExampleURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	ctx := context.Background()

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := txlockotel.New(txlockotel.WithMeterProvider(mp))
	if err != nil {
		fmt.Println(err)
		return
	}
	err = txlock.WithLock(ctx, db, txlock.NewKeyspace("otelexample-stock").Key("sku:1"), func(ctx context.Context, tx *sql.Tx) error {
		return nil
	}, txlock.WithObserver(obs))
	if err != nil {
		fmt.Println(err)
		return
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		fmt.Println(err)
		return
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name == "txlock.acquisitions" {
					for _, dp := range data.DataPoints {
						ks, _ := dp.Attributes.Value("txlock.keyspace")
						fmt.Println(m.Name, ks.Emit(), dp.Value)
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name == "txlock.hold.duration" {
					for _, dp := range data.DataPoints {
						outcome, _ := dp.Attributes.Value("txlock.outcome")
						fmt.Println(m.Name, outcome.Emit(), dp.Count)
					}
				}
			}
		}
	}
	// Unordered output:
	// txlock.acquisitions otelexample-stock 1
	// txlock.hold.duration committed 1
}

// The spans go to the service's own TracerProvider, as children of the
// caller's span; the spans fn starts are children of the hold span.
func ExampleWithTracerProvider() {
	db, err := sql.Open("pgx", pgtest.ExampleURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	obs, err := txlockotel.New(txlockotel.WithTracerProvider(tp))
	if err != nil {
		fmt.Println(err)
		return
	}
	tracer := tp.Tracer("checkout-service")

	ctx, checkout := tracer.Start(context.Background(), "checkout")
	err = txlock.WithLock(ctx, db, txlock.NewKeyspace("otelexample-orders").Key("order:42"), func(ctx context.Context, tx *sql.Tx) error {
		_, charge := tracer.Start(ctx, "charge")
		defer charge.End()
		_, err := tx.ExecContext(ctx, `SELECT 1`)
		return err
	}, txlock.WithObserver(obs))
	checkout.End()
	if err != nil {
		fmt.Println(err)
		return
	}

	names := map[string]string{} // span ID to name
	for _, s := range spans.Ended() {
		names[s.SpanContext().SpanID().String()] = s.Name()
	}
	for _, s := range spans.Ended() {
		if s.Parent().IsValid() {
			fmt.Println(s.Name(), "in", names[s.Parent().SpanID().String()])
		}
	}
	// Output:
	// txlock.wait in checkout
	// charge in txlock.hold
	// txlock.hold in checkout
}
