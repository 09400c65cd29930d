package main

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/txlock/txlock/examples/internal/exampletest"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

var accountLine = regexp.MustCompile(`(?m)^account (acct-\d+): balance (\d+) = (\d+) deposited, in (\d+) journal entries: exact$`)

// TestRepository builds the program and runs it on a throwaway server of
// its own: three services, three workers each, deposit into two accounts
// at once. It must exit 0, every service must have journaled all its
// deposits, and the accounts' balances must add up to the total deposited.
func TestRepository(t *testing.T) {
	bin := exampletest.Build(t)
	const workers, deposits = 3, 20
	out, _ := exampletest.Run(t, bin, "", "-accounts", "2", "-workers", strconv.Itoa(workers), "-deposits", strconv.Itoa(deposits))

	for _, name := range []string{
		"Wallets.Deposit: Queries in txlock.WithLock's tx",
		"Wallets.DepositTx: Queries after txlock.LockTx in the caller's tx",
		"SqlxWallets.Deposit: sqlx in sqlxlock.WithLock's tx",
	} {
		if want := fmt.Sprintf("  %s: %d deposits\n", name, workers*deposits); !strings.Contains(out, want) {
			t.Errorf("the output has no line %q", want)
		}
	}
	accounts := accountLine.FindAllStringSubmatch(out, -1)
	if len(accounts) != 2 {
		t.Fatalf("%d account lines, want 2", len(accounts))
	}
	var sum, entries int
	for _, m := range accounts {
		balance, _ := strconv.Atoi(m[2])
		n, _ := strconv.Atoi(m[4])
		if m[2] != m[3] || n == 0 {
			t.Errorf("account %s: balance %s, %s deposited, %d entries", m[1], m[2], m[3], n)
		}
		sum += balance
		entries += n
	}
	if entries != 3*workers*deposits {
		t.Errorf("%d journal entries in all, want %d", entries, 3*workers*deposits)
	}
	if want := fmt.Sprintf("every balance is exact: %d deposits, %d in all, none lost\n", 3*workers*deposits, sum); !strings.Contains(out, want) {
		t.Errorf("the output has no line %q", want)
	}
}

// TestRepositoryBadFlags checks that bad settings are refused with a
// message naming them, before any server is started.
func TestRepositoryBadFlags(t *testing.T) {
	bin := exampletest.Build(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-accounts", "0"}, "-accounts 0"},
		{[]string{"-workers", "0"}, "-workers 0"},
		{[]string{"-deposits", "0"}, "-deposits 0"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		exampletest.CheckRefused(t, bin, tc.want, tc.args...)
	}
}
