package rehearsal

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

// slowWork is a server whose /work answers after ?ms= milliseconds and
// notes when each request of at least longMs began and ended; the health
// path always passes.
type slowWork struct {
	addr   string
	longMs int
	// long receives, without blocking, each time a long request begins.
	long  chan struct{}
	mu    sync.Mutex
	spans [][2]time.Time
}

func newSlowWork(t *testing.T, longMs int) *slowWork {
	t.Helper()
	w := &slowWork{longMs: longMs, long: make(chan struct{}, 1)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	w.addr = l.Addr().String()
	mux := http.NewServeMux()
	mux.HandleFunc(infra.HealthPath, func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(infra.HealthyStatus) })
	mux.HandleFunc("/work", func(rw http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		start := time.Now()
		if n >= w.longMs {
			select {
			case w.long <- struct{}{}:
			default:
			}
		}
		time.Sleep(time.Duration(n) * time.Millisecond)
		if n >= w.longMs {
			w.mu.Lock()
			w.spans = append(w.spans, [2]time.Time{start, time.Now()})
			w.mu.Unlock()
		}
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return w
}

// spanned counts the long requests that began before from and ended after to.
func (w *slowWork) spanned(from, to time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, s := range w.spans {
		if s[0].Before(from) && s[1].After(to) {
			n++
		}
	}
	return n
}

// TestReloadFidelity pins what the transition rehearsal relies on when it
// reloads a node mid-run, as `pulumi up` changes a live target group:
// health as the node knew it is kept (the ALB keeps its targets' health),
// no request is dropped or refused, not even one in flight, the node's log
// stays whole, and the new numbers are the ones the node then lives by.
func TestReloadFidelity(t *testing.T) {
	bin := testHAProxy(t)
	version := HAProxyVersion(bin)
	tm := fidelityTiming()
	ctx := context.Background()
	isOut := func(h HostHealth) bool { return !h.Healthy }
	isIn := func(h HostHealth) bool { return h.Healthy }

	t.Run("a server out of rotation stays out, and its checks go on", func(t *testing.T) {
		t.Parallel()
		a, b := newUpstream(t, "a"), newUpstream(t, "b")
		lb := startTestBalancer(t, tm, a.addr, b.addr)
		a.healthy.Store(false)
		_, err := lb.Health.Await(ctx, a.addr, 10*tm.WorstCaseDetection(), isOut)
		require.NoError(t, err)

		slower := tm
		slower.HealthCheckInterval = 2 * tm.HealthCheckInterval
		require.NoError(t, lb.Reload(ctx, slower))
		served := a.served.Load()
		byBody, byStatus := ask(t, lb, 20)
		assert.Equal(t, map[int]int{http.StatusOK: 20}, byStatus)
		assert.Equal(t, map[string]int{"b": 20}, byBody, "%s: a server out before the reload gets nothing after it", version)
		assert.Equal(t, served, a.served.Load())
		h, _ := lb.Health.Get(a.addr)
		assert.Equal(t, HostHealth{Outs: 1, FailedChecks: h.FailedChecks}, h, "no UP logged for a: the node never put it back")

		a.healthy.Store(true)
		h, err = lb.Health.Await(ctx, a.addr, 10*slower.Reentry(), isIn)
		require.NoError(t, err, "%s: the reloaded node never checked a back in: %+v", version, h)
		byBody, _ = ask(t, lb, 20)
		assert.Equal(t, 10, byBody["a"], "a back in rotation after the healthy threshold: %v", byBody)
	})

	t.Run("no request is dropped or refused, not even one in flight, and the log stays whole", func(t *testing.T) {
		t.Parallel()
		// Long requests outlast a reload by far, and the balancer waits for
		// them (idle timeout).
		const longMs = 2000
		base := tm
		base.LBIdleTimeout = 2 * longMs * time.Millisecond
		w := newSlowWork(t, longMs)
		lb := startTestBalancer(t, base, w.addr)
		l, err := StartLoad(ctx, LoadConfig{
			Targets: []string{lb.URL()},
			Mix: []Kind{
				{Method: http.MethodGet, Path: "/work?ms=10", Weight: 3},
				{Method: http.MethodPost, Path: "/work?ms=10", Body: 100, Weight: 1},
				{Method: http.MethodGet, Path: "/work?ms=" + strconv.Itoa(longMs), Weight: 1},
			},
			Rate: 40, RequestTimeout: time.Minute, MaxRequests: 1 << 20, MaxDuration: 5 * time.Second,
		})
		require.NoError(t, err)
		// Two reloads, each while a long request is in flight, back and forth
		// between two intervals.
		other := base
		other.HealthCheckInterval = 2 * base.HealthCheckInterval
		var windows [][2]time.Time
		for _, next := range []infra.Timing{other, base} {
			select { // a long request that began earlier may be over
			case <-w.long:
			default:
			}
			select {
			case <-w.long:
			case <-time.After(10 * time.Second):
				t.Fatal("no long request began")
			}
			from := time.Now()
			require.NoError(t, lb.Reload(ctx, next))
			windows = append(windows, [2]time.Time{from, time.Now()})
			t.Logf("reload took %v", windows[len(windows)-1][1].Sub(from))
		}
		<-l.Done()
		spanning := 0
		for _, win := range windows {
			spanning += w.spanned(win[0], win[1])
		}
		got := l.Counts()
		assert.Equal(t, got.Requests, got.OK, "%s: every request through two reloads answered 2xx: %+v %v", version, got, l.Errors())
		assert.Zero(t, got.ClientErrors, "%s: no connection refused or cut: %v", version, l.Errors())
		assert.Positive(t, spanning, "a long request was in flight across a reload, and finished")
		require.NoError(t, lb.Log.Await(ctx, got.Requests, time.Minute), "every answer logged, by the old workers too")
		assert.Equal(t, l.ByMethod(), lb.Log.ALB(), "the node's log agrees with the load across the reloads")
	})

	t.Run("the reloaded node takes a server out at its new interval", func(t *testing.T) {
		t.Parallel()
		u := newUpstream(t, "a")
		lb := startTestBalancer(t, tm, u.addr)
		slow := tm
		slow.HealthCheckInterval = 4 * tm.HealthCheckInterval
		require.NoError(t, lb.Reload(ctx, slow))
		start := time.Now()
		u.healthy.Store(false)
		h, err := lb.Health.Await(ctx, u.addr, 10*slow.WorstCaseDetection(), isOut)
		require.NoError(t, err, "%+v", h)
		took := time.Since(start)
		// The first failed check comes within an interval, the rest one
		// interval apart: never sooner than (threshold − 1) new intervals,
		// which is past the old numbers' worst case.
		require.Greater(t, slow.HealthCheckInterval*time.Duration(slow.UnhealthyThreshold-1), tm.WorstCaseDetection(), "the test's two timings tell apart")
		assert.GreaterOrEqual(t, took, slow.HealthCheckInterval*time.Duration(slow.UnhealthyThreshold-1)-50*time.Millisecond,
			"%s: out after %v: the node still checks at the old interval %v", version, took, tm.HealthCheckInterval)
		assert.LessOrEqual(t, took, slow.WorstCaseDetection()+time.Second, "%s: out after %v", version, took)
	})

	t.Run("a timing the node cannot take leaves it as it was", func(t *testing.T) {
		t.Parallel()
		u := newUpstream(t, "a")
		lb := startTestBalancer(t, tm, u.addr)
		before, err := lb.procs(ctx)
		require.NoError(t, err)
		bad := tm
		bad.HealthCheckInterval = 0
		err = lb.Reload(ctx, bad)
		require.Error(t, err)
		assert.ErrorContains(t, err, "balancer lb1: reload: ")
		assert.ErrorContains(t, err, "HealthCheckInterval 0s")
		after, err := lb.procs(ctx)
		require.NoError(t, err)
		assert.Equal(t, before, after, "the same worker, no reload attempted")
		_, byStatus := ask(t, lb, 5)
		assert.Equal(t, map[int]int{http.StatusOK: 5}, byStatus)
	})
}

func TestParseShowProc(t *testing.T) {
	const header = "#<PID>          <type>          <reloads>       <uptime>        <version>\n"
	tests := []struct {
		name, out string
		want      masterProcs
		err       string
	}{
		{"one worker", header + "16611           master          0 [failed: 0]   0d00h10m07s     2.6.12\n# workers\n16646           worker          0               0d00h10m06s     2.6.12\n# programs\n",
			masterProcs{Worker: 16646}, ""},
		{"mid-reload: the old worker is listed apart", header + "16611           master          1 [failed: 0]   0d00h10m10s     2.6.12\n# workers\n4940            worker          0               0d00h00m00s     2.6.12\n# old workers\n16646           worker          1               0d00h10m09s     2.6.12\n# programs\n",
			masterProcs{Worker: 4940}, ""},
		{"a refused reload", header + "16611           master          2 [failed: 1]   0d00h10m10s     2.6.12\n# workers\n16646           worker          1               0d00h10m09s     2.6.12\n",
			masterProcs{Failed: 1, Worker: 16646}, ""},
		{"no worker yet", header + "16611           master          1 [failed: 0]   0d00h10m10s     2.6.12\n# workers\n# old workers\n16646           worker          1               0d00h10m09s     2.6.12\n",
			masterProcs{}, ""},
		{"no master", "# workers\n16646 worker 0 0d 2.6\n", masterProcs{}, "no master"},
		{"no reload count", "16611 master 0 0d 2.6\n", masterProcs{}, "no reload count"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseShowProc(tt.out)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseServersState(t *testing.T) {
	const head = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n"
	got, err := parseServersState(head +
		"3 targets 1 127.0.0.1:19001 127.0.0.1 0 0 1 1 1 17 2 0 6 0 0 0 - 19001 - 0 0 - - 0\n" +
		"3 targets 2 127.0.0.1:19002 127.0.0.1 2 0 1 1 8 15 3 3 6 0 0 0 - 19002 - 0 0 - - 0\n\n")
	require.NoError(t, err)
	assert.Equal(t, map[string]serverState{
		"127.0.0.1:19001": {Op: 0, Health: 0},
		"127.0.0.1:19002": {Op: 2, Health: 3},
	}, got)
	assert.Equal(t, "DOWN (check counter 0, admin 0x0)", got["127.0.0.1:19001"].String())

	for name, bad := range map[string]string{
		"empty":          "",
		"version 2":      "2\n# srv_name srv_op_state srv_admin_state srv_check_health\nx 2 0 3\n",
		"no server":      head,
		"missing column": "1\n# srv_name srv_op_state srv_admin_state\nx 2 0\n",
		"short line":     head + "3 targets 1 x 127.0.0.1 2\n",
		"not a number":   head + "3 targets 1 x 127.0.0.1 up 0 1 1 8 15 3 3 6 0 0 0 - 19002 - 0 0 - - 0\n",
	} {
		_, err := parseServersState(bad)
		assert.Error(t, err, name)
	}
}

// The master CLI asked while HAProxy's master re-executes itself: the first
// connection is reset (accepted by the master that then re-executed), the
// second closed unanswered, the third answered. cli asks until it gets the
// answer; a fidelity run failed on the reset ("read: connection reset by
// peer") when the node, busy, re-executed after accepting the question.
func TestCLIAsksAgainWhileTheMasterReexecutes(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	const answer = "#<PID> <type> <reloads> <uptime> <version>\n1 master 0 [failed: 0] 0d00h00m01s 2.6.12\n"
	var asked []string
	var mu sync.Mutex
	go func() {
		for n := 0; ; n++ {
			c, err := l.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 64)
			k, _ := c.Read(buf)
			mu.Lock()
			asked = append(asked, string(buf[:k]))
			mu.Unlock()
			switch n {
			case 0: // reset: the master re-executed under it
				_ = c.(*net.TCPConn).SetLinger(0)
			case 1: // closed without a word
			default:
				_, _ = c.Write([]byte(answer))
			}
			_ = c.Close()
		}
	}()
	b := &Balancer{master: l.Addr().String(), done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := b.cli(ctx, "show proc")
	require.NoError(t, err)
	assert.Equal(t, answer, out)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"show proc\n", "show proc\n", "show proc\n"}, asked, "asked three times, the same question")

	// A master that never comes back: asked again until the context ends
	// (the refusals are not the end), and the error says so.
	silent := &Balancer{master: "127.0.0.1:1", done: make(chan struct{})}
	const wait = 300 * time.Millisecond
	short, cancelShort := context.WithTimeout(context.Background(), wait)
	defer cancelShort()
	start := time.Now()
	_, err = silent.cli(short, "show proc")
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "master CLI")
	assert.GreaterOrEqual(t, time.Since(start), wait, "asked until the context ended: %v", err)
}
