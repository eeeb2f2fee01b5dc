package main_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain/draintest"

	"github.com/mythex/infra/infra"
)

// binary is the service, built once as the image builds it: static, with
// builtVersion as its version.
var binary string

// builtVersion is the version built into the test binary; the environment
// says v-test, as a compose file would.
const builtVersion = "v-built"

// wait bounds every wait on the process; reaching it is a failure.
const wait = 30 * time.Second

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "mythex-service-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "service test:", err)
			return 1
		}
		defer os.RemoveAll(dir)
		binary = filepath.Join(dir, "service")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-X main.version="+builtVersion, "-o", binary, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "service test: building the service: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}())
}

// env is the environment the compose definition renders for one role, with
// timing t and a free port.
func env(role string, t infra.Timing) []string {
	return append([]string{"MYTHEX_ROLE=" + role, "MYTHEX_VERSION=v-test", "MYTHEX_PORT=0"}, t.DrainConfig().Environ()...)
}

// proc is one running service, with its JSON log as it arrives.
type proc struct {
	cmd     *exec.Cmd
	addr    string
	records chan map[string]any
	seen    []map[string]any
	exited  chan struct{}
	err     error
}

func startService(t *testing.T, environ []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = environ
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, records: make(chan map[string]any, 1024), exited: make(chan struct{})}
	var readDone sync.WaitGroup
	readDone.Add(1)
	go func() {
		defer readDone.Done()
		defer close(p.records)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var rec map[string]any
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				rec = map[string]any{"msg": "unparsed", "line": sc.Text()}
			}
			p.records <- rec
		}
	}()
	go func() {
		readDone.Wait()
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	serving := p.waitLog(t, "serving")
	_, port, err := net.SplitHostPort(serving["addr"].(string))
	require.NoError(t, err)
	p.addr = net.JoinHostPort("127.0.0.1", port)
	return p
}

// waitLog returns the next log record with message msg, keeping every record
// read on the way for later assertions.
func (p *proc) waitLog(t *testing.T, msg string) map[string]any {
	t.Helper()
	deadline := time.After(wait)
	for {
		select {
		case rec, ok := <-p.records:
			require.True(t, ok, "service exited before logging %q; its log: %v", msg, p.seen)
			p.seen = append(p.seen, rec)
			if rec["msg"] == msg {
				return rec
			}
		case <-deadline:
			require.FailNow(t, "timed out waiting for log", "%q; log so far: %v", msg, p.seen)
		}
	}
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// exit waits for the process and returns its exit code and, after the fact,
// every log record it wrote.
func (p *proc) exit(t *testing.T) (int, []map[string]any) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(wait):
		require.FailNow(t, "service did not exit", "log so far: %v", p.seen)
	}
	for rec := range p.records {
		p.seen = append(p.seen, rec)
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, p.err)
	}
	return code, p.seen
}

