package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A Patroni cluster: one etcd and Patroni nodes, each running a PostgreSQL
// of its own, all on 127.0.0.1, run as the unprivileged account when this
// process is root. Clients reach the primary through URL, a multi-host URL
// with target_session_attrs=read-write.
//
// Patroni starts its postmaster in a session of its own, so that the
// postmaster outlives a Patroni that dies: Kill ends both, Close ends both,
// and a test binary that dies without Close leaves the postmasters running.

// PatroniOptions configures StartPatroni.
type PatroniOptions struct {
	// Nodes is the number of PostgreSQL nodes (default 3).
	Nodes int
	// Async turns Patroni's synchronous_mode off: standbys stream
	// asynchronously. By default one standby is synchronous, and Patroni
	// promotes only it.
	Async bool
	// HAProxy starts an HAProxy in front of the nodes, as production
	// setups have it: it sends connections to the node whose Patroni
	// answers 200 on /primary, and ends the sessions of a node it marks
	// down (ProxyURL).
	HAProxy bool
}

// patroniTTL is the leader key's TTL: a primary whose Patroni stops
// renewing it is replaced once it expires. Patroni needs loop_wait +
// 2*retry_timeout <= ttl.
const (
	patroniTTL       = 10 * time.Second
	patroniLoopWait  = 1 * time.Second
	patroniRetry     = 4 * time.Second
	patroniReadyWait = 2 * time.Minute
)

// Patroni is a running Patroni cluster. Its methods are not safe for
// concurrent use.
type Patroni struct {
	dir       string
	cred      *syscall.Credential
	etcd      *process
	etcdPort  int
	nodes     []*patroniNode
	async     bool
	proxy     *process // HAProxy, if started
	proxyPort int
}

type patroniNode struct {
	name     string
	dir      string
	config   string
	pgPort   int
	restPort int
	proc     *process // nil while stopped
}

