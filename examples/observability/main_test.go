package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/txlock/txlock/examples/internal/exampletest"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/txlockprom"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

var (
	urlLine  = regexp.MustCompile(`(?m)^serving metrics on (http://127\.0\.0\.1:(\d+)/metrics)$`)
	doneLine = regexp.MustCompile(`(?m)^workload done in \S+: acquisitions (\d+) \(orders (\d+), billing (\d+)\), timeouts (\d+)$`)
	// grafanaLines say how to load txlockprom's dashboard.
	grafanaLines = regexp.MustCompile(`(?m)^Grafana: import (\S+) \(Dashboards > New > Import\), datasource: your Prometheus\n  scraping (\S+) \(-linger keeps it up\); in code, the same JSON is txlockprom\.Dashboard\(\)$`)
	// lingerLine comes after the lines the program printed from its own
	// scrape.
	lingerLine = regexp.MustCompile(`^serving \S+ for \S+ more \(interrupt to stop\)$`)
)

// TestObservability builds the program and runs it with -linger, on a
// throwaway server of its own and on DATABASE_URL. Once its workload is
// done, the test scrapes its /metrics itself and checks the histograms'
// counts and the counters against the acquisitions and timeouts the
// workload counted from what its calls returned, and against the number of
// calls the flags ask for, and that the Grafana dashboard it names is
// txlockprom's; then it interrupts the program, which must exit 0 and
// leave nothing listening.
func TestObservability(t *testing.T) {
	bin := exampletest.Build(t)
	const workers, calls = 6, 20
	args := []string{"-workers", strconv.Itoa(workers), "-calls", strconv.Itoa(calls), "-hold", "2ms", "-linger", "2m"}
	t.Run("own server", func(t *testing.T) {
		out := runAndScrape(t, bin, "", workers*calls, args...)
		exampletest.CheckPostgresGone(t, out)
	})
	t.Run("DATABASE_URL", func(t *testing.T) {
		runAndScrape(t, bin, pgtest.Postgres(t), workers*calls, args...)
	})
}

