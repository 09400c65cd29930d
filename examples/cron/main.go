// Command cron runs a job on a schedule in several OS processes at once, and
// each tick of the schedule only one of them runs it.
//
//	go run ./examples/cron                   # a throwaway PostgreSQL of its own
//	DATABASE_URL='postgres://user@127.0.0.1:5432/db?sslmode=disable' go run ./examples/cron -copies 5 -ticks 10
//
// The program starts -copies copies of itself, as a deployment runs one
// scheduler per instance. Time is cut into slots of -tick, the same for
// every copy; at the start of each slot every copy tries the job once with
// txlock.TryWithLock. One gets the lock and runs the job, which holds it for
// -hold of the slot; the others find it busy and skip that tick instead of
// waiting:
//
//	pid 4242 tick 3: ran
//	pid 4243 tick 3: skipped: busy
//
// The job records its run (tick, pid) in a table. A copy that arrives after
// the job has finished, too late to see it busy, finds the run recorded and
// skips as well ("skipped: already ran"): the lock makes that check and the
// record atomic. When the copies have exited, the program reads the table
// and checks that every tick ran exactly once, and exits non-zero if one did
// not.
//
// The copies are children of this process: it starts the servers (or uses
// DATABASE_URL), passes the children the connection string in their
// DATABASE_URL, and stops everything on Ctrl-C. It starts by dropping and
// recreating its table, cron_runs.
//
// The part to copy is job.go (tryJob); the rest is the demo.
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
	"strconv"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock/examples/internal/exampledb"
)

func main() { exampledb.Main("cron", run) }

// ready is what a child prints once it is connected; the parent then sends
// it the time of the first tick.
const ready = "ready"

type config struct {
	copies int
	ticks  int
	tick   time.Duration
	hold   time.Duration
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("cron", flag.ContinueOnError)
	var cfg config
	child := fs.Bool("child", false, "run as one of the copies (the program starts them itself)")
	fs.IntVar(&cfg.copies, "copies", 3, "how many copies of the program to start")
	fs.IntVar(&cfg.ticks, "ticks", 5, "how many ticks to run")
	fs.DurationVar(&cfg.tick, "tick", time.Second, "the schedule: one tick every this long")
	fs.DurationVar(&cfg.hold, "hold", 0, "how long the job runs, holding the lock (default half a tick)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if cfg.hold == 0 {
		cfg.hold = cfg.tick / 2
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected argument %q (the settings are flags; see -h)", fs.Arg(0))
	case cfg.copies < 1:
		return fmt.Errorf("-copies %d: at least 1", cfg.copies)
	case cfg.ticks < 1:
		return fmt.Errorf("-ticks %d: at least 1", cfg.ticks)
	case cfg.tick < 10*time.Millisecond:
		return fmt.Errorf("-tick %v: at least 10ms", cfg.tick)
	case cfg.hold < 0 || cfg.hold >= cfg.tick:
		return fmt.Errorf("-hold %v: must be positive and shorter than -tick %v, so that the job ends within its tick", cfg.hold, cfg.tick)
	}
	if *child {
		return runChild(ctx, os.Stdin, stdout, cfg)
	}
	return runParent(ctx, stdout, cfg)
}

