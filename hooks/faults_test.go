package hooks

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// currentVersion is the version s's current release runs.
func currentVersion(t *testing.T, s Server) string {
	t.Helper()
	for _, l := range lines(string(mustRead(t, filepath.Join(s.Root, "current", "deployed.env")))) {
		if v, ok := strings.CutPrefix(l, "MYTHEX_VERSION="); ok {
			return v
		}
	}
	require.Fail(t, "no MYTHEX_VERSION in the current release")
	return ""
}

// Item 4: a deploy whose caller goes away mid-replace (the ssh session
// drops: stdout is closed, SIGHUP arrives) finishes, and says so in
// state/last-deploy and its log.
func TestDeployOutlivesItsCaller(t *testing.T) {
	parallel(t, 1)
	hangupReaches(t)
	tag := images(t)
	next := tag + "-caller"
	buildVersion(t, next)
	s := newServer(t, dockerTiming)
	deploy(t, s, tag)

	// The SIGHUP comes from the deploy's own mv, the moment it has
	// switched `current`: sent by the test once it read the deploy's
	// "replacing" line, it reached a deploy that had already ended whenever
	// the test was kept off the CPU longer than the rest of the deploy.
	hupAt := filepath.Join(t.TempDir(), "hup-at")
	cmd := s.Command(context.Background(), "deploy", next)
	cmd.Env = append(cmd.Env, hangupAfterMv(t), "HUP_AFTER="+filepath.Join(s.Root, "current"), "HUP_AT="+hupAt)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	errPipe, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.Contains(sc.Text(), " running container(s) with ") {
	}
	// The caller is gone: nobody reads the deploy's output any more.
	require.NoError(t, out.Close())
	require.NoError(t, errPipe.Close())
	_ = cmd.Process.Signal(syscall.SIGPIPE)
	_ = cmd.Wait()
	assert.Equal(t, strconv.Itoa(cmd.Process.Pid), strings.TrimSpace(string(mustRead(t, hupAt))), "mv hung up on the deploy itself")
	assert.Equal(t, 0, cmd.ProcessState.ExitCode(), "the deploy finished and verified")
	assert.Contains(t, string(mustRead(t, filepath.Join(s.Root, "state", "last-deploy"))),
		next+": deployed and verified (finished despite SIGHUP)")
	log := string(mustRead(t, filepath.Join(s.Root, "state", "deploy.log")))
	assert.Contains(t, log, "verified: api orchestrator gateway publish-worker")
	for role, id := range containers(t, s) {
		assert.Equal(t, "running healthy", state(t, id), role)
		assert.Equal(t, next, ask(t, id).Version, role)
	}
	assert.NoFileExists(t, filepath.Join(s.Root, "state", "deploying"))
}

// hangupReaches makes SIGHUP reach the deploys this test starts, as it
// reaches one whose ssh session drops. A test run under nohup would pass on
// SIGHUP ignored, and bash cannot trap a signal ignored when it started: the
// deploy would never hear the hang-up the test asserts it reports. Catching
// it here for the test's life makes the children start with the default.
func hangupReaches(t *testing.T) {
	t.Helper()
	if !signal.Ignored(syscall.SIGHUP) {
		return
	}
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	t.Cleanup(func() { signal.Stop(c) })
}

