package rehearsal

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mythex/infra/drain"
	"github.com/mythex/infra/infra"
)

// The balancer node is HAProxy from Debian. Of the proxies at hand it comes
// closest to an ALB node: it never re-sends a request on another connection
// once retries are off, idempotent or not, so a reused upstream connection
// that turns out closed is a 502, as the ALB answers. Caddy (Go's
// http.Transport) silently re-sends idempotent requests in that case, which
// hid the keep-alive race from the rehearsal.
const (
	HAProxyBinary  = "haproxy"
	HAProxyInstall = "apt-get install haproxy"
)

// FindHAProxy returns the path of the haproxy binary, or an error naming
// the install command.
func FindHAProxy() (string, error) {
	path, err := exec.LookPath(HAProxyBinary)
	if err != nil {
		return "", fmt.Errorf("the rehearsal's balancer nodes are HAProxy, not found on PATH: %s", HAProxyInstall)
	}
	return path, nil
}

// HAProxyVersion is the first line of `haproxy -v`: the fidelity tests name
// it, so a failure after an upgrade says which balancer changed.
func HAProxyVersion(bin string) string {
	out, err := exec.Command(bin, "-v").Output()
	if err != nil {
		return fmt.Sprintf("%s (version unknown: %v)", bin, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line)
}

// backendName is the one backend; servers are named by their address, so a
// log line names the upstream the rehearsal knows.
const backendName = "targets"

// accessLogTag starts every access log line; the fields after it are
// method, server, status and termination state.
const accessLogTag = "answer"

// ms writes d as whole milliseconds, HAProxy's finest unit.
func ms(d time.Duration) string {
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

// checkBalancerTiming reports why t cannot configure a node: HAProxy takes
// whole milliseconds, and a zero timeout would mean none at all.
func checkBalancerTiming(t infra.Timing) error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"HealthCheckInterval", t.HealthCheckInterval},
		{"HealthCheckTimeout", t.HealthCheckTimeout},
		{"LBIdleTimeout", t.LBIdleTimeout},
	} {
		if d.v < time.Millisecond || d.v%time.Millisecond != 0 {
			errs = append(errs, fmt.Errorf("%s %v must be a positive whole number of milliseconds: HAProxy counts in milliseconds", d.name, d.v))
		}
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"UnhealthyThreshold", t.UnhealthyThreshold}, {"HealthyThreshold", t.HealthyThreshold}} {
		if n.v < 1 {
			errs = append(errs, fmt.Errorf("%s %d must be at least 1", n.name, n.v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("timing cannot configure a balancer node: %w", err)
	}
	return nil
}

// HAProxyConfig renders one balancer node listening on 127.0.0.1:port and
// sending to upstreams, every number from t, each line as the ALB behaves:
//
//   - active checks of infra.HealthPath every HealthCheckInterval, each
//     allowed HealthCheckTimeout, healthy only on infra.HealthyStatus; out
//     after UnhealthyThreshold failures, back after HealthyThreshold passes;
//     no passive checks (the ALB has none);
//   - retries 0 and no redispatch: no request is ever sent twice;
//   - http-reuse always: any request may go on any idle upstream connection,
//     as the ALB pools them; idle ones are closed after LBIdleTimeout;
//   - an upstream silent for LBIdleTimeout is answered 504 (timeout server);
//   - HAProxy answers a refused connection 503 (termination state SC); the
//     ALB answers 502, so a 503 from a chosen server is rewritten to 502.
//     The 503 of "no server available" has no server and stays 503.
//
// Every answer is logged to stdout with its method, server, status and
// termination state, and every health transition with the server's name.
// What the node knows of each server's health is read, at start, from
// serverStateFile in its working directory: Reload writes it just before the
// node takes new numbers, as the ALB keeps its targets' health across a
// change of the target group. checks sets the node's checks apart from a
// plain node's; its zero value changes nothing.
func HAProxyConfig(t infra.Timing, port int, upstreams []string, checks NodeChecks) (string, error) {
	if err := checkBalancerTiming(t); err != nil {
		return "", err
	}
	if len(upstreams) == 0 {
		return "", errors.New("balancer node: no upstream")
	}
	if err := checks.validate(upstreams); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, `global
	log stdout format raw local0 info
	# One thread: an ALB node's behaviour, not its throughput, is what is
	# rehearsed, and the machine is shared.
	nbthread 1
	# Each server's health as the running node saw it, written by Reload.
	server-state-file %[12]s

defaults
	mode http
	log global
	load-server-state-from-file global
	option log-health-checks
	# A connection that sends nothing (a readiness probe) is no answer.
	option dontlognull
	log-format "%[1]s %%HM %%s %%ST %%ts"
	retries 0
	no option redispatch
	# The ALB's connection timeout is 10 s; a loopback connect is refused or
	# made at once, so the check timeout bounds it here.
	timeout connect %[2]s
	timeout check %[2]s
	timeout client %[3]s
	timeout http-keep-alive %[3]s
	timeout http-request %[3]s
	timeout server %[3]s

frontend node
	bind 127.0.0.1:%[4]d
	default_backend %[5]s
	# A refused or reset connect is the ALB's 502; "no server" (no server
	# chosen) stays 503.
	http-after-response set-status 502 if { status 503 } { srv_id -m found }

backend %[5]s
	balance roundrobin
	http-reuse always
	option httpchk GET %[6]s
%[13]s	http-check expect status %[7]d
	# HAProxy has no per-connection idle timeout upstream: every
	# pool-purge-delay it closes the idle connections its estimate of need
	# no longer covers, and an unused one goes after three periods. A third
	# of LBIdleTimeout closes it at the idle timeout, as the ALB does
	# (pinned by TestFidelity).
	default-server check inter %[8]s fall %[9]d rise %[10]d pool-purge-delay %[11]s
`, accessLogTag, ms(t.HealthCheckTimeout), ms(t.LBIdleTimeout), port, backendName,
		infra.HealthPath, infra.HealthyStatus, ms(t.HealthCheckInterval), t.UnhealthyThreshold, t.HealthyThreshold, ms(t.LBIdleTimeout/3),
		serverStateFile, checks.send())
	for _, u := range upstreams {
		fmt.Fprintf(&b, "\tserver %s %s%s\n", u, u, checks.via(u))
	}
	return b.String(), nil
}

// NodeChecks is how a node's health checks differ from a plain ALB node's.
type NodeChecks struct {
	// Name, when set, is sent in every check as drain.HeaderNode: the
	// server tells the node apart by it whatever address the check comes
	// from (through Docker's userland proxy every node has one).
	Name string
	// Via sends the checks of an upstream to another address (a LagShim's);
	// requests still go to the upstream itself.
	Via map[string]string
}

// nodeName is what a node may call itself in a header and in HAProxy's
// config, where it is one word.
var nodeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

func (c NodeChecks) validate(upstreams []string) error {
	var errs []error
	if c.Name != "" && !nodeName.MatchString(c.Name) {
		errs = append(errs, fmt.Errorf("node name %q must be letters, digits, '.', '_' or '-'", c.Name))
	}
	for u, addr := range c.Via {
		if !slices.Contains(upstreams, u) {
			errs = append(errs, fmt.Errorf("checks via %s for %s, which is not an upstream", addr, u))
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("checks of %s via %q: %w", u, addr, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("balancer node: %w", err)
	}
	return nil
}

// send is the config line naming the node in its checks, if it has a name.
func (c NodeChecks) send() string {
	if c.Name == "" {
		return ""
	}
	return fmt.Sprintf("\thttp-check send hdr %s %s\n", drain.HeaderNode, c.Name)
}

// via is what a server line adds to send its checks elsewhere.
func (c NodeChecks) via(upstream string) string {
	addr, ok := c.Via[upstream]
	if !ok {
		return ""
	}
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf(" addr %s port %s", host, port)
}

// Balancer is one running HAProxy: one ALB node.
type Balancer struct {
	// Name identifies the node in reports ("lb1", "lb2").
	Name string
	// Port is the loopback port clients send to.
	Port int
	// Health mirrors the node's verdicts on its upstreams.
	Health *HealthTracker
	// Log counts the node's answers from its own access log.
	Log *AnswerLog
	// Lag is how long after the server answers a check the node acts on
	// the answer (NodeOptions.Lag); 0 for a node that acts at once.
	Lag time.Duration

	cmd  *exec.Cmd
	done chan struct{}
	err  error
	logs *ringBuffer

	// What Reload needs: the binary, the node's directory (its config and
	// server-state file), its upstreams and its master CLI's address.
	bin, dir  string
	upstreams []string
	checks    NodeChecks
	master    string
	reloading sync.Mutex
	// shims stand between a lagging node's checks and its upstreams.
	shims map[string]*LagShim
}

// URL is the base URL clients send to.
func (b *Balancer) URL() string {
	return "http://127.0.0.1:" + strconv.Itoa(b.Port)
}

// NodeOptions sets a balancer node apart from a plain ALB node, one that
// checks from an address it shares with every other node and acts on each
// check at once.
type NodeOptions struct {
	// Name names the node in reports ("lb1").
	Name string
	// Named: the node sends its name in every check (NodeChecks.Name), so
	// the servers tell it apart from the other nodes and the evidence
	// drain can count its checks.
	Named bool
	// Lag: the node acts on each check's answer this long after the server
	// gave it, through a LagShim per upstream; 0 acts at once.
	Lag time.Duration
}

// StartBalancer runs HAProxy (bin) as one plain balancer node on a free
// loopback port in front of upstreams, configured from t, with its files
// under dir. It returns once the node accepts connections.
func StartBalancer(ctx context.Context, bin, name, dir string, t infra.Timing, upstreams []string) (*Balancer, error) {
	return StartNode(ctx, bin, dir, t, upstreams, NodeOptions{Name: name})
}

// StartNode runs HAProxy (bin) as one balancer node as o sets it apart, on
// a free loopback port in front of upstreams, configured from t, with its
// files under dir. It returns once the node accepts connections.
func StartNode(ctx context.Context, bin, dir string, t infra.Timing, upstreams []string, o NodeOptions) (_ *Balancer, err error) {
	name := o.Name
	if o.Lag < 0 {
		return nil, fmt.Errorf("balancer %s: lag %v must not be negative", name, o.Lag)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("balancer %s: %w", name, err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, fmt.Errorf("balancer %s: %w", name, err)
	}
	masterPort, err := FreePort()
	if err != nil {
		return nil, fmt.Errorf("balancer %s: %w", name, err)
	}
	var checks NodeChecks
	if o.Named {
		checks.Name = name
	}
	shims := map[string]*LagShim{}
	defer func() {
		if err != nil {
			for _, s := range shims {
				s.Stop()
			}
		}
	}()
	if o.Lag > 0 {
		checks.Via = map[string]string{}
		for _, u := range upstreams {
			s, err := StartLagShim(u, o.Lag, t)
			if err != nil {
				return nil, fmt.Errorf("balancer %s: %w", name, err)
			}
			shims[u] = s
			checks.Via[u] = s.Addr
		}
	}
	cfg, err := HAProxyConfig(t, port, upstreams, checks)
	if err != nil {
		return nil, fmt.Errorf("balancer %s: %w", name, err)
	}
	file := filepath.Join(dir, configFile)
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("balancer %s: write config: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, serverStateFile), []byte(emptyServerState), 0o644); err != nil {
		return nil, fmt.Errorf("balancer %s: write server state: %w", name, err)
	}
	logFile, err := os.Create(filepath.Join(dir, "haproxy.log"))
	if err != nil {
		return nil, fmt.Errorf("balancer %s: %w", name, err)
	}
	b := &Balancer{
		Name:   name,
		Port:   port,
		Health: NewHealthTracker(upstreams),
		Log:    NewAnswerLog(),
		Lag:    o.Lag,
		done:   make(chan struct{}),
		logs:   &ringBuffer{max: 64 << 10},

		bin:       bin,
		dir:       dir,
		upstreams: upstreams,
		checks:    checks,
		master:    "127.0.0.1:" + strconv.Itoa(masterPort),
		shims:     shims,
	}
	// Not CommandContext: Stop ends HAProxy with SIGTERM. -db keeps it in the
	// foreground, logging to our pipe. -W runs it as a master and a worker:
	// Reload has the master start a new worker with new numbers while the
	// old one finishes its requests, every worker logging to the one pipe;
	// -S is the master's CLI, which Reload asks.
	b.cmd = exec.Command(bin, "-W", "-db", "-S", "ipv4@"+b.master, "-f", file)
	b.cmd.Dir = dir
	stdout, err := b.cmd.StdoutPipe()
	if err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("balancer %s: %w", name, err)
	}
	// Alerts and startup errors; the same health lines also reach stdout,
	// which alone is parsed.
	b.cmd.Stderr = io.MultiWriter(logFile, b.logs)
	if err := b.cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("balancer %s: start %s: %w", name, bin, err)
	}
	go func() {
		defer func() { _ = logFile.Close() }()
		consumeLog(io.TeeReader(stdout, logFile), b.Health, b.Log)
		b.err = b.cmd.Wait()
		close(b.done)
	}()
	if err := b.awaitListening(ctx, t.StartTimeout); err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

// awaitListening polls the node's port and its master's CLI until both
// accept a connection, the process exits, or timeout passes.
func (b *Balancer) awaitListening(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	pending := []string{"127.0.0.1:" + strconv.Itoa(b.Port), b.master}
	for {
		for len(pending) > 0 {
			c, err := net.DialTimeout("tcp", pending[0], time.Second)
			if err != nil {
				break
			}
			_ = c.Close()
			pending = pending[1:]
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-b.done:
			return fmt.Errorf("balancer %s exited before listening (%v): %s", b.Name, b.err, b.logs.String())
		case <-ctx.Done():
			return fmt.Errorf("balancer %s: %w", b.Name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("balancer %s not listening on %s after %v: %s", b.Name, pending[0], timeout, b.logs.String())
		}
	}
}

// Stop ends the node and waits for it to exit.
func (b *Balancer) Stop() {
	defer func() {
		for _, s := range b.shims {
			s.Stop()
		}
	}()
	if b.cmd.Process == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
}

// FreePort returns a loopback TCP port nothing listens on right now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// HAProxy's health lines (option log-health-checks): a line per check whose
// result changes, and one per transition.
var (
	healthTransition = regexp.MustCompile(`^Server ` + backendName + `/(\S+) is (UP|DOWN)\b`)
	healthCheckFail  = regexp.MustCompile(`^Health check for server ` + backendName + `/(\S+) failed\b(?:, reason: ([^,]+))?`)
)

// consumeLog reads the node's log until r ends: health lines go to h,
// answers to a.
func consumeLog(r io.Reader, h *HealthTracker, a *AnswerLog) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := healthTransition.FindStringSubmatch(line); m != nil {
			h.observe(m[1], m[2] == "UP")
			continue
		}
		if m := healthCheckFail.FindStringSubmatch(line); m != nil {
			h.failedCheck(m[1], m[2])
			continue
		}
		a.parse(line)
	}
	// Drain the rest so HAProxy never blocks on a full pipe.
	_, _ = io.Copy(io.Discard, r)
}

// HostHealth is one node's verdict on one upstream.
type HostHealth struct {
	// Healthy is whether the node routes to the upstream.
	Healthy bool
	// Outs and Ins count the times the node took the upstream out of and
	// back into rotation.
	Outs, Ins int
	// FailedChecks counts the failed checks HAProxy logged: it logs a check
	// only when its result changes the server's health count.
	FailedChecks int
	// LateOuts counts the outs on a check the upstream refused or reset
	// (its listener had closed) rather than answered unhealthy, as a
	// draining server does: the node sent it requests until then. An out
	// on a check that timed out is neither: a loaded host may be slow.
	LateOuts int
}

// listenerGone are HAProxy's reasons for a check whose connection was
// refused or reset: nothing listens on the port any more.
var listenerGone = []string{"Layer4 connection problem", "Socket error"}

// HealthTracker mirrors a node's active health verdicts from its log. Every
// upstream starts healthy, as in HAProxy (which takes a server out after
// its first failed check until the first rise passes).
type HealthTracker struct {
	mu    sync.Mutex
	hosts map[string]*HostHealth
	// lastFail is each host's last failed check's reason: HAProxy logs the
	// check that takes a server out just before the transition.
	lastFail map[string]string
	changed  chan struct{}
	// moves are the verdicts' changes, in the order the log gave them.
	moves []Move
}

// Move is one change of a node's verdict on an upstream: when the log
// said it, and whether the node took the upstream in or out.
type Move struct {
	At   time.Time
	Host string
	In   bool
}

// NewHealthTracker returns a tracker for upstreams.
func NewHealthTracker(upstreams []string) *HealthTracker {
	h := &HealthTracker{hosts: map[string]*HostHealth{}, lastFail: map[string]string{}, changed: make(chan struct{})}
	for _, u := range upstreams {
		h.hosts[u] = &HostHealth{Healthy: true}
	}
	return h
}

// Consume reads a node's log until r ends, for the health lines only.
func (h *HealthTracker) Consume(r io.Reader) {
	consumeLog(r, h, NewAnswerLog())
}

func (h *HealthTracker) observe(host string, up bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.hosts[host]
	if !ok || s.Healthy == up {
		return
	}
	s.Healthy = up
	h.moves = append(h.moves, Move{At: time.Now(), Host: host, In: up})
	if up {
		s.Ins++
	} else {
		s.Outs++
		if slices.Contains(listenerGone, h.lastFail[host]) {
			s.LateOuts++
		}
	}
	h.notifyLocked()
}

func (h *HealthTracker) failedCheck(host, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s, ok := h.hosts[host]; ok {
		s.FailedChecks++
		h.lastFail[host] = reason
		h.notifyLocked()
	}
}

func (h *HealthTracker) notifyLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// All returns every upstream's verdict.
func (h *HealthTracker) All() map[string]HostHealth {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]HostHealth, len(h.hosts))
	for k, v := range h.hosts {
		out[k] = *v
	}
	return out
}

