package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// result is one measurement: one implementation in one configuration.
type result struct {
	Scenario          string   `json:"scenario"`
	Via               string   `json:"via"` // direct or pgbouncer
	Impl              string   `json:"impl"`
	Workers           int      `json:"workers"`
	Pools             int      `json:"pools"` // the pools (processes) the workers are split over
	Keys              int      `json:"keys"`  // 0: random rows of bench_rows
	HoldMS            float64  `json:"hold_ms"`
	Acquisitions      int64    `json:"acquisitions"`
	Seconds           float64  `json:"seconds"`
	AcqPerS           float64  `json:"acq_per_s"`
	P50WaitMS         float64  `json:"p50_wait_ms"`
	P99WaitMS         float64  `json:"p99_wait_ms"`
	MaxWaitMS         float64  `json:"max_wait_ms"`
	StmtsPerAcq       float64  `json:"stmts_per_acq"`
	WaiterServerConns *float64 `json:"waiter_server_conns"`     // mean, from SHOW POOLS; null when not sampled
	WaiterConnsMax    *int     `json:"waiter_server_conns_max"` // max of the samples
	ClWaitingMax      *int     `json:"cl_waiting_max"`          // clients queued in PgBouncer, max of the samples
	AllocsPerOp       *float64 `json:"allocs_per_op"`           // process-wide mallocs per acquisition; one worker only
	PoolShare         *float64 `json:"min_pool_share"`          // more than one pool: the least served pool's share of acquisitions, times the pools (1: fair)
	Bystander         *latency `json:"bystander,omitempty"`     // the bystander's SELECT 1, if the scenario has one
	HandoffUS         *float64 `json:"handoff_us,omitempty"`    // one key's scenarios: median µs from one fn's end to the next fn's start
	CommitUS          *float64 `json:"commit_us,omitempty"`     // of which: median µs from fn's end to its call's return (the commit)
	Errors            int64    `json:"errors"`
	FirstError        string   `json:"first_error,omitempty"`
}

func summarize(sc scenario, im impl, a *accum) result {
	r := result{
		Scenario: sc.name, Via: sc.via, Impl: im.name, Workers: sc.workers, Pools: max(sc.pools, 1), Keys: sc.keys,
		HoldMS: float64(sc.hold) / float64(time.Millisecond), Acquisitions: a.inWindow,
		Seconds: a.elapsed.Seconds(), Errors: a.errs,
	}
	if a.firstErr != nil {
		r.FirstError = a.firstErr.Error()
	}
	if a.elapsed > 0 {
		r.AcqPerS = float64(a.inWindow) / a.elapsed.Seconds()
	}
	if a.total > 0 {
		r.StmtsPerAcq = float64(a.stmts) / float64(a.total)
	}
	if len(a.waits) > 0 {
		l := latencyOf(a.waits)
		r.P50WaitMS, r.P99WaitMS, r.MaxWaitMS = l.P50MS, l.P99MS, l.MaxMS
	}
	if len(a.bystander) > 0 {
		l := latencyOf(a.bystander)
		r.Bystander = &l
	}
	if a.samples > 0 {
		m := float64(a.waiterConnsSum) / float64(a.samples)
		r.WaiterServerConns, r.WaiterConnsMax, r.ClWaitingMax = &m, &a.waiterConnsMax, &a.clWaitingMax
	}
	// Process-wide mallocs would count the in-process proxy's too.
	if sc.workers == 1 && !sc.network && a.total > 0 {
		v := float64(a.mallocs) / float64(a.total)
		r.AllocsPerOp = &v
	}
	if h, c, ok := handoffs(a.holds); ok {
		r.HandoffUS, r.CommitUS = &h, &c
	}
	if len(a.perPool) > 1 && a.inWindow > 0 {
		v := float64(len(a.perPool)) * float64(slices.Min(a.perPool)) / float64(a.inWindow)
		r.PoolShare = &v
	}
	return r
}