// hangupAfterMv returns a PATH whose mv runs the real one and then, once it
// has put $HUP_AFTER in place, writes its parent's pid to $HUP_AT and sends
// that process SIGHUP: the caller going away, at a set step of the deploy.
func hangupAfterMv(t *testing.T) string {
	t.Helper()
	real, err := exec.LookPath("mv")
	require.NoError(t, err)
	dir := t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
'%s' "$@" || exit
for last; do :; done
[ "$last" = "$HUP_AFTER" ] || exit 0
echo "$PPID" >"$HUP_AT"
kill -HUP "$PPID"
`, real)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mv"), []byte(script), 0o755))
	return "PATH=" + dir + ":" + os.Getenv("PATH")
}

// Item 1: a version whose images cannot be pulled changes nothing, and the
// watchdog still restarts a crashed service from what runs.
func TestUnpullableVersionChangesNothing(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	s := newServer(t, dockerTiming)
	deploy(t, s, tag)
	before := containers(t, s)
	release, _ := os.Readlink(filepath.Join(s.Root, "current"))

	res := run(t, s, nil, "deploy", tag+"-nowhere")
	require.Equal(t, 1, res.code, "%s", res)
	assert.Contains(t, res.stderr, "cannot pull mythex/api:"+tag+"-nowhere")
	assert.Contains(t, res.stderr, "no container was replaced")
	assert.Equal(t, before, containers(t, s), "no container replaced")

	// A crash afterwards: the watchdog restarts what runs.
	docker(t, "stop", before["orchestrator"])
	for range dockerTiming.WatchdogStrikes {
		res = tick(t, s)
	}
	assert.Contains(t, res.stdout, "orchestrator: restarted and healthy")
	assert.Equal(t, tag, ask(t, containers(t, s)["orchestrator"]).Version)

	after, err := os.Readlink(filepath.Join(s.Root, "current"))
	require.NoError(t, err)
	assert.Equal(t, release, after, "the current release is the running one")
	assert.Equal(t, tag, currentVersion(t, s))
	assert.Contains(t, string(mustRead(t, filepath.Join(s.Root, "state", "last-deploy"))), "FAILED before changing anything")
}

// Item 5: the watchdog holds the lock for at most one restart, as the
// contract's lock-wait-outlasts-restart assumes: every service due is
// restarted by one compose call, so a deploy arriving at the start of the
// worst case (all four due, none coming back) still gets the lock.
func TestWatchdogRestartsAllDueInOneLockHold(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	version := tag + "-alldue"
	buildVersion(t, version)
	s := newServer(t, dockerTiming)
	deploy(t, s, version)
	var ids []string
	for role, id := range containers(t, s) {
		ids = append(ids, id)
		// The restart brings back a container that never turns healthy,
		// so each restart waits its whole start timeout.
		docker(t, "tag", unhealthyImage(), ImageName(DefaultImagePrefix, role, version))
	}
	docker(t, append([]string{"stop"}, ids...)...)
	for range dockerTiming.WatchdogStrikes - 1 {
		tick(t, s)
	}

	cmd := s.Command(context.Background(), "watchdog")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	var wout strings.Builder
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		wout.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "restarting after") {
			break
		}
	}
	var wg sync.WaitGroup
	var waiting result
	wg.Go(func() {
		waiting = runScript(s, []string{"MYTHEX_CRITICAL_SECTION_CMD=true"}, "deploy", "v1")
	})
	_, _ = io.Copy(&wout, out)
	_ = cmd.Wait()
	wg.Wait()
	assert.Equal(t, 1, cmd.ProcessState.ExitCode(), "%s%s", wout.String(), stderr.String())
	for _, role := range Roles {
		assert.Contains(t, stderr.String(), role+": restarted but not healthy", "%s", &stderr)
	}
	assert.Equal(t, 0, waiting.code, "a deploy waiting LockWait %v got the lock: %s", dockerTiming.LockWait, waiting)
}

// Item 15: requests an old container cut at its shutdown timeout are lost
// work: the deploy names them per service and fails.
func TestDeployReportsCutRequests(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	next := tag + "-cut"
	buildVersion(t, next)
	s := newServer(t, dockerTiming)
	deploy(t, s, tag)
	old := containers(t, s)["api"]

	// Once the old api drains (it still serves), a request as long as the
	// contract allows outlasts what is left of the drain and the shutdown
	// timeout together.
	done := make(chan result, 1)
	go func() { done <- runScript(s, nil, "deploy", next) }()
	about := fmt.Sprintf("http://127.0.0.1:%d/about", s.AppPort)
	// Bounded by the deploy's own bound: on a busy host, staging and
	// pulling come first and take the host's time, not the timeline's.
	waitFor(t, dockerTiming.ServerDeployMax(), "the old api draining", func() bool {
		resp, err := http.Get(about)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), `"phase":"draining"`)
	})
	go func() {
		c := http.Client{Timeout: 2 * dockerTiming.MaxRequest}
		resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/work?ms=%d", s.AppPort, dockerTiming.MaxRequest.Milliseconds()))
		if err == nil {
			resp.Body.Close()
		}
	}()
	res := <-done
	require.Equal(t, 1, res.code, "%s", res)
	assert.Contains(t, res.stderr, "api: old container "+old[:12]+" cut 1 request(s) at its shutdown timeout: GET /work")
	for _, role := range Roles[1:] {
		assert.NotContains(t, res.stderr, role+": old container", "only api had a request cut")
	}
}
