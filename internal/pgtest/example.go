package pgtest

import (
	"fmt"
	"testing"
)

// ExampleURL returns the shared test PostgreSQL's URL for a runnable
// example, which has no testing.TB of its own: a failure to start the
// server panics, which fails the example.
func ExampleURL() string { return Postgres(exampleTB{}) }

// exampleTB is a testing.TB whose every failure panics.
type exampleTB struct{ testing.TB }

func (exampleTB) Helper()                           {}
func (exampleTB) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (exampleTB) Skipf(format string, args ...any)  { panic(fmt.Sprintf(format, args...)) }
