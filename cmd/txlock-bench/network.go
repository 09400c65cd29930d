package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
)

// The simulated network: an in-process toxiproxy on 127.0.0.1 in front of a
// server, delaying every chunk of bytes by -latency in each direction, so
// that a round trip costs at least twice that on top of loopback's.

// latencyToxic delays data by a number of microseconds. Toxiproxy's own
// latency toxic counts in whole milliseconds, too coarse for 0.5 ms. Like
// it, it delays each chunk from the moment the proxy read it, so that
// chunks in flight overlap their delays as on a wire.
type latencyToxic struct {
	Micros int64 `json:"latency_us"`
}

func (t *latencyToxic) GetBufferSize() int { return 1024 }

func (t *latencyToxic) Pipe(stub *toxics.ToxicStub) {
	delay := time.Duration(t.Micros) * time.Microsecond
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			sleep := delay - time.Since(c.Timestamp)
			if sleep > 0 && sleep < 10*time.Millisecond {
				// A Go timer this short fires a millisecond late or more when
				// the process is otherwise idle (the runtime waits in
				// epoll_pwait, which counts whole milliseconds): 0.5 ms
				// would become 1.1 ms. nanosleep keeps to the kernel's
				// timer slack (about 0.1 ms here), at the cost of a thread
				// blocked for the sleep.
				ts := syscall.NsecToTimespec(int64(sleep))
				_ = syscall.Nanosleep(&ts, nil)
			} else if sleep > 0 {
				timer := time.NewTimer(sleep)
				select {
				case <-timer.C:
				case <-stub.Interrupt:
					timer.Stop()
					stub.Output <- c // don't drop data on the floor
					return
				}
			}
			stub.Output <- c
		}
	}
}

func init() { toxics.Register("latency_us", new(latencyToxic)) }

// netProxy is one proxy with its latency in both directions.
type netProxy struct{ p *toxiproxy.Proxy }

// startProxy starts a proxy to upstream (host:port) with latency each way.
func startProxy(name, upstream string, latency time.Duration) (*netProxy, error) {
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(server, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("toxiproxy in front of %s: %w", upstream, err)
	}
	for _, stream := range []string{"upstream", "downstream"} {
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
			`{"name": "latency_%s", "type": "latency_us", "stream": %q, "attributes": {"latency_us": %d}}`,
			stream, stream, latency.Microseconds()))); err != nil {
			p.Stop()
			return nil, err
		}
	}
	return &netProxy{p: p}, nil
}

func (n *netProxy) addr() string { return n.p.Listen }

func (n *netProxy) close() { n.p.Stop() }

// medianRoundTrip returns the median time of 51 SELECT 1 round trips on one
// connection to url.
func medianRoundTrip(ctx context.Context, url string) (time.Duration, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	var ds []time.Duration
	for range 51 {
		t0 := time.Now()
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			return 0, err
		}
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

// viaProxy returns rawURL (a PostgreSQL URL) with its host and port
// replaced by addr.
func viaProxy(rawURL, addr string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	u.Host = addr
	return u.String(), nil
}

// hostPort returns the host:port of a PostgreSQL URL.
func hostPort(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return "", fmt.Errorf("%s: want host:port: %w", rawURL, err)
	}
	return u.Host, nil
}