func records(recs []map[string]any, msg string) []map[string]any {
	var out []map[string]any
	for _, r := range recs {
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

func logDuration(t *testing.T, rec map[string]any, key string) time.Duration {
	t.Helper()
	s, ok := rec[key].(string)
	require.True(t, ok, "%s in %v", key, rec)
	d, err := time.ParseDuration(s)
	require.NoError(t, err)
	return d
}

// fetch asks path on a new connection; safe off the test goroutine.
func fetch(addr, path string) (draintest.Answer, error) {
	c, err := draintest.Dial(addr, wait)
	if err != nil {
		return draintest.Answer{}, err
	}
	defer c.Close()
	return c.Get(path)
}

// inFlight polls /about until exactly n other requests are in flight: a
// real condition, so the test never guesses how long a request takes to
// arrive. It runs off the test goroutine (require.Eventually).
func inFlight(addr string, n int) func() bool {
	return func() bool {
		a, err := fetch(addr, "/about")
		if err != nil {
			return false
		}
		var about struct {
			InFlight int `json:"in_flight"`
		}
		return json.Unmarshal([]byte(a.Body), &about) == nil && about.InFlight == n
	}
}

func getJSON(t *testing.T, addr, path string) (int, map[string]any) {
	t.Helper()
	a, err := dial(t, addr).Get(path)
	require.NoError(t, err, path)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(a.Body), &v), "%s answered %q", path, a.Body)
	return a.Status, v
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

func TestBadInputExitsTwoListingEveryProblem(t *testing.T) {
	t.Parallel()
	valid := env("api", infra.Prod())
	tests := []struct {
		name string
		args []string
		env  []string
		want []string
		not  []string
	}{
		{"nothing set", nil, nil, []string{
			"20 problem(s)", `role ""`, "version must not be empty", "port: not set",
			"MYTHEX_HEALTH_PATH is not set", "MYTHEX_HEALTHY_STATUS is not set", "MYTHEX_DRAIN is not set",
			"MYTHEX_SHUTDOWN_TIMEOUT is not set", "MYTHEX_KEEPALIVE is not set",
			"MYTHEX_READ_HEADER_TIMEOUT is not set", "MYTHEX_READ_TIMEOUT is not set", "MYTHEX_WRITE_TIMEOUT is not set",
			"MYTHEX_MAX_HEADER_BYTES is not set", "MYTHEX_MAX_REQUEST is not set",
		}, nil},
		{"bad values", []string{"stray"},
			append(valid, "MYTHEX_ROLE=web", "MYTHEX_VERSION= ", "MYTHEX_PORT=70000", "MYTHEX_DRAIN=15"), []string{
				"5 problem(s)", `unexpected arguments ["stray"]`,
				`role "web" must be one of api, orchestrator, gateway, publish-worker`,
				"version must not be empty", `port: "70000" must be a number from 0 to 65535`, `MYTHEX_DRAIN: time: missing unit in duration "15"`,
			}, nil},
		{"flags override the environment", []string{"-role", "gateway", "-version", "v2", "-port", "x"},
			append(valid, "MYTHEX_ROLE=web", "MYTHEX_VERSION="), []string{"1 problem(s)", `port: "x"`},
			[]string{"role", "version"}},
		{"unknown flag", []string{"-scale", "0.1"}, valid, []string{"flag provided but not defined: -scale", "usage: service"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(binary, tt.args...)
			cmd.Env = tt.env
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "output: %s", out)
			assert.Equal(t, 2, ee.ExitCode(), "output: %s", out)
			for _, w := range tt.want {
				assert.Contains(t, string(out), w)
			}
			for _, n := range tt.not {
				assert.NotContains(t, string(out), n)
			}
		})
	}
}

func TestEveryRoleServesItsRoutes(t *testing.T) {
	t.Parallel()
	for _, role := range []string{"api", "orchestrator", "gateway", "publish-worker"} {
		t.Run(role, func(t *testing.T) {
			t.Parallel()
			timing := infra.Prod().Scaled(0.1)
			// The role comes by flag, overriding the environment's.
			p := startService(t, env("api", timing), "-role", role)

			status, about := getJSON(t, p.addr, "/about")
			assert.Equal(t, http.StatusOK, status)
			assert.Equal(t, role, about["role"])
			assert.Equal(t, builtVersion, about["version"])
			assert.Equal(t, "v-test", about["release"])
			assert.Equal(t, "serving", about["phase"])
			assert.EqualValues(t, 0, about["in_flight"])
			assert.NotEmpty(t, about["instance"])

			status, work := getJSON(t, p.addr, "/work?ms=5")
			assert.Equal(t, http.StatusOK, status)
			assert.Equal(t, map[string]any{"role": role, "version": builtVersion, "ms": float64(5), "body_bytes": float64(0)}, work)

			resp, err := http.Post("http://"+p.addr+"/work?ms=1", "application/json", strings.NewReader(`{"order":42}`))
			require.NoError(t, err)
			var posted map[string]any
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&posted))
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, map[string]any{"role": role, "version": builtVersion, "ms": float64(1), "body_bytes": float64(12)}, posted, "POST reads the body")

			for path, want := range map[string]int{
				infra.HealthPath: infra.HealthyStatus,
				"/work":          http.StatusOK,
				"/work?ms=-1":    http.StatusBadRequest,
				"/work?ms=soon":  http.StatusBadRequest,
				"/work?ms=" + ms(timing.MaxRequest+time.Millisecond): http.StatusBadRequest,
				"/work?ms=99999999999999999999":                      http.StatusBadRequest,
				"/":                                                  http.StatusNotFound,
				"/admin":                                             http.StatusNotFound,
			} {
				a, err := dial(t, p.addr).Get(path)
				require.NoError(t, err, path)
				assert.Equal(t, want, a.Status, path)
			}

			p.signal(t, syscall.SIGTERM)
			code, _ := p.exit(t)
			assert.Equal(t, 0, code)
		})
	}
}

