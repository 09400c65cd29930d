// Package txlockotel reports txlock's lock events to OpenTelemetry: a span
// for each wait and each hold, and metrics through the OpenTelemetry metrics
// API. It is a module of its own, so that the txlock module does not depend
// on OpenTelemetry.
//
//	obs, err := txlockotel.New() // otel's global TracerProvider and MeterProvider
//	if err != nil {
//		return err
//	}
//	locker, err := txlock.New(db, txlock.WithObserver(obs))
//
// # Spans
//
// "txlock.wait" starts when a call begins to acquire and ends when the lock
// is granted, the wait times out, or the server turns out to be a hot
// standby (the last two with status Error). "txlock.hold" starts at the
// grant and ends when the lock's transaction has ended (status Error if the
// call returns an error). Both are children of the span of the caller's
// context, one after the other, and the hold span is the current span of
// fn's context, so the spans fn starts are its children. A serialization
// retry gives each round a wait and a hold span of its own.
//
// Attributes: txlock.keys (string slice: each key's String form),
// txlock.keyspace, txlock.mode ("exclusive" or "shared"), txlock.attempts
// (int: lock statements run) on the wait span, and txlock.outcome: on the
// wait span "acquired", "timed_out", "canceled" (the caller's context was
// cancelled), "standby_refused", "skipped" (a busy try) or "failed" (an error that is not about the lock), on the hold span
// "committed" or "rolled_back". Span events: "txlock.token_issued"
// (txlock.fence.token, txlock.fence.sequence), "txlock.hold_timeout" and,
// for a term that lost its lock, "txlock.term_lost" (txlock.fence.token) on
// the hold span; "txlock.stale_write" (txlock.fence.table,
// txlock.fence.token, txlock.fence.current_token) on the span of the
// writer's context; "txlock.fail_open" (txlock.attempts) on the span of
// the caller's context, since fn then runs without a lock.
//
// Every wait span ends, whatever the wait's outcome. LockTx and TryLockTx
// have no hold span: the caller's transaction holds their lock, and no
// event reports its end.
//
// # Metrics
//
//	txlock.wait.duration           histogram, s: wait to outcome acquired, timed_out, canceled, standby_refused, skipped or failed
//	txlock.hold.duration           histogram, s: grant to end of transaction, outcome committed or rolled_back
//	txlock.acquisitions            counter, {acquisition}
//	txlock.timeouts                counter, {timeout}
//	txlock.fail_opens              counter, {fail_open}
//	txlock.stale_writes            counter, {write}
//	txlock.standby_refusals        counter, {refusal}
//	txlock.hold_timeouts           counter, {timeout}
//	txlock.busy_attempts           counter, {attempt}
//	txlock.serialization_retries   counter, {retry}
//	txlock.terms_lost              counter, {term}
//
// Their attributes are bounded: txlock.keyspace, txlock.mode (but not on
// txlock.stale_writes), and txlock.outcome on the histograms; never a key.
// txlock.keyspace is the name of the keyspace the call's keys were made in
// (txlock.Key.Keyspace), NoKeyspace for keys of no keyspace, and
// MixedKeyspaces for keys of several, on spans and metrics alike. The
// histograms advise the bucket bounds of DefaultBuckets. LockTx's
// acquisitions have no hold duration, as in the Prometheus adapter
// (txlockprom).
package txlockotel

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/txlock/txlock"
)

// ScopeName is the instrumentation scope of the Observer's tracer and
// meter: this package's import path.
const ScopeName = "github.com/txlock/txlock/txlockotel"

// Values of txlock.keyspace that are not a keyspace's name.
const (
	NoKeyspace     = "none"  // the call's keys belong to no keyspace
	MixedKeyspaces = "mixed" // the call's keys belong to more than one keyspace (or to one and to none)
)

// DefaultBuckets are the bucket bounds, in seconds, that the duration
// histograms advise: from half a millisecond, about an uncontended lock over
// loopback, to 30 seconds, past the default lock timeout of 5 seconds.
var DefaultBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