// runAndScrape runs the program, scrapes its endpoint once the workload is
// done, checks the metrics, interrupts it, and returns its output.
func runAndScrape(t *testing.T, bin, databaseURL string, workerCalls int, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 15 * time.Second
	cmd.Env = exampletest.Env(databaseURL)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Read the output as it comes, until the program lingers (its workload
	// done, its own lines printed) or exits.
	var out exampletest.Buffer
	lingering := make(chan struct{})
	readAll := make(chan struct{})
	go func() {
		defer close(readAll)
		sc := bufio.NewScanner(stdout)
		sent := false
		for sc.Scan() {
			fmt.Fprintln(&out, sc.Text())
			if !sent && lingerLine.MatchString(sc.Text()) {
				close(lingering)
				sent = true
			}
		}
		if !sent {
			close(lingering)
		}
	}()
	finish := func() error {
		<-readAll
		err := cmd.Wait()
		t.Logf("%s %s: %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, out.String(), stderr.String())
		return err
	}

	<-lingering
	m := doneLine.FindStringSubmatch(out.String())
	if m == nil || !lingerLine.MatchString(lastLine(out.String())) {
		err := finish()
		exampletest.SkipIfNoPostgres(t, databaseURL, stderr.String())
		t.Fatalf("the program ended (%v) before its workload was done and it printed its metrics", err)
	}
	acquisitions, _ := strconv.Atoi(m[1])
	orders, _ := strconv.Atoi(m[2])
	billing, _ := strconv.Atoi(m[3])
	timeouts, _ := strconv.Atoi(m[4])
	u := urlLine.FindStringSubmatch(out.String()) // printed before the workload began
	if u == nil {
		cmd.Cancel()
		finish()
		t.Fatalf("the program did not say where it serves its metrics")
	}

	families := scrapeFamilies(t, u[1])
	// The workload's design: every worker call acquires, and so does the
	// report; the impatient caller times out.
	if acquisitions != workerCalls+1 || orders+billing != acquisitions || timeouts != 1 {
		t.Errorf("the workload counted acquisitions %d (orders %d, billing %d) and timeouts %d; want %d acquisitions and 1 timeout",
			acquisitions, orders, billing, timeouts, workerCalls+1)
	}
	for _, c := range []struct {
		family string
		labels map[string]string
		want   int
	}{
		{"txlock_acquisitions_total", map[string]string{"keyspace": "orders", "mode": "exclusive"}, orders},
		{"txlock_acquisitions_total", map[string]string{"keyspace": "billing", "mode": "exclusive"}, billing},
		{"txlock_wait_seconds", map[string]string{"keyspace": "orders", "mode": "exclusive", "outcome": "acquired"}, orders},
		{"txlock_wait_seconds", map[string]string{"keyspace": "billing", "mode": "exclusive", "outcome": "acquired"}, billing},
		{"txlock_hold_seconds", map[string]string{"keyspace": "orders", "mode": "exclusive", "outcome": "committed"}, orders},
		{"txlock_hold_seconds", map[string]string{"keyspace": "billing", "mode": "exclusive", "outcome": "committed"}, billing},
		{"txlock_timeouts_total", map[string]string{"keyspace": "billing", "mode": "exclusive"}, timeouts},
		{"txlock_wait_seconds", map[string]string{"keyspace": "billing", "mode": "exclusive", "outcome": "timed_out"}, timeouts},
	} {
		got, found := value(families[c.family], c.labels)
		if !found || got != float64(c.want) {
			t.Errorf("%s%v = %v (found %v); the workload counted %d", c.family, c.labels, got, found, c.want)
		}
	}
	// The report held its lock for 300ms: the billing holds add up to at
	// least that.
	if sum := histogramSum(families["txlock_hold_seconds"], map[string]string{"keyspace": "billing", "mode": "exclusive", "outcome": "committed"}); sum < 0.3 {
		t.Errorf("txlock_hold_seconds_sum for billing is %v; the report alone held its lock for 0.3s", sum)
	}
	for name, f := range families {
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetName() == "keyspace" && l.GetValue() != "orders" && l.GetValue() != "billing" {
					t.Errorf("%s has keyspace %q", name, l.GetValue())
				}
				if strings.Contains(l.GetValue(), "item-") || strings.Contains(l.GetValue(), "ledger") {
					t.Errorf("%s has a label holding a key name: %s=%q", name, l.GetName(), l.GetValue())
				}
			}
		}
	}

	// The lines the program printed are lines of the endpoint.
	for _, line := range []string{
		fmt.Sprintf(`  txlock_acquisitions_total{keyspace="orders",mode="exclusive"} %d`, orders),
		fmt.Sprintf(`  txlock_hold_seconds_count{keyspace="billing",mode="exclusive",outcome="committed"} %d`, billing),
		fmt.Sprintf(`  txlock_wait_seconds_count{keyspace="billing",mode="exclusive",outcome="timed_out"} %d`, timeouts),
	} {
		if !strings.Contains(out.String(), line+"\n") {
			t.Errorf("the program did not print %q", line)
		}
	}

	// The dashboard it names is txlockprom's, and the Prometheus it asks
	// for scrapes the program's endpoint.
	if g := grafanaLines.FindStringSubmatch(out.String()); g == nil {
		t.Errorf("the program did not say how to load the Grafana dashboard")
	} else {
		checkDashboard(t, g[1])
		if g[2] != u[1] {
			t.Errorf("the program says Prometheus scrapes %s; it serves its metrics on %s", g[2], u[1])
		}
	}

	// It serves until interrupted, then exits 0 and stops serving.
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err != nil {
		t.Fatalf("the program, interrupted while lingering, failed: %v", err)
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+u[2], time.Second); err == nil {
		c.Close()
		t.Errorf("something still listens on port %s, where the program served its metrics", u[2])
	}
	return out.String()
}

// checkDashboard checks that path, from the repository's root, is the
// dashboard txlockprom.Dashboard returns.
func checkDashboard(t *testing.T, path string) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(path)))
	if err != nil {
		t.Errorf("the program names the dashboard %s: %v", path, err)
		return
	}
	if !bytes.Equal(got, txlockprom.Dashboard()) {
		t.Errorf("the program names the dashboard %s, which is not txlockprom.Dashboard()", path)
	}
}

func lastLine(s string) string {
	s = strings.TrimSuffix(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// scrapeFamilies gets url and parses it as the Prometheus text format.
func scrapeFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scraping %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return families
}

// value returns the counter's value, or the histogram's count, of the
// series of f whose labels are exactly labels.
func value(f *dto.MetricFamily, labels map[string]string) (float64, bool) {
	m := series(f, labels)
	switch {
	case m == nil:
		return 0, false
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount()), true
	}
	return 0, false
}

func histogramSum(f *dto.MetricFamily, labels map[string]string) float64 {
	if m := series(f, labels); m != nil && m.GetHistogram() != nil {
		return m.GetHistogram().GetSampleSum()
	}
	return 0
}

func series(f *dto.MetricFamily, labels map[string]string) *dto.Metric {
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if labels[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		return m
	}
	return nil
}

// TestObservabilityBadFlags checks that bad settings are refused with a
// message naming them, before any server is started.
func TestObservabilityBadFlags(t *testing.T) {
	bin := exampletest.Build(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-workers", "0"}, "-workers 0"},
		{[]string{"-workers", "65"}, "-workers 65"},
		{[]string{"-calls", "0"}, "-calls 0"},
		{[]string{"-hold", "-1ms"}, "-hold -1ms"},
		{[]string{"-hold", "2s"}, "-hold 2s"},
		{[]string{"-linger", "-1s"}, "-linger -1s"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		exampletest.CheckRefused(t, bin, tc.want, tc.args...)
	}
}
