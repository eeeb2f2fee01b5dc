package drain_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain/draintest"

	"github.com/mythex/infra/drain"
	"github.com/mythex/infra/infra"
)

// wait bounds every wait on a phase or a request; reaching it is a failure,
// never part of a passing run.
const wait = 20 * time.Second

// logBuffer collects a Server's JSON log lines; the lifecycle and request
// goroutines write to it concurrently.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// records returns every log record whose msg is msg.
func (b *logBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "log line %q", line)
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// running is a Server serving on loopback, with what a test observes of it.
type running struct {
	srv     *drain.Server
	addr    string
	logs    *logBuffer
	served  chan error
	mu      sync.Mutex
	changes []drain.PhaseChange
}

func (r *running) phaseChanges() []drain.PhaseChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]drain.PhaseChange(nil), r.changes...)
}

// change returns the change into phase to, failing if there was none.
func (r *running) change(t *testing.T, to drain.Phase) drain.PhaseChange {
	t.Helper()
	for _, pc := range r.phaseChanges() {
		if pc.To == to {
			return pc
		}
	}
	require.Failf(t, "no phase change", "into %s; got %+v", to, r.phaseChanges())
	return drain.PhaseChange{}
}

func start(t *testing.T, cfg drain.Config, next http.Handler, opts ...drain.Option) *running {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &running{addr: ln.Addr().String(), logs: &logBuffer{}, served: make(chan error, 1)}
	logger := slog.New(slog.NewJSONHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts = append(opts, drain.WithLogger(logger), drain.OnPhase(func(pc drain.PhaseChange) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.changes = append(r.changes, pc)
	}))
	r.srv, err = drain.New(cfg, next, opts...)
	require.NoError(t, err)
	go func() { r.served <- r.srv.Serve(ln) }()
	t.Cleanup(func() {
		r.srv.SkipDrain()
		waitFor(t, r.srv.Entered(drain.Stopped), "stopped at cleanup")
	})
	return r
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(wait):
		require.FailNow(t, "timed out waiting", what)
	}
}

// gate is a handler that holds each request until released, and says when
// one has arrived: in-flight requests without timing guesses.
type gate struct {
	arrived  chan struct{}
	release  chan struct{}
	canceled chan struct{}
}

func newGate() *gate {
	return &gate{arrived: make(chan struct{}, 8), release: make(chan struct{}), canceled: make(chan struct{}, 8)}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.arrived <- struct{}{}
	select {
	case <-g.release:
		_, _ = io.WriteString(w, "done")
	case <-r.Context().Done():
		g.canceled <- struct{}{}
	}
}

// routes is the handler behind the drain in most tests: /work answers at
// once, /held waits at the gate, anything else is 404.
func routes(g *gate) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /work", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "worked") })
	mux.Handle("GET /held", g)
	return mux
}

// prod is the production drain config: the drain lasts long enough that
// nothing in a test races its end; tests end it with SkipDrain.
func prod() drain.Config { return infra.Prod().DrainConfig() }

func TestNewReportsEveryConfigProblem(t *testing.T) {
	tests := []struct {
		name    string
		cfg     drain.Config
		next    http.Handler
		wantErr []string
	}{
		{"production config is valid", prod(), http.NotFoundHandler(), nil},
		{"zero config", drain.Config{}, http.NotFoundHandler(), []string{
			`HealthPath "" must start with /`, "HealthyStatus 0 must be a 2xx status",
			"Drain 0s must be positive", "ShutdownTimeout 0s must be positive", "KeepAlive 0s must be positive",
		}},
		{"health status outside 2xx", func() drain.Config { c := prod(); c.HealthyStatus = 503; return c }(),
			http.NotFoundHandler(), []string{"HealthyStatus 503 must be a 2xx status"}},
		{"nil handler", prod(), nil, []string{"nil handler"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := drain.New(tt.cfg, tt.next)
			if tt.wantErr == nil {
				require.NoError(t, err)
				assert.Equal(t, drain.Serving, srv.Phase())
				return
			}
			require.Error(t, err)
			assert.Nil(t, srv)
			for _, want := range tt.wantErr {
				assert.Contains(t, err.Error(), want)
			}
		})
	}
}

