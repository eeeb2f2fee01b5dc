package rehearsal

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mythex/infra/drain/draintest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// statusServer answers every request with code and counts the connections
// it accepts.
func statusServer(t *testing.T, code int) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(code)
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s, &conns
}

// closedURL is a loopback URL nothing listens on: every request to it is
// refused, until the test ends.
func closedURL(t *testing.T) string {
	t.Helper()
	addr, closeAddr, err := draintest.RefusedAddr()
	require.NoError(t, err)
	t.Cleanup(func() { _ = closeAddr() })
	return "http://" + addr
}

// getOnly is a mix of one kind: GET path.
func getOnly(path string) []Kind {
	return []Kind{{Method: http.MethodGet, Path: path, Weight: 1}}
}

func TestLoadClassifiesEveryResponse(t *testing.T) {
	const perTarget = 10
	var targets []string
	for _, code := range []int{200, 502, 503, 504, 418} {
		s, _ := statusServer(t, code)
		targets = append(targets, s.URL)
	}
	targets = append(targets, closedURL(t))

	l, err := StartLoad(context.Background(), LoadConfig{
		Targets:        targets,
		Mix:            getOnly("/work"),
		Rate:           200,
		RequestTimeout: 5 * time.Second,

		MaxRequests: perTarget * int64(len(targets)),
		MaxDuration: time.Minute,
	})
	require.NoError(t, err)
	select {
	case <-l.Done():
	case <-time.After(time.Minute):
		t.Fatal("load did not stop at MaxRequests")
	}
	got := l.Stop()
	assert.Equal(t, Counts{
		Requests:     perTarget * 6,
		OK:           perTarget,
		BadGateway:   perTarget,
		Unavailable:  perTarget,
		Timeout:      perTarget,
		OtherStatus:  perTarget,
		ClientErrors: perTarget,
	}, got)
	assert.Equal(t, int64(2*perTarget), got.ReachedNothing(), "502s and 504s reached nothing")
	assert.Equal(t, map[string]Counts{"GET": {Requests: perTarget * 6, OK: perTarget, BadGateway: perTarget, Unavailable: perTarget,
		Timeout: perTarget, OtherStatus: perTarget, ClientErrors: perTarget}}, l.ByMethod())
	assert.Equal(t, Counts{Requests: perTarget, BadGateway: perTarget}, l.ByTarget()[targets[1]], "counted per target too")
	var refused, teapot int64
	for msg, n := range l.Errors() {
		if msg == "GET: status 418" {
			teapot += n
		} else {
			refused += n
		}
	}
	assert.Equal(t, int64(perTarget), teapot, "unexpected statuses are named: %v", l.Errors())
	assert.Equal(t, int64(perTarget), refused, "client errors are named: %v", l.Errors())
}

// TestLoadMixesKinds sends a weighted mix and counts each method apart;
// every kind reaches every target, and a POST carries its body.
func TestLoadMixesKinds(t *testing.T) {
	var gets, posts, bodyBytes atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		bodyBytes.Add(n)
		if r.Method == http.MethodPost {
			posts.Add(1)
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		gets.Add(1)
	})
	a, b := httptest.NewServer(h), httptest.NewServer(h)
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	const n = 60
	l, err := StartLoad(context.Background(), LoadConfig{
		Targets: []string{a.URL, b.URL},
		Mix: []Kind{
			{Method: http.MethodGet, Path: "/work", Weight: 2},
			{Method: http.MethodPost, Path: "/work", Body: 100, Weight: 1},
		},
		Rate: 500, RequestTimeout: 5 * time.Second, MaxRequests: n, MaxDuration: time.Minute,
	})
	require.NoError(t, err)
	<-l.Done()
	assert.Equal(t, map[string]Counts{
		"GET":  {Requests: 40, OK: 40},
		"POST": {Requests: 20, BadGateway: 20},
	}, l.ByMethod())
	assert.Equal(t, int64(20*100), bodyBytes.Load(), "every POST carried its body")
	for _, u := range []string{a.URL, b.URL} {
		assert.Equal(t, Counts{Requests: 30, OK: 20, BadGateway: 10}, l.ByTarget()[u], "%s got its share of each kind", u)
	}
}

// TestLoadQuietSpells checks the rate drops to QuietRate for the last Quiet
// of every QuietEvery.
func TestLoadQuietSpells(t *testing.T) {
	c := LoadConfig{Rate: 100, Quiet: 300 * time.Millisecond, QuietEvery: time.Second, QuietRate: 5}
	assert.Equal(t, 100.0, c.rateAt(0))
	assert.Equal(t, 100.0, c.rateAt(699*time.Millisecond))
	assert.Equal(t, 5.0, c.rateAt(700*time.Millisecond))
	assert.Equal(t, 5.0, c.rateAt(999*time.Millisecond))
	assert.Equal(t, 100.0, c.rateAt(time.Second))
	assert.Equal(t, 100.0, LoadConfig{Rate: 100}.rateAt(time.Hour), "no quiet spells")
}

