// Package txlockprom exports txlock's lock events as Prometheus metrics. It
// is a module of its own, so that the txlock module does not depend on the
// Prometheus client.
//
//	obs, err := txlockprom.New(prometheus.DefaultRegisterer)
//	if err != nil {
//		return err
//	}
//	locker, err := txlock.New(db, txlock.WithObserver(obs))
//
// The metrics, all with the label keyspace and most with mode:
//
//	txlock_wait_seconds{keyspace,mode,outcome}     histogram: the wait, from its start to
//	                                               outcome acquired, timed_out, canceled, standby_refused, skipped or failed
//	txlock_hold_seconds{keyspace,mode,outcome}     histogram: the hold, from the grant to the end of the
//	                                               lock's transaction, outcome committed or rolled_back
//	txlock_acquisitions_total{keyspace,mode}       locks granted
//	txlock_timeouts_total{keyspace,mode}           waits that timed out (not those the caller's context cancelled)
//	txlock_fail_opens_total{keyspace,mode}         fn run without the lock (txlock.WithFailOpen)
//	txlock_stale_writes_total{keyspace}            fenced writes refused for a stale token
//	txlock_standby_refusals_total{keyspace,mode}   calls refused on a hot standby
//	txlock_hold_timeouts_total{keyspace,mode}      holds ended by txlock.WithMaxHold
//	txlock_busy_attempts_total{keyspace,mode}      attempts that found a key held by another session
//	txlock_serialization_retries_total{keyspace,mode}  fn re-run after SQLSTATE 40001 or 40P01
//	txlock_terms_lost_total{keyspace,mode}         terms (txlock.AcquireTerm, txlock.Lead) that lost their lock
//
// Labels are bounded. keyspace is the name of the keyspace the call's keys
// were made in (txlock.Key.Keyspace), NoKeyspace for keys of no keyspace
// (StringKey, Int64Key, PairKey, KeyspaceID), and MixedKeyspaces when a
// WithLocks call's keys come from several; a key itself never becomes a
// label. It is as bounded as the service's keyspaces: build keyspaces from
// fixed names, not from request data. mode is "exclusive" or "shared".
//
// What the counts cover: every wait is one txlock_wait_seconds sample, with
// outcome acquired, timed_out, canceled (the caller's context was cancelled:
// a shutdown, an abandoned request; not counted in txlock_timeouts_total),
// standby_refused, skipped (a try that found the lock busy) or failed (an error that is not about the lock). LockTx and
// TryLockTx report no release (the caller's transaction ends the lock), so
// their acquisitions have no txlock_hold_seconds sample; with WithLock and
// WithLocks alone, txlock_hold_seconds_count equals
// txlock_acquisitions_total once the calls have returned. Each round of a
// serialization retry is an acquisition of its own.
//
// The module holds a Grafana dashboard of these metrics,
// grafana-dashboard.json, which Dashboard returns: waits by outcome, wait
// and hold times (p50, p99), timeouts, lost terms, serialization retries,
// busy attempts, the rarer events and the hottest keyspaces. Import it in
// Grafana (Dashboards > New > Import) and pick the Prometheus that scrapes
// the service in its datasource menu; its keyspace menu filters every
// panel.
package txlockprom

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/txlock/txlock"
)

//go:embed grafana-dashboard.json
var dashboard []byte

// Dashboard returns the Grafana dashboard of these metrics, the JSON of the
// module's grafana-dashboard.json, for a program that provisions Grafana or
// serves the file. Its panels query the Prometheus data source of its
// variable datasource, and filter by its variable keyspace. Each call
// returns a copy of its own, which the caller may change.
func Dashboard() []byte { return slices.Clone(dashboard) }

// Label values of keyspace that are not a keyspace's name.
const (
	NoKeyspace     = "none"  // the call's keys belong to no keyspace
	MixedKeyspaces = "mixed" // the call's keys belong to more than one keyspace (or to one and to none)
)

// DefaultBuckets are the upper bounds, in seconds, of the buckets of both
// histograms unless WithWaitBuckets or WithHoldBuckets says otherwise: from
// half a millisecond, about an uncontended lock over loopback, to 30
// seconds, past the default lock timeout of 5 seconds.
var DefaultBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// An Option configures New.
type Option func(*config)

