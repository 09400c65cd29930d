// Command txlock answers an operator's questions about txlock's advisory
// locks: what a key is in pg_locks (key), who holds and who waits for the
// advisory locks of a database, in names (locks), and whether a database is
// fit for txlock (doctor).
//
// Usage:
//
//	txlock key [--keyspace SERVICE] [--slots N] NAME...
//	txlock locks [--db URL] [--keyspace SERVICE]... [--name NAME]... [--semaphore NAME=N]... [--watch] [--json]
//	txlock doctor [--db URL]
//
// --db defaults to $DATABASE_URL. Run txlock COMMAND --help for each
// command's flags. Semaphores (txlock.WithSemaphore) show by slot: key
// --slots N shows the keys of a semaphore's N slots, and locks --semaphore
// NAME=N names a lock of slot i as "semaphore NAME, slot i of N".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // the command ran and found a problem, or could not reach the database
	exitUsage = 2 // bad command line
)

const usage = `txlock answers questions about txlock's PostgreSQL advisory locks.

Usage:

	txlock <command> [flags] [arguments]

Commands:

	key      show a key: its numbers, how pg_locks shows it, the SQL that takes it
	locks    show who holds and who waits for the database's advisory locks, in names
	doctor   check that a database is fit for txlock, with a fix for each problem

Run "txlock <command> --help" for a command's flags. --db defaults to
$DATABASE_URL.
`

// env is what a command reads from the environment, and where it writes.
type env struct {
	getenv         func(string) string
	stdout, stderr io.Writer
	terminal       bool // stdout is a terminal: locks --watch redraws in place
	colour         bool // stdout is a terminal and NO_COLOR is unset
}

// run runs the command line args (without the program name) and returns the
// exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	e := newEnv(getenv, stdout, stderr)
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "-h", "-help", "--help", "help":
		if cmd == "help" && len(rest) > 0 {
			return run(ctx, []string{rest[0], "--help"}, getenv, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	case "key":
		return keyCmd(ctx, e, rest)
	case "locks":
		return locksCmd(ctx, e, rest)
	case "doctor":
		return doctorCmd(ctx, e, rest)
	}
	fmt.Fprintf(stderr, "txlock: unknown command %q\n\n%s", cmd, usage)
	return exitUsage
}

func newEnv(getenv func(string) string, stdout, stderr io.Writer) *env {
	terminal := isTerminal(stdout)
	return &env{getenv: getenv, stdout: stdout, stderr: stderr, terminal: terminal, colour: terminal && getenv("NO_COLOR") == ""}
}

// isTerminal reports whether w is a character device, such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// newFlags returns a flag set for a command that writes its usage, a
// synopsis and the flags, to e.stderr (or e.stdout for --help, see parse).
func newFlags(name, synopsis, about string) *flag.FlagSet {
	fs := flag.NewFlagSet("txlock "+name, flag.ContinueOnError)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: txlock %s %s\n\n%s\n", name, synopsis, strings.TrimSpace(about))
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintf(out, "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parse parses args with fs, allowing flags after positional arguments
// (txlock key NAME --keyspace SVC). It returns the positional arguments,
// and an exit code when the command must stop: 0 after --help (the usage
// went to stdout), 2 after a bad flag (the error and the usage went to
// stderr).
func parse(e *env, fs *flag.FlagSet, args []string) (pos []string, code int, stop bool) {
	fs.SetOutput(io.Discard)
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(e.stdout)
			fs.Usage()
			return nil, exitOK, true
		}
		if err != nil {
			fmt.Fprintf(e.stderr, "%s: %v\n", fs.Name(), err)
			fs.SetOutput(e.stderr)
			fs.Usage()
			return nil, exitUsage, true
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), exitOK, false // everything after -- is an argument
		}
		if len(rest) == 0 {
			return pos, exitOK, false
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// usageError reports a bad command line: the message, then the usage, on
// stderr.
func usageError(e *env, fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(e.stderr, "%s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	fs.SetOutput(e.stderr)
	fs.Usage()
	return exitUsage
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}