// The whole handshake, as the balancer sees it, against a real process.
func TestSIGTERMDrainsThenExitsZero(t *testing.T) {
	t.Parallel()
	timing := infra.Prod().Scaled(0.2)
	p := startService(t, env("api", timing))

	kept := dial(t, p.addr)
	a, err := kept.Get("/work")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, a.Status)
	require.False(t, a.Close, "keep-alive while serving")

	sigterm := time.Now()
	p.signal(t, syscall.SIGTERM)
	draining := p.waitLog(t, "phase draining")

	// In flight across the listener closing, sent first and sized from the
	// service's own drain start, so it ends halfway through the shutdown
	// timeout however late this test reads the log: only its own trip to
	// the handler, well under ShutdownTimeout/2, moves its end.
	drainStart, err := time.Parse(time.RFC3339Nano, draining["time"].(string))
	require.NoError(t, err)
	slow := time.Until(drainStart.Add(timing.Drain + timing.ShutdownTimeout/2))
	require.Greater(t, slow, timing.ShutdownTimeout/2, "the draining log arrived after the drain had ended")
	answered := make(chan draintest.Answer, 1)
	go func() {
		a, err := fetch(p.addr, "/work?ms="+ms(slow))
		assert.NoError(t, err)
		answered <- a
	}()
	require.Eventually(t, inFlight(p.addr, 1), wait, 10*time.Millisecond, "slow request never in flight")

	health, err := dial(t, p.addr).Get(infra.HealthPath)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, health.Status, "health on a new connection")
	assert.Equal(t, "draining", health.Body)
	work, err := kept.Get("/work")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, work.Status, "work on a kept-alive connection")
	assert.True(t, work.Close, "a draining response closes its connection")
	work, err = dial(t, p.addr).Get("/work")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, work.Status, "work on a new connection")

	closing := p.waitLog(t, "phase shutting-down")
	_, err = net.Dial("tcp", p.addr)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED, "after the drain nothing listens")
	assert.EqualValues(t, 1, closing["in_flight"], "the slow request must be in flight when the listener closes")
	assert.Equal(t, "drain elapsed", closing["reason"])
	assert.GreaterOrEqual(t, logDuration(t, closing, "lasted"), timing.Drain)

	select {
	case a := <-answered:
		assert.Equal(t, http.StatusOK, a.Status, "the in-flight request completes")
	case <-time.After(wait):
		require.FailNow(t, "in-flight request never answered")
	}

	code, logs := p.exit(t)
	elapsed := time.Since(sigterm)
	assert.Equal(t, 0, code)
	assert.GreaterOrEqual(t, elapsed, timing.Drain)
	// Measured against the contract: done by the shutdown deadline, with the
	// kill margin as tolerance, which is exactly "before Docker's SIGKILL".
	assert.Less(t, elapsed, timing.ShutdownDeadline()+timing.KillMargin, "exit took %v", elapsed)
	assert.Less(t, elapsed, timing.StopGracePeriod, "exit took %v", elapsed)

	var phases []string
	for _, r := range logs {
		if strings.HasPrefix(r["msg"].(string), "phase ") {
			phases = append(phases, r["phase"].(string))
			logDuration(t, r, "lasted")
		}
	}
	assert.Equal(t, []string{"draining", "shutting-down", "stopped"}, phases)
	assert.Empty(t, records(logs, "request cut at shutdown timeout"))
}