func TestLoadQuietLeft(t *testing.T) {
	c := LoadConfig{Quiet: 300 * time.Millisecond, QuietEvery: time.Second}
	assert.Equal(t, time.Duration(0), c.quietLeft(699*time.Millisecond))
	assert.Equal(t, 300*time.Millisecond, c.quietLeft(700*time.Millisecond))
	assert.Equal(t, time.Millisecond, c.quietLeft(1999*time.Millisecond))
	assert.Equal(t, time.Duration(0), c.quietLeft(2*time.Second))
	assert.Equal(t, time.Duration(0), LoadConfig{}.quietLeft(time.Hour), "no quiet spells")
}

// TestLoadProbeIdlesConnectionsForTheGap checks the probe's shape on a
// server that notes when each request arrives: sent in the spells only,
// bursts of Width requests together, each burst Gap (within the race
// window, plus what scheduling adds) after the previous one was answered,
// as many as fit in a spell.
func TestLoadProbeIdlesConnectionsForTheGap(t *testing.T) {
	const (
		gap   = 150 * time.Millisecond
		width = 3
	)
	var mu sync.Mutex
	var probeAt, workAt []time.Time
	s := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/probe" {
			probeAt = append(probeAt, now)
		} else {
			workAt = append(workAt, now)
		}
	}))
	t.Cleanup(s.Close)
	cfg := LoadConfig{
		Targets: []string{s.URL}, Mix: getOnly("/work"), Rate: 100,
		Quiet: 700 * time.Millisecond, QuietEvery: 1500 * time.Millisecond, QuietRate: 0,
		Probe:          &Probe{Gap: gap, Width: width, Kinds: getOnly("/probe")},
		RequestTimeout: time.Second, MaxRequests: 1 << 40, MaxDuration: 2850 * time.Millisecond,
	}
	l, err := StartLoad(context.Background(), cfg)
	require.NoError(t, err)
	<-l.Done()
	mu.Lock()
	defer mu.Unlock()
	// Arrivals on the load's own clock, the one its spells are cut by.
	since := func(at []time.Time) []time.Duration {
		d := make([]time.Duration, len(at))
		for i, a := range at {
			d[i] = a.Sub(l.start)
		}
		return d
	}
	probes, work := since(probeAt), since(workAt)
	// Handlers take the time before the lock: put arrivals in order.
	slices.Sort(probes)

	// Bursts: requests that arrive well within a gap of each other.
	var bursts [][]time.Duration
	for i, at := range probes {
		if i == 0 || at-probes[i-1] > gap/2 {
			bursts = append(bursts, nil)
		}
		bursts[len(bursts)-1] = append(bursts[len(bursts)-1], at)
	}
	// Two spells (0.8–1.5 s, 2.3–2.85 s, the second cut by MaxDuration),
	// each with a burst at its start and one a gap after the other while a
	// whole gap fits: 0.7 s holds 4 gaps, the cut spell 3 (another would
	// come at 2.89 s at the earliest, after the run). A busy machine may fit
	// fewer, never more.
	require.GreaterOrEqual(t, len(bursts), 2, "bursts at %v", bursts)
	require.LessOrEqual(t, len(bursts), 5+4, "bursts at %v", bursts)
	for i, b := range bursts {
		assert.Len(t, b, width, "burst %d: one request per server behind the target", i)
		prev := bursts[max(i-1, 0)]
		if i == 0 || cfg.quietLeft(prev[0]) < cfg.quietLeft(b[0]) {
			// The first burst of a spell is sent once the spell has begun,
			// with all of it to come.
			assert.NotZero(t, cfg.quietLeft(b[0]), "burst %d at %v is in a spell", i, b[0])
			continue
		}
		// A later one is sent only if, once the previous burst was
		// answered, more of the spell was left than its gap: that much
		// was left when the previous burst arrived. The burst itself may
		// land past the spell's end, on a late timer.
		last := prev[len(prev)-1]
		assert.Greater(t, cfg.quietLeft(last), gap-probeEarly, "burst %d: sent though a gap no longer fit after burst %d at %v", i, i-1, last)
		// Timers never fire early: the aim's lower edge holds on any
		// machine; its spread is TestProbeGapsSpanTheWindow's.
		idle := b[0] - last
		assert.GreaterOrEqual(t, idle, gap-probeEarly, "burst %d: no connection reused before the window", i)
	}
	// The mix sends nothing in a spell (QuietRate 0), but what it sent
	// just before one may arrive in it on a busy machine: a silent mix
	// leaves a few arrivals at a spell's start, a mix that kept its rate
	// would put Rate × the spells' length in them.
	var quiet time.Duration
	for d := time.Duration(0); d < cfg.MaxDuration; d += time.Millisecond {
		if cfg.quietLeft(d) > 0 {
			quiet += time.Millisecond
		}
	}
	kept := int(float64(cfg.Rate) * quiet.Seconds())
	var inSpells []time.Duration
	for _, at := range work {
		if cfg.quietLeft(at) > 0 {
			inSpells = append(inSpells, at)
		}
	}
	require.NotEmpty(t, work, "the mix ran")
	assert.LessOrEqual(t, len(inSpells), kept/4, "the mix falls silent in the spells; arrivals in them at %v", inSpells)
}

