package rehearsal

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mythex/infra/infra"
)

// CaddyModule and CaddyVersion pin the balancer stand-in. Debian's Caddy 2.6
// lacks health_passes and health_fails, so a Caddy found on the machine is
// used only if it accepts the configuration we generate.
const (
	CaddyModule  = "github.com/caddyserver/caddy/v2/cmd/caddy"
	CaddyVersion = "v2.11.9"
)

// caddyCandidates are the places a Caddy binary is looked for before one is
// built: PATH, then the directory CI installs its tools into.
var caddyCandidates = []string{"caddy", "/root/tools/bin/caddy"}

// FindCaddy returns the path of a Caddy binary that accepts the rehearsal's
// configuration, building the pinned version into cacheDir with `go install`
// when none on the machine does. The build needs only Go and the module
// proxy, so a fresh machine with Go and Docker can run the rehearsal.
func FindCaddy(ctx context.Context, cacheDir string) (string, error) {
	probe := CaddyConfig(infra.Prod(), 1, []string{"127.0.0.1:2"}, cacheDir)
	var tried []string
	candidates := append([]string{}, caddyCandidates...)
	built := filepath.Join(cacheDir, "caddy-"+CaddyVersion, "caddy")
	candidates = append(candidates, built)
	for _, c := range candidates {
		path, err := exec.LookPath(c)
		if err != nil {
			continue
		}
		if err := adaptCaddyfile(ctx, path, probe); err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", path, err))
			continue
		}
		return path, nil
	}
	if err := installCaddy(ctx, filepath.Dir(built)); err != nil {
		return "", fmt.Errorf("no usable caddy (tried %s): %w", strings.Join(tried, "; "), err)
	}
	if err := adaptCaddyfile(ctx, built, probe); err != nil {
		return "", fmt.Errorf("caddy %s built into %s rejects the rehearsal config: %w", CaddyVersion, built, err)
	}
	return built, nil
}

func installCaddy(ctx context.Context, gobin string) error {
	if err := os.MkdirAll(gobin, 0o755); err != nil {
		return fmt.Errorf("create caddy cache dir: %w", err)
	}
	cmd := exec.CommandContext(ctx, "go", "install", CaddyModule+"@"+CaddyVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go install %s@%s: %w\n%s", CaddyModule, CaddyVersion, err, tail(out, 2000))
	}
	return nil
}