// handoffs returns the median handoff of holds, one lock's turns, in µs:
// from one fn's end to the next fn's start, and of that, from fn's end to
// its call's return, the commit. Spans measured in different rounds are
// apart by a round's end: a gap of over a second is not a handoff.
func handoffs(holds []span) (handoff, commit float64, ok bool) {
	slices.SortFunc(holds, func(a, b span) int { return a.start.Compare(b.start) })
	var gaps, commits []time.Duration
	for i := 0; i+1 < len(holds); i++ {
		if g := holds[i+1].start.Sub(holds[i].end); g >= 0 && g < time.Second {
			gaps = append(gaps, g)
			commits = append(commits, holds[i].ret.Sub(holds[i].end))
		}
	}
	if len(gaps) == 0 {
		return 0, 0, false
	}
	us := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2]) / float64(time.Microsecond)
	}
	return us(gaps), us(commits), true
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// latency is the median, 99th percentile and maximum of some durations.
type latency struct {
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`
}

// latencyOf sorts ds, and returns their latency.
func latencyOf(ds []time.Duration) latency {
	slices.Sort(ds)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(ds)))) - 1
		return ms(ds[max(i, 0)])
	}
	return latency{q(0.50), q(0.99), ms(ds[len(ds)-1])}
}

func printJSON(w io.Writer, rs []result) {
	enc := json.NewEncoder(w)
	for _, r := range rs {
		_ = enc.Encode(r)
	}
}

// baseline names the implementation a scenario's ratios are taken against.
func baseline(scenario string) string {
	switch {
	case strings.HasPrefix(scenario, "uncontended"), scenario == "many-keys":
		return "plain-tx"
	case scenario == "semaphore":
		return "txlock-4-keys"
	default:
		return "pg-blocking"
	}
}

// find returns the result of one implementation in one configuration of
// one pool.
func find(rs []result, scenario, via, impl string, workers int, hold float64) *result {
	return findPools(rs, scenario, via, impl, workers, 1, hold)
}

func findPools(rs []result, scenario, via, impl string, workers, pools int, hold float64) *result {
	for i := range rs {
		r := &rs[i]
		if r.Scenario == scenario && r.Via == via && r.Impl == impl && r.Workers == workers && r.Pools == pools && r.HoldMS == hold {
			return r
		}
	}
	return nil
}

func printTable(w io.Writer, rs []result, o options, network string) {
	one := 4 * o.rounds
	if o.roundsSet {
		one = o.rounds
	}
	fmt.Fprintf(w, "Each row: %v of measurement in %d interleaved rounds (%d for one worker). Ratios are against the scenario's baseline in the same run.\n\n", o.dur, o.rounds, one)
	if network != "" {
		fmt.Fprintf(w, "Simulated network (the -network scenarios): %s.\n\n", network)
	}
	type group struct {
		scenario, via  string
		workers, pools int
		hold           float64
	}
	var groups []group
	for _, r := range rs {
		g := group{r.Scenario, r.Via, r.Workers, r.Pools, r.HoldMS}
		if !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	scenario := ""
	for _, g := range groups {
		if g.scenario != scenario {
			scenario = g.scenario
			fmt.Fprintf(w, "\n### %s (ratio against %s)\n\n", scenario, baseline(scenario))
			fmt.Fprintln(w, "| via | impl | workers | pools | hold ms | acq/s | ratio | p50 wait ms | p99 wait ms | max wait ms | stmts/acq | waiter server conns (mean/max) | allocs/op | min pool share | errors |")
			fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		}
		base := findPools(rs, g.scenario, g.via, baseline(g.scenario), g.workers, g.pools, g.hold)
		for _, r := range rs {
			if r.Scenario != g.scenario || r.Via != g.via || r.Workers != g.workers || r.Pools != g.pools || r.HoldMS != g.hold {
				continue
			}
			ratio := "–"
			if base != nil && base.AcqPerS > 0 {
				ratio = fmt.Sprintf("%.2f", r.AcqPerS/base.AcqPerS)
			}
			conns := "–"
			if r.WaiterServerConns != nil {
				conns = fmt.Sprintf("%.1f / %d", *r.WaiterServerConns, *r.WaiterConnsMax)
			}
			allocs := "–"
			if r.AllocsPerOp != nil {
				allocs = fmt.Sprintf("%.0f", *r.AllocsPerOp)
			}
			share := "–"
			if r.PoolShare != nil {
				share = fmt.Sprintf("%.2f", *r.PoolShare)
			}
			fmt.Fprintf(w, "| %s | %s | %d | %d | %g | %.0f | %s | %.2f | %.2f | %.2f | %.1f | %s | %s | %s | %d |\n",
				r.Via, r.Impl, r.Workers, r.Pools, r.HoldMS, r.AcqPerS, ratio, r.P50WaitMS, r.P99WaitMS, r.MaxWaitMS,
				r.StmtsPerAcq, conns, allocs, share, r.Errors)
		}
	}
	fmt.Fprintln(w)
	printTargets(w, rs)
}

// chart draws, for one key and a 1 ms hold, directly: throughput and p99
// wait against workers in one process (the contended scenario), and below,
// throughput, p99 wait and the least served pool's share against the pools
// that 16 workers are split over (contended is 1 pool, two-pools 2, fleet 4
// and 16), one line per implementation.
func chart(rs []result) string {
	const via, hold = "direct", 1.0
	var impls []string
	addImpl := func(r *result) {
		if !slices.Contains(impls, r.Impl) {
			impls = append(impls, r.Impl)
		}
	}
	// row 1: workers of one pool
	var workers []int
	for i := range rs {
		r := &rs[i]
		if r.Scenario == "contended" && r.Via == via && r.HoldMS == hold {
			addImpl(r)
			if !slices.Contains(workers, r.Workers) {
				workers = append(workers, r.Workers)
			}
		}
	}
	slices.Sort(workers)
	// row 2: 16 workers split over pools
	splitScenario := func(pools int) string {
		switch pools {
		case 1:
			return "contended"
		case 2:
			return "two-pools"
		default:
			return "fleet"
		}
	}
	var pools []int
	hasFleet := slices.ContainsFunc(rs, func(r result) bool { return r.Scenario == "fleet" && r.Via == via })
	for i := range rs {
		r := &rs[i]
		if hasFleet && r.Workers == 16 && r.Via == via && r.HoldMS == hold && r.Scenario == splitScenario(r.Pools) {
			addImpl(r)
			if !slices.Contains(pools, r.Pools) {
				pools = append(pools, r.Pools)
			}
		}
	}
	slices.Sort(pools)
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}
	color := func(im string) string { return colors[slices.Index(impls, im)%len(colors)] }
	const pw, ph, left, top, gap = 420.0, 300.0, 70.0, 40.0, 110.0
	const rowH = ph + 90
	rows := 1.0
	if len(pools) > 1 {
		rows = 2
	}
	legendH := 18.0 * float64(len(impls))
	width, height := left+2*pw+gap+40, top+rows*rowH+30+legendH
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&sb, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	// panel draws one chart at (x0, y0) of width w: value of each
	// implementation's point(im, x) against xs, labelled xlabel.
	panel := func(x0, y0, w float64, title, ylabel, xlabel string, xs []int, point func(im string, x int) *result, value func(*result) float64, logY bool) {
		var maxV, minV float64 = 0, math.Inf(1)
		for _, im := range impls {
			for _, xv := range xs {
				if r := point(im, xv); r != nil {
					v := value(r)
					maxV = max(maxV, v)
					if v > 0 {
						minV = min(minV, v)
					}
				}
			}
		}
		if maxV == 0 {
			maxV = 1
		}
		lo, hi := 0.0, maxV*1.1
		if logY {
			lo, hi = math.Floor(math.Log10(max(minV, 0.01))), math.Ceil(math.Log10(maxV))
			if hi <= lo {
				hi = lo + 1
			}
		}
		y := func(v float64) float64 {
			if logY {
				v = math.Log10(max(v, math.Pow(10, lo)))
			}
			return y0 + ph - (v-lo)/(hi-lo)*ph
		}
		x := func(i int) float64 {
			if len(xs) < 2 {
				return x0 + w/2
			}
			return x0 + 20 + float64(i)/float64(len(xs)-1)*(w-40)
		}
		fmt.Fprintf(&sb, `<text x="%.0f" y="%.0f" font-size="14" font-weight="bold">%s</text>`+"\n", x0, y0-15, title)
		fmt.Fprintf(&sb, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", x0, y0, w, ph)
		// grid and y labels
		if logY {
			for e := lo; e <= hi; e++ {
				fmt.Fprintf(&sb, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.0f" y="%.1f" text-anchor="end">%g</text>`+"\n",
					x0, x0+w, y(math.Pow(10, e)), y(math.Pow(10, e)), x0-5, y(math.Pow(10, e))+4, math.Pow(10, e))
			}
		} else {
			for i := 0; i <= 5; i++ {
				v := hi * float64(i) / 5
				label := fmt.Sprintf("%.0f", v)
				if hi < 10 {
					label = fmt.Sprintf("%.1f", v)
				}
				fmt.Fprintf(&sb, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n",
					x0, x0+w, y(v), y(v), x0-5, y(v)+4, label)
			}
		}
		fmt.Fprintf(&sb, `<text transform="translate(%.0f,%.0f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", x0-50, y0+ph/2, ylabel)
		for i, xv := range xs {
			fmt.Fprintf(&sb, `<text x="%.1f" y="%.0f" text-anchor="middle">%d</text>`+"\n", x(i), y0+ph+16, xv)
		}
		fmt.Fprintf(&sb, `<text x="%.0f" y="%.0f" text-anchor="middle">%s</text>`+"\n", x0+w/2, y0+ph+34, xlabel)
		for _, im := range impls {
			var pts []string
			for i, xv := range xs {
				if r := point(im, xv); r != nil {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(value(r))))
				}
			}
			if len(pts) == 0 {
				continue
			}
			c := color(im)
			fmt.Fprintf(&sb, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(pts, " "))
			for _, p := range pts {
				xy := strings.Split(p, ",")
				fmt.Fprintf(&sb, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], c)
			}
		}
	}
	tput := func(r *result) float64 { return r.AcqPerS }
	p99 := func(r *result) float64 { return r.P99WaitMS }
	byWorkers := func(im string, wk int) *result { return find(rs, "contended", via, im, wk, hold) }
	xl := fmt.Sprintf("workers (1 key, %g ms hold, %s)", hold, via)
	panel(left, top, pw, "Throughput", "acquisitions per second", xl, workers, byWorkers, tput, false)
	panel(left+pw+gap, top, pw, "p99 wait (log scale)", "p99 wait, ms", xl, workers, byWorkers, p99, true)
	yLegend := top + rowH
	if len(pools) > 1 {
		byPools := func(im string, n int) *result { return findPools(rs, splitScenario(n), via, im, 16, n, hold) }
		share := func(r *result) float64 {
			if r.PoolShare == nil {
				return 1 // one pool has all of it
			}
			return *r.PoolShare
		}
		y0 := top + rowH
		w3 := (2*pw + gap - 2*75) / 3
		xl := "pools of 16 workers (1 key, 1 ms, direct)"
		panel(left, y0, w3, "A fleet: throughput", "acquisitions per second", xl, pools, byPools, tput, false)
		panel(left+w3+75, y0, w3, "p99 wait (log scale)", "p99 wait, ms", xl, pools, byPools, p99, true)
		panel(left+2*(w3+75), y0, w3, "least served pool's share", "min pool share (1: fair)", xl, pools, byPools, share, false)
		yLegend += rowH
	}
	for k, im := range impls {
		yy := yLegend - 25 + 18*float64(k)
		c := color(im)
		fmt.Fprintf(&sb, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="3"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			left, left+24, yy-4, yy-4, c, left+30, yy, im)
	}
	sb.WriteString("</svg>\n")
	return sb.String()
}
