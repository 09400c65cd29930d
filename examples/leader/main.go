// Command leader elects one leader among several OS processes with
// txlock.Lead, and shows what happens when the leader freezes or dies.
//
//	go run ./examples/leader                 # a throwaway PostgreSQL of its own
//	DATABASE_URL='postgres://user@127.0.0.1:5432/db?sslmode=disable' go run ./examples/leader -copies 5
//
// The program starts -copies copies of itself, as a deployment runs one
// replica per instance. Each campaigns for the same key in a loop of
// txlock.Lead calls; the one elected is the leader for its term, and does
// the leader's work: every -work it writes the shared state, a row of
// leader_state, through a txlock.FencedTable with its term's fencing
// token, outside the term's transaction. A step of work does not look at
// the term's context until it has written, as real work often does not:
// that is what the fence is for.
//
// The program then plays a failure script on the leaders, printing each
// step:
//
//  1. It freezes the first leader (SIGSTOP). The server ends that leader's
//     session once no heartbeat has arrived for the TTL (-ttl), and
//     another copy is elected, with a larger token.
//  2. It thaws the frozen leader (SIGCONT). That one finishes the step of
//     work it was frozen in, and writes: the fence refuses the write, as
//     the row holds the newer leader's token. Its term's context is
//     already cancelled, with txlock.ErrLockLost, and it campaigns again.
//  3. It kills the current leader (SIGKILL). Its connection closes, the
//     server releases the lock at once, and another copy is elected.
//  4. It interrupts every copy (SIGINT): the leader resigns, the others stop
//     campaigning.
//
// Each copy prints when it wins, when a write is refused, and when it loses
// or resigns. At the end the program checks that the row holds the last
// leader's token, the largest drawn, and that the frozen leader's write was
// refused, and exits non-zero otherwise.
//
// The copies are children of this process: it starts the servers (or uses
// DATABASE_URL), passes the children the connection string in their
// DATABASE_URL, and stops everything on Ctrl-C. It starts by dropping and
// recreating its table, leader_state, and creates the fencing sequence if
// it does not exist.
//
// The part to copy is lead.go (lead); the rest is the demo.
package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/examples/internal/exampledb"
)

func main() { exampledb.Main("leader", run) }

type config struct {
	copies int
	ttl    time.Duration
	work   time.Duration
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("leader", flag.ContinueOnError)
	var cfg config
	child := fs.Bool("child", false, "run as one of the copies (the program starts them itself)")
	fs.IntVar(&cfg.copies, "copies", 3, "how many copies of the program to start")
	fs.DurationVar(&cfg.ttl, "ttl", time.Second, "the term's TTL: a leader whose heartbeats stop loses its term after this long (heartbeats every fifth of it)")
	fs.DurationVar(&cfg.work, "work", 300*time.Millisecond, "how long one step of the leader's work takes, between two writes")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q (the settings are flags; see -h)", fs.Arg(0))
	case cfg.copies < 2:
		return fmt.Errorf("-copies %d: at least 2, so that a leader can be succeeded", cfg.copies)
	case cfg.ttl < 50*time.Millisecond:
		return fmt.Errorf("-ttl %v: at least 50ms", cfg.ttl)
	case cfg.work < 10*time.Millisecond:
		return fmt.Errorf("-work %v: at least 10ms", cfg.work)
	}
	if *child {
		return runChild(ctx, stdout, cfg)
	}
	return runParent(ctx, stdout, cfg)
}

// runChild is one copy: it campaigns, leads, and campaigns again, until it
// is interrupted.
func runChild(ctx context.Context, stdout io.Writer, cfg config) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("-child: DATABASE_URL is not set (the copies get it from the program that starts them)")
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	pid := os.Getpid()
	say := func(format string, args ...any) {
		fmt.Fprintf(stdout, "pid %d: "+format+"\n", append([]any{pid}, args...)...)
	}
	for ctx.Err() == nil {
		token, err := lead(ctx, db, pid, cfg.ttl, cfg.work, say)
		switch {
		case errors.Is(err, txlock.ErrLockLost):
			say("lost the term with token %d: %v", token, lostErr(err))
		case ctx.Err() != nil:
			if token != 0 {
				say("resigned the term with token %d", token)
			}
			return nil
		case err != nil:
			// The campaign failed (a connection error, a failover): pause,
			// then campaign again.
			say("campaign failed: %v", err)
			time.Sleep(cfg.ttl)
		}
	}
	return nil
}

