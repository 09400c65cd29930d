package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txlock/txlock/examples/internal/exampletest"
	"github.com/txlock/txlock/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

var (
	mostLine   = regexp.MustCompile(`(?m)^most running at once, by the server's clock: (\d+) \(the bound is (\d+)\)$`)
	slotLine   = regexp.MustCompile(`(?m)^  slot (\d+): (\d+)$`)
	holderLine = regexp.MustCompile(`(?m)^  slot (\d+): pid \d+, "export replica-(\d+) job-(\d+)"$`)
)

// runRow is one row of exportpool_runs.
type runRow struct {
	job, replica, slot int
	start, end         time.Time
}

// TestExportPool builds the program and runs it on the test suite's
// PostgreSQL: 3 replicas of 4 workers, 24 jobs of 150ms, 3 slots. It must
// exit 0 and report every job done, 3 at most and 3 at best running at
// once, and a snapshot of the 3 slots held by labelled exports. The test
// then reads exportpool_runs itself and checks the same from the rows,
// measured in Go: no more than 3 jobs at once, no slot held by two jobs at
// once, the per-slot counts printed, and each label of the snapshot naming
// a job that ran on that replica in that slot.
func TestExportPool(t *testing.T) {
	bin := exampletest.Build(t)
	url := pgtest.Postgres(t)
	const replicas, workers, jobs, slots = 3, 4, 24, 3
	out, _ := exampletest.Run(t, bin, url, "-replicas", strconv.Itoa(replicas), "-workers", strconv.Itoa(workers),
		"-jobs", strconv.Itoa(jobs), "-slots", strconv.Itoa(slots), "-work", "150ms")

	for _, want := range []string{
		fmt.Sprintf("\n%d of %d slots of \"orders-export\" held, by pg_locks joined to pg_stat_activity:\n", slots, slots),
		fmt.Sprintf("\nexports done: %d of %d in ", jobs, jobs),
		fmt.Sprintf("\nmost running at once, by the server's clock: %d (the bound is %d)\n", slots, slots),
		fmt.Sprintf("\nthe bound held: never more than %d exports at once, across %d replicas\n", slots, replicas),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if n := strings.Count(out, "\n"); n > 25 {
		t.Errorf("the output has %d lines, want at most 25", n)
	}

	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT job, replica, slot, started_at, ended_at FROM exportpool_runs ORDER BY job`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	byJob := map[int]runRow{}
	perSlot := map[int]int{}
	for rows.Next() {
		var r runRow
		if err := rows.Scan(&r.job, &r.replica, &r.slot, &r.start, &r.end); err != nil {
			t.Fatal(err)
		}
		if r.slot < 0 || r.slot >= slots || !r.end.After(r.start) {
			t.Errorf("job %d: slot %d, from %v to %v", r.job, r.slot, r.start, r.end)
		}
		byJob[r.job] = r
		perSlot[r.slot]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(byJob) != jobs {
		t.Fatalf("exportpool_runs holds %d jobs, want %d", len(byJob), jobs)
	}

	// The most running at once, and no slot held twice at once, from the
	// rows: at each job's start, the jobs that had started and not ended.
	most := 0
	for _, r := range byJob {
		running := 0
		for _, o := range byJob {
			if !o.start.After(r.start) && o.end.After(r.start) {
				running++
				if o.job != r.job && o.slot == r.slot {
					t.Errorf("jobs %d and %d held slot %d at once", o.job, r.job, r.slot)
				}
			}
		}
		most = max(most, running)
	}
	if most != slots {
		t.Errorf("by the rows, %d jobs ran at once; want %d, the bound, reached", most, slots)
	}
	if m := mostLine.FindStringSubmatch(out); m == nil || m[1] != strconv.Itoa(most) {
		t.Errorf("the program's measure %q differs from the rows' %d", m, most)
	}

	printed := slotLine.FindAllStringSubmatch(out, -1)
	if len(printed) != slots {
		t.Errorf("%d per-slot lines, want %d", len(printed), slots)
	}
	for _, m := range printed {
		slot, _ := strconv.Atoi(m[1])
		if n, _ := strconv.Atoi(m[2]); n != perSlot[slot] || n == 0 {
			t.Errorf("slot %d: the program counts %d exports, the rows %d", slot, n, perSlot[slot])
		}
	}

	holders := holderLine.FindAllStringSubmatch(out, -1)
	if len(holders) != slots {
		t.Fatalf("the snapshot shows %d slots held by labelled exports, want all %d", len(holders), slots)
	}
	for _, m := range holders {
		slot, _ := strconv.Atoi(m[1])
		replica, _ := strconv.Atoi(m[2])
		job, _ := strconv.Atoi(m[3])
		if r := byJob[job]; r.replica != replica || r.slot != slot {
			t.Errorf("the snapshot shows replica-%d job-%d in slot %d; the rows say replica-%d, slot %d", replica, job, slot, r.replica, r.slot)
		}
	}
}

var brokenLine = regexp.MustCompile(`exportpool: the bound was broken: (\d+) exports ran at once, more than the 3 allowed`)

// TestExportPoolPerReplica runs the program on a throwaway server of its
// own with -per-replica, a semaphore per replica: the fleet then runs more
// than 3 exports at once, and the program must see it by the server's
// clock and exit 1, having stopped its server.
func TestExportPoolPerReplica(t *testing.T) {
	bin := exampletest.Build(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-per-replica", "-replicas", "3", "-workers", "4", "-jobs", "24", "-slots", "3", "-work", "150ms")
	cmd.Env = exampletest.Env("")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("%v\n%s%s", err, stdout.String(), stderr.String())
	exampletest.SkipIfNoPostgres(t, "", stderr.String())
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v; want status 1", err)
	}
	m := brokenLine.FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("stderr does not say the bound was broken")
	}
	if n, _ := strconv.Atoi(m[1]); n <= 3 {
		t.Errorf("%d at once, yet called broken", n)
	}
	if mm := mostLine.FindStringSubmatch(stdout.String()); mm == nil || mm[1] != m[1] {
		t.Errorf("the report's most at once %q differs from the error's %s", mm, m[1])
	}
	exampletest.CheckPostgresGone(t, stdout.String())
}

// TestExportPoolBadFlags checks that bad settings are refused with a
// message naming them, before any server is started.
func TestExportPoolBadFlags(t *testing.T) {
	bin := exampletest.Build(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-replicas", "0"}, "-replicas 0"},
		{[]string{"-workers", "0"}, "-workers 0"},
		{[]string{"-jobs", "0"}, "-jobs 0"},
		{[]string{"-slots", "0"}, "-slots 0"},
		{[]string{"-slots", "1001"}, "-slots 1001"},
		{[]string{"-work", "1ms"}, "-work 1ms"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		exampletest.CheckRefused(t, bin, tc.want, tc.args...)
	}
}
