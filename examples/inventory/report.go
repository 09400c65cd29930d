package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// What the demo prints: each phase's result, the summary table, and the
// percentiles of the lock waits it collects.

// result is one phase's row of the summary.
type result struct {
	name     string
	locked   bool
	skipped  bool
	sold     int
	left     int
	oversold int
	waits    []time.Duration // lock waits, from txlock.LockFromContext
	stale    int             // stale writes the fence refused
	fenced   bool            // the phase counts stale writes
}

// waitLog collects the lock waits of a phase.
type waitLog struct {
	mu    sync.Mutex
	waits []time.Duration
}

// add records the lock wait of a sale that ended with err, if it got the
// lock: its error is nil or errSoldOut. (Any other error ends the phase.)
func (l *waitLog) add(waited time.Duration, err error) {
	if err != nil && !errors.Is(err, errSoldOut) {
		return
	}
	l.mu.Lock()
	l.waits = append(l.waits, waited)
	l.mu.Unlock()
}

func (l *waitLog) all() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.waits)
}

// title is a phase's name as its heading shows it: "1: no lock".
func title(name string) string { return strings.Replace(name, " ", ": ", 1) }

// summary prints the table of results.
func summary(w io.Writer, results []result) {
	fmt.Fprintln(w, "\nsummary")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tsold\tstock left\toversold\tlock wait p50\tp99\tstale writes refused")
	for _, r := range results {
		name := strings.Replace(r.name, " ", ". ", 1)
		if r.skipped {
			fmt.Fprintf(tw, "%s\tskipped\n", name)
			continue
		}
		p50, p99, stale := "-", "-", "-"
		if r.locked && len(r.waits) > 0 {
			p50, p99 = fmtDur(percentile(r.waits, 50)), fmtDur(percentile(r.waits, 99))
		}
		if r.fenced {
			stale = fmt.Sprint(r.stale)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\n", name, r.sold, r.left, r.oversold, p50, p99, stale)
	}
	tw.Flush()
}

// percentile returns the p-th percentile of ds, by nearest rank.
func percentile(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= 100*time.Millisecond:
		return d.Round(10 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}
