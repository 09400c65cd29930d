package txlockprom_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/txlockprom"
)

// A service makes one Observer for its registry and gives it to its
// Lockers; each call then shows in the metrics, labelled by keyspace.
func ExampleNew() {
	db, err := sql.Open("pgx", pgtest.ExampleURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer
	obs, err := txlockprom.New(reg, txlockprom.WithWaitBuckets(0.001, 0.01, 0.1, 1, 5))
	if err != nil {
		fmt.Println(err)
		return
	}
	locks, err := txlock.New(db, txlock.WithObserver(obs))
	if err != nil {
		fmt.Println(err)
		return
	}
	billing := txlock.NewKeyspace("promexample-billing")
	err = locks.WithLock(context.Background(), billing.Key("invoice:42"), func(ctx context.Context, tx *sql.Tx) error {
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	families, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "txlock_acquisitions_total":
				fmt.Println(f.GetName(), labels(m.GetLabel()), m.GetCounter().GetValue())
			case "txlock_hold_seconds":
				fmt.Println(f.GetName(), labels(m.GetLabel()), m.GetHistogram().GetSampleCount())
			}
		}
	}
	// Output:
	// txlock_acquisitions_total keyspace=promexample-billing mode=exclusive 1
	// txlock_hold_seconds keyspace=promexample-billing mode=exclusive outcome=committed 1
}

// A program that provisions Grafana reads the dashboard of these metrics.
func ExampleDashboard() {
	var d map[string]any
	if err := json.Unmarshal(txlockprom.Dashboard(), &d); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d["title"])
	// Output: txlock: PostgreSQL advisory locks
}

// labels renders a metric's labels as name=value, in the order Prometheus
// gives them (by name).
func labels(pairs []*dto.LabelPair) string {
	var b strings.Builder
	for i, p := range pairs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(p.GetName() + "=" + p.GetValue())
	}
	return b.String()
}

// Buckets sized to the service's own waits and holds; bounds that are not
// in increasing order are refused.
func ExampleWithWaitBuckets() {
	_, err := txlockprom.New(prometheus.NewRegistry(),
		txlockprom.WithWaitBuckets(0.001, 0.01, 0.1, 1, 5),
		txlockprom.WithHoldBuckets(0.01, 0.1, 1, 10, 60))
	fmt.Println(err)
	_, err = txlockprom.New(prometheus.NewRegistry(), txlockprom.WithHoldBuckets(1, 0.1))
	fmt.Println(err != nil)
	// Output:
	// <nil>
	// true
}

// The keyspace label a call's metrics carry: its keyspace's name, or a
// label that says there is none, or more than one.
func ExampleKeyspaceLabel() {
	billing, stock := txlock.NewKeyspace("billing"), txlock.NewKeyspace("stock")
	fmt.Println(txlockprom.KeyspaceLabel([]txlock.Key{billing.Key("invoice:42")}))
	fmt.Println(txlockprom.KeyspaceLabel([]txlock.Key{txlock.StringKey("nightly")}) == txlockprom.NoKeyspace)
	fmt.Println(txlockprom.KeyspaceLabel([]txlock.Key{billing.Key("a"), stock.Key("b")}) == txlockprom.MixedKeyspaces)
	// Output:
	// billing
	// true
	// true
}

// A service whose jobs hold their lock for minutes counts its holds in
// buckets of its own, up to an hour; the buckets show in the histogram.
func ExampleWithHoldBuckets() {
	db, err := sql.Open("pgx", pgtest.ExampleURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	reg := prometheus.NewRegistry()
	obs, err := txlockprom.New(reg, txlockprom.WithHoldBuckets(1, 60, 600, 3600))
	if err != nil {
		fmt.Println(err)
		return
	}
	err = txlock.WithLock(context.Background(), db, txlock.NewKeyspace("promexample-jobs").Key("nightly"), func(ctx context.Context, tx *sql.Tx) error {
		return nil
	}, txlock.WithObserver(obs))
	if err != nil {
		fmt.Println(err)
		return
	}

	families, err := reg.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range families {
		if f.GetName() != "txlock_hold_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			var bounds []float64
			for _, b := range m.GetHistogram().GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
			}
			fmt.Println(labels(m.GetLabel()), bounds, m.GetHistogram().GetSampleCount())
		}
	}
	// Output: keyspace=promexample-jobs mode=exclusive outcome=committed [1 60 600 3600] 1
}
