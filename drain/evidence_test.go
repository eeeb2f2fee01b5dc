package drain_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain"
)

// evidenceConfig is a drain whose evidence rules play out in a few seconds:
// checks a second apart, two to take a node out, a half-second quiet
// window, and a fixed drain well past the earliest evidence end (1.5 s).
func evidenceConfig() drain.Config {
	c := prod()
	c.HealthCheckInterval = time.Second
	c.HealthCheckTimeout = 500 * time.Millisecond
	c.UnhealthyThreshold = 2
	c.DrainQuiet = 500 * time.Millisecond
	c.QuietRequests = 5
	c.Drain = 5 * time.Second
	c.MaxDrain = 7 * time.Second
	c.ShutdownTimeout = time.Second
	return c
}

// client asks the server as a balancer node does; every call is bounded.
type client struct {
	t    *testing.T
	addr string
	hc   *http.Client
}

func newClient(t *testing.T, addr string) *client {
	return &client{t: t, addr: addr, hc: &http.Client{Timeout: wait}}
}

// get sends GET path with the given headers and returns the status, or 0
// when the connection failed (the listener is closed).
func (c *client) get(path string, headers map[string]string) int {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.addr+path, nil)
	require.NoError(c.t, err)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// check is one health check from the node named name ("" sends none).
func (c *client) check(name string) int {
	h := map[string]string{}
	if name != "" {
		h[drain.HeaderNode] = name
	}
	return c.get("/healthz", h)
}

// traffic sends n real requests at once-off pace: enough for silence to count.
func (c *client) traffic(n int) {
	c.t.Helper()
	for range n {
		require.Equal(c.t, http.StatusOK, c.get("/work", nil))
	}
}

// before is what the server sees of the balancer before its drain: each
// node checks, one interval later the drain's first round will come, and
// requests arrive in between.
func (c *client) before(nodes []string, requests int, interval time.Duration) {
	c.t.Helper()
	c.checkRounds(nodes, 1, 0)
	time.Sleep(interval)
	c.traffic(requests)
}

// checkRounds has every node check rounds times, one interval apart, as
// balancer nodes do; it returns when the last round is answered.
func (c *client) checkRounds(nodes []string, rounds int, interval time.Duration) {
	c.t.Helper()
	for i := range rounds {
		if i > 0 {
			time.Sleep(interval)
		}
		for _, n := range nodes {
			c.check(n)
		}
	}
}

// keepSending sends a real request every gap until stop is closed and
// returns how many were not answered 200.
func (c *client) keepSending(gap time.Duration, stop <-chan struct{}) <-chan int {
	failed := make(chan int, 1)
	go func() {
		bad := 0
		for {
			select {
			case <-stop:
				failed <- bad
				return
			case <-time.After(gap):
			}
			if c.get("/work", nil) != http.StatusOK {
				bad++
			}
		}
	}()
	return failed
}

func TestEvidenceEndsTheDrainOnceEveryNodeFailedAndRequestsStopped(t *testing.T) {
	t.Parallel()
	cfg := evidenceConfig()
	r := start(t, cfg, routes(newGate()))
	c := newClient(t, r.addr)
	nodes := []string{"lb1", "lb2", "lb3"}

	c.before(nodes, cfg.QuietRequests, cfg.HealthCheckInterval)
	r.srv.StartDrain()
	waitFor(t, r.srv.Entered(drain.Draining), "draining")
	c.checkRounds(nodes, cfg.UnhealthyThreshold, cfg.HealthCheckInterval)
	waitFor(t, r.srv.Entered(drain.ShuttingDown), "shutting down")

	drained := r.change(t, drain.ShuttingDown)
	assert.Equal(t, drain.ReasonEvidence, drained.Reason)
	assert.GreaterOrEqual(t, drained.Lasted, cfg.EarliestEnd())
	assert.Less(t, drained.Lasted, cfg.Drain, "the evidence was complete, yet the fixed drain ran")
	ev := r.srv.Evidence()
	assert.Empty(t, ev.Weak)
	require.Len(t, ev.Nodes, len(nodes))
	for _, n := range ev.Nodes {
		assert.GreaterOrEqual(t, n.Failed, cfg.UnhealthyThreshold, n.Name)
	}
	// The drain's last log line names the rule and how long it took.
	recs := r.logs.records(t, "phase shutting-down")
	require.Len(t, recs, 1)
	assert.Equal(t, drain.ReasonEvidence, recs[0]["reason"])
	assert.NotEmpty(t, recs[0]["lasted"])
	assert.Contains(t, recs[0]["nodes"], "node lb3: 2 failed")
}