// TestProbeGapsSpanTheWindow: the gaps cover the measured race window (a
// request 1 ms before to 0.5 ms after the close) and stay within their bounds.
func TestProbeGapsSpanTheWindow(t *testing.T) {
	p := &Probe{Gap: 200 * time.Millisecond}
	lo, hi := time.Hour, time.Duration(0)
	for range 10000 {
		g := p.nextGap()
		require.GreaterOrEqual(t, g, p.Gap-probeEarly)
		require.Less(t, g, p.Gap+probeLate)
		lo, hi = min(lo, g), max(hi, g)
	}
	assert.LessOrEqual(t, lo, p.Gap-time.Millisecond, "reaches 1 ms early")
	assert.GreaterOrEqual(t, hi, p.Gap+time.Millisecond/2, "reaches 0.5 ms late")
}

// TestLoadProbeEndsWithTheRun: the probes stop when the run reaches
// MaxRequests, not only at MaxDuration.
func TestLoadProbeEndsWithTheRun(t *testing.T) {
	s, _ := statusServer(t, 200)
	l, err := StartLoad(context.Background(), LoadConfig{
		Targets: []string{s.URL}, Mix: getOnly("/work"), Rate: 100,
		Quiet: 50 * time.Millisecond, QuietEvery: 100 * time.Millisecond, QuietRate: 100,
		Probe:          &Probe{Gap: 10 * time.Millisecond, Width: 1, Kinds: getOnly("/probe")},
		RequestTimeout: time.Second, MaxRequests: 20, MaxDuration: time.Hour,
	})
	require.NoError(t, err)
	select {
	case <-l.Done():
	case <-time.After(time.Minute):
		t.Fatal("the probes ran on after MaxRequests")
	}
}

// TestLoadOpensAConnectionPerRequest: every request is the first on its
// client connection, where the balancer node answers as the ALB does (see
// StartLoad's transport).
func TestLoadOpensAConnectionPerRequest(t *testing.T) {
	s, conns := statusServer(t, 200)
	const n = 50
	l, err := StartLoad(context.Background(), LoadConfig{
		Targets: []string{s.URL}, Mix: getOnly("/about"), Rate: 200,
		RequestTimeout: 5 * time.Second, MaxRequests: n, MaxDuration: time.Minute,
	})
	require.NoError(t, err)
	<-l.Done()
	got := l.Stop()
	require.Equal(t, int64(n), got.OK, "all requests answered: %+v %v", got, l.Errors())
	assert.Equal(t, int64(n), conns.Load(), "connections opened for %d requests", n)
}

func TestLoadStopsAtMaxDuration(t *testing.T) {
	s, _ := statusServer(t, 200)
	l, err := StartLoad(context.Background(), LoadConfig{
		Targets: []string{s.URL}, Mix: getOnly("/work"), Rate: 50,
		RequestTimeout: time.Second, MaxRequests: 1 << 40, MaxDuration: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	select {
	case <-l.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("load ran past MaxDuration")
	}
	got := l.Stop()
	assert.Less(t, got.Requests, int64(1<<40))
	assert.Equal(t, got.Requests, got.OK)
}

func TestLoadFinishesInFlightRequestsOnStop(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		select {
		case started <- struct{}{}:
		default:
		}
		<-release
	}))
	t.Cleanup(s.Close)
	l, err := StartLoad(context.Background(), LoadConfig{
		Targets: []string{s.URL}, Mix: getOnly("/work"), Rate: 100,
		RequestTimeout: time.Minute, MaxRequests: 1, MaxDuration: time.Minute,
	})
	require.NoError(t, err)
	<-started
	stopped := make(chan Counts)
	go func() { stopped <- l.Stop() }()
	close(release)
	got := <-stopped
	assert.Equal(t, Counts{Requests: 1, OK: 1}, got, "a request in flight at Stop is answered and counted")
}