func TestRequestSlowerThanShutdownTimeoutIsCut(t *testing.T) {
	t.Parallel()
	timing := infra.Prod().Scaled(0.2)
	p := startService(t, env("orchestrator", timing))

	cut := make(chan error, 1)
	go func() {
		// The longest request /work takes, longer than a drain lets finish.
		_, err := fetch(p.addr, "/work?ms="+ms(timing.MaxRequest))
		cut <- err
	}()
	require.Eventually(t, inFlight(p.addr, 1), wait, 10*time.Millisecond, "slow request never in flight")

	sigterm := time.Now()
	p.signal(t, syscall.SIGTERM)
	code, logs := p.exit(t)
	elapsed := time.Since(sigterm)

	assert.Equal(t, 0, code, "a cut is logged, not a failure")
	assert.GreaterOrEqual(t, elapsed, timing.ShutdownDeadline())
	assert.ErrorIs(t, <-cut, io.ErrUnexpectedEOF, "the cut request gets no draintest.Answer")

	cuts := records(logs, "request cut at shutdown timeout")
	require.Len(t, cuts, 1, "log: %v", logs)
	assert.Equal(t, "/work", cuts[0]["path"])
	assert.Equal(t, "orchestrator", cuts[0]["role"])
	assert.GreaterOrEqual(t, logDuration(t, cuts[0], "running"), timing.ShutdownTimeout)
	stopped := records(logs, "phase stopped")
	require.Len(t, stopped, 1)
	assert.EqualValues(t, 1, stopped[0]["cut"])
	assert.Equal(t, "shutdown timeout elapsed", stopped[0]["reason"])
	// Stopped by the shutdown deadline with the kill margin as tolerance,
	// "before Docker's SIGKILL", by the service's own clock: measured here,
	// it would also count signal delivery and this test reading the pipe.
	done := logDuration(t, stopped[0], "since_drain_start")
	assert.GreaterOrEqual(t, done, timing.ShutdownDeadline())
	assert.Less(t, done, timing.ShutdownDeadline()+timing.KillMargin, "stopped %v after the drain started", done)
}

// A second SIGTERM ends the drain at once but not the requests in flight;
// a third changes nothing.
func TestSecondSIGTERMSkipsTheRestOfTheDrain(t *testing.T) {
	t.Parallel()
	timing := infra.Prod().Scaled(0.2)
	// The production drain, never waited out: the second SIGTERM lands
	// inside it however late, and a skip that did not happen still shows.
	timing.Drain = infra.Prod().Drain
	timing.MaxDrain = infra.Prod().MaxDrain
	p := startService(t, env("gateway", timing))

	sigterm := time.Now()
	p.signal(t, syscall.SIGTERM)
	p.waitLog(t, "phase draining")

	// Started before the shutdown timeout, so never cut; as long as most of
	// it, so the third SIGTERM arrives before it ends and the service exits.
	answered := make(chan draintest.Answer, 1)
	go func() {
		a, err := fetch(p.addr, "/work?ms="+ms(3*timing.ShutdownTimeout/4))
		assert.NoError(t, err)
		answered <- a
	}()
	require.Eventually(t, inFlight(p.addr, 1), wait, 10*time.Millisecond, "request never in flight")

	p.signal(t, syscall.SIGTERM)
	closing := p.waitLog(t, "phase shutting-down")
	assert.Equal(t, "second stop request: SIGTERM", closing["reason"])
	assert.Less(t, logDuration(t, closing, "lasted"), timing.Drain, "the drain ran its course despite the second SIGTERM")
	_, err := net.Dial("tcp", p.addr)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)

	p.signal(t, syscall.SIGTERM)
	p.waitLog(t, "stop request ignored: already shutting down; in-flight requests keep their shutdown timeout")

	select {
	case a := <-answered:
		assert.Equal(t, http.StatusOK, a.Status, "a second SIGTERM does not cut requests")
	case <-time.After(wait):
		require.FailNow(t, "in-flight request never answered")
	}
	code, logs := p.exit(t)
	assert.Equal(t, 0, code)
	assert.Less(t, time.Since(sigterm), timing.Drain+timing.ShutdownTimeout)
	assert.Empty(t, records(logs, "request cut at shutdown timeout"))
}