func TestServingAnswersHealthAndRoutes(t *testing.T) {
	t.Parallel()
	r := start(t, prod(), routes(newGate()))
	c := dial(t, r.addr)
	tests := []struct {
		method, path string
		want         draintest.Answer
	}{
		{http.MethodGet, infra.HealthPath, draintest.Answer{Status: infra.HealthyStatus, Body: "ok"}},
		{http.MethodHead, infra.HealthPath, draintest.Answer{Status: infra.HealthyStatus}},
		{http.MethodPost, infra.HealthPath, draintest.Answer{Status: http.StatusMethodNotAllowed, Body: "method not allowed"}},
		{http.MethodGet, "/work", draintest.Answer{Status: http.StatusOK, Body: "worked"}},
		{http.MethodGet, "/nowhere", draintest.Answer{Status: http.StatusNotFound, Body: "404 page not found"}},
	}
	for _, tt := range tests {
		// All on one connection: while serving, nothing closes it.
		got, err := c.Do(tt.method, tt.path)
		require.NoError(t, err, "%s %s", tt.method, tt.path)
		assert.Equal(t, tt.want, got, "%s %s", tt.method, tt.path)
	}
	assert.Equal(t, drain.Serving, r.srv.Phase())
}

func TestDrainingFailsHealthButServesWork(t *testing.T) {
	t.Parallel()
	r := start(t, prod(), routes(newGate()))

	// Connections the balancer has pooled before the drain starts.
	kept := map[string]*draintest.Conn{}
	for _, path := range []string{infra.HealthPath, "/work"} {
		c := dial(t, r.addr)
		got, err := c.Get("/work")
		require.NoError(t, err)
		require.Equal(t, draintest.Answer{Status: http.StatusOK, Body: "worked"}, got)
		kept[path] = c
	}

	r.srv.StartDrain()
	waitFor(t, r.srv.Entered(drain.Draining), "draining")
	require.Equal(t, drain.Draining, r.srv.Phase())

	tests := []struct {
		name string
		conn func() *draintest.Conn
		path string
		want draintest.Answer
	}{
		{"health on a kept-alive connection", func() *draintest.Conn { return kept[infra.HealthPath] }, infra.HealthPath,
			draintest.Answer{Status: http.StatusServiceUnavailable, Close: true, Body: "draining"}},
		{"work on a kept-alive connection", func() *draintest.Conn { return kept["/work"] }, "/work",
			draintest.Answer{Status: http.StatusOK, Close: true, Body: "worked"}},
		{"health on a new connection", func() *draintest.Conn { return dial(t, r.addr) }, infra.HealthPath,
			draintest.Answer{Status: http.StatusServiceUnavailable, Close: true, Body: "draining"}},
		{"work on a new connection", func() *draintest.Conn { return dial(t, r.addr) }, "/work",
			draintest.Answer{Status: http.StatusOK, Close: true, Body: "worked"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.conn()
			got, err := c.Get(tt.path)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			// Connection: close is kept: the balancer's connection moves
			// away now, not when the listener closes under it.
			assert.True(t, closedByServer(t, c), "connection still open after a draining response")
		})
	}
	assert.Equal(t, drain.Draining, r.srv.Phase(), "the drain must still be running: its end is not what closed the connections")
}

func TestResponseStartedBeforeDrainClosesItsConnection(t *testing.T) {
	t.Parallel()
	g := newGate()
	r := start(t, prod(), routes(g))
	c := dial(t, r.addr)
	got := hold(t, c, g)

	r.srv.StartDrain()
	waitFor(t, r.srv.Entered(drain.Draining), "draining")
	close(g.release)

	assert.Equal(t, draintest.Answer{Status: http.StatusOK, Close: true, Body: "done"}, <-got)
	assert.True(t, closedByServer(t, c))
}

