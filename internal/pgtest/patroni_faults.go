package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The faults a test injects into a Patroni cluster's nodes.

// postmasterPID reads node i's postmaster.pid.
func (p *Patroni) postmasterPID(i int) int {
	b, err := os.ReadFile(filepath.Join(p.nodes[i].dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// Kill ends node i as a machine's crash would: SIGKILL to its Patroni, to
// its postmaster, and to the postmaster's children. Each child of a
// postmaster leads a session of its own, so they are found by parent, not
// by process group; a child that is stopped (SIGSTOP) would otherwise
// outlive its postmaster and hold the shared memory that a restart needs.
// The postmaster is stopped first, so that it forks no child while they
// are found. Kill returns once every one of them is gone, and then
// removes postmaster.pid, or reports the processes that are not gone.
func (p *Patroni) Kill(i int) error {
	n := p.nodes[i]
	if n.proc != nil {
		n.proc.kill()
		n.proc = nil
	}
	pm := p.postmasterPID(i)
	if pm <= 0 || !alive(pm) {
		return nil
	}
	syscall.Kill(pm, syscall.SIGSTOP)
	pids := append(children(pm), pm)
	for _, pid := range pids {
		syscall.Kill(-pid, syscall.SIGKILL) // the child's session: its own children
		syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("pgtest: Kill %s: process %d outlived SIGKILL", n.name, pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	os.Remove(filepath.Join(n.dir, "data", "postmaster.pid"))
	return nil
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != "Z" && state != "X"
}

// procStat reads a process's state and parent from /proc.
func procStat(pid int) (state string, ppid int, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", 0, false
	}
	// The fields after the command name, which is in parentheses and may
	// hold any byte, ")" too: state, then the parent's pid.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0], ppid, true
}

// children lists the processes whose parent is pid, from /proc.
func children(pid int) []int {
	dirs, _ := os.ReadDir("/proc")
	var out []int
	for _, d := range dirs {
		child, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(child); ok && ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// Restart starts node i's Patroni again after Kill: it rejoins as a
// replica of the primary (rewound, or copied again if rewinding fails).
func (p *Patroni) Restart(i int) error {
	patroni, err := exec.LookPath("patroni")
	if err != nil {
		return err
	}
	return p.startNode(p.nodes[i], patroni)
}

// Freeze stops node i's Patroni (SIGSTOP), and not its PostgreSQL: the
// primary's leader key expires and another node is promoted, while the old
// primary goes on serving the clients connected to it. Thaw resumes it.
func (p *Patroni) Freeze(i int) error { return p.signal(i, syscall.SIGSTOP) }

// Thaw resumes node i's Patroni after Freeze.
func (p *Patroni) Thaw(i int) error { return p.signal(i, syscall.SIGCONT) }

// signal sends sig to node i's Patroni.
func (p *Patroni) signal(i int, sig syscall.Signal) error {
	if p.nodes[i].proc == nil {
		return fmt.Errorf("pgtest: %s's Patroni is not running", p.nodes[i].name)
	}
	return p.nodes[i].proc.signal(sig)
}

// Switchover asks Patroni to move the primary from node from to node to,
// with patronictl, now.
func (p *Patroni) Switchover(ctx context.Context, from, to int) error {
	ctx, cancel := context.WithTimeout(ctx, patroniReadyWait)
	defer cancel()
	out, err := exec.CommandContext(ctx, "patronictl", "-c", p.nodes[from].config, "switchover",
		"--leader", p.nodes[from].name, "--candidate", p.nodes[to].name, "--force").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: patronictl switchover %s to %s: %w: %s", p.nodes[from].name, p.nodes[to].name, err, out)
	}
	return nil
}
