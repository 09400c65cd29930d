package pgtest

import (
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// Delayed returns dbURL with its host and port replaced by those of a proxy
// on 127.0.0.1 that passes the bytes each way latency after they arrive, as
// a network between the client and the server would: a round trip then
// takes at least twice latency. The proxy stops at the end of t.
func Delayed(t testing.TB, dbURL string, latency time.Duration) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("pgtest: Delayed: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: Delayed: %v", err)
	}
	upstream := u.Host
	var (
		mu     sync.Mutex
		conns  []net.Conn
		closed bool
		pumps  sync.WaitGroup
	)
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		pumps.Wait()
	})
	go func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = client.Close()
				continue
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				_, _ = client.Close(), server.Close()
				return
			}
			conns = append(conns, client, server)
			pumps.Add(2)
			mu.Unlock()
			go func() { defer pumps.Done(); delayCopy(server, client, latency) }()
			go func() { defer pumps.Done(); delayCopy(client, server, latency) }()
		}
	}()
	u.Host = l.Addr().String()
	return u.String()
}

// delayCopy copies src to dst, each chunk latency after it was read, and
// closes both once either ends.
func delayCopy(dst, src net.Conn, latency time.Duration) {
	type chunk struct {
		b  []byte
		at time.Time
	}
	chunks := make(chan chunk, 256)
	go func() {
		defer close(chunks)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				chunks <- chunk{b[:n], time.Now().Add(latency)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	for range chunks { // until the reader sees src closed
	}
}
