package main

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/txlock/txlock/examples/internal/exampletest"
)

func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }

var (
	ordersLine = regexp.MustCompile(`(?m)^(.+): (\d+) orders: (\d+) reserved \((\d+) via WithLock, (\d+) via LockTx\), (\d+) sold out$`)
	stockLine  = regexp.MustCompile(`(?m)^  (\d+) left \+ (\d+) reserved = (\d+) in stock: (\w+)$`)
)

// TestSqlcPgx builds the program and runs it on throwaway servers of its
// own, directly and through PgBouncer: more orders than stock, so that
// every phase sells out. Each phase must sell exactly the stock, through
// both ways in, and the program must exit 0.
func TestSqlcPgx(t *testing.T) {
	bin := exampletest.Build(t)
	const workers, orders, stock = 6, 15, 50
	out, _ := exampletest.Run(t, bin, "", "-workers", strconv.Itoa(workers), "-orders", strconv.Itoa(orders), "-stock", strconv.Itoa(stock))
	phases := ordersLine.FindAllStringSubmatch(out, -1)
	stocks := stockLine.FindAllStringSubmatch(out, -1)
	if len(phases) != 2 || len(stocks) != 2 {
		t.Fatalf("%d phase lines and %d stock lines, want 2 of each (direct and PgBouncer):\n%s", len(phases), len(stocks), out)
	}
	for i, m := range phases {
		n := func(j int) int { v, _ := strconv.Atoi(m[j]); return v }
		if n(2) != workers*orders || n(3) != stock || n(4)+n(5) != stock || n(6) != workers*orders-stock || n(4) == 0 || n(5) == 0 {
			t.Errorf("%s: %s", m[1], m[0])
		}
		if s := stocks[i]; s[1] != "0" || s[2] != fmt.Sprint(stock) || s[4] != "exact" {
			t.Errorf("%s: %s", m[1], s[0])
		}
	}
}

// TestSqlcPgxBadFlags checks that bad settings are refused with a message
// naming them, before any server is started.
func TestSqlcPgxBadFlags(t *testing.T) {
	bin := exampletest.Build(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-workers", "0"}, "-workers 0"},
		{[]string{"-orders", "0"}, "-orders 0"},
		{[]string{"-stock", "-1"}, "-stock -1"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		exampletest.CheckRefused(t, bin, tc.want, tc.args...)
	}
}
