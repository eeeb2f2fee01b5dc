package rehearsal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mythex/infra/infra"
)

// A node's numbers change while it runs, as `pulumi up` changes a live
// target group. HAProxy 2.6 reloads in master-worker mode: on SIGUSR2 the
// master re-reads the config and starts a new worker, which takes the
// listening sockets over from the old one (the master passes it -x
// sockpair@, so no connection is refused); the old worker stops accepting
// and finishes its requests ("soft stop", -sf). Every worker logs to the
// master's stdout, so one log, one HealthTracker and one AnswerLog follow
// the node across reloads.
//
// A new worker would start believing every server healthy; the ALB keeps
// its targets' health across a change of the target group. So Reload dumps
// the running worker's view ("show servers state") into the file the config
// names (server-state-file), which the new worker loads before it takes
// traffic: a server that was out stays out until it passes the healthy
// threshold, under the new numbers. HAProxy's manual, "Reloading HAProxy
// without impacting server states" (seamless_reload.txt), is this procedure.

const (
	// configFile is a node's config, in its directory.
	configFile = "haproxy.cfg"
	// serverStateFile is where Reload writes the node's view of every
	// server for the next worker, in the node's directory.
	serverStateFile = "server-state"
	// emptyServerState knows no server: the format version alone, which
	// HAProxy reads without a warning at a node's first start.
	emptyServerState = "1\n"
)

// Reload gives the running node t's numbers, keeping what it knows of each
// server's health, its requests in flight and its log. It checks the new
// config with haproxy -c before the running node sees it, and returns once
// the new worker serves, with each server's health as the old worker left
// it; an error says which step failed and leaves the node running.
func (b *Balancer) Reload(ctx context.Context, t infra.Timing) error {
	b.reloading.Lock()
	defer b.reloading.Unlock()
	if err := b.reload(ctx, t); err != nil {
		return fmt.Errorf("balancer %s: reload: %w", b.Name, err)
	}
	return nil
}

func (b *Balancer) reload(ctx context.Context, t infra.Timing) error {
	if len(b.shims) > 0 {
		// Its shims make its checks on its schedule, which new numbers
		// would move under them.
		return errors.New("a lagging node keeps its numbers")
	}
	cfg, err := HAProxyConfig(t, b.Port, b.upstreams, b.checks)
	if err != nil {
		return err
	}
	file := filepath.Join(b.dir, configFile)
	if err := writeChecked(ctx, b.bin, b.dir, file, cfg); err != nil {
		return err
	}
	// Every step below waits on HAProxy; the start timeout bounds them all,
	// as it bounds the node's first start.
	ctx, cancel := context.WithTimeout(ctx, t.StartTimeout)
	defer cancel()
	before, err := b.procs(ctx)
	if err != nil {
		return err
	}
	state, err := b.cli(ctx, "@1 show servers state")
	if err != nil {
		return err
	}
	kept, err := parseServersState(state)
	if err != nil {
		return fmt.Errorf("the running worker's server state: %w", err)
	}
	if err := writeAtomic(filepath.Join(b.dir, serverStateFile), state); err != nil {
		return err
	}
	if err := b.cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		return fmt.Errorf("signal the master: %w", err)
	}
	if err := b.awaitWorker(ctx, before); err != nil {
		return err
	}
	state, err = b.cli(ctx, "@1 show servers state")
	if err != nil {
		return err
	}
	loaded, err := parseServersState(state)
	if err != nil {
		return fmt.Errorf("the new worker's server state: %w", err)
	}
	var changed []string
	for _, u := range b.upstreams {
		was, ok := kept[u]
		if !ok {
			return fmt.Errorf("the running worker did not report server %s", u)
		}
		// In or out of rotation is what the ALB keeps; the check counter
		// may move with the new worker's first check.
		if now := loaded[u]; now.Op != was.Op || now.Admin != was.Admin {
			changed = append(changed, fmt.Sprintf("%s from %s to %s", u, was, now))
		}
	}
	if len(changed) > 0 {
		return fmt.Errorf("the new worker changed what the node knew of %s: the ALB keeps its targets' health across a change of the target group",
			strings.Join(changed, ", "))
	}
	return nil
}

