package txlockotel_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/txlockotel"
)

// env is an Observer on in-memory SDK providers, and a Locker that reports
// to it.
type env struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tracer trace.Tracer // the test's own, for the caller's and fn's spans
	obs    *txlockotel.Observer
	locker *txlock.Locker
	db     *sql.DB
}

func setup(t *testing.T, opts ...txlock.Option) *env {
	t.Helper()
	e := &env{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() {
		assert.NoError(t, tp.Shutdown(context.Background()))
		assert.NoError(t, mp.Shutdown(context.Background()))
	})
	e.tracer = tp.Tracer("test")
	var err error
	e.obs, err = txlockotel.New(txlockotel.WithTracerProvider(tp), txlockotel.WithMeterProvider(mp))
	require.NoError(t, err)
	e.db = open(t, pgtest.Postgres(t))
	e.locker, err = txlock.New(e.db, append([]txlock.Option{txlock.WithObserver(e.obs)}, opts...)...)
	require.NoError(t, err)
	return e
}

// ended returns the ended spans named name, in the order they ended.
func (e *env) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// one returns the only ended span named name.
func (e *env) one(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	s := e.ended(name)
	require.Len(t, s, 1, "ended spans named %q", name)
	return s[0]
}

// requireAllEnded checks that every span started has ended.
func (e *env) requireAllEnded(t *testing.T) {
	t.Helper()
	var open []string
	for _, s := range e.spans.Started() {
		if s.EndTime().IsZero() {
			open = append(open, s.Name())
		}
	}
	require.Empty(t, open, "spans left open")
}

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func attrString(t *testing.T, s sdktrace.ReadOnlySpan, key string) string {
	t.Helper()
	v, ok := attr(s, key)
	require.True(t, ok, "span %s has no attribute %s", s.Name(), key)
	return v.Emit()
}

func childOf(t *testing.T, child, parent sdktrace.ReadOnlySpan) {
	t.Helper()
	assert.Equal(t, parent.SpanContext().TraceID(), child.SpanContext().TraceID(), "%s is not in %s's trace", child.Name(), parent.Name())
	assert.Equal(t, parent.SpanContext().SpanID(), child.Parent().SpanID(), "%s is not a child of %s", child.Name(), parent.Name())
}

func eventNames(s sdktrace.ReadOnlySpan) []string {
	var names []string
	for _, ev := range s.Events() {
		names = append(names, ev.Name)
	}
	return names
}

// point is what the metrics hold for one instrument and one attribute set.
type point struct {
	found      bool
	value      int64   // a counter's
	count      uint64  // a histogram's
	sum        float64 // a histogram's
	unit       string
	boundaries []float64
}

// metric returns the data point of the instrument name whose attributes are
// exactly attrs.
func (e *env) metric(t *testing.T, name string, attrs ...attribute.KeyValue) point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, e.reader.Collect(context.Background(), &rm))
	want := attribute.NewSet(attrs...)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			assert.Equal(t, txlockotel.ScopeName, sm.Scope.Name)
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				assert.True(t, d.IsMonotonic, "%s is not monotonic", name)
				for _, dp := range d.DataPoints {
					if dp.Attributes.Equals(&want) {
						return point{found: true, value: dp.Value, unit: m.Unit}
					}
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					if dp.Attributes.Equals(&want) {
						return point{found: true, count: dp.Count, sum: dp.Sum, unit: m.Unit, boundaries: dp.Bounds}
					}
				}
			default:
				t.Fatalf("%s: unexpected data %T", name, m.Data)
			}
		}
	}
	return point{}
}

// metricAttrs returns every attribute key and value of every data point.
func (e *env) metricAttrs(t *testing.T) []attribute.KeyValue {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, e.reader.Collect(context.Background(), &rm))
	var out []attribute.KeyValue
	add := func(s attribute.Set) { out = append(out, s.ToSlice()...) }
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					add(dp.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					add(dp.Attributes)
				}
			}
		}
	}
	return out
}