func TestDrainLastsItsConfiguredTimeThenRefusesConnections(t *testing.T) {
	// Not parallel: it dials the port its listener closed, and a listener
	// of a test beside it can take that port at once (seen at -test.parallel
	// 32): the dial would reach it.
	timing := infra.Prod().Scaled(0.1)
	r := start(t, timing.DrainConfig(), routes(newGate()))

	r.srv.StartDrain()
	waitFor(t, r.srv.Entered(drain.ShuttingDown), "shutting down")

	// What the balancer sees after the drain: nothing listens.
	_, err := net.Dial("tcp", r.addr)
	require.Error(t, err)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)

	waitFor(t, r.srv.Entered(drain.Stopped), "stopped")
	require.NoError(t, <-r.served)

	changes := r.phaseChanges()
	var order []drain.Phase
	for _, pc := range changes {
		order = append(order, pc.To)
	}
	require.Equal(t, []drain.Phase{drain.Draining, drain.ShuttingDown, drain.Stopped}, order)
	assert.Equal(t, drain.ReasonCalled, changes[0].Reason)

	drained := r.change(t, drain.ShuttingDown)
	assert.Equal(t, drain.ReasonDrainElapsed, drained.Reason)
	assert.GreaterOrEqual(t, drained.Lasted, timing.Drain, "the drain ended early: the balancer may still be routing here")
	// Measured, not raced: the bound only catches a drain that runs on.
	assert.Less(t, drained.Lasted, timing.Drain+timing.ShutdownTimeout)

	stopped := r.change(t, drain.Stopped)
	assert.Equal(t, drain.ReasonAllFinished, stopped.Reason)
	assert.Less(t, stopped.Lasted, timing.ShutdownTimeout, "nothing was in flight, yet shutdown used its whole timeout")

	// Each phase change is logged with how long the phase before it lasted.
	for _, p := range []drain.Phase{drain.Draining, drain.ShuttingDown, drain.Stopped} {
		recs := r.logs.records(t, "phase "+p.String())
		require.Len(t, recs, 1, "log of phase %s", p)
		assert.NotEmpty(t, recs[0]["lasted"], "phase %s", p)
		assert.NotEmpty(t, recs[0]["reason"], "phase %s", p)
	}
	d, err := time.ParseDuration(r.logs.records(t, "phase shutting-down")[0]["lasted"].(string))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, d, timing.Drain)
}

func TestInFlightRequestFinishesAfterListenerCloses(t *testing.T) {
	// Not parallel: it dials the port its listener closed, and a listener
	// of a test beside it can take that port at once (seen at -test.parallel
	// 32): the dial would reach it.
	g := newGate()
	r := start(t, prod(), routes(g))
	c := dial(t, r.addr)
	got := hold(t, c, g)
	assert.Equal(t, 1, r.srv.InFlight())

	r.srv.SkipDrain()
	waitFor(t, r.srv.Entered(drain.ShuttingDown), "shutting down")
	_, err := net.Dial("tcp", r.addr)
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "the listener must be closed while the request is in flight")
	assert.Equal(t, drain.ReasonSkipCalled, r.change(t, drain.ShuttingDown).Reason)
	select {
	case <-r.srv.Entered(drain.Stopped):
		require.FailNow(t, "stopped with a request in flight")
	default:
	}

	close(g.release)
	assert.Equal(t, draintest.Answer{Status: http.StatusOK, Close: true, Body: "done"}, <-got)
	waitFor(t, r.srv.Entered(drain.Stopped), "stopped")
	require.NoError(t, <-r.served)
	assert.Equal(t, 0, r.srv.InFlight())
	assert.Equal(t, drain.ReasonAllFinished, r.change(t, drain.Stopped).Reason)
	assert.Empty(t, r.logs.records(t, "request cut at shutdown timeout"))
}

