package main

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/txlock/txlock/examples/internal/exampletest"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

var (
	childLine = regexp.MustCompile(`(?m)^pid (\d+) tick (\d+): (ran|skipped: busy|skipped: already ran \(by pid \d+\)|missed: .*)$`)
	checkLine = regexp.MustCompile(`(?m)^tick (\d+): ran once, by pid (\d+)$`)
)

// TestCron builds the program and runs it with three copies for three
// ticks of 1.2s, the job holding the lock for 250ms of each, on a throwaway
// server it starts itself: the tick is the job's hold bound, far enough
// past its hold that a pause of a loaded machine does not end a healthy
// job, and the other copies try while the job holds the lock. It must exit 0
// after its own check; the test then reads the copies' lines: one per copy
// per tick, exactly one "ran" per tick, by the pid the check names, from
// three processes other than the parent, some of them turned away busy,
// and the server gone afterwards.
func TestCron(t *testing.T) {
	bin := exampletest.Build(t)
	const copies, ticks = 3, 3
	out, parent := exampletest.Run(t, bin, "", "-copies", strconv.Itoa(copies), "-ticks", strconv.Itoa(ticks), "-tick", "1200ms", "-hold", "250ms")

	if !strings.Contains(out, fmt.Sprintf("every tick ran exactly once: %d ticks, %d processes\n", ticks, copies)) {
		t.Errorf("the program did not report every tick run exactly once")
	}
	lines := map[int][]string{} // tick -> outcomes
	ranBy := map[int]string{}   // tick -> pid
	pids := map[string]bool{}
	busy := 0
	for _, m := range childLine.FindAllStringSubmatch(out, -1) {
		tick, _ := strconv.Atoi(m[2])
		lines[tick] = append(lines[tick], m[3])
		pids[m[1]] = true
		switch m[3] {
		case "ran":
			if prev, ok := ranBy[tick]; ok {
				t.Errorf("tick %d: both pid %s and pid %s say they ran", tick, prev, m[1])
			}
			ranBy[tick] = m[1]
		case "skipped: busy":
			busy++
		}
	}
	for tick := range ticks {
		if len(lines[tick]) != copies {
			t.Errorf("tick %d: %d lines from the copies (%q), want %d", tick, len(lines[tick]), lines[tick], copies)
		}
		if ranBy[tick] == "" {
			t.Errorf("tick %d: no copy says it ran", tick)
		}
	}
	checked := map[int]string{}
	for _, m := range checkLine.FindAllStringSubmatch(out, -1) {
		tick, _ := strconv.Atoi(m[1])
		checked[tick] = m[2]
	}
	for tick := range ticks {
		if checked[tick] != ranBy[tick] {
			t.Errorf("tick %d: the table says pid %q ran it, the copies say pid %q", tick, checked[tick], ranBy[tick])
		}
	}
	if len(pids) != copies || pids[strconv.Itoa(parent)] {
		t.Errorf("the copies' lines come from pids %v; want %d processes other than the parent %d", pids, copies, parent)
	}
	if busy == 0 {
		t.Errorf("no copy was ever turned away busy")
	}

	exampletest.CheckPostgresGone(t, out)
}

// TestCronBadFlags checks that bad settings are refused with a message
// naming them, before any server is started.
func TestCronBadFlags(t *testing.T) {
	bin := exampletest.Build(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-copies", "0"}, "-copies 0"},
		{[]string{"-ticks", "0"}, "-ticks 0"},
		{[]string{"-tick", "1ms"}, "-tick 1ms"},
		{[]string{"-tick", "1s", "-hold", "2s"}, "-hold 2s"},
		{[]string{"-hold", "-1s"}, "-hold -1s"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		exampletest.CheckRefused(t, bin, tc.want, tc.args...)
	}
	// A copy started by hand, without the parent's DATABASE_URL.
	cmd := exec.Command(bin, "-child")
	cmd.Env = exampletest.Env("")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "DATABASE_URL is not set") {
		t.Errorf("-child without DATABASE_URL: err %v, output %q; want a failure naming DATABASE_URL", err, out)
	}
}
