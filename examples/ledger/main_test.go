package main

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/txlock/txlock/examples/internal/exampletest"
	"github.com/txlock/txlock/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

// TestLedger builds the program and runs it twice for about two seconds: on
// a throwaway server of its own, where the reports get a database of their
// own, and on DATABASE_URL, where they get a schema. Each run must exit 0
// and print every consistency line, with transfers in both directions.
func TestLedger(t *testing.T) {
	bin := exampletest.Build(t)
	args := []string{"-accounts", "6", "-workers", "4", "-duration", "2s", "-balance", "500"}

	// The two runs use different servers: run them side by side.
	t.Run("own server", func(t *testing.T) {
		t.Parallel()
		out, _ := exampletest.Run(t, bin, "", args...)
		checkOutput(t, out, "database ledger_reports")
	})
	t.Run("DATABASE_URL", func(t *testing.T) {
		t.Parallel()
		out, _ := exampletest.Run(t, bin, pgtest.Postgres(t), args...)
		checkOutput(t, out, "schema ledger_reports of the same database")
	})
}

// TestLedgerBadFlags checks that bad settings are refused with a message
// naming them, before any server is started.
func TestLedgerBadFlags(t *testing.T) {
	bin := exampletest.Build(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-accounts", "1"}, "-accounts 1"},
		{[]string{"-workers", "0"}, "-workers 0"},
		{[]string{"-duration", "0s"}, "-duration 0s"},
		{[]string{"-balance", "0"}, "-balance 0"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		exampletest.CheckRefused(t, bin, tc.want, tc.args...)
	}
}

var transfersLine = regexp.MustCompile(`(?m)^transfers: (\d+) done \((\d+) to a higher account id, (\d+) to a lower\), \d+ refused for lack of funds, \d+ gave up waiting for the lock; no deadlock, no other error$`)

func checkOutput(t *testing.T, out, where string) {
	t.Helper()
	if !strings.Contains(out, "reports in "+where) {
		t.Errorf("the output does not say the reports are in %s", where)
	}
	m := transfersLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no transfers line in the output")
	}
	done, up, down := atoi(t, m[1]), atoi(t, m[2]), atoi(t, m[3])
	if done == 0 || up == 0 || down == 0 || up+down != done {
		t.Errorf("transfers: %d done, %d up, %d down; want some in each direction", done, up, down)
	}
	for _, re := range []string{
		`(?m)^total: 3000 at the start, 3000 at the end: conserved$`,
		`(?m)^no lost update: every balance is its opening balance plus the ` + m[1] + ` transfers the journal records$`,
		`(?m)^stale write refused: token \d+ for account \d+: txlock: stale fencing token: .* holds token \d+, the write carried \d+$`,
		`(?m)^reports: 6 rows, each with its account's balance and the token and id of the account's last transfer: consistent$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("the output has no line matching %s", re)
		}
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
