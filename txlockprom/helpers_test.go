package txlockprom_test

import (
	"database/sql"
	"os"
	"sort"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// The helpers shared with the library's tests.
var uniq = locktest.Uniq

func open(t *testing.T, url string) *sql.DB { return locktest.Open(t, url, 20) }

func hold(t *testing.T, db *sql.DB, k txlock.Key) (release func()) {
	return locktest.Hold(t, db, k, false)
}

// sample is one series of a gathered metric family.
type sample struct {
	found      bool
	value      float64 // a counter's value
	count, sum float64 // a histogram's
}

// get returns the series of the metric family name whose labels are exactly
// labels (name, value, name, value...).
func get(t *testing.T, g prometheus.Gatherer, name string, labels ...string) sample {
	t.Helper()
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	families, err := g.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if !labelsEqual(m.GetLabel(), want) {
				continue
			}
			s := sample{found: true}
			if c := m.GetCounter(); c != nil {
				s.value = c.GetValue()
			}
			if h := m.GetHistogram(); h != nil {
				s.count, s.sum = float64(h.GetSampleCount()), h.GetSampleSum()
			}
			return s
		}
	}
	return sample{}
}

func labelsEqual(got []*dto.LabelPair, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, l := range got {
		if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
			return false
		}
	}
	return true
}

// labelValues returns every value of label name in the gathered families
// whose name starts with "txlock_", sorted and without duplicates.
func labelValues(t *testing.T, g prometheus.Gatherer, name string) []string {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "txlock_") {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == name {
					seen[l.GetValue()] = true
				}
			}
		}
	}
	var vals []string
	for v := range seen {
		vals = append(vals, v)
	}
	sort.Strings(vals)
	return vals
}

// allLabelValues returns every label value of the txlock_ families.
func allLabelValues(t *testing.T, g prometheus.Gatherer) []string {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	var vals []string
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "txlock_") {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				vals = append(vals, l.GetValue())
			}
		}
	}
	return vals
}