// /about reports the version built into the binary, whatever the
// environment says: a deploy comparing it with the release it asked for
// catches a mis-tagged image.
func TestAboutReportsTheBuiltInVersion(t *testing.T) {
	t.Parallel()
	environ := append(env("api", infra.Prod().Scaled(0.1)), "MYTHEX_VERSION=v-other")
	p := startService(t, environ)
	status, about := getJSON(t, p.addr, "/about")
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, builtVersion, about["version"], "the version /about reports must be the binary's")
	assert.Equal(t, "v-other", about["release"], "the release compose started it as")
	_, work := getJSON(t, p.addr, "/work?ms=1")
	assert.Equal(t, builtVersion, work["version"])

	p.signal(t, syscall.SIGTERM)
	code, logs := p.exit(t)
	assert.Equal(t, 0, code)
	warned := records(logs, "the binary's version is not the release it was started as: the image is mis-tagged")
	require.Len(t, warned, 1, "log: %v", logs)
	assert.Equal(t, "v-other", warned[0]["release"])
	assert.Equal(t, builtVersion, warned[0]["version"])
}

// /work holds a request at most the contract's MaxRequest: past it the
// balancer has given up, and nothing may hold requests past every deploy.
func TestWorkIsBoundedByMaxRequest(t *testing.T) {
	t.Parallel()
	// Scaled so the longest allowed request is quick. The header bound, 50
	// ms at that scale, runs from accept: as long as the keep-alive, it
	// cannot cut a busy machine's client before it writes.
	timing := infra.Prod().Scaled(0.01)
	timing.ReadHeaderTimeout = timing.AppKeepAlive
	p := startService(t, env("gateway", timing))
	tests := []struct {
		ms   string
		want int
	}{
		{ms(timing.MaxRequest), http.StatusOK},
		{ms(timing.MaxRequest + time.Millisecond), http.StatusBadRequest},
		{strconv.FormatInt(int64(10*time.Hour/time.Millisecond), 10), http.StatusBadRequest},
	}
	for _, tt := range tests {
		status, got := getJSON(t, p.addr, "/work?ms="+tt.ms)
		assert.Equal(t, tt.want, status, "ms=%s: %v", tt.ms, got)
		if tt.want == http.StatusBadRequest {
			assert.Contains(t, got["error"], "from 0 to "+ms(timing.MaxRequest)+" (MYTHEX_MAX_REQUEST", "ms=%s", tt.ms)
		}
	}
	p.signal(t, syscall.SIGTERM)
	code, _ := p.exit(t)
	assert.Equal(t, 0, code)
}

func TestIdleKeepAliveIsTheContracts(t *testing.T) {
	t.Parallel()
	// Scaled so an idle connection times out in under a second. The
	// header bound, 50 ms at that scale, is not what is measured: as long
	// as the keep-alive, it cannot cut the first request of a busy
	// machine's client before it is sent.
	timing := infra.Prod().Scaled(0.01)
	timing.ReadHeaderTimeout = timing.AppKeepAlive
	p := startService(t, env("publish-worker", timing))
	c := dial(t, p.addr)
	// The service arms its idle deadline after it has read the request and
	// flushed the answer: from before the request is sent, the close comes
	// no sooner than the keep-alive, however late either side wakes; from
	// the answer, no later than the keep-alive plus delays.
	sent := time.Now()
	a, err := c.Get("/work")
	require.NoError(t, err)
	require.False(t, a.Close)

	answered := time.Now()
	closed, err := c.ClosedByServer()
	closedAt := time.Now()
	require.NoError(t, err)
	require.True(t, closed, "the service must close the idle connection")
	assert.Greater(t, closedAt.Sub(sent), timing.LBIdleTimeout, "closed before the balancer's idle timeout: a 502 in production")
	assert.GreaterOrEqual(t, closedAt.Sub(sent), timing.AppKeepAlive)
	assert.Less(t, closedAt.Sub(answered), timing.AppKeepAlive+time.Second)

	p.signal(t, syscall.SIGTERM)
	code, _ := p.exit(t)
	assert.Equal(t, 0, code)
}