var (
	exclusive = attribute.String("txlock.mode", "exclusive")
	none      = attribute.String("txlock.keyspace", txlockotel.NoKeyspace)
	billing   = attribute.String("txlock.keyspace", "billing")
)

func outcome(v string) attribute.KeyValue { return attribute.String("txlock.outcome", v) }

// TestSpansNest runs a WithLock in a request span, whose fn starts a span
// of its own and a nested WithLock: the wait and hold spans are children of
// the request, one after the other, and fn's spans, the nested call's
// included, are children of the hold span.
func TestSpansNest(t *testing.T) {
	e := setup(t)
	key := txlock.NewKeyspace("billing").Key(uniq(t))
	inner := txlock.StringKey(uniq(t))
	ctx, request := e.tracer.Start(context.Background(), "request")
	err := e.locker.WithLock(ctx, key, func(ctx context.Context, tx *sql.Tx) error {
		_, work := e.tracer.Start(ctx, "work")
		work.End()
		return e.locker.WithLock(ctx, inner, func(ctx context.Context, tx *sql.Tx) error {
			_, work := e.tracer.Start(ctx, "inner work")
			work.End()
			return nil
		})
	})
	require.NoError(t, err)
	request.End()
	e.requireAllEnded(t)

	req := e.one(t, "request")
	waits, holds := e.ended("txlock.wait"), e.ended("txlock.hold")
	require.Len(t, waits, 2)
	require.Len(t, holds, 2)
	// The outer wait ends first, the outer hold last.
	outerWait, innerWait, innerHold, outerHold := waits[0], waits[1], holds[0], holds[1]
	childOf(t, outerWait, req)
	childOf(t, outerHold, req)
	childOf(t, e.one(t, "work"), outerHold)
	childOf(t, innerWait, outerHold)
	childOf(t, innerHold, outerHold)
	childOf(t, e.one(t, "inner work"), innerHold)
	assert.False(t, outerHold.StartTime().Before(outerWait.EndTime()), "the hold started before the wait ended")

	assert.Equal(t, txlockotel.ScopeName, outerWait.InstrumentationScope().Name)
	assert.Equal(t, trace.SpanKindInternal, outerWait.SpanKind())
	for _, s := range []sdktrace.ReadOnlySpan{outerWait, outerHold} {
		v, ok := attr(s, "txlock.keys")
		require.True(t, ok)
		assert.Equal(t, []string{key.String()}, v.AsStringSlice(), s.Name())
		assert.Equal(t, "billing", attrString(t, s, "txlock.keyspace"), s.Name())
		assert.Equal(t, "exclusive", attrString(t, s, "txlock.mode"), s.Name())
		assert.Equal(t, codes.Unset, s.Status().Code, s.Name())
	}
	assert.Equal(t, "acquired", attrString(t, outerWait, "txlock.outcome"))
	assert.Equal(t, "1", attrString(t, outerWait, "txlock.attempts"))
	assert.Equal(t, "committed", attrString(t, outerHold, "txlock.outcome"))
	assert.Equal(t, txlockotel.NoKeyspace, attrString(t, innerHold, "txlock.keyspace"))
}

