package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// superuser is the role every throwaway cluster is initialised with.
const superuser = "txlock"

const (
	// closeTimeout is how long Close waits for a fast shutdown before
	// killing the server.
	closeTimeout = 10 * time.Second
	// stopTimeout is how long Stop waits for the server to exit.
	stopTimeout = 60 * time.Second
)

// ClusterOptions configures StartCluster. The zero value is valid.
type ClusterOptions struct {
	// Settings are extra postgresql.conf settings (name -> value, written
	// verbatim, e.g. "max_connections": "200"). They are written after the
	// defaults and so override them, except port, listen_addresses and
	// unix_socket_directories, which the cluster manages itself.
	Settings map[string]string
}

// Cluster is a throwaway PostgreSQL server run from the installed binaries.
// Its methods are safe for concurrent use.
type Cluster struct {
	binDir  string
	dir     string // temporary directory owning everything below
	dataDir string
	logPath string
	port    int
	cred    *syscall.Credential
	standby bool

	mu     sync.Mutex
	proc   *process // nil while stopped
	closed bool
}

// StartCluster creates a new database cluster in a temporary directory and
// starts a PostgreSQL server for it on a free port of 127.0.0.1. It returns
// once the server answers queries. The superuser is "txlock" and every local
// connection, including replication, is trusted.
func StartCluster(opts ClusterOptions) (*Cluster, error) {
	binDir, err := findPostgresBin()
	if err != nil {
		return nil, err
	}
	cred, err := runCredential()
	if err != nil {
		return nil, err
	}
	dir, err := makeTempDir("pgtest-pg-", cred)
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		binDir:  binDir,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "postgres.log"),
		cred:    cred,
	}
	if err := c.initdb(opts); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.firstStart(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) initdb(opts ClusterOptions) error {
	initLog := filepath.Join(c.dir, "initdb.log")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := run(ctx, procSpec{
		path: filepath.Join(c.binDir, "initdb"),
		args: []string{
			"-D", c.dataDir,
			"-U", superuser,
			"--auth=trust",
			"--no-sync",
			"--encoding=UTF8",
			"--locale=C",
		},
		dir:      c.dir,
		logPath:  initLog,
		cred:     c.cred,
		deathSig: syscall.SIGKILL,
	})
	if err != nil {
		return withLog(fmt.Errorf("pgtest: initdb failed: %w", err), initLog)
	}
	hba := strings.Join([]string{
		"# Throwaway test cluster: trust everything local.",
		"local all         all              trust",
		"host  all         all 127.0.0.1/32 trust",
		"local replication all              trust",
		"host  replication all 127.0.0.1/32 trust",
		"",
	}, "\n")
	if err := writeFile(filepath.Join(c.dataDir, "pg_hba.conf"), []byte(hba), c.cred); err != nil {
		return fmt.Errorf("pgtest: writing pg_hba.conf: %w", err)
	}
	var conf strings.Builder
	conf.WriteString("\n# Throwaway test cluster settings.\n")
	for _, kv := range [][2]string{
		{"fsync", "on"},
		{"max_connections", "200"},
		{"wal_level", "replica"},
		{"max_wal_senders", "5"},
		{"hot_standby", "on"},
		{"logging_collector", "off"},
	} {
		fmt.Fprintf(&conf, "%s = %s\n", kv[0], kv[1])
	}
	names := make([]string, 0, len(opts.Settings))
	for name := range opts.Settings {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(&conf, "%s = %s\n", name, opts.Settings[name])
	}
	if err := appendFile(filepath.Join(c.dataDir, "postgresql.conf"), []byte(conf.String())); err != nil {
		return fmt.Errorf("pgtest: writing postgresql.conf: %w", err)
	}
	return nil
}

// firstStart starts the server on a fresh port, retrying on another port if
// the chosen one was taken in the meantime.
func (c *Cluster) firstStart() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	for range startAttempts {
		if c.port, err = FreePort(); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
		if err = c.startLocked(); err == nil || !addrInUse(c.logPath) {
			return err
		}
		os.Truncate(c.logPath, 0)
	}
	return err
}

// URL returns the connection URL of the server:
// "postgres://txlock@127.0.0.1:PORT/postgres?sslmode=disable".
func (c *Cluster) URL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", superuser, c.port)
}

// Port returns the TCP port the server listens on at 127.0.0.1. It stays the
// same across Stop and Start.
func (c *Cluster) Port() int { return c.port }

// LogPath returns the path of the server's log.
func (c *Cluster) LogPath() string { return c.logPath }

