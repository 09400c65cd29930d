package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// readyTimeout bounds how long a freshly started server may take to
	// accept a real query.
	readyTimeout = 30 * time.Second
	// logTailBytes is how much of a log file is quoted in errors.
	logTailBytes = 4096
	// startAttempts is how often a first start is retried on a new port
	// when the chosen port turned out to be taken.
	startAttempts = 3
)

// unprivileged is the account servers run as when this process is root.
const unprivileged = "nobody"

var (
	credOnce sync.Once
	credVal  *syscall.Credential
	credErr  error
)

// runCredential returns the credential child servers must run with: nil when
// this process is not root (children inherit the current user), otherwise the
// unprivileged account, because PostgreSQL and PgBouncer refuse to run as root.
func runCredential() (*syscall.Credential, error) {
	credOnce.Do(func() {
		if os.Geteuid() != 0 {
			return
		}
		u, err := user.Lookup(unprivileged)
		if err != nil {
			credErr = fmt.Errorf("running as root, and PostgreSQL refuses to run as root, but looking up the unprivileged user %q failed: %w", unprivileged, err)
			return
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			credErr = fmt.Errorf("user %q has a non-numeric uid %q or gid %q", unprivileged, u.Uid, u.Gid)
			return
		}
		credVal = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	})
	return credVal, credErr
}

// chown hands path to the account servers run as, when that differs from the
// current one.
func chown(path string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
		return fmt.Errorf("chown %s: %w", path, err)
	}
	return nil
}

// tempBase picks the directory throwaway directories are created in. It must
// be reachable by the unprivileged account and short enough for Unix socket
// paths (about 107 bytes including the socket file name).
func tempBase(cred *syscall.Credential) string {
	base := os.TempDir()
	if len(base) > 64 {
		return "/tmp"
	}
	if cred != nil && !searchableByOthers(base) {
		return "/tmp"
	}
	return base
}

// searchableByOthers reports whether every directory on the way to dir can be
// traversed by an arbitrary user.
func searchableByOthers(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

// makeTempDir creates a fresh directory owned by the account servers run as.
func makeTempDir(prefix string, cred *syscall.Credential) (string, error) {
	dir, err := os.MkdirTemp(tempBase(cred), prefix)
	if err != nil {
		return "", fmt.Errorf("creating a temporary directory: %w", err)
	}
	if err := chown(dir, cred); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// writeFile writes a file readable by the account servers run as.
func writeFile(path string, data []byte, cred *syscall.Credential) error {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return err
	}
	return chown(path, cred)
}

// appendFile appends data to an existing file.
func appendFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on right
// now. Ports below the kernel's ephemeral range are preferred, so that the
// port is not handed out to an outgoing connection while a server is briefly
// stopped and is about to be restarted on it.
func FreePort() (int, error) {
	lo, hi := 15000, 32767
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if start, err := strconv.Atoi(f[0]); err == nil && start-1 < hi {
				hi = start - 1
			}
		}
	}
	if hi-lo >= 1000 {
		for range 50 {
			p := lo + rand.IntN(hi-lo+1)
			if portFree(p) {
				return p, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port on 127.0.0.1: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// childEnv is the environment for server processes: the current one without
// libpq variables that could redirect the tools, with a C locale and a home
// directory the unprivileged account can use.
func childEnv(home string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "PG"), k == "HOME", k == "LANG", strings.HasPrefix(k, "LC_"):
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+home, "LANG=C", "LC_ALL=C")
}

// process is a server child process together with the goroutine reaping it.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited
	err  error         // exit status, valid after done is closed
}

// procSpec describes how to start a child.
type procSpec struct {
	path    string
	args    []string
	dir     string              // working directory
	logPath string              // stdout and stderr are appended here
	cred    *syscall.Credential // nil: run as the current user
	// deathSig is delivered to the child if this process dies without
	// cleaning up, so that servers do not outlive a crashed test binary.
	deathSig syscall.Signal
}

func (s procSpec) command() (*exec.Cmd, *os.File, error) {
	logf, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("opening log file: %w", err)
	}
	cmd := exec.Command(s.path, s.args...)
	cmd.Dir = s.dir
	cmd.Env = childEnv(s.dir)
	cmd.Stdin = nil
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: s.cred,
		// A process group of its own: a terminal's Ctrl-C does not reach the
		// server directly, and a stuck server is killed with all its children.
		Setpgid:   true,
		Pdeathsig: s.deathSig,
	}
	return cmd, logf, nil
}