func TestEvidenceNeverEndsTheDrainBeforeTheEarliestANodeCanAct(t *testing.T) {
	t.Parallel()
	cfg := evidenceConfig()
	r := start(t, cfg, routes(newGate()))
	c := newClient(t, r.addr)

	c.before([]string{"lb1"}, cfg.QuietRequests, cfg.HealthCheckInterval)
	r.srv.StartDrain()
	waitFor(t, r.srv.Entered(drain.Draining), "draining")
	// Checks just far enough apart to be one node's: the evidence is
	// complete long before a node checking at the interval could act.
	c.checkRounds([]string{"lb1"}, cfg.UnhealthyThreshold, cfg.HealthCheckInterval*6/10)
	waitFor(t, r.srv.Entered(drain.ShuttingDown), "shutting down")

	drained := r.change(t, drain.ShuttingDown)
	assert.Equal(t, drain.ReasonEvidence, drained.Reason)
	assert.GreaterOrEqual(t, drained.Lasted, cfg.EarliestEnd(), "ended before any node could have acted on its checks")
}

func TestRequestsStillArrivingExtendTheDrain(t *testing.T) {
	t.Parallel()
	cfg := evidenceConfig()
	r := start(t, cfg, routes(newGate()))
	c := newClient(t, r.addr)

	c.before([]string{"lb1", "lb2"}, cfg.QuietRequests, cfg.HealthCheckInterval)
	r.srv.StartDrain()
	waitFor(t, r.srv.Entered(drain.Draining), "draining")
	stop := make(chan struct{})
	failed := c.keepSending(cfg.DrainQuiet/5, stop)
	waitFor(t, r.srv.Extended(), "extended")
	// A node that keeps sending past the fixed drain is still served.
	time.Sleep(cfg.DrainQuiet * 2)
	close(stop)
	assert.Zero(t, <-failed, "a request sent while the drain was extended was not served")
	waitFor(t, r.srv.Entered(drain.ShuttingDown), "shutting down")

	drained := r.change(t, drain.ShuttingDown)
	assert.Equal(t, drain.ReasonRequestsStopped, drained.Reason)
	assert.Greater(t, drained.Lasted, cfg.Drain)
	assert.Less(t, drained.Lasted, cfg.MaxDrain, "requests stopped, yet the drain ran to its bound")
	assert.Len(t, r.logs.records(t, "drain extended: requests still arriving after the drain; serving until they stop"), 1)
}

func TestTheDrainStopsAtMaxDrainAndSaysSo(t *testing.T) {
	t.Parallel()
	cfg := evidenceConfig()
	r := start(t, cfg, routes(newGate()))
	c := newClient(t, r.addr)

	c.before([]string{"lb1", "lb2"}, cfg.QuietRequests, cfg.HealthCheckInterval)
	r.srv.StartDrain()
	waitFor(t, r.srv.Entered(drain.Draining), "draining")
	stop := make(chan struct{})
	failed := c.keepSending(cfg.DrainQuiet/5, stop)
	waitFor(t, r.srv.Entered(drain.ShuttingDown), "shutting down")
	close(stop)
	<-failed

	drained := r.change(t, drain.ShuttingDown)
	assert.Equal(t, drain.ReasonMaxDrain, drained.Reason)
	assert.GreaterOrEqual(t, drained.Lasted, cfg.MaxDrain)
	recs := r.logs.records(t, "drain cut at max drain: requests still arriving; the balancer is still sending here and will get 502s")
	require.Len(t, recs, 1)
	assert.Equal(t, "ERROR", recs[0]["level"])
	assert.Equal(t, cfg.MaxDrain.String(), recs[0]["max_drain"])
}