func TestRequestSlowerThanShutdownTimeoutIsCutAndLogged(t *testing.T) {
	t.Parallel()
	timing := infra.Prod().Scaled(0.1)
	g := newGate()
	r := start(t, timing.DrainConfig(), routes(g))
	c := dial(t, r.addr)
	failed := make(chan error, 1)
	go func() {
		_, err := c.Get("/held?secret=1")
		failed <- err
	}()
	waitFor(t, g.arrived, "request at the gate")

	r.srv.SkipDrain()
	waitFor(t, r.srv.Entered(drain.Stopped), "stopped")
	require.NoError(t, <-r.served, "a cut is logged, not an error")

	// The balancer sees the connection close with no draintest.Answer: a 502.
	err := <-failed
	require.Error(t, err)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	// The handler is told, so it stops working for nobody.
	waitFor(t, g.canceled, "handler context canceled")

	stopped := r.change(t, drain.Stopped)
	assert.Equal(t, drain.ReasonDeadline, stopped.Reason)
	assert.GreaterOrEqual(t, stopped.Lasted, timing.ShutdownTimeout)

	cuts := r.logs.records(t, "request cut at shutdown timeout")
	require.Len(t, cuts, 1)
	assert.Equal(t, "GET", cuts[0]["method"])
	assert.Equal(t, "/held", cuts[0]["path"], "the path is logged without its query")
	assert.Equal(t, "WARN", cuts[0]["level"])
	running, err := time.ParseDuration(cuts[0]["running"].(string))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, running, timing.ShutdownTimeout)
	assert.InDelta(t, 1, r.logs.records(t, "phase stopped")[0]["cut"], 0)
}

func TestKeepAliveIdleTimeoutIsTheContracts(t *testing.T) {
	t.Parallel()
	t.Run("in force", func(t *testing.T) {
		srv, err := drain.New(prod(), http.NotFoundHandler())
		require.NoError(t, err)
		assert.Equal(t, infra.Prod().AppKeepAlive, srv.IdleTimeout())
	})
	t.Run("measured", func(t *testing.T) {
		// Scaled so an idle connection times out in under a second. The
		// header bound, 50 ms at that scale, is not what is measured: as
		// long as the keep-alive, it cannot cut the first request of a busy
		// machine's client before it is sent.
		timing := infra.Prod().Scaled(0.01)
		cfg := timing.DrainConfig()
		cfg.ReadHeaderTimeout = cfg.KeepAlive
		r := start(t, cfg, routes(newGate()))
		c := dial(t, r.addr)
		// The server arms its idle deadline after it has read the request
		// and flushed the answer: from before the request is sent, the close
		// comes no sooner than the keep-alive, however late either side
		// wakes; from the answer, no later than the keep-alive plus delays.
		sent := time.Now()
		_, err := c.Get("/work")
		require.NoError(t, err)
		answered := time.Now()
		require.True(t, closedByServer(t, c))
		closed := time.Now()
		assert.Greater(t, closed.Sub(sent), timing.LBIdleTimeout, "the app closed an idle connection before the balancer would")
		assert.GreaterOrEqual(t, closed.Sub(sent), timing.AppKeepAlive)
		assert.Less(t, closed.Sub(answered), timing.AppKeepAlive+time.Second)
	})
}