// run runs a one-shot tool to completion.
func run(ctx context.Context, s procSpec) error {
	cmd, logf, err := s.command()
	if err != nil {
		return err
	}
	defer logf.Close()
	if err := cmd.Start(); err != nil {
		return err
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		return err
	case <-ctx.Done():
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-waited
		return ctx.Err()
	}
}

// startProcess starts a long-running server.
func startProcess(s procSpec) (*process, error) {
	cmd, logf, err := s.command()
	if err != nil {
		return nil, err
	}
	err = cmd.Start()
	logf.Close() // the child holds its own descriptor
	if err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the server process itself.
func (p *process) signal(sig syscall.Signal) error {
	if p.exited() {
		return nil
	}
	err := p.cmd.Process.Signal(sig)
	if err != nil && errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// wait waits up to timeout for the process to exit.
func (p *process) wait(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// kill kills the process and everything in its process group, then waits for
// the process to exit.
func (p *process) kill() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	// Orphaned children (for example backends of a killed postmaster) are
	// still in the group.
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
}

// stop sends sig and waits up to timeout; if the process is still alive it
// is killed when force is set.
func (p *process) stop(sig syscall.Signal, timeout time.Duration, force bool) bool {
	p.signal(sig)
	if p.wait(timeout) {
		return true
	}
	if force {
		p.kill()
		return true
	}
	return false
}

// logTail returns the last part of a log file, for error messages.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	off := fi.Size() - logTailBytes
	if off < 0 {
		off = 0
	}
	b, err := io.ReadAll(io.NewSectionReader(f, off, fi.Size()-off))
	if err != nil {
		return fmt.Sprintf("(reading log: %v)", err)
	}
	if off > 0 {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "(" + filepath.Base(path) + " is empty)"
	}
	return filepath.Base(path) + " ends with:\n" + s
}

// withLog wraps err with a tail of the log at path.
func withLog(err error, path string) error {
	return fmt.Errorf("%w\n%s", err, logTail(path))
}

// addrInUse reports whether the log at path says the listen port was taken.
func addrInUse(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte("Address already in use"))
}

// waitReady polls until check succeeds against a server on port, the process
// exits, or the timeout passes.
func waitReady(p *process, port int, check func(ctx context.Context) error) error {
	deadline := time.Now().Add(readyTimeout)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var last error
	for delay := 10 * time.Millisecond; ; delay = min(delay*2, 200*time.Millisecond) {
		if p.exited() {
			if p.err != nil {
				return fmt.Errorf("the process exited before accepting connections: %v", p.err)
			}
			return errors.New("the process exited before accepting connections")
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err != nil {
			last = err
		} else {
			c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			last = check(ctx)
			cancel()
			if last == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %v", readyTimeout, last)
		}
		time.Sleep(delay)
	}
}

// queryCheck returns a readiness check that connects to url and runs query,
// which must return a single boolean true.
func queryCheck(url, query string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		var ok bool
		if err := conn.QueryRow(ctx, query, pgx.QueryExecModeSimpleProtocol).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%q returned false", query)
		}
		return nil
	}
}

// findPostgresBin locates the directory holding the PostgreSQL server
// binaries.
func findPostgresBin() (string, error) {
	has := func(dir string) bool {
		fi, err := os.Stat(filepath.Join(dir, "postgres"))
		if err != nil || fi.IsDir() {
			return false
		}
		_, err = os.Stat(filepath.Join(dir, "initdb"))
		return err == nil
	}
	if dir := os.Getenv(envPGBinDir); dir != "" {
		if has(dir) {
			return dir, nil
		}
		return "", fmt.Errorf("%s=%s does not contain postgres and initdb", envPGBinDir, dir)
	}
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.Command(pgConfig, "--bindir").Output(); err == nil {
			if dir := strings.TrimSpace(string(out)); has(dir) {
				return dir, nil
			}
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	// Debian and Ubuntu keep the server binaries off PATH.
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, dir := range append(dirs, "/usr/local/pgsql/bin") {
		if has(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("PostgreSQL server binaries (initdb, postgres) not found via pg_config, PATH or /usr/lib/postgresql/*/bin; install them (on Debian: apt-get install postgresql-15; scripts/deps.sh test installs everything the tests need) or set %s", envPGBinDir)
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// findPgBouncer locates the pgbouncer binary.
func findPgBouncer() (string, error) {
	if p := os.Getenv(envPgBouncerBin); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s: %w", envPgBouncerBin, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer", "/usr/bin/pgbouncer"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("pgbouncer not found on PATH or in /usr/sbin; install it (on Debian: apt-get install pgbouncer; scripts/deps.sh test installs everything the tests need) or set %s", envPgBouncerBin)
}