// TestContendedWait waits behind a holder on another connection that lets
// go after a while: the wait span lasts at least that long and counts every
// attempt, and the busy attempts are counted.
func TestContendedWait(t *testing.T) {
	e := setup(t, txlock.WithRetry(txlock.ConstantBackoff{Interval: 10 * time.Millisecond}))
	key := txlock.StringKey(uniq(t))
	release := hold(t, e.db, key)
	const heldFor = 150 * time.Millisecond
	// The holder lets go heldFor after the wait began (by then the adapter,
	// told first, has started the wait span), and not before an attempt has
	// found the key busy, however late a loaded machine makes the first.
	sawBusy := make(chan struct{})
	var busyOnce, startOnce sync.Once
	countdown := txlock.ObserverFunc(func(ctx context.Context, ev txlock.Event) context.Context {
		switch ev.Kind {
		case txlock.WaitStarted:
			startOnce.Do(func() {
				time.AfterFunc(heldFor, func() {
					select {
					case <-sawBusy:
					case <-time.After(10 * time.Second): // the attempt count below fails
					}
					release()
				})
			})
		case txlock.Busy:
			busyOnce.Do(func() { close(sawBusy) })
		}
		return ctx
	})
	require.NoError(t, e.locker.WithLock(context.Background(), key, func(context.Context, *sql.Tx) error { return nil },
		txlock.WithObserver(txlock.Observers(e.obs, countdown))))
	e.requireAllEnded(t)

	wait := e.one(t, "txlock.wait")
	assert.GreaterOrEqual(t, wait.EndTime().Sub(wait.StartTime()), heldFor/2,
		"the wait span is shorter than the hold it waited for")
	v, _ := attr(wait, "txlock.attempts")
	busy := e.metric(t, "txlock.busy_attempts", none, exclusive)
	assert.GreaterOrEqual(t, v.AsInt64(), int64(2))
	assert.Equal(t, v.AsInt64()-1, busy.value, "busy attempts: all but the granted one")
	w := e.metric(t, "txlock.wait.duration", none, exclusive, outcome("acquired"))
	assert.Equal(t, uint64(1), w.count)
	assert.GreaterOrEqual(t, w.sum, (heldFor / 2).Seconds())
}

