package txlock

import (
	"context"
	"log/slog"
)

// SlogObserver returns an Observer that logs every event to logger
// (slog.Default() if nil), with the message "txlock: " and the event's
// name, and the event's fields that apply as attributes:
//
//   - Debug: wait_started, busy, acquired, released (without error),
//     skipped, token_issued, serialization_retry;
//   - Info: canceled;
//   - Warn: timed_out, failed_open, stale_write, hold_timeout, failed,
//     term_lost, and released with an error;
//   - Error: standby_refused.
//
// Keys are logged in their String form (the name, then the PostgreSQL
// key). It logs with the event's context, and returns it unchanged.
func SlogObserver(logger *slog.Logger) Observer {
	if logger == nil {
		logger = slog.Default()
	}
	return slogObserver{logger}
}

type slogObserver struct{ l *slog.Logger }

func (o slogObserver) Observe(ctx context.Context, e Event) context.Context {
	level := slog.LevelDebug
	switch e.Kind {
	case TimedOut, FailedOpen, StaleWrite, HoldTimeout, Failed, TermLost:
		level = slog.LevelWarn
	case StandbyRefused:
		level = slog.LevelError
	case Canceled:
		level = slog.LevelInfo
	case Released:
		if e.Err != nil {
			level = slog.LevelWarn
		}
	}
	if !o.l.Enabled(ctx, level) {
		return ctx
	}
	attrs := make([]slog.Attr, 0, 8)
	if len(e.Keys) > 0 {
		attrs = append(attrs, slog.String("keys", keysString(e.Keys)))
	}
	if e.Shared {
		attrs = append(attrs, slog.Bool("shared", true))
	}
	switch e.Kind {
	case Busy, Acquired, TimedOut, Canceled, FailedOpen, StandbyRefused, Skipped, Failed:
		attrs = append(attrs, slog.Int("attempts", e.Attempts), slog.Duration("waited", e.Waited))
	case Released:
		attrs = append(attrs, slog.Duration("held", e.Held), slog.Bool("committed", e.Committed))
	case HoldTimeout:
		attrs = append(attrs, slog.Duration("held", e.Held))
	case TermLost:
		attrs = append(attrs, slog.Duration("held", e.Held), slog.Int64("token", e.Token))
	case TokenIssued:
		attrs = append(attrs, slog.Int64("token", e.Token), slog.String("sequence", e.Sequence))
	case StaleWrite:
		attrs = append(attrs, slog.String("table", e.Table), slog.Int64("token", e.Token), slog.Int64("current", e.Current))
	}
	if e.Err != nil && e.Kind != StaleWrite {
		attrs = append(attrs, slog.String("err", e.Err.Error()))
	}
	o.l.LogAttrs(ctx, level, "txlock: "+e.Kind.String(), attrs...)
	return ctx
}