// adaptCaddyfile asks bin to parse config without running it: an unknown
// directive (an old Caddy) fails here.
func adaptCaddyfile(ctx context.Context, bin, config string) error {
	dir, err := os.MkdirTemp("", "caddy-probe-")
	if err != nil {
		return fmt.Errorf("probe dir: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	file := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		return fmt.Errorf("write probe config: %w", err)
	}
	cmd := exec.CommandContext(ctx, bin, "adapt", "--config", file, "--adapter", "caddyfile")
	cmd.Env = caddyEnv(dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("caddy adapt: %w: %s", err, tail(out, 500))
	}
	return nil
}

// caddyEnv keeps Caddy's data and config directories inside dir, so two
// instances (or two rehearsals) never share state.
func caddyEnv(dir string) []string {
	return append(os.Environ(),
		"XDG_DATA_HOME="+filepath.Join(dir, "data"),
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"),
	)
}

// CaddyConfig renders the Caddyfile of one balancer node listening on
// 127.0.0.1:port and sending to upstreams, every number from t:
//
//   - active checks of infra.HealthPath every HealthCheckInterval, each
//     allowed HealthCheckTimeout, healthy only on infra.HealthyStatus;
//   - out after UnhealthyThreshold failures, back after HealthyThreshold
//     passes, as the target group does;
//   - no retries: like the ALB, a refused connection is answered 502 and
//     never tried on another upstream, so the rehearsal sees exactly what
//     users would;
//   - idle connections, both sides, closed after LBIdleTimeout, the ALB's
//     idle timeout, which the app's keep-alive outlasts; an upstream silent
//     that long is answered 504, as the ALB does.
func CaddyConfig(t infra.Timing, port int, upstreams []string, dataDir string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{
	admin off
	auto_https off
	storage file_system %s
	log {
		output stderr
		format json
		level INFO
	}
	servers {
		timeouts {
			idle %s
		}
	}
}

http://:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		lb_policy round_robin
		lb_retries 0
		health_uri %s
		health_interval %s
		health_timeout %s
		health_status %d
		health_fails %d
		health_passes %d
		transport http {
			keepalive %s
			response_header_timeout %s
		}
	}
}
`, strconv.Quote(filepath.Join(dataDir, "storage")), t.LBIdleTimeout, port, strings.Join(upstreams, " "),
		infra.HealthPath, t.HealthCheckInterval, t.HealthCheckTimeout, infra.HealthyStatus,
		t.UnhealthyThreshold, t.HealthyThreshold, t.LBIdleTimeout, t.LBIdleTimeout)
	return b.String()
}

// Balancer is one running Caddy instance: one ALB node.
type Balancer struct {
	// Name identifies the node in reports ("lb1", "lb2").
	Name string
	// Port is the loopback port clients send to.
	Port int
	// Health mirrors the node's verdicts on its upstreams.
	Health *HealthTracker

	cmd  *exec.Cmd
	done chan struct{}
	err  error
	logs *ringBuffer
}

// URL is the base URL clients send to.
func (b *Balancer) URL() string {
	return "http://127.0.0.1:" + strconv.Itoa(b.Port)
}

// StartBalancer runs Caddy (bin) as one balancer node on a free loopback port
// in front of upstreams, configured from t, with its files under dir. It
// returns once the node accepts connections.
func StartBalancer(ctx context.Context, bin, name, dir string, t infra.Timing, upstreams []string) (*Balancer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("balancer %s: %w", name, err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, fmt.Errorf("balancer %s: %w", name, err)
	}
	file := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(file, []byte(CaddyConfig(t, port, upstreams, dir)), 0o644); err != nil {
		return nil, fmt.Errorf("balancer %s: write config: %w", name, err)
	}
	logFile, err := os.Create(filepath.Join(dir, "caddy.log"))
	if err != nil {
		return nil, fmt.Errorf("balancer %s: %w", name, err)
	}
	b := &Balancer{
		Name:   name,
		Port:   port,
		Health: NewHealthTracker(t.UnhealthyThreshold, upstreams),
		done:   make(chan struct{}),
		logs:   &ringBuffer{max: 64 << 10},
	}
	// Not CommandContext: Stop ends Caddy with SIGTERM so it exits cleanly.
	b.cmd = exec.Command(bin, "run", "--config", file, "--adapter", "caddyfile")
	b.cmd.Env = caddyEnv(dir)
	b.cmd.Dir = dir
	stderr, err := b.cmd.StderrPipe()
	if err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("balancer %s: %w", name, err)
	}
	b.cmd.Stdout = logFile
	if err := b.cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("balancer %s: start %s: %w", name, bin, err)
	}
	go func() {
		defer func() { _ = logFile.Close() }()
		b.Health.Consume(io.TeeReader(stderr, io.MultiWriter(logFile, b.logs)))
		b.err = b.cmd.Wait()
		close(b.done)
	}()
	if err := b.awaitListening(ctx, t.StartTimeout); err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

// awaitListening polls the node's port until it accepts a connection, the
// process exits, or timeout passes.
func (b *Balancer) awaitListening(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(b.Port), time.Second)
		if err == nil {
			_ = c.Close()
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
			return fmt.Errorf("balancer %s not listening on port %d after %v: %s", b.Name, b.Port, timeout, b.logs.String())
		}
	}
}

// Stop ends the node and waits for it to exit.
func (b *Balancer) Stop() {
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

// The active health checker's log: a line per failed check, a line when a
// host comes back. Caddy logs no line for a host going out; HealthTracker
// derives it the way Caddy decides it.
const (
	healthLogger = "http.handlers.reverse_proxy.health_checker.active"
	healthUpMsg  = "host is up"
)

var healthFailMsgs = map[string]bool{
	"HTTP request failed":               true,
	"unexpected status code":            true,
	"status code out of tolerances":     true,
	"failed to read response body":      true,
	"response body failed expectations": true,
}

// HostHealth is one node's verdict on one upstream.
type HostHealth struct {
	// Healthy is whether the node routes to the upstream.
	Healthy bool
	// Outs and Ins count the times the node took the upstream out of and
	// back into rotation.
	Outs, Ins int
	// FailedChecks counts every failed active check.
	FailedChecks int
	// fails counts failures since the last transition: Caddy takes a host
	// out when it reaches health_fails.
	fails int
}

// HealthTracker mirrors a Caddy node's active health verdicts from its log.
// Caddy counts failures since a host's last transition and takes the host
// out when the count reaches health_fails; it logs "host is up" when it puts
// one back. Every upstream starts healthy, as in Caddy.
type HealthTracker struct {
	mu      sync.Mutex
	fails   int
	hosts   map[string]*HostHealth
	changed chan struct{}
}

// NewHealthTracker returns a tracker for upstreams with Caddy's health_fails.
func NewHealthTracker(fails int, upstreams []string) *HealthTracker {
	h := &HealthTracker{fails: fails, hosts: map[string]*HostHealth{}, changed: make(chan struct{})}
	for _, u := range upstreams {
		h.hosts[u] = &HostHealth{Healthy: true}
	}
	return h
}

type caddyLogLine struct {
	Logger string `json:"logger"`
	Msg    string `json:"msg"`
	Host   string `json:"host"`
}

// Consume reads Caddy's JSON log until r ends.
func (h *HealthTracker) Consume(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var l caddyLogLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Logger != healthLogger {
			continue
		}
		switch {
		case l.Msg == healthUpMsg:
			h.observe(l.Host, true)
		case healthFailMsgs[l.Msg]:
			h.observe(l.Host, false)
		}
	}
	// Drain the rest so Caddy never blocks on a full pipe.
	_, _ = io.Copy(io.Discard, r)
}

func (h *HealthTracker) observe(host string, up bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.hosts[host]
	if !ok {
		return
	}
	was := s.Healthy
	if up {
		if !s.Healthy {
			s.Healthy = true
			s.Ins++
		}
		s.fails = 0
	} else {
		s.FailedChecks++
		if s.Healthy {
			s.fails++
			if s.fails >= h.fails {
				s.Healthy = false
				s.Outs++
				s.fails = 0
			}
		}
	}
	if was != s.Healthy || !up {
		close(h.changed)
		h.changed = make(chan struct{})
	}
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

// CacheDir is where the rehearsal keeps what it builds once per machine (the
// pinned Caddy).
func CacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cache dir: %w", err)
	}
	return filepath.Join(base, "mythex-rehearsal"), nil
}
