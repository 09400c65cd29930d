package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/txlock/txlock/internal/pgtest"
)

// redisServer is a throwaway redis-server child process.
type redisServer struct {
	addr  string
	cmd   *exec.Cmd
	dir   string
	close func()
}

// startRedis starts redis-server on a free port of 127.0.0.1, without
// persistence, and waits until it answers PING.
func startRedis() (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (install it, e.g. apt-get install -y redis-server, or pass -redis host:port): %w", err)
	}
	dir, err := os.MkdirTemp("", "txlock-bench-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		port, err := pgtest.FreePort()
		if err != nil {
			return nil, err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
			"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "yes")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		r := &redisServer{addr: addr, cmd: cmd, dir: dir}
		r.close = func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
			os.RemoveAll(dir)
		}
		c := redis.NewClient(&redis.Options{Addr: addr})
		deadline := time.Now().Add(10 * time.Second)
	poll:
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			lastErr = c.Ping(ctx).Err()
			cancel()
			if lastErr == nil {
				c.Close()
				return r, nil
			}
			select {
			case <-exited:
				lastErr = fmt.Errorf("redis-server exited: %w", lastErr)
				break poll
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				break
			}
		}
		c.Close()
		r.close()
		dir, _ = os.MkdirTemp("", "txlock-bench-redis-")
	}
	return nil, fmt.Errorf("starting redis-server: %w", lastErr)
}