// DataDir returns the cluster's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// Stop shuts the server down and waits for it to exit. Mode is "fast"
// (SIGINT: abort transactions, disconnect clients), "immediate" (SIGQUIT: no
// shutdown checkpoint, crash recovery on the next start) or "smart"
// (SIGTERM: wait for clients to disconnect). Stopping a stopped cluster does
// nothing.
func (c *Cluster) Stop(mode string) error {
	var sig syscall.Signal
	switch mode {
	case "fast":
		sig = syscall.SIGINT
	case "immediate":
		sig = syscall.SIGQUIT
	case "smart":
		sig = syscall.SIGTERM
	default:
		return fmt.Errorf("pgtest: unknown shutdown mode %q (want fast, immediate or smart)", mode)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return nil
	}
	if !c.proc.stop(sig, stopTimeout, false) {
		return withLog(fmt.Errorf("pgtest: PostgreSQL on port %d did not exit within %v of a %s shutdown", c.port, stopTimeout, mode), c.logPath)
	}
	c.proc = nil
	return nil
}

// Start starts the server again after Stop, with the same data directory and
// port, and waits until it answers queries (after crash recovery, if any).
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("pgtest: Start on a closed cluster")
	}
	if c.proc != nil {
		if !c.proc.exited() {
			return fmt.Errorf("pgtest: PostgreSQL on port %d is already running", c.port)
		}
		c.proc = nil
	}
	return c.startLocked()
}

func (c *Cluster) startLocked() error {
	p, err := startProcess(procSpec{
		path: filepath.Join(c.binDir, "postgres"),
		args: []string{
			"-D", c.dataDir,
			"-c", "listen_addresses=127.0.0.1",
			"-c", "port=" + strconv.Itoa(c.port),
			"-c", "unix_socket_directories=" + c.dir,
		},
		dir:     c.dir,
		logPath: c.logPath,
		cred:    c.cred,
		// Immediate shutdown if the test binary dies without cleaning up.
		deathSig: syscall.SIGQUIT,
	})
	if err != nil {
		return withLog(fmt.Errorf("pgtest: starting postgres: %w", err), c.logPath)
	}
	query := "SELECT true"
	if c.standby {
		query = "SELECT pg_is_in_recovery()"
	}
	if err := waitReady(p, c.port, queryCheck(c.URL(), query)); err != nil {
		if !p.exited() {
			p.stop(syscall.SIGQUIT, closeTimeout, true)
		}
		return withLog(fmt.Errorf("pgtest: PostgreSQL on port %d: %w", c.port, err), c.logPath)
	}
	c.proc = p
	return nil
}

// Close stops the server (fast shutdown, killed after 10s) and removes its
// temporary directory. It is idempotent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.proc != nil {
		c.proc.stop(syscall.SIGINT, closeTimeout, true)
		c.proc = nil
	}
	if err := os.RemoveAll(c.dir); err != nil {
		return fmt.Errorf("pgtest: removing %s: %w", c.dir, err)
	}
	return nil
}

// StartStandby takes a base backup of c (pg_basebackup -R -X stream) into a
// new temporary directory and starts it as a hot standby streaming from c on
// its own port. It returns once the standby answers queries and is in
// recovery. The standby is independent of c: closing it does not affect c.
func (c *Cluster) StartStandby() (*Cluster, error) {
	c.mu.Lock()
	running := c.proc != nil && !c.proc.exited()
	c.mu.Unlock()
	if !running {
		return nil, fmt.Errorf("pgtest: StartStandby: the primary on port %d is not running", c.port)
	}
	dir, err := makeTempDir("pgtest-standby-", c.cred)
	if err != nil {
		return nil, err
	}
	s := &Cluster{
		binDir:  c.binDir,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "postgres.log"),
		cred:    c.cred,
		standby: true,
	}
	backupLog := filepath.Join(dir, "basebackup.log")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err = run(ctx, procSpec{
		path: filepath.Join(c.binDir, "pg_basebackup"),
		args: []string{
			"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=%s", c.port, superuser),
			"-D", s.dataDir,
			"-R",
			"-X", "stream",
			"-c", "fast",
			"--no-sync",
		},
		dir:      dir,
		logPath:  backupLog,
		cred:     c.cred,
		deathSig: syscall.SIGKILL,
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, withLog(fmt.Errorf("pgtest: pg_basebackup from port %d failed: %w", c.port, err), backupLog)
	}
	if err := s.firstStart(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}