type config struct {
	waitBuckets, holdBuckets []float64
	errs                     []error
}

// WithWaitBuckets sets the upper bounds, in seconds, of txlock_wait_seconds'
// buckets: at least one, finite, in increasing order.
func WithWaitBuckets(bounds ...float64) Option {
	return func(c *config) {
		if err := checkBuckets(bounds); err != nil {
			c.errs = append(c.errs, fmt.Errorf("txlockprom: WithWaitBuckets: %w", err))
		}
		c.waitBuckets = slices.Clone(bounds)
	}
}

// WithHoldBuckets sets the upper bounds, in seconds, of txlock_hold_seconds'
// buckets, with the rules of WithWaitBuckets.
func WithHoldBuckets(bounds ...float64) Option {
	return func(c *config) {
		if err := checkBuckets(bounds); err != nil {
			c.errs = append(c.errs, fmt.Errorf("txlockprom: WithHoldBuckets: %w", err))
		}
		c.holdBuckets = slices.Clone(bounds)
	}
}

func checkBuckets(bounds []float64) error {
	if len(bounds) == 0 {
		return errors.New("no bucket bounds given")
	}
	for i, b := range bounds {
		if math.IsNaN(b) || math.IsInf(b, 0) {
			return fmt.Errorf("bound %d is %v; bounds must be finite (the +Inf bucket is implicit)", i, b)
		}
		if i > 0 && b <= bounds[i-1] {
			return fmt.Errorf("bounds must increase, but bound %d (%v) follows %v", i, b, bounds[i-1])
		}
	}
	return nil
}

// Observer is a txlock.Observer that counts lock events in Prometheus
// metrics. It is safe for concurrent use; one Observer can serve every
// Locker and call of a process.
type Observer struct {
	wait, hold         *prometheus.HistogramVec
	acquisitions       *prometheus.CounterVec
	timeouts           *prometheus.CounterVec
	failOpens          *prometheus.CounterVec
	staleWrites        *prometheus.CounterVec
	standbyRefusals    *prometheus.CounterVec
	holdTimeouts       *prometheus.CounterVec
	busyAttempts       *prometheus.CounterVec
	serializationRetry *prometheus.CounterVec
	termsLost          *prometheus.CounterVec
}

var _ txlock.Observer = (*Observer)(nil)

// New returns an Observer whose metrics are registered with reg. It
// reports an error, and registers nothing, if an option is invalid or reg
// refuses a metric (one already registered under the same name: share one
// Observer rather than making a second for the same registry). Pass
// prometheus.DefaultRegisterer for the default registry; a nil reg is an
// error.
func New(reg prometheus.Registerer, opts ...Option) (*Observer, error) {
	c := config{waitBuckets: DefaultBuckets, holdBuckets: DefaultBuckets}
	for _, o := range opts {
		if o == nil {
			c.errs = append(c.errs, errors.New("txlockprom: nil Option"))
			continue
		}
		o(&c)
	}
	if reg == nil {
		c.errs = append(c.errs, errors.New("txlockprom: the Registerer is nil (pass prometheus.DefaultRegisterer for the default registry)"))
	}
	if err := errors.Join(c.errs...); err != nil {
		return nil, err
	}
	ks := []string{"keyspace"}
	ksMode := []string{"keyspace", "mode"}
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	o := &Observer{
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "txlock_wait_seconds",
			Help:    "Time from the start of a lock wait to its outcome: acquired, timed_out, canceled, standby_refused, skipped or failed.",
			Buckets: c.waitBuckets,
		}, []string{"keyspace", "mode", "outcome"}),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "txlock_hold_seconds",
			Help:    "Time from a lock's grant to the end of its transaction, by outcome: committed or rolled_back.",
			Buckets: c.holdBuckets,
		}, []string{"keyspace", "mode", "outcome"}),
		acquisitions:       counter("txlock_acquisitions_total", "Locks granted.", ksMode),
		timeouts:           counter("txlock_timeouts_total", "Lock waits that timed out without the lock (a wait its context cancelled is outcome canceled of txlock_wait_seconds instead).", ksMode),
		failOpens:          counter("txlock_fail_opens_total", "Calls that ran fn without the lock after a timeout (WithFailOpen).", ksMode),
		staleWrites:        counter("txlock_stale_writes_total", "Fenced writes refused because the row holds a larger fencing token.", ks),
		standbyRefusals:    counter("txlock_standby_refusals_total", "Calls refused because the server is a hot standby.", ksMode),
		holdTimeouts:       counter("txlock_hold_timeouts_total", "Holds ended because fn outlived WithMaxHold.", ksMode),
		busyAttempts:       counter("txlock_busy_attempts_total", "Lock attempts that found a key held by another session.", ksMode),
		serializationRetry: counter("txlock_serialization_retries_total", "Times fn was run again after a serialization failure or deadlock (SQLSTATE 40001, 40P01).", ksMode),
		termsLost:          counter("txlock_terms_lost_total", "Terms (AcquireTerm, Lead) that lost their lock: a heartbeat failed, or none succeeded for the TTL.", ksMode),
	}
	var done []prometheus.Collector
	for _, col := range o.collectors() {
		if err := reg.Register(col); err != nil {
			for _, d := range done {
				reg.Unregister(d)
			}
			return nil, fmt.Errorf("txlockprom: registering the metrics: %w", err)
		}
		done = append(done, col)
	}
	return o, nil
}