func TestNotReadyAndDrainingAreLoggedApart(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var readyErr error
	setReady := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		readyErr = err
	}
	ready := func(context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		return readyErr
	}
	r := start(t, prod(), routes(newGate()), drain.WithReady(ready))
	c := dial(t, r.addr)

	steps := []struct {
		name     string
		readyErr error
		drain    bool
		want     draintest.Answer
	}{
		{"ready", nil, false, draintest.Answer{Status: infra.HealthyStatus, Body: "ok"}},
		{"dependency down", errors.New("database unreachable"), false, draintest.Answer{Status: http.StatusServiceUnavailable, Body: "not ready"}},
		{"still down", errors.New("database unreachable"), false, draintest.Answer{Status: http.StatusServiceUnavailable, Body: "not ready"}},
		{"back", nil, false, draintest.Answer{Status: infra.HealthyStatus, Body: "ok"}},
		{"draining", nil, true, draintest.Answer{Status: http.StatusServiceUnavailable, Close: true, Body: "draining"}},
	}
	for _, s := range steps {
		setReady(s.readyErr)
		if s.drain {
			r.srv.StartDrain()
			waitFor(t, r.srv.Entered(drain.Draining), "draining")
		}
		got, err := c.Get(infra.HealthPath)
		require.NoError(t, err, s.name)
		assert.Equal(t, s.want, got, s.name)
		// Work is served whatever health says.
		if !s.drain {
			w, err := c.Get("/work")
			require.NoError(t, err, s.name)
			assert.Equal(t, http.StatusOK, w.Status, s.name)
		}
	}

	notReady := r.logs.records(t, "not ready: health answers 503")
	require.Len(t, notReady, 1, "logged when readiness changes, not on every check")
	assert.Equal(t, "database unreachable", notReady[0]["err"])
	assert.Equal(t, "not ready", notReady[0]["reason"])
	assert.Len(t, r.logs.records(t, "ready again: health answers OK"), 1)
	draining := r.logs.records(t, "phase draining")
	require.Len(t, draining, 1)
	assert.EqualValues(t, http.StatusServiceUnavailable, draining[0]["health"])

	var reasons []any
	for _, rec := range r.logs.records(t, "health answered 503") {
		reasons = append(reasons, rec["reason"])
	}
	assert.Equal(t, []any{"not ready", "not ready", "draining"}, reasons)
}

func TestRunDrainsWhenContextEnds(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := drain.New(prod(), routes(newGate()), drain.WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx, ln) }()

	c := dial(t, ln.Addr().String())
	got, err := c.Get(infra.HealthPath)
	require.NoError(t, err)
	require.Equal(t, infra.HealthyStatus, got.Status)

	cancel()
	waitFor(t, srv.Entered(drain.Draining), "draining after the context ended")
	got, err = dial(t, ln.Addr().String()).Get(infra.HealthPath)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, got.Status)

	srv.SkipDrain()
	select {
	case err := <-ran:
		assert.NoError(t, err)
	case <-time.After(wait):
		require.FailNow(t, "Run did not return after the drain")
	}
	assert.Equal(t, drain.Stopped, srv.Phase())
}

func TestServeOnlyOnce(t *testing.T) {
	t.Parallel()
	r := start(t, prod(), routes(newGate()))
	// An draintest.Answer proves the first Serve is running.
	_, err := dial(t, r.addr).Get(infra.HealthPath)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	assert.ErrorContains(t, r.srv.Serve(ln), "Serve called twice")
}

func TestPhaseNames(t *testing.T) {
	tests := []struct {
		p    drain.Phase
		want string
	}{
		{drain.Serving, "serving"},
		{drain.Draining, "draining"},
		{drain.ShuttingDown, "shutting-down"},
		{drain.Stopped, "stopped"},
		{drain.Phase(9), "phase(9)"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.p.String())
	}
}

func dial(t *testing.T, addr string) *draintest.Conn {
	t.Helper()
	c, err := draintest.Dial(addr, wait)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// closedByServer reports whether the server has closed c: a read sees EOF.
func closedByServer(t *testing.T, c *draintest.Conn) bool {
	t.Helper()
	closed, err := c.ClosedByServer()
	require.NoError(t, err)
	return closed
}

// hold sends GET /held on c and returns once the request is at gate g, so it
// is in flight; its answer arrives on the channel when g releases it.
func hold(t *testing.T, c *draintest.Conn, g *gate) <-chan draintest.Answer {
	t.Helper()
	got := make(chan draintest.Answer, 1)
	go func() {
		a, err := c.Get("/held")
		assert.NoError(t, err)
		got <- a
	}()
	waitFor(t, g.arrived, "request at the gate")
	return got
}