var (
	keyKeys      = attribute.Key("txlock.keys")
	keyKeyspace  = attribute.Key("txlock.keyspace")
	keyMode      = attribute.Key("txlock.mode")
	keyOutcome   = attribute.Key("txlock.outcome")
	keyAttempts  = attribute.Key("txlock.attempts")
	keyToken     = attribute.Key("txlock.fence.token")
	keySequence  = attribute.Key("txlock.fence.sequence")
	keyTable     = attribute.Key("txlock.fence.table")
	keyCurrent   = attribute.Key("txlock.fence.current_token")
	exclusive    = keyMode.String("exclusive")
	shared       = keyMode.String("shared")
	acquired     = keyOutcome.String("acquired")
	timedOut     = keyOutcome.String("timed_out")
	refused      = keyOutcome.String("standby_refused")
	skipped      = keyOutcome.String("skipped")
	failed       = keyOutcome.String("failed")
	canceled     = keyOutcome.String("canceled")
	committed    = keyOutcome.String("committed")
	rolledBack   = keyOutcome.String("rolled_back")
	internalKind = trace.WithSpanKind(trace.SpanKindInternal)
)

// An Option configures New.
type Option func(*config)

type config struct {
	tp   trace.TracerProvider
	mp   metric.MeterProvider
	errs []error
}

// WithTracerProvider sets the TracerProvider of the spans, in place of
// otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) {
		if tp == nil {
			c.errs = append(c.errs, errors.New("txlockotel: WithTracerProvider needs a TracerProvider, got nil"))
		}
		c.tp = tp
	}
}

// WithMeterProvider sets the MeterProvider of the metrics, in place of
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) {
		if mp == nil {
			c.errs = append(c.errs, errors.New("txlockotel: WithMeterProvider needs a MeterProvider, got nil"))
		}
		c.mp = mp
	}
}

// Observer is a txlock.Observer that reports lock events as spans and
// metrics. It is safe for concurrent use; one Observer can serve every
// Locker and call of a process.
type Observer struct {
	tracer               trace.Tracer
	wait, hold           metric.Float64Histogram
	acquisitions         metric.Int64Counter
	timeouts             metric.Int64Counter
	failOpens            metric.Int64Counter
	staleWrites          metric.Int64Counter
	standbyRefusals      metric.Int64Counter
	holdTimeouts         metric.Int64Counter
	busyAttempts         metric.Int64Counter
	serializationRetries metric.Int64Counter
	termsLost            metric.Int64Counter

	mu    sync.RWMutex
	attrs map[attrKey]*attrSets
}

// attrSets are the metric attributes of one keyspace label and mode, made
// once: an attribute set costs allocations and a sort to build.
type attrSets struct {
	keyspace, mode        attribute.KeyValue
	ks, ksMode            metric.MeasurementOption // txlock.keyspace; and txlock.mode
	acquired, timedOut    metric.MeasurementOption // and txlock.outcome
	refused               metric.MeasurementOption
	skipped, failed       metric.MeasurementOption
	canceled              metric.MeasurementOption
	committed, rolledBack metric.MeasurementOption
}

type attrKey struct {
	keyspace string
	shared   bool
}

// sets returns the attribute sets of a call on keys.
func (o *Observer) sets(keys []txlock.Key, isShared bool) *attrSets {
	k := attrKey{KeyspaceLabel(keys), isShared}
	o.mu.RLock()
	s := o.attrs[k]
	o.mu.RUnlock()
	if s != nil {
		return s
	}
	s = &attrSets{keyspace: keyKeyspace.String(k.keyspace), mode: exclusive}
	if isShared {
		s.mode = shared
	}
	with := func(kv ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(append([]attribute.KeyValue{s.keyspace, s.mode}, kv...)...))
	}
	s.ks = metric.WithAttributeSet(attribute.NewSet(s.keyspace))
	s.ksMode = with()
	s.acquired, s.timedOut, s.refused = with(acquired), with(timedOut), with(refused)
	s.skipped, s.failed = with(skipped), with(failed)
	s.canceled = with(canceled)
	s.committed, s.rolledBack = with(committed), with(rolledBack)
	o.mu.Lock()
	defer o.mu.Unlock()
	if prev := o.attrs[k]; prev != nil {
		return prev
	}
	o.attrs[k] = s
	return s
}