// runParent starts the servers and the copies, relays their output, and
// checks the record of runs once they have exited.
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
	for _, stmt := range []string{
		`DROP TABLE IF EXISTS cron_runs`,
		`CREATE TABLE cron_runs (tick int NOT NULL, pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("creating the table of runs: %w", err)
		}
	}

	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program to start its copies: %w", err)
	}
	out := &lineWriter{w: stdout}
	copies := make([]*copyProc, 0, cfg.copies)
	defer func() {
		// On an early return, a copy still waiting for the first tick
		// reads end of file, and exits. Their errors are on stderr.
		for _, c := range copies {
			c.stdin.Close()
		}
		for _, c := range copies {
			_ = c.wait()
		}
	}()
	for range cfg.copies {
		c, err := startCopy(ctx, exe, servers.URL, cfg, out)
		if err != nil {
			return err
		}
		copies = append(copies, c)
	}

	// Every copy is connected: agree on the first tick, a moment from now.
	for _, c := range copies {
		select {
		case <-c.ready:
		case <-c.exited:
			return fmt.Errorf("copy pid %d exited before it was ready", c.pid)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	start := time.Now().Add(100 * time.Millisecond)
	out.printf("%d copies ready; %d ticks of %v from %s, the job holding the lock for %v of each\n",
		cfg.copies, cfg.ticks, cfg.tick, start.Format("15:04:05.000"), cfg.hold)
	for _, c := range copies {
		if _, err := fmt.Fprintln(c.stdin, start.UnixNano()); err != nil {
			return fmt.Errorf("starting copy pid %d: %w", c.pid, err)
		}
		c.stdin.Close()
	}
	var failed []error
	for _, c := range copies {
		failed = append(failed, c.wait())
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := errors.Join(failed...); err != nil {
		return err
	}
	return checkRuns(ctx, out, db, cfg)
}

// checkRuns reads the table the job wrote and checks that each tick ran
// exactly once.
func checkRuns(ctx context.Context, out *lineWriter, db *sql.DB, cfg config) error {
	rows, err := db.QueryContext(ctx, `SELECT tick, count(*), string_agg(pid::text, ', ' ORDER BY at) FROM cron_runs GROUP BY tick`)
	if err != nil {
		return err
	}
	defer rows.Close()
	type runs struct {
		n    int
		pids string
	}
	byTick := map[int]runs{}
	for rows.Next() {
		var tick int
		var r runs
		if err := rows.Scan(&tick, &r.n, &r.pids); err != nil {
			return err
		}
		byTick[tick] = r
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var bad []string
	for tick := range cfg.ticks {
		r := byTick[tick]
		delete(byTick, tick)
		switch r.n {
		case 1:
			out.printf("tick %d: ran once, by pid %s\n", tick, r.pids)
		case 0:
			bad = append(bad, fmt.Sprintf("tick %d never ran", tick))
		default:
			bad = append(bad, fmt.Sprintf("tick %d ran %d times (pids %s)", tick, r.n, r.pids))
		}
	}
	for tick, r := range byTick {
		bad = append(bad, fmt.Sprintf("a tick %d that was not scheduled ran %d times", tick, r.n))
	}
	if len(bad) > 0 {
		return fmt.Errorf("not every tick ran exactly once: %s", strings.Join(bad, "; "))
	}
	out.printf("every tick ran exactly once: %d ticks, %d processes\n", cfg.ticks, cfg.copies)
	return nil
}

// copyProc is one running copy of the program.
type copyProc struct {
	cmd      *exec.Cmd
	pid      int
	stdin    io.WriteCloser
	ready    chan struct{} // closed when the copy has printed ready
	exited   chan struct{} // closed when its output has ended
	waitOnce sync.Once
	waitErr  error
}

// startCopy starts a copy of the program in child mode, with the database
// in its DATABASE_URL (not on its command line, where ps shows it), and
// relays its output lines to out.
func startCopy(ctx context.Context, exe, databaseURL string, cfg config, out *lineWriter) (*copyProc, error) {
	cmd := exec.CommandContext(ctx, exe, "-child",
		"-ticks", strconv.Itoa(cfg.ticks), "-tick", cfg.tick.String(), "-hold", cfg.hold.String())
	// On Ctrl-C the terminal interrupts the copies too, and this second
	// interrupt ends them at once (see exampledb.Main); if only this
	// process was told to stop, pass it on, and kill a copy that lingers.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 5 * time.Second
	// The last value of a variable wins: this one replaces any DATABASE_URL
	// this process has.
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	childOut, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting a copy of %s: %w", exe, err)
	}
	c := &copyProc{cmd: cmd, pid: cmd.Process.Pid, stdin: stdin, ready: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		defer close(c.exited)
		sc := bufio.NewScanner(childOut)
		for sc.Scan() {
			if sc.Text() == ready {
				close(c.ready)
				continue
			}
			out.printf("%s\n", sc.Text())
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

// lineWriter writes whole lines from several goroutines to one writer.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format, args...)
}

// runChild is one copy: it connects, waits for the time of the first tick,
// and then tries the job once at the start of every tick.
func runChild(ctx context.Context, stdin io.Reader, stdout io.Writer, cfg config) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("-child: DATABASE_URL is not set (the copies get it from the program that starts them)")
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return err
	}
	fmt.Fprintln(stdout, ready)
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil {
		return fmt.Errorf("-child: reading the time of the first tick: %w", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		return fmt.Errorf("-child: the time of the first tick %q: %w", line, err)
	}
	start := time.Unix(0, ns)

	pid := os.Getpid()
	for tick := range cfg.ticks {
		slot := start.Add(time.Duration(tick) * cfg.tick)
		select {
		case <-time.After(time.Until(slot)):
		case <-ctx.Done():
			return ctx.Err()
		}
		if time.Since(slot) >= cfg.tick {
			fmt.Fprintf(stdout, "pid %d tick %d: missed: this process was late for the whole tick\n", pid, tick)
			continue
		}
		// The job must end within its tick: the next tick's tries would
		// find it busy, and skip.
		locked, ranBy, err := tryJob(ctx, db, tick, pid, cfg.tick, func(ctx context.Context) error {
			// The job's work: here, holding the lock for -hold.
			select {
			case <-time.After(cfg.hold):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if ctx.Err() != nil {
			return ctx.Err()
		}
		outcome := "ran"
		switch {
		case err != nil:
			return fmt.Errorf("pid %d tick %d: %w", pid, tick, err)
		case !locked:
			outcome = "skipped: busy"
		case ranBy != 0:
			outcome = fmt.Sprintf("skipped: already ran (by pid %d)", ranBy)
		}
		fmt.Fprintf(stdout, "pid %d tick %d: %s\n", pid, tick, outcome)
	}
	return nil
}