func TestWeakEvidenceFallsBackToTheFixedDrain(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		evidence bool
		nodes    []string
		requests int
		weak     string
	}{
		{"no balancer node seen", true, nil, 5, "no balancer node seen checking"},
		{"traffic too thin for silence to mean anything", true, []string{"lb1", "lb2"}, 4, "traffic too thin: 4 requests"},
		{"no traffic at all", true, []string{"lb1"}, 0, "traffic too thin: 0 requests"},
		{"the evidence drain is off", false, []string{"lb1", "lb2"}, 5, "evidence drain off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := evidenceConfig()
			cfg.Evidence = tt.evidence
			r := start(t, cfg, routes(newGate()))
			c := newClient(t, r.addr)

			c.before(tt.nodes, tt.requests, cfg.HealthCheckInterval)
			r.srv.StartDrain()
			waitFor(t, r.srv.Entered(drain.Draining), "draining")
			// Requests still arriving at the end of the drain do not extend
			// a drain whose evidence is weak.
			stop := make(chan struct{})
			sent := c.keepSending(cfg.DrainQuiet/2, stop)
			c.checkRounds(tt.nodes, cfg.UnhealthyThreshold, cfg.HealthCheckInterval)
			waitFor(t, r.srv.Entered(drain.ShuttingDown), "shutting down")
			close(stop)
			<-sent

			drained := r.change(t, drain.ShuttingDown)
			assert.Equal(t, drain.ReasonDrainElapsed, drained.Reason)
			assert.GreaterOrEqual(t, drained.Lasted, cfg.Drain, "weak evidence ended the drain early")
			assert.Less(t, drained.Lasted, cfg.Drain+cfg.DrainQuiet, "weak evidence extended the drain")
			assert.Contains(t, r.srv.Evidence().Weak, tt.weak)
			assert.Contains(t, r.logs.records(t, "phase shutting-down")[0]["weak"], tt.weak)
		})
	}
}

func TestPeersItCannotTellApartNeverCountAsOneNode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// checkers are the names each checker sends ("" none), all from
		// one loopback address, checking one interval apart each but
		// interleaved a quarter interval apart.
		checkers []string
		// self adds the service's own check between every round.
		self   bool
		reason string
		weak   string
	}{
		{"two nodes behind one address", []string{"", ""}, false, drain.ReasonDrainElapsed, "nodes cannot be told apart: checks too frequent from addr 127.0.0.1"},
		{"two nodes giving one name", []string{"lb1", "lb1"}, false, drain.ReasonDrainElapsed, "checks too frequent from node lb1"},
		{"two nodes naming themselves", []string{"lb1", "lb2"}, false, drain.ReasonEvidence, ""},
		{"the service's own check is no node", []string{"lb1"}, true, drain.ReasonEvidence, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := evidenceConfig()
			r := start(t, cfg, routes(newGate()))
			c := newClient(t, r.addr)
			round := func() {
				for i, n := range tt.checkers {
					if i > 0 {
						time.Sleep(cfg.HealthCheckInterval / 4)
					}
					c.check(n)
					if tt.self {
						c.get("/healthz", map[string]string{drain.HeaderSelfCheck: "1"})
					}
				}
			}
			round()
			time.Sleep(cfg.HealthCheckInterval)
			c.traffic(cfg.QuietRequests)
			r.srv.StartDrain()
			waitFor(t, r.srv.Entered(drain.Draining), "draining")
			for i := range cfg.UnhealthyThreshold {
				if i > 0 {
					time.Sleep(cfg.HealthCheckInterval)
				}
				round()
			}
			waitFor(t, r.srv.Entered(drain.ShuttingDown), "shutting down")

			drained := r.change(t, drain.ShuttingDown)
			assert.Equal(t, tt.reason, drained.Reason)
			ev := r.srv.Evidence()
			if tt.weak == "" {
				assert.Empty(t, ev.Weak)
				assert.Less(t, drained.Lasted, cfg.Drain)
				return
			}
			assert.Contains(t, ev.Weak, tt.weak)
			assert.GreaterOrEqual(t, drained.Lasted, cfg.Drain, "checkers it cannot tell apart ended the drain early")
			require.Len(t, ev.Nodes, 1, "one address or name is one peer")
			assert.True(t, ev.Nodes[0].Merged)
		})
	}
}

