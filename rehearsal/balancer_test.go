package rehearsal

import (
	"bufio"
	"context"
	"errors"
	"fmt"
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
	"github.com/mythex/infra/internal/needs"
)

// testHAProxy returns the haproxy binary, failing at once with the install
// command when it is missing.
func testHAProxy(t *testing.T) string {
	t.Helper()
	needs.Have(t, needs.HAProxy)
	bin, err := FindHAProxy()
	require.NoError(t, err)
	return bin
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

// TestHAProxyConfigAsHAProxyReadsIt checks the generated config with the
// real HAProxy (haproxy -c) and pins every line the ALB's behaviour rests on.
func TestHAProxyConfigAsHAProxyReadsIt(t *testing.T) {
	bin := testHAProxy(t)
	tm := oddTiming()
	cfg, err := HAProxyConfig(tm, 18080, []string{"127.0.0.1:10001", "127.0.0.1:10002"}, NodeChecks{})
	require.NoError(t, err)
	// In the node's directory, as StartBalancer lays it out: the server
	// state a first start reads is there.
	dir := t.TempDir()
	file := filepath.Join(dir, configFile)
	require.NoError(t, os.WriteFile(file, []byte(cfg), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, serverStateFile), []byte(emptyServerState), 0o644))
	check := exec.Command(bin, "-c", "-f", file)
	check.Dir = dir
	out, err := check.CombinedOutput()
	require.NoError(t, err, "haproxy -c: %s", out)
	assert.NotContains(t, string(out), "WARNING", "HAProxy takes the config without a warning")

	for _, want := range []string{
		"bind 127.0.0.1:18080",
		"option httpchk GET " + infra.HealthPath,
		fmt.Sprintf("http-check expect status %d", infra.HealthyStatus),
		"default-server check inter 700ms fall 3 rise 4 pool-purge-delay 3000ms",
		"timeout check 300ms",
		"timeout server 9000ms",
		"timeout http-keep-alive 9000ms",
		"retries 0",
		"no option redispatch",
		"http-reuse always",
		"server 127.0.0.1:10001 127.0.0.1:10001",
		"server 127.0.0.1:10002 127.0.0.1:10002",
		// Health survives a reload (Reload).
		"server-state-file " + serverStateFile,
		"load-server-state-from-file global",
	} {
		assert.Contains(t, cfg, want)
	}
	assert.NotContains(t, cfg, "observe", "no passive checks: only the active ones, as the ALB")
}

// TestHAProxyConfigSetsNodesApart: a named node names itself in every
// check, a lagging one sends its checks to its shims, and HAProxy takes
// both; a plain node's config has neither.
func TestHAProxyConfigSetsNodesApart(t *testing.T) {
	bin := testHAProxy(t)
	ups := []string{"127.0.0.1:10001", "127.0.0.1:10002"}
	plain, err := HAProxyConfig(oddTiming(), 18080, ups, NodeChecks{})
	require.NoError(t, err)
	assert.NotContains(t, plain, "http-check send")
	assert.NotContains(t, plain, " addr ")

	cfg, err := HAProxyConfig(oddTiming(), 18080, ups, NodeChecks{Name: "lb2", Via: map[string]string{ups[1]: "127.0.0.1:20002"}})
	require.NoError(t, err)
	dir := t.TempDir()
	file := filepath.Join(dir, configFile)
	require.NoError(t, os.WriteFile(file, []byte(cfg), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, serverStateFile), []byte(emptyServerState), 0o644))
	check := exec.Command(bin, "-c", "-f", file)
	check.Dir = dir
	out, err := check.CombinedOutput()
	require.NoError(t, err, "haproxy -c: %s", out)
	assert.NotContains(t, string(out), "WARNING")
	assert.Contains(t, cfg, "\thttp-check send hdr X-Mythex-Node lb2\n\thttp-check expect status 200\n", "the name is sent, then the answer judged")
	assert.Contains(t, cfg, "server 127.0.0.1:10001 127.0.0.1:10001\n", "an upstream without a shim is checked directly")
	assert.Contains(t, cfg, "server 127.0.0.1:10002 127.0.0.1:10002 addr 127.0.0.1 port 20002\n")

	_, err = HAProxyConfig(oddTiming(), 18080, ups, NodeChecks{Name: "lb 2", Via: map[string]string{"127.0.0.1:9": "127.0.0.1:20002", ups[0]: "nowhere"}})
	require.Error(t, err)
	for _, want := range []string{`node name "lb 2"`, "for 127.0.0.1:9, which is not an upstream", `checks of 127.0.0.1:10001 via "nowhere"`} {
		assert.ErrorContains(t, err, want)
	}
}