func (o *Observer) collectors() []prometheus.Collector {
	return []prometheus.Collector{o.wait, o.hold, o.acquisitions, o.timeouts, o.failOpens, o.staleWrites,
		o.standbyRefusals, o.holdTimeouts, o.busyAttempts, o.serializationRetry, o.termsLost}
}

// Observe implements txlock.Observer: it counts e, and returns ctx.
func (o *Observer) Observe(ctx context.Context, e txlock.Event) context.Context {
	ks, mode := KeyspaceLabel(e.Keys), "exclusive"
	if e.Shared {
		mode = "shared"
	}
	switch e.Kind {
	case txlock.Acquired:
		o.acquisitions.WithLabelValues(ks, mode).Inc()
		o.wait.WithLabelValues(ks, mode, "acquired").Observe(e.Waited.Seconds())
	case txlock.TimedOut:
		o.timeouts.WithLabelValues(ks, mode).Inc()
		o.wait.WithLabelValues(ks, mode, "timed_out").Observe(e.Waited.Seconds())
	case txlock.Canceled:
		o.wait.WithLabelValues(ks, mode, "canceled").Observe(e.Waited.Seconds())
	case txlock.StandbyRefused:
		o.standbyRefusals.WithLabelValues(ks, mode).Inc()
		o.wait.WithLabelValues(ks, mode, "standby_refused").Observe(e.Waited.Seconds())
	case txlock.Skipped:
		o.wait.WithLabelValues(ks, mode, "skipped").Observe(e.Waited.Seconds())
	case txlock.Failed:
		o.wait.WithLabelValues(ks, mode, "failed").Observe(e.Waited.Seconds())
	case txlock.Released:
		outcome := "rolled_back"
		if e.Committed {
			outcome = "committed"
		}
		o.hold.WithLabelValues(ks, mode, outcome).Observe(e.Held.Seconds())
	case txlock.FailedOpen:
		o.failOpens.WithLabelValues(ks, mode).Inc()
	case txlock.StaleWrite:
		o.staleWrites.WithLabelValues(ks).Inc()
	case txlock.HoldTimeout:
		o.holdTimeouts.WithLabelValues(ks, mode).Inc()
	case txlock.Busy:
		o.busyAttempts.WithLabelValues(ks, mode).Inc()
	case txlock.SerializationRetry:
		o.serializationRetry.WithLabelValues(ks, mode).Inc()
	case txlock.TermLost:
		o.termsLost.WithLabelValues(ks, mode).Inc()
	}
	return ctx
}

// KeyspaceLabel returns the keyspace label of a call on keys: the name of the
// keyspace they were all made in, NoKeyspace if none of them was made in one
// (or there are no keys), and MixedKeyspaces otherwise (see
// txlock.Event.Keyspace).
func KeyspaceLabel(keys []txlock.Key) string {
	switch name, mixed := (txlock.Event{Keys: keys}).Keyspace(); {
	case mixed:
		return MixedKeyspaces
	case name == "":
		return NoKeyspace
	default:
		return name
	}
}