// StartPatroni starts etcd and the nodes, and returns once one node is the
// primary, every other streams from it, and (unless opts.Async) one is its
// synchronous standby.
func StartPatroni(opts PatroniOptions) (_ *Patroni, err error) {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	patroni, err := exec.LookPath("patroni")
	if err != nil {
		return nil, errors.New("pgtest: patroni not found on PATH (on Debian: apt-get install patroni etcd-server; scripts/deps.sh test installs it)")
	}
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		return nil, errors.New("pgtest: etcd not found on PATH (on Debian: apt-get install etcd-server; scripts/deps.sh test installs it)")
	}
	binDir, err := findPostgresBin()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(binDir, "pg_basebackup")); err != nil {
		return nil, fmt.Errorf("pgtest: Patroni's replicas need pg_basebackup, which %s lacks", binDir)
	}
	cred, err := runCredential()
	if err != nil {
		return nil, err
	}
	dir, err := makeTempDir("pgtest-patroni-", cred)
	if err != nil {
		return nil, err
	}
	p := &Patroni{dir: dir, cred: cred, async: opts.Async}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	ports := make([]int, 0, 2+2*opts.Nodes)
	for len(ports) < cap(ports) {
		port, err := FreePort()
		if err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
		if !slices.Contains(ports, port) {
			ports = append(ports, port)
		}
	}
	p.etcdPort = ports[0]
	if p.etcd, err = startProcess(procSpec{
		path: etcd,
		args: []string{"--name", "etcd", "--data-dir", filepath.Join(dir, "etcd"),
			"--listen-client-urls", fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
			"--advertise-client-urls", fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
			"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
			"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
			"--initial-cluster", fmt.Sprintf("etcd=http://127.0.0.1:%d", ports[1]),
			"--initial-cluster-state", "new"},
		dir: dir, logPath: filepath.Join(dir, "etcd.log"), cred: cred, deathSig: syscall.SIGKILL,
	}); err != nil {
		return nil, fmt.Errorf("pgtest: starting etcd: %w", err)
	}
	for i := range opts.Nodes {
		n := &patroniNode{name: fmt.Sprintf("node%d", i+1), pgPort: ports[2+2*i], restPort: ports[3+2*i]}
		n.dir = filepath.Join(dir, n.name)
		n.config = filepath.Join(dir, n.name+".yml")
		if err := os.Mkdir(n.dir, 0o700); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
		if err := chown(n.dir, cred); err != nil {
			return nil, err
		}
		if err := writeFile(n.config, []byte(p.config(n, binDir)), cred); err != nil {
			return nil, err
		}
		p.nodes = append(p.nodes, n)
	}
	for i, n := range p.nodes {
		if err := p.startNode(n, patroni); err != nil {
			return nil, err
		}
		if i == 0 { // the first node bootstraps the cluster alone
			if _, err := p.WaitPrimary(context.Background(), -1, patroniReadyWait); err != nil {
				return nil, err
			}
		}
	}
	if err := p.waitReplicas(patroniReadyWait); err != nil {
		return nil, err
	}
	if opts.HAProxy {
		if err := p.startProxy(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// config is a node's Patroni configuration.
func (p *Patroni) config(n *patroniNode, binDir string) string {
	return fmt.Sprintf(`scope: pgtest
name: %[1]s
restapi:
  listen: 127.0.0.1:%[2]d
  connect_address: 127.0.0.1:%[2]d
etcd3:
  hosts: 127.0.0.1:%[3]d
bootstrap:
  dcs:
    ttl: %[4]d
    loop_wait: %[5]d
    retry_timeout: %[6]d
    maximum_lag_on_failover: 1048576
    synchronous_mode: %[7]t
    postgresql:
      use_pg_rewind: true
      use_slots: true
      remove_data_directory_on_rewind_failure: true
      remove_data_directory_on_diverged_timelines: true
      parameters:
        max_connections: 200
        fsync: off # the faults are of processes, not of the machine
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host replication all 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:%[8]d
  connect_address: 127.0.0.1:%[8]d
  data_dir: %[9]s
  bin_dir: %[10]s
  pgpass: %[11]s
  authentication:
    superuser: {username: %[12]s, password: pgtest}
    replication: {username: replicator, password: pgtest}
    rewind: {username: rewinder, password: pgtest}
  parameters:
    unix_socket_directories: %[13]s
`, n.name, n.restPort, p.etcdPort, int(patroniTTL/time.Second), int(patroniLoopWait/time.Second), int(patroniRetry/time.Second), !p.async,
		n.pgPort, filepath.Join(n.dir, "data"), binDir, filepath.Join(n.dir, "pgpass"), superuser, n.dir)
}

func (p *Patroni) startNode(n *patroniNode, patroni string) error {
	proc, err := startProcess(procSpec{
		path: patroni, args: []string{n.config},
		dir: n.dir, logPath: filepath.Join(p.dir, n.name+".log"), cred: p.cred, deathSig: syscall.SIGKILL,
	})
	if err != nil {
		return fmt.Errorf("pgtest: starting Patroni %s: %w", n.name, err)
	}
	n.proc = proc
	return nil
}

// Nodes returns the number of nodes.
func (p *Patroni) Nodes() int { return len(p.nodes) }

// URL returns a multi-host URL of every node, with
// target_session_attrs=read-write: a client that connects reaches the
// primary, wherever it is.
func (p *Patroni) URL() string {
	hosts := make([]string, len(p.nodes))
	for i, n := range p.nodes {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", n.pgPort)
	}
	return fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=5", superuser, strings.Join(hosts, ","))
}

// NodeURL returns the URL of node i alone.
func (p *Patroni) NodeURL(i int) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", superuser, p.nodes[i].pgPort)
}

// Name returns node i's Patroni name.
func (p *Patroni) Name(i int) string { return p.nodes[i].name }

// LogPath returns node i's Patroni log (which PostgreSQL's own lines join).
func (p *Patroni) LogPath(i int) string { return filepath.Join(p.dir, p.nodes[i].name+".log") }

// restClient keeps no connection open between requests, so that a test
// that checks for leaked goroutines finds none of its.
var restClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// role asks node i's REST API whether it is what path names: /primary,
// /replica, /sync (a synchronous standby). Patroni answers 200 if so.
func (p *Patroni) role(ctx context.Context, i int, path string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d%s", p.nodes[i].restPort, path), nil)
	if err != nil {
		return false
	}
	res, err := restClient.Do(req)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// Primary returns the node that Patroni's REST API calls the primary, or -1.
func (p *Patroni) Primary(ctx context.Context) int {
	for i, n := range p.nodes {
		if n.proc != nil && p.role(ctx, i, "/primary") {
			return i
		}
	}
	return -1
}

// WaitPrimary waits until a node other than not (-1: any) is the primary,
// and returns it.
func (p *Patroni) WaitPrimary(ctx context.Context, not int, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		for i, n := range p.nodes {
			if i != not && n.proc != nil && p.role(ctx, i, "/primary") {
				return i, nil
			}
		}
		if time.Now().After(deadline) {
			return -1, p.withLogs(fmt.Errorf("pgtest: no Patroni node other than %d became the primary within %v", not, timeout))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitReplicas waits until every running node but the primary is a
// streaming replica, and one is synchronous (unless the cluster is
// asynchronous).
func (p *Patroni) waitReplicas(timeout time.Duration) error {
	ctx := context.Background()
	deadline := time.Now().Add(timeout)
	for {
		primary, replicas, syncs, running := p.Primary(ctx), 0, 0, 0
		for i, n := range p.nodes {
			if n.proc == nil || i == primary {
				continue
			}
			running++
			if p.role(ctx, i, "/replica") {
				replicas++
			}
			if p.role(ctx, i, "/sync") {
				syncs++
			}
		}
		if primary >= 0 && replicas == running && (p.async || running == 0 || syncs > 0) {
			return nil
		}
		if time.Now().After(deadline) {
			return p.withLogs(fmt.Errorf("pgtest: Patroni: after %v, primary %d, %d of %d replicas streaming, %d synchronous", timeout, primary, replicas, running, syncs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitReplicas waits until every running node but the primary runs as its
// replica (Patroni's /replica), and (unless Async) one is synchronous.
func (p *Patroni) WaitReplicas(timeout time.Duration) error { return p.waitReplicas(timeout) }

// withLogs adds the tail of each node's log to err.
func (p *Patroni) withLogs(err error) error {
	for i := range p.nodes {
		err = withLog(err, p.LogPath(i))
	}
	return err
}

// Close stops every node and etcd, and removes the cluster's directory.
func (p *Patroni) Close() error {
	// The replicas first, so that stopping the primary starts no failover.
	primary := p.Primary(context.Background())
	order := make([]int, 0, len(p.nodes))
	for i := range p.nodes {
		if i != primary {
			order = append(order, i)
		}
	}
	if primary >= 0 {
		order = append(order, primary)
	}
	var errs []error
	for _, i := range order {
		n := p.nodes[i]
		if n.proc != nil && !n.proc.exited() {
			n.proc.signal(syscall.SIGCONT) // a frozen Patroni cannot stop
			n.proc.stop(syscall.SIGTERM, closeTimeout, true)
		}
		n.proc = nil
		errs = append(errs, p.Kill(i)) // the postmaster, if Patroni left it behind
	}
	if p.proxy != nil {
		p.proxy.stop(syscall.SIGTERM, closeTimeout, true)
	}
	if p.etcd != nil {
		p.etcd.stop(syscall.SIGTERM, closeTimeout, true)
	}
	return errors.Join(append(errs, os.RemoveAll(p.dir))...)
}

// NewPatroni starts a Patroni cluster dedicated to the test
// (StartPatroni), closed when the test ends. If it cannot be started the
// test is skipped, or failed when $CI is set (see Unavailable).
func NewPatroni(t testing.TB, opts PatroniOptions) *Patroni {
	t.Helper()
	p, err := StartPatroni(opts)
	if err != nil {
		Unavailable(t, "no Patroni cluster (install patroni and etcd-server, and the PostgreSQL server binaries): %v", err)
		return nil
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}