// Moves returns the verdicts' changes so far, oldest first.
func (h *HealthTracker) Moves() []Move {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.moves)
}

// Get returns the verdict on host.
func (h *HealthTracker) Get(host string) (HostHealth, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.hosts[host]
	if !ok {
		return HostHealth{}, false
	}
	return *s, true
}

// Await blocks until cond holds for host's verdict, ctx ends, or timeout
// passes; it returns the last verdict seen.
func (h *HealthTracker) Await(ctx context.Context, host string, timeout time.Duration, cond func(HostHealth) bool) (HostHealth, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		h.mu.Lock()
		s, ok := h.hosts[host]
		if !ok {
			h.mu.Unlock()
			return HostHealth{}, fmt.Errorf("host %s is not an upstream", host)
		}
		v, changed := *s, h.changed
		h.mu.Unlock()
		if cond(v) {
			return v, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return v, fmt.Errorf("waiting on %s: %w", host, ctx.Err())
		case <-timer.C:
			return v, fmt.Errorf("waiting on %s: %w after %v", host, errTimeout, timeout)
		}
	}
}

var errTimeout = errors.New("timed out")

// ringBuffer keeps the last max bytes written, for error messages.
type ringBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (r *ringBuffer) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = append(r.buf, p...)
	if len(r.buf) > r.max {
		r.buf = append([]byte{}, r.buf[len(r.buf)-r.max:]...)
	}
	return len(p), nil
}

func (r *ringBuffer) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return string(tail(r.buf, 2000))
}

func tail(b []byte, n int) []byte {
	b = bytes.TrimSpace(b)
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
