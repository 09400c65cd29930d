package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// startProxy starts HAProxy on a free port, and waits until it sends a
// connection to the primary.
func (p *Patroni) startProxy() (err error) {
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		for _, c := range []string{"/usr/sbin/haproxy", "/usr/local/sbin/haproxy"} {
			if _, e := os.Stat(c); e == nil {
				haproxy, err = c, nil
				break
			}
		}
		if err != nil {
			return errors.New("pgtest: haproxy not found on PATH or in /usr/sbin (on Debian: apt-get install haproxy; scripts/deps.sh test installs it)")
		}
	}
	if p.proxyPort, err = FreePort(); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	var servers strings.Builder
	for _, n := range p.nodes {
		fmt.Fprintf(&servers, "  server %s 127.0.0.1:%d check port %d\n", n.name, n.pgPort, n.restPort)
	}
	// Checks every 200ms; a node is down after 2 failed checks and up after
	// 1, and the sessions of a node marked down are ended.
	cfg := fmt.Sprintf(`global
  maxconn 1000
defaults
  mode tcp
  timeout connect 2s
  timeout client 30m
  timeout server 30m
listen primary
  bind 127.0.0.1:%d
  option httpchk GET /primary
  http-check expect status 200
  default-server inter 200ms fall 2 rise 1 on-marked-down shutdown-sessions
%s`, p.proxyPort, servers.String())
	path := filepath.Join(p.dir, "haproxy.cfg")
	if err := writeFile(path, []byte(cfg), p.cred); err != nil {
		return err
	}
	if p.proxy, err = startProcess(procSpec{
		path: haproxy, args: []string{"-db", "-f", path},
		dir: p.dir, logPath: filepath.Join(p.dir, "haproxy.log"), cred: p.cred, deathSig: syscall.SIGKILL,
	}); err != nil {
		return fmt.Errorf("pgtest: starting HAProxy: %w", err)
	}
	// HAProxy starts with every server up until its checks say otherwise:
	// ready once ten connections in a row reach the primary.
	primary := queryCheck(p.ProxyURL(), "SELECT NOT pg_is_in_recovery()")
	ready := func(ctx context.Context) error {
		for range 10 {
			if err := primary(ctx); err != nil {
				return err
			}
		}
		return nil
	}
	if err := waitReady(p.proxy, p.proxyPort, ready); err != nil {
		return withLog(fmt.Errorf("pgtest: HAProxy: %w", err), filepath.Join(p.dir, "haproxy.log"))
	}
	return nil
}

// ProxyURL returns the URL of HAProxy (PatroniOptions.HAProxy), which
// leads to the primary.
func (p *Patroni) ProxyURL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", superuser, p.proxyPort)
}
