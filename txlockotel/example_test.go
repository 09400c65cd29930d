package txlockotel_test

import (
	"context"
	"database/sql"
	"fmt"

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