var _ txlock.Observer = (*Observer)(nil)

// New returns an Observer on the providers the options name, otel's global
// ones by default. It reports an error if an option is invalid or the meter
// refuses an instrument.
func New(opts ...Option) (*Observer, error) {
	var c config
	for _, o := range opts {
		if o == nil {
			c.errs = append(c.errs, errors.New("txlockotel: nil Option"))
			continue
		}
		o(&c)
	}
	if err := errors.Join(c.errs...); err != nil {
		return nil, err
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	meter := c.mp.Meter(ScopeName)
	o := &Observer{tracer: c.tp.Tracer(ScopeName), attrs: map[attrKey]*attrSets{}}
	var errs []error
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(DefaultBuckets...))
		errs = append(errs, err)
		return h
	}
	counter := func(name, unit, desc string) metric.Int64Counter {
		ctr, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return ctr
	}
	o.wait = histogram("txlock.wait.duration", "Time from the start of a lock wait to its outcome: acquired, timed_out, canceled, standby_refused, skipped or failed.")
	o.hold = histogram("txlock.hold.duration", "Time from a lock's grant to the end of its transaction, by outcome: committed or rolled_back.")
	o.acquisitions = counter("txlock.acquisitions", "{acquisition}", "Locks granted.")
	o.timeouts = counter("txlock.timeouts", "{timeout}", "Lock waits that timed out without the lock (a wait its context cancelled has outcome canceled instead).")
	o.failOpens = counter("txlock.fail_opens", "{fail_open}", "Calls that ran fn without the lock after a timeout (WithFailOpen).")
	o.staleWrites = counter("txlock.stale_writes", "{write}", "Fenced writes refused because the row holds a larger fencing token.")
	o.standbyRefusals = counter("txlock.standby_refusals", "{refusal}", "Calls refused because the server is a hot standby.")
	o.holdTimeouts = counter("txlock.hold_timeouts", "{timeout}", "Holds ended because fn outlived WithMaxHold.")
	o.busyAttempts = counter("txlock.busy_attempts", "{attempt}", "Lock attempts that found a key held by another session.")
	o.serializationRetries = counter("txlock.serialization_retries", "{retry}", "Times fn was run again after a serialization failure or deadlock (SQLSTATE 40001, 40P01).")
	o.termsLost = counter("txlock.terms_lost", "{term}", "Terms (AcquireTerm, Lead) that lost their lock: a heartbeat failed, or none succeeded for the TTL.")
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("txlockotel: creating the instruments: %w", err)
	}
	return o, nil
}

// A span the Observer started, found again at the event that ends it
// through a context key of this Observer's own (so that two Observers in a
// chain, or a nested call's, never take each other's).
type spanState struct {
	span   trace.Span
	parent trace.Span // the span of the call's context, current again once span ends
}

type ctxKey struct {
	o    *Observer
	hold bool // the hold span; else the wait span
}

func (o *Observer) state(ctx context.Context, hold bool) *spanState {
	st, _ := ctx.Value(ctxKey{o, hold}).(*spanState)
	return st
}

// end ends the span that ctx carries for o, if any, and returns ctx with the
// span that was current before it current again.
func (o *Observer) end(ctx context.Context, hold bool, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	st := o.state(ctx, hold)
	if st == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	st.span.SetAttributes(attrs...)
	return trace.ContextWithSpan(ctx, st.parent), st.span
}