// lostErr finds the error that matches txlock.ErrLockLost among err's
// joined errors, to print it alone.
func lostErr(err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if errors.Is(e, txlock.ErrLockLost) {
				return lostErr(e)
			}
		}
	}
	return err
}

// copyProc is one running copy of the program.
type copyProc struct {
	cmd      *exec.Cmd
	pid      int
	exited   chan struct{} // closed when its output has ended
	waitOnce sync.Once
	waitErr  error
}

// A copy's lines that the script follows: it won a term, or it wrote
// as the leader for the first time in its term.
var (
	wonLine     = regexp.MustCompile(`^pid (\d+): won the term with token (\d+)`)
	writingLine = regexp.MustCompile(`^pid (\d+): writing leader_state every .* with token (\d+)$`)
)

type election struct {
	pid   int
	token int64
}

// runParent starts the servers and the copies, plays the failure script,
// and checks the shared state at the end.
func runParent(ctx context.Context, stdout io.Writer, cfg config) (err error) {
	servers, err := exampledb.Start(stdout, false)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, servers.Close()) }()
	db, err := sql.Open("pgx", servers.URL)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := (txlock.Fencer{}).CreateSequence(ctx, db); err != nil {
		return err
	}
	for _, stmt := range []string{
		`DROP TABLE IF EXISTS leader_state`,
		`CREATE TABLE leader_state (id int PRIMARY KEY, leader_pid int, step int, fence_token bigint NOT NULL DEFAULT 0)`,
		`INSERT INTO leader_state (id) VALUES (1)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("creating leader_state: %w", err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program to start its copies: %w", err)
	}

	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(stdout, format+"\n", args...)
	}
	elected := make(chan election, 64)
	writing := make(chan election, 64)
	var refusedMu sync.Mutex
	refused := map[int]int{} // pid -> refused writes
	refusedLine := regexp.MustCompile(`^pid (\d+): write with token \d+ refused`)
	copies := map[int]*copyProc{}
	defer func() {
		for _, c := range copies {
			_ = c.cmd.Process.Signal(syscall.SIGCONT)
			_ = c.cmd.Process.Signal(os.Interrupt)
		}
		for _, c := range copies {
			_ = c.wait()
		}
	}()
	say("%d copies campaign for the leader's key; TTL %v, heartbeats every %v; the leader writes leader_state every %v", cfg.copies, cfg.ttl, cfg.ttl/5, cfg.work)
	for range cfg.copies {
		c, err := startCopy(ctx, exe, servers.URL, cfg, func(line string) {
			say("%s", line)
			if m := wonLine.FindStringSubmatch(line); m != nil {
				pid, _ := strconv.Atoi(m[1])
				tok, _ := strconv.ParseInt(m[2], 10, 64)
				elected <- election{pid, tok}
			}
			if m := writingLine.FindStringSubmatch(line); m != nil {
				pid, _ := strconv.Atoi(m[1])
				tok, _ := strconv.ParseInt(m[2], 10, 64)
				writing <- election{pid, tok}
			}
			if m := refusedLine.FindStringSubmatch(line); m != nil {
				pid, _ := strconv.Atoi(m[1])
				refusedMu.Lock()
				refused[pid]++
				refusedMu.Unlock()
			}
		})
		if err != nil {
			return err
		}
		copies[c.pid] = c
	}
	next := func(ch <-chan election) (election, error) {
		select {
		case e := <-ch:
			return e, nil
		case <-time.After(30 * time.Second):
			return election{}, errors.New("no copy was elected, or wrote, within 30s")
		case <-ctx.Done():
			return election{}, ctx.Err()
		}
	}
	pause := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	signal := func(pid int, sig syscall.Signal, why string) error {
		say("parent: %s pid %d, %s", sigName[sig], pid, why)
		return copies[pid].cmd.Process.Signal(sig)
	}

	first, err := next(elected)
	if err != nil {
		return err
	}
	// Freeze the leader in the middle of a step of its work, half a step
	// after it has written.
	if _, err := next(writing); err != nil {
		return err
	}
	if err := pause(cfg.work / 2); err != nil {
		return err
	}
	if err := signal(first.pid, syscall.SIGSTOP, "the leader"); err != nil {
		return err
	}
	frozen := time.Now()
	second, err := next(elected)
	if err != nil {
		return err
	}
	say("parent: pid %d was elected %v after the leader froze", second.pid, time.Since(frozen).Round(time.Millisecond))
	if err := pause(3 * cfg.work); err != nil {
		return err
	}
	if err := signal(first.pid, syscall.SIGCONT, "the leader that froze"); err != nil {
		return err
	}
	if err := pause(2*cfg.work + cfg.ttl); err != nil {
		return err
	}
	if err := signal(second.pid, syscall.SIGKILL, "the leader"); err != nil {
		return err
	}
	killed := time.Now()
	third, err := next(elected)
	if err != nil {
		return err
	}
	say("parent: pid %d was elected %v after the leader was killed", third.pid, time.Since(killed).Round(time.Millisecond))
	if err := pause(3 * cfg.work); err != nil {
		return err
	}
	say("parent: interrupting every copy")
	for pid, c := range copies {
		if pid != second.pid {
			_ = c.cmd.Process.Signal(os.Interrupt)
		}
	}
	var failed []error
	for pid, c := range copies {
		if err := c.wait(); err != nil && pid != second.pid {
			failed = append(failed, err)
		}
	}
	if err := errors.Join(failed...); err != nil {
		return err
	}

	// The check: the row holds the last leader's token, the largest drawn,
	// and the frozen leader's write was refused.
	var pid, step int
	var token, last int64
	if err := db.QueryRowContext(ctx, `SELECT leader_pid, step, fence_token FROM leader_state WHERE id = 1`).Scan(&pid, &step, &token); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, `SELECT last_value FROM `+txlock.DefaultFenceSchema+`.`+txlock.DefaultFenceSequence).Scan(&last); err != nil {
		return err
	}
	say("leader_state: written last by pid %d (step %d) with token %d; the last token drawn is %d", pid, step, token, last)
	refusedMu.Lock()
	n := refused[first.pid]
	refusedMu.Unlock()
	var bad []string
	if pid != third.pid || token != third.token {
		bad = append(bad, fmt.Sprintf("the last leader was pid %d with token %d", third.pid, third.token))
	}
	if servers.Throwaway && token != last {
		bad = append(bad, fmt.Sprintf("the row's token %d is not the last drawn, %d", token, last))
	}
	if n == 0 {
		bad = append(bad, fmt.Sprintf("the frozen leader, pid %d, had no write refused", first.pid))
	}
	if len(bad) > 0 {
		return fmt.Errorf("the fence did not hold: %v", bad)
	}
	say("the fence held: the frozen leader's late write was refused, and the row keeps the last leader's")
	return nil
}

var sigName = map[syscall.Signal]string{syscall.SIGSTOP: "SIGSTOP", syscall.SIGCONT: "SIGCONT", syscall.SIGKILL: "SIGKILL"}

// startCopy starts a copy of the program in child mode, with the database
// in its DATABASE_URL (not on its command line, where ps shows it), and
// passes its output lines to line.
func startCopy(ctx context.Context, exe, databaseURL string, cfg config, line func(string)) (*copyProc, error) {
	cmd := exec.CommandContext(ctx, exe, "-child", "-ttl", cfg.ttl.String(), "-work", cfg.work.String())
	cmd.Cancel = func() error {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		return cmd.Process.Signal(os.Interrupt)
	}
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting a copy of %s: %w", exe, err)
	}
	c := &copyProc{cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		defer close(c.exited)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line(sc.Text())
		}
	}()
	return c, nil
}

// wait waits for the copy to exit, once, after its output has been read.
func (c *copyProc) wait() error {
	c.waitOnce.Do(func() {
		<-c.exited
		if err := c.cmd.Wait(); err != nil {
			c.waitErr = fmt.Errorf("copy pid %d: %w", c.pid, err)
		}
	})
	return c.waitErr
}
