package main

import (
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
	stopLine    = regexp.MustCompile(`(?m)^parent: SIGSTOP pid (\d+), the leader$`)
	killLine    = regexp.MustCompile(`(?m)^parent: SIGKILL pid (\d+), the leader$`)
	wonRe       = regexp.MustCompile(`(?m)^pid (\d+): won the term with token (\d+), after campaigning for .*$`)
	refusedRe   = regexp.MustCompile(`(?m)^pid (\d+): write with token (\d+) refused: txlock: stale fencing token: "leader_state" holds token (\d+), the write carried \d+$`)
	lostRe      = regexp.MustCompile(`(?m)^pid (\d+): lost the term with token (\d+): txlock: lock lost: .*$`)
	lastWriteRe = regexp.MustCompile(`(?m)^leader_state: written last by pid (\d+) \(step \d+\) with token (\d+); the last token drawn is (\d+)$`)
)

// TestLeader builds the program and runs it with three copies on a
// throwaway server it starts itself, with a TTL of 2s (a loaded machine's
// pause of a second must not end a healthy term early). It must exit 0
// after its own check; the test then reads the lines: three elections with
// growing tokens, each by a copy other than the parent, the frozen leader
// refused by the fence with the second leader's token and then told its
// term was lost, the killed leader succeeded, and the row left with the
// last leader's token.
func TestLeader(t *testing.T) {
	bin := exampletest.Build(t)
	out, parent := exampletest.Run(t, bin, "", "-copies", "3", "-ttl", "2s", "-work", "300ms")
	if !strings.Contains(out, "the fence held: the frozen leader's late write was refused, and the row keeps the last leader's\n") {
		t.Errorf("the program did not report that the fence held")
	}
	stop, kill := stopLine.FindStringSubmatch(out), killLine.FindStringSubmatch(out)
	if stop == nil || kill == nil {
		t.Fatalf("the output does not name the frozen and the killed leader")
	}
	wins := wonRe.FindAllStringSubmatch(out, -1)
	if len(wins) < 3 {
		t.Fatalf("%d elections, want at least 3", len(wins))
	}
	var prev int64
	for _, w := range wins {
		tok, _ := strconv.ParseInt(w[2], 10, 64)
		if tok <= prev {
			t.Errorf("token %d after %d: tokens must grow with the terms", tok, prev)
		}
		prev = tok
		if w[1] == strconv.Itoa(parent) {
			t.Errorf("the parent, pid %d, was elected", parent)
		}
	}
	if wins[0][1] != stop[1] {
		t.Errorf("the first leader was pid %s, the frozen one pid %s", wins[0][1], stop[1])
	}
	if wins[1][1] != kill[1] || wins[1][1] == stop[1] {
		t.Errorf("the second leader was pid %s, the killed one pid %s, the frozen one pid %s", wins[1][1], kill[1], stop[1])
	}
	ref := refusedRe.FindStringSubmatch(out)
	if ref == nil || ref[1] != stop[1] || ref[2] != wins[0][2] || ref[3] != wins[1][2] {
		t.Errorf("refused write %q: want the frozen leader's (pid %s, token %s) refused for the second leader's token %s", ref, stop[1], wins[0][2], wins[1][2])
	}
	lost := lostRe.FindStringSubmatch(out)
	if lost == nil || lost[1] != stop[1] || lost[2] != wins[0][2] {
		t.Errorf("lost term %q: want the frozen leader's, pid %s with token %s", lost, stop[1], wins[0][2])
	}
	last := lastWriteRe.FindStringSubmatch(out)
	if last == nil || last[1] != wins[2][1] || last[2] != wins[2][2] || last[3] != wins[2][2] {
		t.Errorf("the last write %q: want the third leader's, pid %s with token %s, the last drawn", last, wins[2][1], wins[2][2])
	}
	exampletest.CheckPostgresGone(t, out)
}

// TestLeaderBadFlags checks that bad settings are refused with a message
// naming them, before any server is started.
func TestLeaderBadFlags(t *testing.T) {
	bin := exampletest.Build(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-copies", "1"}, "-copies 1"},
		{[]string{"-ttl", "1ms"}, "-ttl 1ms"},
		{[]string{"-work", "1ms"}, "-work 1ms"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		exampletest.CheckRefused(t, bin, tc.want, tc.args...)
	}
	cmd := exec.Command(bin, "-child")
	cmd.Env = exampletest.Env("")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "DATABASE_URL is not set") {
		t.Errorf("-child without DATABASE_URL: err %v, output %q; want a failure naming DATABASE_URL", err, out)
	}
}