func TestCheck(t *testing.T) {
	t.Parallel()
	timing := infra.Prod().Scaled(0.2)
	serving := startService(t, env("api", timing))
	// The production drain outlasts every row however slow the machine; a
	// second SIGTERM ends it, so it is never waited out.
	drainingTiming := timing
	drainingTiming.Drain = infra.Prod().Drain
	drainingTiming.MaxDrain = infra.Prod().MaxDrain
	draining := startService(t, env("api", drainingTiming))
	draining.signal(t, syscall.SIGTERM)
	draining.waitLog(t, "phase draining")
	closedPort := refusingPort(t)

	portOf := func(p *proc) string {
		_, port, err := net.SplitHostPort(p.addr)
		require.NoError(t, err)
		return port
	}
	checkEnv := func(port string, extra ...string) []string {
		return append(append(env("api", timing), "MYTHEX_PORT="+port), extra...)
	}
	tests := []struct {
		name     string
		env      []string
		args     []string
		wantCode int
		want     []string
	}{
		{"serving", checkEnv(portOf(serving)), nil, 0, []string{"healthy: GET http://127.0.0.1:" + portOf(serving) + infra.HealthPath + " answered 200"}},
		{"draining", checkEnv(portOf(draining)), nil, 1, []string{"unhealthy:", "answered 503, want 200 (draining)"}},
		{"other healthy status", checkEnv(portOf(serving), "MYTHEX_HEALTHY_STATUS=204"), nil, 1, []string{"answered 200, want 204"}},
		{"nothing listening", checkEnv(closedPort), nil, 1, []string{"unhealthy: GET", "connection refused"}},
		{"bad environment", []string{"MYTHEX_PORT=0", "MYTHEX_HEALTH_PATH=healthz", "MYTHEX_HEALTHY_STATUS=ok"}, nil, 1, []string{
			"MYTHEX_PORT is 0", `MYTHEX_HEALTH_PATH "healthz" must start with /`, `MYTHEX_HEALTHY_STATUS "ok" is not a status code`,
		}},
		{"stray argument", checkEnv(portOf(serving)), []string{"now"}, 1, []string{`check takes no arguments, got ["now"]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(binary, append([]string{"check"}, tt.args...)...)
			cmd.Env = tt.env
			out, err := cmd.CombinedOutput()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tt.wantCode, code, "output: %s", out)
			assert.Equal(t, 1, strings.Count(string(out), "\n"), "one line: %q", out)
			for _, w := range tt.want {
				assert.Contains(t, string(out), w)
			}
		})
	}
	serving.signal(t, syscall.SIGTERM)
	code, _ := serving.exit(t)
	assert.Equal(t, 0, code)
	draining.signal(t, syscall.SIGTERM)
	code, _ = draining.exit(t)
	assert.Equal(t, 0, code)
}

// refusingPort returns a loopback port that refuses connections until the
// test ends.
func refusingPort(t *testing.T) string {
	t.Helper()
	addr, closeAddr, err := draintest.RefusedAddr()
	require.NoError(t, err)
	t.Cleanup(func() { _ = closeAddr() })
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return port
}

func dial(t *testing.T, addr string) *draintest.Conn {
	t.Helper()
	c, err := draintest.Dial(addr, wait)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}