// A service no balancer fronts (nothing checks it, nothing is sent to it)
// has nobody to wait for: its drain ends at EarliestDrainEnd, not after the
// whole fixed drain. Anything that could be a balancer keeps the drain:
// a node's check, a request before the drain or during it, or a server too
// young for a node that checks it to have been seen yet.
func TestNothingWatchingEndsTheDrainAtTheEarliest(t *testing.T) {
	t.Parallel()
	cfg := evidenceConfig()
	// A node checking the server is seen within the detection time.
	window := cfg.HealthCheckInterval*time.Duration(cfg.UnhealthyThreshold) + cfg.HealthCheckTimeout
	tests := []struct {
		name string
		// young: the drain starts at once, before the detection time.
		young bool
		// before: what the server sees before its drain, in order.
		selfCheck, nodeCheck, request bool
		// during: a request arrives once the drain has begun.
		during bool
		want   string
	}{
		{name: "nothing checks or sends", want: drain.ReasonUnwatched},
		{name: "only the host's own checks", selfCheck: true, want: drain.ReasonUnwatched},
		{name: "a node checked, long before", nodeCheck: true, want: drain.ReasonDrainElapsed},
		{name: "a request before the drain", request: true, want: drain.ReasonDrainElapsed},
		{name: "a request during the drain", during: true, want: drain.ReasonDrainElapsed},
		{name: "too young to know", young: true, want: drain.ReasonDrainElapsed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := start(t, cfg, routes(newGate()))
			c := newClient(t, r.addr)
			if tt.selfCheck {
				c.get("/healthz", map[string]string{drain.HeaderSelfCheck: "docker"})
			}
			if tt.nodeCheck {
				c.check("lb1")
			}
			if tt.request {
				c.traffic(1)
			}
			if !tt.young {
				// The rule is about time passing with nothing seen: there
				// is no event to await.
				time.Sleep(window + cfg.HealthCheckInterval/10)
			}
			if tt.request {
				// Recent enough to count: within the detection time.
				c.traffic(1)
			}
			r.srv.StartDrain()
			waitFor(t, r.srv.Entered(drain.Draining), "draining")
			if tt.during {
				c.traffic(1)
			}
			waitFor(t, r.srv.Entered(drain.ShuttingDown), "shutting down")
			drained := r.change(t, drain.ShuttingDown)
			assert.Equal(t, tt.want, drained.Reason)
			if tt.want == drain.ReasonUnwatched {
				assert.GreaterOrEqual(t, drained.Lasted, cfg.EarliestEnd(), "never before the earliest a node can act")
				assert.Less(t, drained.Lasted, cfg.Drain, "not the whole fixed drain")
			} else {
				assert.GreaterOrEqual(t, drained.Lasted, cfg.Drain, "the fixed drain kept")
			}
			assert.Equal(t, tt.want, r.logs.records(t, "phase shutting-down")[0]["reason"])
		})
	}
}