// TestTimeoutAndFailOpen checks the wait span of calls that time out, the
// fail-open event on the caller's span, and their metrics.
func TestTimeoutAndFailOpen(t *testing.T) {
	e := setup(t)
	key := txlock.StringKey(uniq(t))
	hold(t, e.db, key)
	const timeout = 100 * time.Millisecond
	ctx, request := e.tracer.Start(context.Background(), "request")
	err := e.locker.WithLock(ctx, key, func(context.Context, *sql.Tx) error { return nil }, txlock.WithTimeout(timeout))
	require.ErrorIs(t, err, txlock.ErrLockTimeout)
	var fnSpan trace.SpanContext
	err = e.locker.WithLock(ctx, key, func(ctx context.Context, tx *sql.Tx) error {
		fnSpan = trace.SpanContextFromContext(ctx)
		return nil
	}, txlock.WithTimeout(timeout), txlock.WithFailOpen(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	request.End()
	e.requireAllEnded(t)

	req := e.one(t, "request")
	waits := e.ended("txlock.wait")
	require.Len(t, waits, 2)
	for _, w := range waits {
		childOf(t, w, req)
		assert.Equal(t, codes.Error, w.Status().Code)
		assert.Contains(t, w.Status().Description, "timed out")
		assert.Equal(t, "timed_out", attrString(t, w, "txlock.outcome"))
		assert.GreaterOrEqual(t, w.EndTime().Sub(w.StartTime()), timeout)
	}
	assert.Empty(t, e.ended("txlock.hold"), "a hold span for a lock never granted")
	assert.Equal(t, []string{"txlock.fail_open"}, eventNames(req))
	assert.Equal(t, req.SpanContext(), fnSpan, "fn run fail-open does not see the request span")

	assert.Equal(t, int64(2), e.metric(t, "txlock.timeouts", none, exclusive).value)
	assert.Equal(t, int64(1), e.metric(t, "txlock.fail_opens", none, exclusive).value)
	w := e.metric(t, "txlock.wait.duration", none, exclusive, outcome("timed_out"))
	assert.Equal(t, uint64(2), w.count)
	assert.GreaterOrEqual(t, w.sum, 2*timeout.Seconds())
	assert.False(t, e.metric(t, "txlock.acquisitions", none, exclusive).found)
}

// TestCanceled checks that a wait its caller's context cancelled ends its
// span with outcome canceled, and counts no timeout.
func TestCanceled(t *testing.T) {
	e := setup(t)
	key := txlock.StringKey(uniq(t))
	hold(t, e.db, key)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	err := e.locker.WithLock(ctx, key, func(context.Context, *sql.Tx) error { return nil }, txlock.WithTimeout(time.Minute))
	require.ErrorIs(t, err, context.Canceled)
	e.requireAllEnded(t)
	waits := e.ended("txlock.wait")
	require.Len(t, waits, 1)
	assert.Equal(t, "canceled", attrString(t, waits[0], "txlock.outcome"))
	assert.NotEqual(t, codes.Error, waits[0].Status().Code, "the caller gave up: not an error of the lock")
	assert.Equal(t, uint64(1), e.metric(t, "txlock.wait.duration", none, exclusive, outcome("canceled")).count)
	assert.False(t, e.metric(t, "txlock.timeouts", none, exclusive).found, "a cancellation was counted as a timeout")
}

// TestHoldErrors checks the hold span of an fn that fails, and of one that
// outlives WithMaxHold.
func TestHoldErrors(t *testing.T) {
	e := setup(t)
	boom := errors.New("boom")
	err := e.locker.WithLock(context.Background(), txlock.StringKey(uniq(t)), func(context.Context, *sql.Tx) error { return boom })
	require.ErrorIs(t, err, boom)
	err = e.locker.WithLock(context.Background(), txlock.NewKeyspace("billing").ID(3), func(ctx context.Context, tx *sql.Tx) error {
		<-ctx.Done()
		return ctx.Err()
	}, txlock.WithMaxHold(100*time.Millisecond))
	require.ErrorIs(t, err, txlock.ErrHoldTimeout)
	e.requireAllEnded(t)

	holds := e.ended("txlock.hold")
	require.Len(t, holds, 2)
	assert.Equal(t, codes.Error, holds[0].Status().Code)
	assert.Equal(t, "boom", holds[0].Status().Description)
	assert.Equal(t, "rolled_back", attrString(t, holds[0], "txlock.outcome"))
	assert.Empty(t, eventNames(holds[0]))
	assert.Equal(t, codes.Error, holds[1].Status().Code)
	assert.Equal(t, []string{"txlock.hold_timeout"}, eventNames(holds[1]))
	// About the bound: the span's start is stamped as the grant is
	// reported, an instant after the grant that the bound counts from (a
	// loaded CI machine measured 99.8ms), so it may fall a little short.
	assert.GreaterOrEqual(t, holds[1].EndTime().Sub(holds[1].StartTime()), 90*time.Millisecond)
	assert.Equal(t, int64(1), e.metric(t, "txlock.hold_timeouts", billing, exclusive).value)
	assert.Equal(t, uint64(1), e.metric(t, "txlock.hold.duration", billing, exclusive, outcome("rolled_back")).count)
	assert.Equal(t, uint64(1), e.metric(t, "txlock.hold.duration", none, exclusive, outcome("rolled_back")).count)
}

// TestSerializationRetry checks that each round of a retried call has its
// own wait and hold spans, all children of the caller's.
func TestSerializationRetry(t *testing.T) {
	e := setup(t)
	ctx, request := e.tracer.Start(context.Background(), "request")
	rounds := 0
	err := e.locker.WithLock(ctx, txlock.StringKey(uniq(t)), func(ctx context.Context, tx *sql.Tx) error {
		rounds++
		if rounds == 1 {
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access due to concurrent update"}
		}
		return nil
	}, txlock.WithSerializationRetries(1))
	require.NoError(t, err)
	request.End()
	e.requireAllEnded(t)
	req := e.one(t, "request")
	waits, holds := e.ended("txlock.wait"), e.ended("txlock.hold")
	require.Len(t, waits, 2)
	require.Len(t, holds, 2)
	for _, s := range append(waits, holds...) {
		childOf(t, s, req)
	}
	assert.Equal(t, codes.Error, holds[0].Status().Code)
	assert.Equal(t, codes.Unset, holds[1].Status().Code)
	assert.Equal(t, int64(1), e.metric(t, "txlock.serialization_retries", none, exclusive).value)
	assert.Equal(t, int64(2), e.metric(t, "txlock.acquisitions", none, exclusive).value)
}

// TestFencingEvents draws a token and makes a stale fenced write in fn:
// both are events of the hold span, and the stale write is counted under
// the lock's keyspace.
func TestFencingEvents(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, e.db))
	table := "otel_stale_" + uniq(t)[len(t.Name())+1:] // the random hex part
	_, err := e.db.ExecContext(ctx, `CREATE TABLE `+table+` (id int PRIMARY KEY, v int, fence_token bigint NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = e.db.ExecContext(context.Background(), `DROP TABLE `+table) })
	_, err = e.db.ExecContext(ctx, `INSERT INTO `+table+` (id, v, fence_token) VALUES (1, 0, $1)`, int64(1)<<62)
	require.NoError(t, err)

	var token int64
	err = e.locker.WithLock(ctx, txlock.NewKeyspace("billing").Key(uniq(t)), func(ctx context.Context, tx *sql.Tx) error {
		var err error
		if token, err = txlock.FenceToken(ctx); err != nil {
			return err
		}
		_, err = txlock.FencedTable{Name: table}.Update(ctx, e.db, token, []txlock.Col{{Name: "v", Value: 1}}, []txlock.Col{{Name: "id", Value: 1}})
		return err
	})
	require.ErrorIs(t, err, txlock.ErrStaleToken)
	e.requireAllEnded(t)
	h := e.one(t, "txlock.hold")
	require.Equal(t, []string{"txlock.token_issued", "txlock.stale_write"}, eventNames(h))
	issued, stale := attribute.NewSet(h.Events()[0].Attributes...), attribute.NewSet(h.Events()[1].Attributes...)
	v, _ := issued.Value("txlock.fence.token")
	assert.Equal(t, token, v.AsInt64())
	v, _ = issued.Value("txlock.fence.sequence")
	assert.Contains(t, v.AsString(), "txlock_fence_seq")
	v, _ = stale.Value("txlock.fence.current_token")
	assert.Equal(t, int64(1)<<62, v.AsInt64())
	v, _ = stale.Value("txlock.fence.table")
	assert.Contains(t, v.AsString(), table)
	assert.Equal(t, int64(1), e.metric(t, "txlock.stale_writes", billing).value)
}

// TestStandbyRefused checks the wait span and the counter of a call on a
// hot standby.
func TestStandbyRefused(t *testing.T) {
	e := setup(t)
	db := open(t, pgtest.Standby(t))
	err := txlock.WithLock(context.Background(), db, txlock.NewKeyspace("billing").Key(uniq(t)),
		func(context.Context, *sql.Tx) error { return nil }, txlock.WithObserver(e.obs))
	require.ErrorIs(t, err, txlock.ErrStandby)
	e.requireAllEnded(t)
	w := e.one(t, "txlock.wait")
	assert.Equal(t, codes.Error, w.Status().Code)
	assert.Equal(t, "standby_refused", attrString(t, w, "txlock.outcome"))
	assert.Empty(t, e.ended("txlock.hold"))
	assert.Equal(t, int64(1), e.metric(t, "txlock.standby_refusals", billing, exclusive).value)
}

// TestMetricsCountCalls runs contended calls from several goroutines,
// counting the acquisitions itself, and checks the metrics against the
// counts: units, bucket bounds, and attributes that never hold a key.
func TestMetricsCountCalls(t *testing.T) {
	e := setup(t, txlock.WithRetry(txlock.ExponentialBackoff{Min: time.Millisecond, Max: 5 * time.Millisecond}))
	names := []string{uniq(t), uniq(t)}
	keys := []txlock.Key{txlock.NewKeyspace("billing").Key(names[0]), txlock.StringKey(names[1])}
	var n [2]atomic.Int64
	var wg sync.WaitGroup
	for w := range 5 {
		wg.Go(func() {
			for i := range 8 {
				k := (w + i) % 2
				err := e.locker.WithLock(context.Background(), keys[k], func(context.Context, *sql.Tx) error {
					time.Sleep(time.Millisecond)
					return nil
				})
				if assert.NoError(t, err) {
					n[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	e.requireAllEnded(t)
	for i, ks := range []attribute.KeyValue{billing, none} {
		want := n[i].Load()
		require.Positive(t, want)
		assert.Equal(t, want, e.metric(t, "txlock.acquisitions", ks, exclusive).value, ks.Value.Emit())
		w := e.metric(t, "txlock.wait.duration", ks, exclusive, outcome("acquired"))
		assert.Equal(t, uint64(want), w.count, ks.Value.Emit())
		assert.Equal(t, "s", w.unit)
		assert.Equal(t, txlockotel.DefaultBuckets, w.boundaries)
		h := e.metric(t, "txlock.hold.duration", ks, exclusive, outcome("committed"))
		assert.Equal(t, uint64(want), h.count, ks.Value.Emit())
		assert.GreaterOrEqual(t, h.sum, float64(want)*time.Millisecond.Seconds())
	}
	assert.Equal(t, "{acquisition}", e.metric(t, "txlock.acquisitions", billing, exclusive).unit)
	assert.Len(t, e.ended("txlock.wait"), 40)
	assert.Len(t, e.ended("txlock.hold"), 40)
	for _, kv := range e.metricAttrs(t) {
		assert.True(t, slices.Contains([]string{"txlock.keyspace", "txlock.mode", "txlock.outcome"}, string(kv.Key)), "metric attribute %s", kv.Key)
		for _, name := range names {
			assert.False(t, strings.Contains(kv.Value.Emit(), name), "a metric attribute holds a key name: %s=%s", kv.Key, kv.Value.Emit())
		}
	}
}

// TestTwoObservers chains two Observers: each ends its own spans, even
// though both see every event and context.
func TestTwoObservers(t *testing.T) {
	a, b := tracetest.NewSpanRecorder(), tracetest.NewSpanRecorder()
	obsA, err := txlockotel.New(txlockotel.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(a))))
	require.NoError(t, err)
	obsB, err := txlockotel.New(txlockotel.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b))))
	require.NoError(t, err)
	db := open(t, pgtest.Postgres(t))
	var fnSpan trace.SpanContext
	err = txlock.WithLock(context.Background(), db, txlock.StringKey(uniq(t)), func(ctx context.Context, tx *sql.Tx) error {
		fnSpan = trace.SpanContextFromContext(ctx)
		return nil
	}, txlock.WithObserver(txlock.Observers(obsA, obsB)))
	require.NoError(t, err)
	for _, r := range []*tracetest.SpanRecorder{a, b} {
		var names []string
		for _, s := range r.Ended() {
			names = append(names, s.Name())
		}
		assert.Equal(t, []string{"txlock.wait", "txlock.hold"}, names)
		assert.Len(t, r.Started(), 2)
	}
	// fn sees the hold span of the last Observer of the chain.
	assert.Equal(t, b.Ended()[1].SpanContext(), fnSpan)
}

// TestNewRefuses checks that bad options are refused with a message naming
// them.
func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		opt  txlockotel.Option
		want string
	}{
		{nil, "txlockotel: nil Option"},
		{txlockotel.WithTracerProvider(nil), "WithTracerProvider needs a TracerProvider, got nil"},
		{txlockotel.WithMeterProvider(nil), "WithMeterProvider needs a MeterProvider, got nil"},
	} {
		obs, err := txlockotel.New(tc.opt)
		assert.Nil(t, obs)
		if assert.Error(t, err) {
			assert.Contains(t, err.Error(), tc.want)
		}
	}
	obs, err := txlockotel.New()
	require.NoError(t, err, "the global providers")
	assert.NotNil(t, obs)
}

// BenchmarkObserve measures the events of one uncontended call (a wait
// started, a grant and a release) on the SDK's providers, every span
// sampled, and on otel's no-op ones.
func BenchmarkObserve(b *testing.B) {
	keys := []txlock.Key{txlock.NewKeyspace("billing").Key("inv-7")}
	run := func(b *testing.B, opts ...txlockotel.Option) {
		obs, err := txlockotel.New(opts...)
		require.NoError(b, err)
		for b.Loop() {
			ctx := context.Background()
			for _, k := range []txlock.EventKind{txlock.WaitStarted, txlock.Acquired, txlock.Released} {
				ctx = obs.Observe(ctx, txlock.Event{Kind: k, Keys: keys, Attempts: 1, Waited: time.Millisecond, Held: time.Millisecond, Committed: true})
			}
		}
	}
	b.Run("sdk", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		run(b, txlockotel.WithTracerProvider(tp), txlockotel.WithMeterProvider(mp))
	})
	b.Run("noop", func(b *testing.B) {
		run(b, txlockotel.WithTracerProvider(tracenoop.NewTracerProvider()), txlockotel.WithMeterProvider(metricnoop.NewMeterProvider()))
	})
}

// TestEveryWaitSpanEnds checks the waits that end without a hold: a busy
// try (skipped), a wait that fails (failed), and LockTx, whose lock the
// caller's transaction holds, so that it has a wait span and no hold span.
func TestEveryWaitSpanEnds(t *testing.T) {
	e := setup(t)
	key := txlock.StringKey(uniq(t))
	release := hold(t, e.db, key)
	ran, err := e.locker.TryWithLock(context.Background(), key, func(context.Context, *sql.Tx) error { return nil })
	require.NoError(t, err)
	require.False(t, ran)
	release()

	tx, err := e.db.Begin()
	require.NoError(t, err)
	require.NoError(t, e.locker.LockTx(context.Background(), tx, key))
	require.NoError(t, tx.Commit())

	unreachable, err := sql.Open("pgx", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	defer unreachable.Close()
	err = txlock.WithLock(context.Background(), unreachable, key, func(context.Context, *sql.Tx) error { return nil },
		txlock.WithObserver(e.obs))
	require.Error(t, err)

	e.requireAllEnded(t)
	waits := e.ended("txlock.wait")
	require.Len(t, waits, 3)
	assert.Equal(t, "skipped", attrString(t, waits[0], "txlock.outcome"))
	assert.NotEqual(t, codes.Error, waits[0].Status().Code, "a busy try is not an error")
	assert.Equal(t, "acquired", attrString(t, waits[1], "txlock.outcome"))
	assert.Equal(t, "failed", attrString(t, waits[2], "txlock.outcome"))
	assert.Equal(t, codes.Error, waits[2].Status().Code)
	assert.Empty(t, e.ended("txlock.hold"), "LockTx has no hold span")
	assert.Equal(t, uint64(1), e.metric(t, "txlock.wait.duration", none, exclusive, outcome("skipped")).count)
	assert.Equal(t, uint64(1), e.metric(t, "txlock.wait.duration", none, exclusive, outcome("failed")).count)
}

// TestTermLost checks that a term whose backend is terminated ends its hold
// span with an error and a txlock.term_lost event, and counts a lost term.
func TestTermLost(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, e.db))
	key := txlock.NewKeyspace("leases").ID(int32(time.Now().UnixNano() & 0x7fffffff))
	term, err := e.locker.AcquireTerm(ctx, key, txlock.WithHeartbeat(txlock.Heartbeat{Interval: 100 * time.Millisecond, Timeout: 2 * time.Second, TTL: 5 * time.Second}))
	require.NoError(t, err)
	a, b, _ := key.Pair()
	var n int
	require.NoError(t, e.db.QueryRow(`SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory'
		AND classid = $1 AND objid = $2 AND objsubid = 2`, int64(uint32(a)), int64(uint32(b))).Scan(&n))
	require.Equal(t, 1, n)
	select {
	case <-term.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the term outlived its backend")
	}
	require.ErrorIs(t, term.Err(), txlock.ErrLockLost)
	require.NoError(t, term.Release(ctx))
	e.requireAllEnded(t)
	h := e.one(t, "txlock.hold")
	assert.Equal(t, codes.Error, h.Status().Code)
	var names []string
	for _, ev := range h.Events() {
		names = append(names, ev.Name)
	}
	assert.Equal(t, []string{"txlock.token_issued", "txlock.term_lost"}, names)
	leases := attribute.String("txlock.keyspace", "leases")
	assert.Equal(t, int64(1), e.metric(t, "txlock.terms_lost", leases, exclusive).value)
}