func TestHAProxyConfigRefusesBadTiming(t *testing.T) {
	tm := oddTiming()
	tm.HealthCheckInterval = 1500 * time.Microsecond
	tm.LBIdleTimeout = 0
	tm.HealthyThreshold = 0
	_, err := HAProxyConfig(tm, 18080, []string{"127.0.0.1:1"}, NodeChecks{})
	require.Error(t, err)
	for _, want := range []string{"HealthCheckInterval 1.5ms", "LBIdleTimeout 0s", "HealthyThreshold 0"} {
		assert.ErrorContains(t, err, want)
	}
	_, err = HAProxyConfig(oddTiming(), 18080, nil, NodeChecks{})
	assert.ErrorContains(t, err, "no upstream")
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
	// checked is closed once a connection that served a health check has
	// closed: its answer was written, so no later stop can fail it.
	checked     chan struct{}
	checkedOnce sync.Once
}

func newUpstream(t *testing.T, name string) *upstream {
	t.Helper()
	u := &upstream{name: name, checked: make(chan struct{})}
	u.healthy.Store(true)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u.addr = l.Addr().String()
	u.serve(l)
	t.Cleanup(u.stop)
	return u
}

func (u *upstream) serve(l net.Listener) {
	var checks sync.Map // remote addresses of connections that served a check
	mux := http.NewServeMux()
	mux.HandleFunc(infra.HealthPath, func(w http.ResponseWriter, r *http.Request) {
		checks.Store(r.RemoteAddr, true)
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
	srv := &http.Server{Handler: mux, ConnState: func(c net.Conn, s http.ConnState) {
		if _, ok := checks.Load(c.RemoteAddr().String()); ok && s == http.StateClosed {
			u.checkedOnce.Do(func() { close(u.checked) })
		}
	}}
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

func startTestBalancer(t *testing.T, tm infra.Timing, ups ...string) *Balancer {
	t.Helper()
	lb, err := StartBalancer(context.Background(), testHAProxy(t), "lb1", t.TempDir(), tm, ups)
	require.NoError(t, err)
	t.Cleanup(lb.Stop)
	return lb
}

// TestBalancerFollowsHealthChecks runs the real HAProxy in front of two
// loopback upstreams and checks what the rehearsal relies on:
// HealthTracker's verdicts match where the node really routes; an upstream
// taken out can vanish without a single failed request; an upstream back in
// gets its share again.
func TestBalancerFollowsHealthChecks(t *testing.T) {
	// Checks every 500 ms, each allowed 300 ms: quick, yet no check times out
	// on a busy machine.
	tm := infra.Prod().Scaled(0.1)
	a, b := newUpstream(t, "a"), newUpstream(t, "b")
	ctx := context.Background()
	lb := startTestBalancer(t, tm, a.addr, b.addr)
	wait := 10 * (tm.WorstCaseDetection() + tm.Reentry())
	isOut := func(h HostHealth) bool { return !h.Healthy }
	isIn := func(h HostHealth) bool { return h.Healthy }

	byBody, byStatus := ask(t, lb, 20)
	assert.Equal(t, map[int]int{200: 20}, byStatus)
	assert.Equal(t, map[string]int{"a": 10, "b": 10}, byBody, "round robin over both")

	// Drain a: health fails, a keeps serving. The node takes it out.
	a.healthy.Store(false)
	h, err := lb.Health.Await(ctx, a.addr, wait, isOut)
	require.NoError(t, err, "the node never took a out: %+v", h)
	assert.Equal(t, 1, h.Outs)
	assert.Positive(t, h.FailedChecks)
	before := a.served.Load()
	byBody, byStatus = ask(t, lb, 20)
	assert.Equal(t, map[int]int{200: 20}, byStatus)
	assert.Equal(t, map[string]int{"b": 20}, byBody, "once out, a gets nothing")
	assert.Equal(t, before, a.served.Load())

	// a's process goes away: nobody notices.
	a.stop()
	_, byStatus = ask(t, lb, 20)
	assert.Equal(t, map[int]int{200: 20}, byStatus, "an upstream out of rotation can vanish")

	// a comes back healthy: in again after the healthy threshold.
	a.healthy.Store(true)
	a.restart(t)
	h, err = lb.Health.Await(ctx, a.addr, wait, isIn)
	require.NoError(t, err, "the node never put a back: %+v", h)
	assert.Equal(t, 1, h.Outs)
	assert.Equal(t, 1, h.Ins)
	byBody, _ = ask(t, lb, 20)
	assert.Equal(t, 10, byBody["a"], "a back in rotation: %v", byBody)

	// Every answer is in the node's own log, as the client saw it.
	require.NoError(t, lb.Log.Await(ctx, 80, wait))
	assert.Equal(t, map[string]Counts{"GET": {Requests: 80, OK: 80}}, lb.Log.ALB())
}

// fidelityTiming is the production timing scaled down, with checks slow
// enough that none lands inside a fidelity test's few requests and an idle
// timeout short enough to wait out.
func fidelityTiming() infra.Timing {
	t := infra.Prod().Scaled(0.2)
	t.LBIdleTimeout = time.Second
	return t
}

// checkedAtStart is tm with the node checking each server once, as it
// starts, and not again within a subtest; that check is allowed long
// enough never to time out on a busy machine.
func checkedAtStart(tm infra.Timing) infra.Timing {
	tm.HealthCheckInterval = time.Minute
	tm.HealthCheckTimeout = 5 * time.Second
	return tm
}

// send sends one request on a fresh connection and returns the status.
func send(t *testing.T, c *http.Client, method, url string) int {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{"order":42}`)
	}
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	resp, err := c.Do(req)
	require.NoError(t, err, "%s %s", method, url)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

// freshClient never reuses a client-side connection, so only the node's
// upstream pooling is at play.
func freshClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
}

// dropSecond is a backend that answers the first request of each
// connection with keep-alive, and closes the connection when the second one
// arrives, without answering: a server closing a connection the balancer
// just reused. Health checks come on their own connections and pass.
func dropSecond(t *testing.T) (addr string, dropped *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	dropped = &atomic.Int64{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				r := bufio.NewReader(c)
				req, err := http.ReadRequest(r)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
				if _, err := http.ReadRequest(r); err == nil {
					dropped.Add(1)
				}
			}()
		}
	}()
	return l.Addr().String(), dropped
}

// TestFidelity pins each ALB behaviour the rehearsal's proof relies on,
// through the rehearsal's own balancer node. Each row names the AWS
// troubleshooting entry it reproduces; a row that fails after an upgrade
// says the balancer no longer answers as the ALB does.
func TestFidelity(t *testing.T) {
	bin := testHAProxy(t)
	version := HAProxyVersion(bin)
	tm := fidelityTiming()
	ctx := context.Background()

	t.Run("a reused connection the server closes is a 502, for GET and POST", func(t *testing.T) {
		addr, dropped := dropSecond(t)
		lb := startTestBalancer(t, tm, addr)
		c := freshClient()
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			// The first request opens an upstream connection the node pools;
			// the second reuses it and the server closes it: "the target
			// closed the connection with a TCP RST or a TCP FIN while the
			// load balancer had an outstanding request to the target".
			assert.Equal(t, http.StatusOK, send(t, c, method, lb.URL()+"/work"), "%s: %s, first request", version, method)
			assert.Equal(t, http.StatusBadGateway, send(t, c, method, lb.URL()+"/work"),
				"%s: %s on a reused connection the server closed: the ALB answers 502 and never re-sends", version, method)
		}
		assert.Equal(t, int64(2), dropped.Load(), "the server saw each second request once: no retry")
		require.NoError(t, lb.Log.Await(ctx, 4, time.Minute))
		assert.Equal(t, map[string]Counts{
			"GET":  {Requests: 2, OK: 1, BadGateway: 1},
			"POST": {Requests: 2, OK: 1, BadGateway: 1},
		}, lb.Log.ALB(), "the node's log classifies them the same way")
	})

	t.Run("the rehearsal's load sees those 502s, for GET and POST", func(t *testing.T) {
		addr, _ := dropSecond(t)
		lb := startTestBalancer(t, tm, addr)
		l, err := StartLoad(ctx, LoadConfig{
			Targets: []string{lb.URL()},
			Mix: []Kind{
				// Two and one: every kind lands both first and second on an
				// upstream connection.
				{Method: http.MethodGet, Path: "/work", Weight: 2},
				{Method: http.MethodPost, Path: "/work", Body: 100, Weight: 1},
			},
			Rate: 20, RequestTimeout: time.Minute, MaxRequests: 30, MaxDuration: time.Minute,
		})
		require.NoError(t, err)
		<-l.Done()
		got := l.ByMethod()
		for _, m := range []string{http.MethodGet, http.MethodPost} {
			assert.Positive(t, got[m].BadGateway, "%s: %s through the load generator: %+v %v", version, m, got[m], l.Errors())
			assert.Zero(t, got[m].ClientErrors, "%s: %s: no request cut without an answer: %v", version, m, l.Errors())
		}
		require.NoError(t, lb.Log.Await(ctx, 30, time.Minute))
		assert.Equal(t, got, lb.Log.ALB(), "the node's log agrees with the load")
	})

	t.Run("a closed port is a 502", func(t *testing.T) {
		u := newUpstream(t, "a")
		once := checkedAtStart(tm)
		lb := startTestBalancer(t, once, u.addr)
		c := freshClient()
		require.Equal(t, http.StatusOK, send(t, c, http.MethodGet, lb.URL()+"/about"))
		// The node's one check is answered before the port closes: no check
		// fails in the test, and the server stays in service. (At start a
		// single failed check would take it out.)
		select {
		case <-u.checked:
		case <-time.After(once.HealthCheckTimeout):
			t.Fatalf("the node's first check was not answered within %v", once.HealthCheckTimeout)
		}
		// Gone before any check notices: "the load balancer received a TCP
		// RST from the target when attempting to establish a connection".
		u.stop()
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			assert.Equal(t, http.StatusBadGateway, send(t, c, method, lb.URL()+"/about"), "%s: %s to a refused port", version, method)
		}
		h, _ := lb.Health.Get(u.addr)
		require.True(t, h.Healthy, "the node took the server out, so its answers were not a refused connection's: %+v", h)
		require.NoError(t, lb.Log.Await(ctx, 3, time.Minute))
		assert.Equal(t, int64(2), lb.Log.ALB()["GET"].BadGateway+lb.Log.ALB()["POST"].BadGateway, "the log says 502 too (termination SC)")
	})

	t.Run("a server that never answers is a 504 after the idle timeout", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		mux := http.NewServeMux()
		mux.HandleFunc(infra.HealthPath, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(infra.HealthyStatus) })
		mux.HandleFunc("/", func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		srv := &http.Server{Handler: mux}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
		lb := startTestBalancer(t, tm, l.Addr().String())
		start := time.Now()
		assert.Equal(t, http.StatusGatewayTimeout, send(t, freshClient(), http.MethodGet, lb.URL()+"/work"), "%s: silent server", version)
		assert.GreaterOrEqual(t, time.Since(start), tm.LBIdleTimeout, "not before the idle timeout")
	})

	t.Run("no healthy server is a 503", func(t *testing.T) {
		u := newUpstream(t, "a")
		u.healthy.Store(false)
		lb := startTestBalancer(t, tm, u.addr)
		h, err := lb.Health.Await(ctx, u.addr, 10*tm.WorstCaseDetection(), func(h HostHealth) bool { return !h.Healthy })
		require.NoError(t, err, "%+v", h)
		assert.Equal(t, http.StatusServiceUnavailable, send(t, freshClient(), http.MethodGet, lb.URL()+"/about"), "%s: no healthy target", version)
		assert.Zero(t, u.served.Load(), "nothing reached the unhealthy server")
	})

	t.Run("idle upstream connections are closed after the idle timeout", func(t *testing.T) {
		closed := make(chan time.Time, 1)
		var served sync.Map // remote addresses of connections that served /work
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		mux := http.NewServeMux()
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != infra.HealthPath {
				served.Store(r.RemoteAddr, true)
			}
			w.WriteHeader(infra.HealthyStatus)
		})
		srv := &http.Server{Handler: mux, ConnState: func(c net.Conn, s http.ConnState) {
			// Only the connection that served /work: checks close their own.
			if _, ok := served.Load(c.RemoteAddr().String()); ok && s == http.StateClosed {
				select {
				case closed <- time.Now():
				default:
				}
			}
		}}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
		slow := checkedAtStart(tm) // no check connection in the way
		lb := startTestBalancer(t, slow, l.Addr().String())
		sent := time.Now()
		require.Equal(t, http.StatusOK, send(t, freshClient(), http.MethodGet, lb.URL()+"/work"))
		select {
		case at := <-closed:
			idle := at.Sub(sent)
			// The ALB closes it at the idle timeout: not much before (the
			// keep-alive race needs reuse near it), not long after (the app's
			// keep-alive need only outlast LBIdleTimeout).
			assert.GreaterOrEqual(t, idle, slow.LBIdleTimeout*9/10, "%s: the node closed an idle upstream connection well before the idle timeout", version)
			assert.Less(t, idle, slow.LBIdleTimeout*3/2, "%s: the node kept an idle upstream connection well past the idle timeout", version)
			t.Logf("upstream connection closed after %v idle (LBIdleTimeout %v)", idle, slow.LBIdleTimeout)
		case <-time.After(10 * slow.LBIdleTimeout):
			t.Fatalf("%s: an idle upstream connection still open after 10 × LBIdleTimeout", version)
		}
	})
}

func TestStartBalancerReportsFailure(t *testing.T) {
	tm := infra.Prod().Scaled(0.05)
	fake := filepath.Join(t.TempDir(), "haproxy")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\necho '[ALERT] config is broken' >&2\nexit 1\n"), 0o755))
	_, err := StartBalancer(context.Background(), fake, "lb1", t.TempDir(), tm, []string{"127.0.0.1:1"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "balancer lb1 exited before listening")
	assert.Contains(t, err.Error(), "config is broken", "HAProxy's own words reach the error")
}

func TestHealthTrackerReadsHAProxy(t *testing.T) {
	const x, y = "127.0.0.1:1", "127.0.0.1:2"
	down := "Server " + backendName + "/" + x + " is DOWN, reason: Layer7 wrong status, code: 503. 1 active and 0 backup servers left.\n"
	up := "Server " + backendName + "/" + x + " is UP, reason: Layer7 check passed, code: 200. 2 active and 0 backup servers online.\n"
	fail := "Health check for server " + backendName + "/" + x + " failed, reason: Layer4 connection problem, status: 1/2 UP.\n"
	reset := "Health check for server " + backendName + "/" + x + " failed, reason: Socket error, info: \"Connection reset by peer\", check duration: 0ms, status: 0/2 DOWN.\n"
	timeout := "Health check for server " + backendName + "/" + x + " failed, reason: Layer7 timeout, check duration: 602ms, status: 0/2 DOWN.\n"
	drained := "Health check for server " + backendName + "/" + x + " failed, reason: Layer7 wrong status, code: 503, info: \"Service Unavailable\", check duration: 0ms, status: 1/2 UP.\n"
	tests := []struct {
		name string
		log  string
		want HostHealth
	}{
		{"starts healthy", "", HostHealth{Healthy: true}},
		{"a failed check alone changes nothing", fail, HostHealth{Healthy: true, FailedChecks: 1}},
		{"out on DOWN, late: the server no longer answered", fail + down, HostHealth{Outs: 1, LateOuts: 1, FailedChecks: 1}},
		{"out on DOWN, in time: the server answered 503", drained + down, HostHealth{Outs: 1, FailedChecks: 1}},
		{"the check that takes it out is what counts", drained + fail + down, HostHealth{Outs: 1, LateOuts: 1, FailedChecks: 2}},
		{"a reset is late too", drained + reset + down, HostHealth{Outs: 1, LateOuts: 1, FailedChecks: 2}},
		{"a timeout is not late: a loaded host may be slow", timeout + down, HostHealth{Outs: 1, FailedChecks: 1}},
		{"DOWN twice is one transition", drained + down + down, HostHealth{Outs: 1, FailedChecks: 1}},
		{"back in on UP", drained + down + up, HostHealth{Healthy: true, Outs: 1, Ins: 1, FailedChecks: 1}},
		{"another host's lines are not ours", strings.ReplaceAll(down, x, y), HostHealth{Healthy: true}},
		{"another backend's lines are ignored", strings.ReplaceAll(down, backendName+"/", "other/"), HostHealth{Healthy: true}},
		{"access lines are ignored", accessLogTag + " GET " + x + " 200 --\n", HostHealth{Healthy: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := NewHealthTracker([]string{x, y})
			h.Consume(strings.NewReader(tt.log))
			got, ok := h.Get(x)
			require.True(t, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestHealthTrackerAwait(t *testing.T) {
	const x = "127.0.0.1:1"
	h := NewHealthTracker([]string{x})
	r, w := io.Pipe()
	go h.Consume(r)
	done := make(chan error, 1)
	go func() {
		_, err := h.Await(context.Background(), x, time.Minute, func(s HostHealth) bool { return !s.Healthy })
		done <- err
	}()
	_, err := io.WriteString(w, "Server "+backendName+"/"+x+" is DOWN. 0 active servers left.\n")
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.NoError(t, w.Close())

	_, err = h.Await(context.Background(), x, time.Millisecond, func(s HostHealth) bool { return s.Healthy })
	assert.True(t, errors.Is(err, errTimeout), "%v", err)
	_, err = h.Await(context.Background(), "127.0.0.1:9", time.Minute, func(HostHealth) bool { return true })
	assert.ErrorContains(t, err, "not an upstream")
}

func TestAnswerALBStatus(t *testing.T) {
	tests := []struct {
		line string
		want int
	}{
		{accessLogTag + " GET 127.0.0.1:1 200 --", 200},
		{accessLogTag + " GET 127.0.0.1:1 502 SC", 502},
		{accessLogTag + " POST 127.0.0.1:1 502 SH", 502},
		{accessLogTag + " GET 127.0.0.1:1 503 sC", 504},
		{accessLogTag + " GET 127.0.0.1:1 504 sH", 504},
		{accessLogTag + " GET <NOSRV> 503 SC", 503},
		{accessLogTag + " GET 127.0.0.1:1 404 --", 404},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			a, ok := ParseAnswer(tt.line)
			require.True(t, ok)
			assert.Equal(t, tt.want, a.ALBStatus())
		})
	}
	for _, bad := range []string{"", "answer GET x", "answer GET x two SC", "Server targets/x is UP"} {
		_, ok := ParseAnswer(bad)
		assert.False(t, ok, "%q", bad)
	}
}
