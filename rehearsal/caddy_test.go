package rehearsal

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

var (
	caddyOnce sync.Once
	caddyBin  string
	caddyErr  error
)

// testCaddy finds (or builds, once per test binary) the pinned Caddy.
func testCaddy(t *testing.T) string {
	t.Helper()
	caddyOnce.Do(func() {
		dir, err := CacheDir()
		if err != nil {
			caddyErr = err
			return
		}
		caddyBin, caddyErr = FindCaddy(context.Background(), dir)
	})
	require.NoError(t, caddyErr, "the rehearsal needs Caddy %s: on PATH, or Go and the module proxy to build it", CaddyVersion)
	return caddyBin
}

// oddTiming differs from Prod in every field the balancer reads, so a config
// that took a number from anywhere but its argument would show it.
func oddTiming() infra.Timing {
	t := infra.Prod().Scaled(0.1)
	t.HealthCheckInterval = 700 * time.Millisecond
	t.HealthCheckTimeout = 300 * time.Millisecond
	t.UnhealthyThreshold = 3
	t.HealthyThreshold = 4
	t.LBIdleTimeout = 9 * time.Second
	return t
}

// TestCaddyConfigAsCaddyReadsIt adapts the generated Caddyfile with the real
// Caddy and checks its JSON: what Caddy will do, not what we wrote.
func TestCaddyConfigAsCaddyReadsIt(t *testing.T) {
	bin := testCaddy(t)
	tm := oddTiming()
	dir := t.TempDir()
	file := filepath.Join(dir, "Caddyfile")
	ups := []string{"127.0.0.1:10001", "127.0.0.1:10002"}
	require.NoError(t, os.WriteFile(file, []byte(CaddyConfig(tm, 18080, ups, dir)), 0o644))
	out, err := exec.Command(bin, "adapt", "--config", file, "--adapter", "caddyfile").Output()
	require.NoError(t, err)

	var cfg struct {
		Admin struct {
			Disabled bool `json:"disabled"`
		} `json:"admin"`
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Listen      []string `json:"listen"`
					IdleTimeout int64    `json:"idle_timeout"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	require.NoError(t, json.Unmarshal(out, &cfg), "%s", out)
	assert.True(t, cfg.Admin.Disabled, "admin API off: nothing listens but the balancer")
	require.Len(t, cfg.Apps.HTTP.Servers, 1, "%s", out)
	for name, srv := range cfg.Apps.HTTP.Servers {
		assert.Equal(t, []string{"127.0.0.1:18080"}, srv.Listen, "server %s listens on loopback only", name)
		assert.Equal(t, int64(tm.LBIdleTimeout), srv.IdleTimeout, "server %s client idle timeout", name)
	}
	rp := findReverseProxy(t, out)
	assert.Equal(t, infra.HealthPath, rp.HealthChecks.Active.URI)
	assert.Equal(t, int64(tm.HealthCheckInterval), rp.HealthChecks.Active.Interval)
	assert.Equal(t, int64(tm.HealthCheckTimeout), rp.HealthChecks.Active.Timeout)
	assert.Equal(t, infra.HealthyStatus, rp.HealthChecks.Active.ExpectStatus)
	assert.Equal(t, tm.UnhealthyThreshold, rp.HealthChecks.Active.Fails)
	assert.Equal(t, tm.HealthyThreshold, rp.HealthChecks.Active.Passes)
	assert.Empty(t, rp.HealthChecks.Passive, "no passive checks: only the active ones, as the ALB")
	assert.Equal(t, int64(tm.LBIdleTimeout), rp.Transport.KeepAlive.IdleTimeout, "upstream idle timeout")
	assert.Equal(t, int64(tm.LBIdleTimeout), rp.Transport.ResponseHeaderTimeout, "silent upstream answered 504")
	if assert.NotNil(t, rp.LoadBalancing) {
		assert.Zero(t, rp.LoadBalancing.Retries, "no retries")
		assert.Zero(t, rp.LoadBalancing.TryDuration, "no retries")
	}
	var dials []string
	for _, u := range rp.Upstreams {
		dials = append(dials, u.Dial)
	}
	assert.Equal(t, []string{"127.0.0.1:10001", "127.0.0.1:10002"}, dials)
}

type reverseProxyJSON struct {
	Handler   string `json:"handler"`
	Upstreams []struct {
		Dial string `json:"dial"`
	} `json:"upstreams"`
	LoadBalancing *struct {
		Retries     int   `json:"retries"`
		TryDuration int64 `json:"try_duration"`
	} `json:"load_balancing"`
	HealthChecks struct {
		Active struct {
			URI          string `json:"uri"`
			Interval     int64  `json:"interval"`
			Timeout      int64  `json:"timeout"`
			ExpectStatus int    `json:"expect_status"`
			Passes       int    `json:"passes"`
			Fails        int    `json:"fails"`
		} `json:"active"`
		Passive json.RawMessage `json:"passive"`
	} `json:"health_checks"`
	Transport struct {
		KeepAlive struct {
			IdleTimeout int64 `json:"idle_timeout"`
		} `json:"keep_alive"`
		ResponseHeaderTimeout int64 `json:"response_header_timeout"`
	} `json:"transport"`
}

// findReverseProxy walks Caddy's adapted JSON for the one reverse_proxy
// handler, wherever the adapter nested it.
func findReverseProxy(t *testing.T, raw []byte) reverseProxyJSON {
	t.Helper()
	var tree any
	require.NoError(t, json.Unmarshal(raw, &tree))
	var found []any
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "reverse_proxy" {
				found = append(found, v)
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(tree)
	require.Len(t, found, 1, "one reverse_proxy handler in %s", raw)
	b, err := json.Marshal(found[0])
	require.NoError(t, err)
	var rp reverseProxyJSON
	require.NoError(t, json.Unmarshal(b, &rp))
	return rp
}

// upstream is a loopback server whose health can be switched and whose
// listener can be closed and reopened on the same port, as a container's is
// across a deploy.
type upstream struct {
	name    string
	addr    string
	healthy atomic.Bool
	served  atomic.Int64
	mu      sync.Mutex
	srv     *http.Server
}

func newUpstream(t *testing.T, name string) *upstream {
	t.Helper()
	u := &upstream{name: name}
	u.healthy.Store(true)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u.addr = l.Addr().String()
	u.serve(l)
	t.Cleanup(u.stop)
	return u
}

func (u *upstream) serve(l net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc(infra.HealthPath, func(w http.ResponseWriter, _ *http.Request) {
		if u.healthy.Load() {
			w.WriteHeader(infra.HealthyStatus)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/about", func(w http.ResponseWriter, _ *http.Request) {
		u.served.Add(1)
		_, _ = io.WriteString(w, u.name)
	})
	srv := &http.Server{Handler: mux}
	u.mu.Lock()
	u.srv = srv
	u.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

// stop closes the listener and every connection at once: a process gone.
func (u *upstream) stop() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.srv != nil {
		_ = u.srv.Close()
		u.srv = nil
	}
}

func (u *upstream) restart(t *testing.T) {
	t.Helper()
	l, err := net.Listen("tcp", u.addr)
	require.NoError(t, err, "reopen %s", u.addr)
	u.serve(l)
}

// ask sends n requests through the balancer and returns how many each
// upstream answered and how many came back with each status.
func ask(t *testing.T, b *Balancer, n int) (byBody map[string]int, byStatus map[int]int) {
	t.Helper()
	byBody, byStatus = map[string]int{}, map[int]int{}
	for range n {
		resp, err := http.Get(b.URL() + "/about")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		byStatus[resp.StatusCode]++
		if resp.StatusCode == http.StatusOK {
			byBody[string(body)]++
		}
	}
	return byBody, byStatus
}

// TestBalancerFollowsHealthChecks runs the real Caddy in front of two
// loopback upstreams and checks the three things the rehearsal relies on:
// HealthTracker's verdicts match where Caddy really routes; an upstream
// taken out can vanish without a single failed request; and an upstream that
// vanishes while still in rotation gives 502s, never retried elsewhere.
func TestBalancerFollowsHealthChecks(t *testing.T) {
	bin := testCaddy(t)
	// Checks every 500 ms, each allowed 300 ms: quick, yet no check times out
	// on a busy machine.
	tm := infra.Prod().Scaled(0.1)
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	ctx := context.Background()
	lb, err := StartBalancer(ctx, bin, "lb1", t.TempDir(), tm, []string{a.addr, b.addr})
	require.NoError(t, err)
	t.Cleanup(lb.Stop)
	wait := 10 * (tm.WorstCaseDetection() + tm.Reentry())
	isOut := func(h HostHealth) bool { return !h.Healthy }
	isIn := func(h HostHealth) bool { return h.Healthy }

	byBody, byStatus := ask(t, lb, 20)
	assert.Equal(t, map[int]int{200: 20}, byStatus)
	assert.Equal(t, map[string]int{"a": 10, "b": 10}, byBody, "round robin over both")

	// Drain a: health fails, a keeps serving. Caddy takes it out.
	a.healthy.Store(false)
	h, err := lb.Health.Await(ctx, a.addr, wait, isOut)
	require.NoError(t, err, "Caddy never took a out: %+v", h)
	assert.Equal(t, 1, h.Outs)
	assert.GreaterOrEqual(t, h.FailedChecks, tm.UnhealthyThreshold, "out after health_fails failed checks")
	_, byStatus = ask(t, lb, 20)
	assert.Equal(t, map[int]int{200: 20}, byStatus)
	before := a.served.Load()
	byBody, _ = ask(t, lb, 20)
	assert.Equal(t, map[string]int{"b": 20}, byBody, "once out, a gets nothing")
	assert.Equal(t, before, a.served.Load())

	// a's process goes away: nobody notices.
	a.stop()
	_, byStatus = ask(t, lb, 20)
	assert.Equal(t, map[int]int{200: 20}, byStatus, "an upstream out of rotation can vanish")

	// a comes back healthy: in again after health_passes passes.
	a.healthy.Store(true)
	a.restart(t)
	h, err = lb.Health.Await(ctx, a.addr, wait, isIn)
	require.NoError(t, err, "Caddy never put a back: %+v", h)
	assert.Equal(t, 1, h.Outs)
	assert.Equal(t, 1, h.Ins)
	byBody, _ = ask(t, lb, 20)
	assert.Equal(t, 10, byBody["a"], "a back in rotation: %v", byBody)

	// b vanishes while in rotation: its share comes back 502, not retried on a.
	b.stop()
	_, byStatus = ask(t, lb, 20)
	got, ok := lb.Health.Get(b.addr)
	require.True(t, ok)
	if got.Healthy {
		assert.Equal(t, 10, byStatus[http.StatusBadGateway], "refused connections are 502s: %v", byStatus)
		assert.Equal(t, 10, byStatus[http.StatusOK], "%v", byStatus)
	} else {
		// A check raced the requests and took b out; at least the first
		// request to b must have been a 502.
		assert.Positive(t, byStatus[http.StatusBadGateway], "refused connections are 502s: %v", byStatus)
	}
}

func TestStartBalancerReportsCaddyFailure(t *testing.T) {
	tm := infra.Prod().Scaled(0.05)
	fake := filepath.Join(t.TempDir(), "caddy")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\necho 'Error: config is broken' >&2\nexit 1\n"), 0o755))
	_, err := StartBalancer(context.Background(), fake, "lb1", t.TempDir(), tm, []string{"127.0.0.1:1"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "balancer lb1 exited before listening")
	assert.Contains(t, err.Error(), "config is broken", "Caddy's own words reach the error")
}

func TestHealthTrackerMirrorsCaddy(t *testing.T) {
	line := func(msg, host string) string {
		return `{"level":"info","logger":"` + healthLogger + `","msg":"` + msg + `","host":"` + host + `"}` + "\n"
	}
	const x, y = "127.0.0.1:1", "127.0.0.1:2"
	tests := []struct {
		name  string
		fails int
		log   string
		want  HostHealth
	}{
		{"starts healthy", 2, "", HostHealth{Healthy: true}},
		{"one failure is not enough", 2, line("HTTP request failed", x), HostHealth{Healthy: true, FailedChecks: 1, fails: 1}},
		{"out at health_fails", 2, line("HTTP request failed", x) + line("unexpected status code", x), HostHealth{Outs: 1, FailedChecks: 2}},
		{"failures while out change nothing", 2, strings.Repeat(line("unexpected status code", x), 5), HostHealth{Outs: 1, FailedChecks: 5}},
		{"back in on host is up", 2, strings.Repeat(line("unexpected status code", x), 2) + line("host is up", x), HostHealth{Healthy: true, Outs: 1, Ins: 1, FailedChecks: 2}},
		{"another host's failures are not ours", 2, strings.Repeat(line("HTTP request failed", y), 3), HostHealth{Healthy: true}},
		{"other loggers are ignored", 1, `{"logger":"http.log.error","msg":"HTTP request failed","host":"` + x + `"}` + "\n", HostHealth{Healthy: true}},
		{"non-JSON lines are ignored", 1, "caddy is starting\n", HostHealth{Healthy: true}},
		{"threshold three", 3, strings.Repeat(line("HTTP request failed", x), 2), HostHealth{Healthy: true, FailedChecks: 2, fails: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHealthTracker(tt.fails, []string{x, y})
			h.Consume(strings.NewReader(tt.log))
			got, ok := h.Get(x)
			require.True(t, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestHealthTrackerAwait(t *testing.T) {
	const x = "127.0.0.1:1"
	h := NewHealthTracker(1, []string{x})
	r, w := io.Pipe()
	go h.Consume(r)
	done := make(chan error, 1)
	go func() {
		_, err := h.Await(context.Background(), x, time.Minute, func(s HostHealth) bool { return !s.Healthy })
		done <- err
	}()
	_, err := io.WriteString(w, `{"logger":"`+healthLogger+`","msg":"HTTP request failed","host":"`+x+`"}`+"\n")
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.NoError(t, w.Close())

	_, err = h.Await(context.Background(), x, time.Millisecond, func(s HostHealth) bool { return s.Healthy })
	assert.True(t, errors.Is(err, errTimeout), "%v", err)
	_, err = h.Await(context.Background(), "127.0.0.1:9", time.Minute, func(HostHealth) bool { return true })
	assert.ErrorContains(t, err, "not an upstream")
}