// writeChecked writes cfg to file once `haproxy -c`, run in dir, has taken
// it: the running node never sees a config it would refuse.
func writeChecked(ctx context.Context, bin, dir, file, cfg string) error {
	next := file + ".next"
	if err := os.WriteFile(next, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	cmd := exec.CommandContext(ctx, bin, "-c", "-f", next)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("haproxy -c refuses the new config (%w): %s", err, tail(out, 2000))
	}
	if err := os.Rename(next, file); err != nil {
		return fmt.Errorf("install config: %w", err)
	}
	return nil
}

// writeAtomic replaces file with data in one rename, so a worker starting
// meanwhile reads the old state or the new one, never half of it.
func writeAtomic(file, data string) error {
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(file), err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("install %s: %w", filepath.Base(file), err)
	}
	return nil
}

// awaitWorker waits until the master reports a worker other than before's,
// which it does once it has read the new config and forked the worker. A
// reload the master refused counts as failed in its report.
func (b *Balancer) awaitWorker(ctx context.Context, before masterProcs) error {
	for {
		// The master answers once it is back from re-executing (cli asks
		// again meanwhile); the new worker may come after.
		now, err := b.procs(ctx)
		if err == nil {
			if now.Failed > before.Failed {
				return fmt.Errorf("the master refused the new config: %s", b.logs.String())
			}
			if now.Worker != 0 && now.Worker != before.Worker {
				return nil
			}
		}
		select {
		case <-b.done:
			return fmt.Errorf("the node exited (%v): %s", b.err, b.logs.String())
		case <-ctx.Done():
			return fmt.Errorf("no new worker (last: %+v, %v): %w", now, err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// masterProcs is what the master says of its processes (`show proc`).
type masterProcs struct {
	// Failed counts the reloads the master refused.
	Failed int
	// Worker is the current worker's PID.
	Worker int
}

func (b *Balancer) procs(ctx context.Context) (masterProcs, error) {
	out, err := b.cli(ctx, "show proc")
	if err != nil {
		return masterProcs{}, err
	}
	return parseShowProc(out)
}

// cli sends one command to the node's master CLI and returns the answer; a
// command prefixed "@1 " goes to the current worker. Every command sent is
// a question (show …), so it is asked again when the master was not there
// to answer: HAProxy's master re-executes itself once it has started its
// worker, and again at each reload. A connection it accepted just before
// is reset or closed unanswered, and one made meanwhile is refused; a node
// busy enough re-executes after it first accepted a connection.
func (b *Balancer) cli(ctx context.Context, command string) (string, error) {
	for {
		out, err := b.ask(ctx, command)
		if err == nil && out != "" {
			return out, nil
		}
		if err != nil && !masterAway(err) {
			return "", err
		}
		if err == nil {
			err = fmt.Errorf("master CLI %q: closed without an answer", command)
		}
		select {
		case <-b.done:
			return "", fmt.Errorf("%w; the node exited (%v): %s", err, b.err, b.logs.String())
		case <-ctx.Done():
			return "", fmt.Errorf("%w; then %w", err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// masterAway says err is the master re-executing: the connection refused,
// or reset at any step of the exchange (while the question is written, at
// its end, or while the answer is read).
func masterAway(err error) bool {
	for _, e := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE, syscall.ENOTCONN} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// ask sends command to the master CLI once.
func (b *Balancer) ask(ctx context.Context, command string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", b.master)
	if err != nil {
		return "", fmt.Errorf("master CLI: %w", err)
	}
	defer func() { _ = conn.Close() }()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	if _, err := io.WriteString(conn, command+"\n"); err != nil {
		return "", fmt.Errorf("master CLI %q: %w", command, err)
	}
	// The master answers one command and closes once the client has said
	// it has no more.
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return "", fmt.Errorf("master CLI %q: %w", command, err)
	}
	out, err := io.ReadAll(conn)
	if err != nil {
		return "", fmt.Errorf("master CLI %q: %w", command, err)
	}
	return string(out), nil
}

var failedReloads = regexp.MustCompile(`\[failed: (\d+)\]`)

// parseShowProc reads the master CLI's `show proc`:
//
//	#<PID>          <type>          <reloads>       <uptime>        <version>
//	16611           master          1 [failed: 0]   0d00h10m10s     2.6.12-1+deb12u4
//	# workers
//	4940            worker          0               0d00h00m00s     2.6.12-1+deb12u4
//	# old workers
//	16646           worker          1               0d00h10m09s     2.6.12-1+deb12u4
func parseShowProc(out string) (masterProcs, error) {
	var p masterProcs
	section, master := "", false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if strings.HasPrefix(f[0], "#") {
			section = strings.TrimSpace(strings.TrimPrefix(line, "#"))
			continue
		}
		if len(f) < 2 {
			continue
		}
		switch {
		case f[1] == "master":
			m := failedReloads.FindStringSubmatch(line)
			if m == nil {
				return masterProcs{}, fmt.Errorf("show proc: no reload count on the master's line %q", line)
			}
			p.Failed, _ = strconv.Atoi(m[1])
			master = true
		case f[1] == "worker" && section == "workers" && p.Worker == 0:
			pid, err := strconv.Atoi(f[0])
			if err != nil {
				return masterProcs{}, fmt.Errorf("show proc: worker line %q: %w", line, err)
			}
			p.Worker = pid
		}
	}
	if !master {
		return masterProcs{}, fmt.Errorf("show proc: no master in %q", out)
	}
	return p, nil
}

// serverState is one server's health as a worker holds it: operational
// state (0 down, 1 starting, 2 up, 3 stopping), administrative state, and
// the check counter on its way to the rise or fall threshold.
type serverState struct {
	Op, Admin, Health int
}

func (s serverState) String() string {
	op := map[int]string{0: "DOWN", 1: "STARTING", 2: "UP", 3: "STOPPING"}[s.Op]
	return fmt.Sprintf("%s (check counter %d, admin %#x)", op, s.Health, s.Admin)
}

// parseServersState reads `show servers state` (format 1, the fields named
// in its header line) into each server's state by name.
func parseServersState(out string) (map[string]serverState, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 || strings.TrimSpace(lines[0]) != "1" || !strings.HasPrefix(lines[1], "# ") {
		return nil, fmt.Errorf("not a version 1 server state: %q", tail([]byte(out), 300))
	}
	col := map[string]int{}
	for i, name := range strings.Fields(strings.TrimPrefix(lines[1], "# ")) {
		col[name] = i
	}
	names := []string{"srv_name", "srv_op_state", "srv_admin_state", "srv_check_health"}
	for _, n := range names {
		if _, ok := col[n]; !ok {
			return nil, fmt.Errorf("server state: no column %s in %q", n, lines[1])
		}
	}
	states := map[string]serverState{}
	for _, line := range lines[2:] {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if len(f) < len(col) {
			return nil, fmt.Errorf("server state: short line %q", line)
		}
		var v [3]int
		for i, name := range names[1:] {
			n, err := strconv.Atoi(f[col[name]])
			if err != nil {
				return nil, fmt.Errorf("server state: %s on line %q: %w", name, line, err)
			}
			v[i] = n
		}
		states[f[col["srv_name"]]] = serverState{Op: v[0], Admin: v[1], Health: v[2]}
	}
	if len(states) == 0 {
		return nil, errors.New("server state: no server")
	}
	return states, nil
}
