package pgtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// BouncerOptions configures StartBouncer. Zero value: PoolSize 5.
type BouncerOptions struct {
	// PoolSize is default_pool_size: the number of server connections per
	// database and user pair. Zero or less means 5.
	PoolSize int
}

// Bouncer is a throwaway PgBouncer in transaction pool mode in front of a
// Cluster. Its methods are safe for concurrent use.
type Bouncer struct {
	bin     string
	dir     string
	ini     string
	logPath string // pgbouncer's stdout and stderr
	pidPath string
	port    int
	cred    *syscall.Credential

	mu     sync.Mutex
	proc   *process // nil while stopped
	closed bool
}

// StartBouncer starts a PgBouncer in transaction pool mode on a free port of
// 127.0.0.1, serving database "postgres" of upstream to user "txlock"
// without authentication. It returns once a query through it succeeds.
func StartBouncer(upstream *Cluster, opts BouncerOptions) (*Bouncer, error) {
	if upstream == nil {
		return nil, errors.New("pgtest: StartBouncer needs an upstream cluster")
	}
	if opts.PoolSize <= 0 {
		opts.PoolSize = 5
	}
	bin, err := findPgBouncer()
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	cred, err := runCredential()
	if err != nil {
		return nil, err
	}
	dir, err := makeTempDir("pgtest-bouncer-", cred)
	if err != nil {
		return nil, err
	}
	b := &Bouncer{
		bin:     bin,
		dir:     dir,
		ini:     filepath.Join(dir, "pgbouncer.ini"),
		logPath: filepath.Join(dir, "pgbouncer.out"),
		pidPath: filepath.Join(dir, "pgbouncer.pid"),
		cred:    cred,
	}
	if err := writeFile(filepath.Join(dir, "userlist.txt"), []byte(`"`+superuser+`" ""`+"\n"), cred); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: writing the PgBouncer auth file: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for range startAttempts {
		if b.port, err = FreePort(); err != nil {
			break
		}
		if err = b.writeIni(upstream.Port(), opts.PoolSize); err != nil {
			break
		}
		if err = b.startLocked(); err == nil {
			return b, nil
		}
		if !addrInUse(b.logPath) {
			break
		}
		os.Truncate(b.logPath, 0)
	}
	b.closed = true
	os.RemoveAll(dir)
	return nil, err
}

func (b *Bouncer) writeIni(upstreamPort, poolSize int) error {
	ini := strings.Join([]string{
		"[databases]",
		fmt.Sprintf("postgres = host=127.0.0.1 port=%d dbname=postgres", upstreamPort),
		"",
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		fmt.Sprintf("listen_port = %d", b.port),
		"unix_socket_dir = " + b.dir,
		"auth_type = trust",
		"auth_file = " + filepath.Join(b.dir, "userlist.txt"),
		"admin_users = " + superuser,
		"stats_users = " + superuser,
		"pool_mode = transaction",
		fmt.Sprintf("default_pool_size = %d", poolSize),
		"max_client_conn = 500",
		"ignore_startup_parameters = extra_float_digits",
		"server_reset_query =",
		"logfile = " + filepath.Join(b.dir, "pgbouncer.log"),
		"pidfile = " + b.pidPath,
		"",
	}, "\n")
	if err := writeFile(b.ini, []byte(ini), b.cred); err != nil {
		return fmt.Errorf("pgtest: writing pgbouncer.ini: %w", err)
	}
	return nil
}

// URL returns the connection URL of the pooled database:
// "postgres://txlock@127.0.0.1:PORT/postgres?sslmode=disable".
func (b *Bouncer) URL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", superuser, b.port)
}

// AdminURL returns the URL of the PgBouncer admin console (database
// "pgbouncer"). The console only understands the simple query protocol, so
// the URL selects it for pgx.
func (b *Bouncer) AdminURL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/pgbouncer?sslmode=disable&default_query_exec_mode=simple_protocol", superuser, b.port)
}

// Port returns the TCP port PgBouncer listens on at 127.0.0.1. It stays the
// same across Stop, Kill and Start.
func (b *Bouncer) Port() int { return b.port }

// Stop shuts PgBouncer down cleanly (SIGINT, which lets running transactions
// finish; SIGTERM if that takes longer than 10s) and waits for it to exit.
// Stopping a stopped Bouncer does nothing.
func (b *Bouncer) Stop() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stopLocked()
}

func (b *Bouncer) stopLocked() error {
	if b.proc == nil {
		return nil
	}
	if !b.proc.stop(syscall.SIGINT, closeTimeout, false) && !b.proc.stop(syscall.SIGTERM, closeTimeout, false) {
		return withLog(fmt.Errorf("pgtest: PgBouncer on port %d did not exit after SIGINT and SIGTERM", b.port), b.logPath)
	}
	b.proc = nil
	return nil
}

// Kill kills PgBouncer with SIGKILL and waits for it to exit, dropping every
// client and server connection at once. Killing a stopped Bouncer does
// nothing.
func (b *Bouncer) Kill() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil {
		return nil
	}
	b.proc.kill()
	b.proc = nil
	return nil
}

// Start starts PgBouncer again after Stop or Kill, on the same port, and
// waits until a query through it succeeds.
func (b *Bouncer) Start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errors.New("pgtest: Start on a closed Bouncer")
	}
	if b.proc != nil {
		if !b.proc.exited() {
			return fmt.Errorf("pgtest: PgBouncer on port %d is already running", b.port)
		}
		b.proc = nil
	}
	return b.startLocked()
}

func (b *Bouncer) startLocked() error {
	// A killed PgBouncer leaves its pidfile behind; a new one would refuse to
	// start if the recorded pid happened to be reused.
	os.Remove(b.pidPath)
	p, err := startProcess(procSpec{
		path:     b.bin,
		args:     []string{b.ini},
		dir:      b.dir,
		logPath:  b.logPath,
		cred:     b.cred,
		deathSig: syscall.SIGTERM,
	})
	if err != nil {
		return withLog(fmt.Errorf("pgtest: starting pgbouncer: %w", err), b.logPath)
	}
	check := queryCheck(b.URL()+"&default_query_exec_mode=simple_protocol", "SELECT true")
	if err := waitReady(p, b.port, check); err != nil {
		if !p.exited() {
			p.kill()
		}
		return withLog(fmt.Errorf("pgtest: PgBouncer on port %d: %w", b.port, err), b.logPath)
	}
	b.proc = p
	return nil
}

// Close stops PgBouncer (killing it if it does not exit cleanly) and removes
// its temporary directory. It is idempotent.
func (b *Bouncer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if b.proc != nil {
		if !b.proc.stop(syscall.SIGINT, closeTimeout, false) {
			b.proc.stop(syscall.SIGTERM, closeTimeout, true)
		}
		b.proc = nil
	}
	if err := os.RemoveAll(b.dir); err != nil {
		return fmt.Errorf("pgtest: removing %s: %w", b.dir, err)
	}
	return nil
}