// Observe implements txlock.Observer.
func (o *Observer) Observe(ctx context.Context, e txlock.Event) context.Context {
	a := o.sets(e.Keys, e.Shared)
	switch e.Kind {
	case txlock.WaitStarted:
		return o.start(ctx, "txlock.wait", false, e, a)

	case txlock.Acquired:
		o.acquisitions.Add(ctx, 1, a.ksMode)
		o.wait.Record(ctx, e.Waited.Seconds(), a.acquired)
		ctx, span := o.end(ctx, false, keyAttempts.Int(e.Attempts), acquired)
		span.End()
		if e.CallerTx {
			return ctx // LockTx: the caller's transaction holds the lock, and no Released follows
		}
		return o.start(ctx, "txlock.hold", true, e, a)

	case txlock.TimedOut, txlock.Canceled, txlock.StandbyRefused, txlock.Skipped, txlock.Failed:
		outcome, opt, desc := timedOut, a.timedOut, "lock wait timed out"
		if e.Err != nil {
			desc = e.Err.Error()
		}
		switch e.Kind {
		case txlock.StandbyRefused:
			outcome, opt, desc = refused, a.refused, "the server is a hot standby"
			o.standbyRefusals.Add(ctx, 1, a.ksMode)
		case txlock.Skipped:
			outcome, opt, desc = skipped, a.skipped, ""
		case txlock.Failed:
			outcome, opt = failed, a.failed
		case txlock.Canceled:
			// The caller gave up: not an error of the lock, and not a timeout.
			outcome, opt, desc = canceled, a.canceled, ""
		default:
			o.timeouts.Add(ctx, 1, a.ksMode)
		}
		o.wait.Record(ctx, e.Waited.Seconds(), opt)
		ctx, span := o.end(ctx, false, keyAttempts.Int(e.Attempts), outcome)
		if desc != "" {
			span.SetStatus(codes.Error, desc)
		}
		span.End()
		return ctx

	case txlock.Released:
		outcome, opt := rolledBack, a.rolledBack
		if e.Committed {
			outcome, opt = committed, a.committed
		}
		o.hold.Record(ctx, e.Held.Seconds(), opt)
		ctx, span := o.end(ctx, true, outcome)
		if e.Err != nil {
			span.SetStatus(codes.Error, e.Err.Error())
		}
		span.End()
		return ctx

	case txlock.HoldTimeout:
		o.holdTimeouts.Add(ctx, 1, a.ksMode)
		if st := o.state(ctx, true); st != nil {
			st.span.AddEvent("txlock.hold_timeout")
		}

	case txlock.FailedOpen:
		o.failOpens.Add(ctx, 1, a.ksMode)
		trace.SpanFromContext(ctx).AddEvent("txlock.fail_open", trace.WithAttributes(keyAttempts.Int(e.Attempts)))

	case txlock.TokenIssued:
		trace.SpanFromContext(ctx).AddEvent("txlock.token_issued",
			trace.WithAttributes(keyToken.Int64(e.Token), keySequence.String(e.Sequence)))

	case txlock.StaleWrite:
		o.staleWrites.Add(ctx, 1, a.ks)
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			attrs := []attribute.KeyValue{keyTable.String(e.Table), keyToken.Int64(e.Token)}
			if e.Current != 0 {
				attrs = append(attrs, keyCurrent.Int64(e.Current))
			}
			span.AddEvent("txlock.stale_write", trace.WithAttributes(attrs...))
		}

	case txlock.Busy:
		o.busyAttempts.Add(ctx, 1, a.ksMode)

	case txlock.SerializationRetry:
		o.serializationRetries.Add(ctx, 1, a.ksMode)

	case txlock.TermLost:
		o.termsLost.Add(ctx, 1, a.ksMode)
		if st := o.state(ctx, true); st != nil {
			st.span.AddEvent("txlock.term_lost", trace.WithAttributes(keyToken.Int64(e.Token)))
		}
	}
	return ctx
}

// start starts a span named name as a child of ctx's, and returns ctx with
// it current and findable again by end.
func (o *Observer) start(ctx context.Context, name string, hold bool, e txlock.Event, a *attrSets) context.Context {
	parent := trace.SpanFromContext(ctx)
	ctx, span := o.tracer.Start(ctx, name, internalKind, trace.WithAttributes(a.keyspace, a.mode))
	if span.IsRecording() {
		keys := make([]string, len(e.Keys))
		for i, k := range e.Keys {
			keys[i] = k.String()
		}
		span.SetAttributes(keyKeys.StringSlice(keys))
	}
	return context.WithValue(ctx, ctxKey{o, hold}, &spanState{span: span, parent: parent})
}

// KeyspaceLabel returns the txlock.keyspace of a call on keys: the name of the
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