func TestLoadConfigValidate(t *testing.T) {
	good := LoadConfig{
		Targets: []string{"http://127.0.0.1:8080"}, Mix: getOnly("/work"), Rate: 1,
		RequestTimeout: time.Second, MaxRequests: 1, MaxDuration: time.Second,
	}
	tests := []struct {
		name    string
		edit    func(*LoadConfig)
		wantErr []string
	}{
		{"valid", func(*LoadConfig) {}, nil},
		{"off-machine target", func(c *LoadConfig) { c.Targets = []string{"http://10.0.0.1:80"} }, []string{`"http://10.0.0.1:80" must be http://127.0.0.1:<port>`}},
		{"name, not address", func(c *LoadConfig) { c.Targets = []string{"http://localhost:80"} }, []string{"localhost"}},
		{"https", func(c *LoadConfig) { c.Targets = []string{"https://127.0.0.1:443"} }, []string{"https://127.0.0.1:443"}},
		{"no targets", func(c *LoadConfig) { c.Targets = nil }, []string{"Targets is empty"}},
		{"everything wrong at once", func(c *LoadConfig) {
			*c = LoadConfig{Mix: []Kind{{Method: "PUT", Path: "work", Body: -1}}, Quiet: time.Second, QuietRate: -1, Probe: &Probe{Gap: probeEarly}}
		}, []string{
			"Targets is empty", `Mix[0].Method "PUT"`, `Mix[0].Path "work"`, "Mix[0].Body -1", "Mix[0].Weight 0", "QuietEvery 0s must exceed Quiet 1s", "QuietRate -1", "Rate 0", "RequestTimeout 0s", "MaxRequests 0", "MaxDuration 0s",
			"Probe.Gap 2ms must exceed 2ms", "Probe.Width 0 must be at least 1", "Probe.Kinds is empty",
		}},
		{"probe without quiet spells", func(c *LoadConfig) {
			c.Probe = &Probe{Gap: time.Second, Width: 1, Kinds: getOnly("/work")}
		}, []string{"Probe needs quiet spells (Quiet is 0)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.edit(&c)
			err := c.Validate()
			if tt.wantErr == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, want := range tt.wantErr {
				assert.Contains(t, err.Error(), want)
			}
			_, startErr := StartLoad(context.Background(), c)
			assert.Error(t, startErr, "StartLoad refuses what Validate refuses")
		})
	}
}

func TestCountsArithmetic(t *testing.T) {
	a := Counts{Requests: 10, OK: 5, BadGateway: 1, Unavailable: 1, Timeout: 1, OtherStatus: 1, ClientErrors: 1, Skipped: 2}
	b := Counts{Requests: 4, OK: 3, BadGateway: 1}
	assert.Equal(t, Counts{Requests: 6, OK: 2, Unavailable: 1, Timeout: 1, OtherStatus: 1, ClientErrors: 1, Skipped: 2}, a.Sub(b))
	assert.Equal(t, a, a.Sub(b).Add(b))
	assert.Equal(t, int64(2), a.ReachedNothing())
}

// TestLoadSnapshotIsOneInstant reads the load while its requests finish:
// in every snapshot the total, the sum per method and the sum per target
// are the same requests. Read one counter group after another, a request
// finishing in between is in one and not the other (a deploy's total once
// exceeded its per-method sum by one).
func TestLoadSnapshotIsOneInstant(t *testing.T) {
	ok, _ := statusServer(t, http.StatusOK)
	const n = 6000
	l, err := StartLoad(context.Background(), LoadConfig{
		Targets: []string{ok.URL, closedURL(t)},
		Mix: []Kind{
			{Method: http.MethodGet, Path: "/work", Weight: 1},
			{Method: http.MethodPost, Path: "/work", Body: 10, Weight: 1},
		},
		Rate: 2000, RequestTimeout: 5 * time.Second, MaxRequests: n, MaxDuration: time.Minute,
	})
	require.NoError(t, err)
	sum := func(m map[string]Counts) Counts {
		var c Counts
		for _, v := range m {
			c = c.Add(v)
		}
		return c
	}
	snapshots := 0
	for done := false; !done; snapshots++ {
		select {
		case <-l.Done():
			done = true
		default:
		}
		s := l.Snapshot()
		total := s.Total
		total.Skipped = 0 // not split per method or target
		require.Equal(t, total, sum(s.ByMethod), "snapshot %d: the total is the sum per method", snapshots)
		require.Equal(t, total, sum(s.ByTarget), "snapshot %d: the total is the sum per target", snapshots)
	}
	final := l.Snapshot().Total
	assert.Equal(t, int64(n), final.Requests+final.Skipped, "every request the run sent is counted")
	t.Logf("%d snapshots, %d requests", snapshots, final.Requests)
}
