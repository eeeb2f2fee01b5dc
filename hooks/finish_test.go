package hooks

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deployKilledAfterSwitch runs deploy of version on s and SIGKILLs it, and
// everything it runs, right after it switched `current`: state/deploying
// is left for the watchdog, the old containers still run.
func deployKilledAfterSwitch(t *testing.T, s Server, version string) {
	t.Helper()
	bin := t.TempDir()
	killingCmd(t, bin, "mv")
	killedAt := filepath.Join(t.TempDir(), "killed-at")
	cmd := s.Command(context.Background(), "deploy", version)
	cmd.Env = append(cmd.Env, "PATH="+bin+":"+os.Getenv("PATH"),
		"KILL_CMD=mv", "KILL_AFTER="+filepath.Join(s.Root, "current"), "KILLED_AT="+killedAt)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, _ := cmd.CombinedOutput()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL,
		"deploy was not killed right after the switch: %v\n%s", cmd.ProcessState, out)
	require.FileExists(t, filepath.Join(s.Root, "state", "deploying"), "left for the watchdog to finish")
}

// shortGrace is s publishing a release whose stop grace period (1 s) is
// shorter than the drain: the containers it replaces are killed mid-drain.
func shortGrace(t *testing.T, s Server) Server {
	t.Helper()
	next := s
	next.ReleaseDir = filepath.Join(t.TempDir(), "release")
	require.NoError(t, os.Mkdir(next.ReleaseDir, 0o755))
	require.NoError(t, WriteRelease(next.ReleaseDir, dockerTiming))
	compose := string(mustRead(t, filepath.Join(next.ReleaseDir, ComposeFile)))
	grace := "stop_grace_period: " + span(dockerTiming.StopGracePeriod)
	require.Contains(t, compose, grace)
	compose = strings.ReplaceAll(compose, grace, "stop_grace_period: 1s")
	require.NoError(t, os.WriteFile(filepath.Join(next.ReleaseDir, ComposeFile), []byte(compose), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(next.ReleaseDir, ChecksumFile), Checksum([]byte(compose)), 0o644))
	return next
}

// cutARequest sends api a request as long as the contract allows once it
// drains, which outlasts what is left of its drain and shutdown timeout.
func cutARequest(t *testing.T, s Server) {
	t.Helper()
	about := fmt.Sprintf("http://127.0.0.1:%d/about", s.AppPort)
	waitFor(t, dockerTiming.DeployDowntime(), "the old api draining", func() bool {
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
}

// A deploy killed right after its switch leaves the old containers running
// and state/deploying; the next watchdog run replaces them. It judges each
// one it replaced as the deploy would have: exit 0 (its drain fit inside
// the grace period), no request cut at its shutdown timeout. Before, the
// watchdog verified only the new containers: an old one killed mid-drain,
// or one that cut a request, passed as a clean finish.
func TestWatchdogFinishChecksTheReplacedContainers(t *testing.T) {
	// The cases hold the servers, one each.
	t.Parallel()
	tag := images(t)
	for _, tc := range []struct {
		name   string
		next   func(t *testing.T, s Server) Server
		during func(t *testing.T, s Server)
		code   int
		// want is per role; %s is the old container's short id.
		want map[string]string
	}{
		{"drained", changedDefinition, nil, 0, map[string]string{
			"api": "api: old container %s drained and exited 0", "gateway": "gateway: old container %s drained and exited 0"}},
		{"killed mid-drain", shortGrace, nil, 1, map[string]string{
			"api":          "api: old container %s exited 137: killed after stop_grace_period",
			"orchestrator": "orchestrator: old container %s exited 137: killed after stop_grace_period"}},
		{"request cut", changedDefinition, cutARequest, 1, map[string]string{
			"api": "api: old container %s cut 1 request(s) at its shutdown timeout: GET /work"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parallel(t, 1)
			s := newServer(t, dockerTiming)
			deploy(t, s, tag)
			old := containers(t, s)
			next := tc.next(t, s)
			deployKilledAfterSwitch(t, next, tag)
			require.Equal(t, old, containers(t, s), "killed before it replaced anything")

			done := make(chan result, 1)
			go func() { done <- runScript(s, nil, "watchdog") }()
			if tc.during != nil {
				tc.during(t, s)
			}
			res := <-done
			assert.Equal(t, tc.code, res.code, "%s", res)
			for role, want := range tc.want {
				assert.Contains(t, res.stdout+res.stderr, fmt.Sprintf(want, old[role][:12]), "%s", res)
			}
			last := string(mustRead(t, filepath.Join(s.Root, "state", "last-deploy")))
			if tc.code == 0 {
				assert.Contains(t, res.stdout, "verified: api orchestrator gateway publish-worker")
				assert.Contains(t, last, tag+": interrupted; finished by the watchdog, verified")
			} else {
				assert.Contains(t, res.stderr, "finished the interrupted deploy of "+tag+", but it FAILED")
				assert.Contains(t, last, tag+": interrupted; finished by the watchdog, FAILED")
			}
			assert.NoFileExists(t, filepath.Join(s.Root, "state", "deploying"))
			for role, id := range containers(t, s) {
				assert.NotEqual(t, old[role], id, "%s replaced", role)
				assert.Equal(t, "running healthy", state(t, id), role)
			}
			left, err := filepath.Glob(filepath.Join(s.Root, "state", ".*"))
			require.NoError(t, err)
			assert.Empty(t, left, "no temp file left behind")
		})
	}
}

// fakeDocker is a Docker CLI stand-in for the watchdog finishing a deploy:
// the four services run healthy, each published at addr, compose succeeds
// at once, and docker wait and docker logs wait for a container that never
// stops.
const fakeDocker = `case "$1" in
compose) exit 0 ;;
ps)
  svc=""
  for a; do
    case "$a" in label=com.docker.compose.service=*) svc="${a#label=com.docker.compose.service=}" ;; esac
  done
  for s in api orchestrator gateway publish-worker; do
    if [ -z "$svc" ] || [ "$svc" = "$s" ]; then echo "$s-0123456789abcdef"; fi
  done ;;
inspect)
  shift
  printf '['
  sep=""
  for id; do
    printf '%s{"Id":"%s","Config":{"Labels":{"com.docker.compose.service":"%s"}},"State":{"Status":"running","ExitCode":0,"Health":{"Status":"healthy"}}}' "$sep" "$id" "${id%-*}"
    sep=,
  done
  echo ']' ;;
port) echo "8080/tcp -> $FAKE_ADDR" ;;
wait | logs) exec sleep 3600 ;;
esac
`

// withTimes is timing.env with the given keys set to other values.
func withTimes(t *testing.T, env []byte, set map[string]int64) []byte {
	t.Helper()
	var out []string
	for _, l := range strings.Split(string(env), "\n") {
		k, _, _ := strings.Cut(l, "=")
		if v, ok := set[k]; ok {
			l = k + "=" + strconv.FormatInt(v, 10)
			delete(set, k)
		}
		out = append(out, l)
	}
	require.Empty(t, set, "keys timing.env does not have")
	return []byte(strings.Join(out, "\n"))
}

// The watchdog holds the lock for at most WatchdogHold, and finishing an
// interrupted deploy verifies every service over HTTP: each request is
// bounded by what is left of that hold, and none starts past it. Here the
// services answer their health check but never /about, and a request may
// take five holds (the container health timeout). Before, the first /about
// ran its whole bound with the lock held, four holds past the hold (the
// Docker queries after it were cut by the hold: four services that
// answered them would have taken twenty); now the run ends with its hold,
// naming what it could not verify. The hold is 8 s: the first /about must
// start inside it, after some sixty processes the watchdog starts before
// it, which a busy machine can take a second or more to run.
func TestWatchdogFinishVerifiesWithinTheLockHold(t *testing.T) {
	const hold = 8000
	const perRequest = 5 * hold
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/about" {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })

	s := newServer(t, dockerTiming)
	env := mustRender(t, RenderTimingEnv, fastTiming)
	env = withTimes(t, env, map[string]int64{"MYTHEX_WATCHDOG_HOLD_MS": hold, "MYTHEX_CONTAINER_HEALTH_TIMEOUT_MS": perRequest})
	require.NoError(t, os.WriteFile(filepath.Join(s.ReleaseDir, TimingEnvFile), env, 0o644))
	installRelease(t, s, "v1")
	require.NoError(t, os.WriteFile(filepath.Join(s.Root, "state", "deploying"), []byte("v1 v1-test pid 1\n"), 0o644))

	ctx, cancel := context.WithTimeout(context.Background(), 3*perRequest*time.Millisecond)
	defer cancel()
	cmd := s.Command(ctx, "watchdog")
	cmd.Env = append(cmd.Env, standIn(t, "docker", fakeDocker), "FAKE_ADDR="+l.Addr().String())
	cmd.WaitDelay = time.Second
	start := time.Now()
	out, _ := cmd.CombinedOutput()
	took := time.Since(start)
	require.NoError(t, ctx.Err(), "the watchdog outran its bound:\n%s", out)
	assert.Equal(t, 1, cmd.ProcessState.ExitCode(), "%s", out)
	assert.Less(t, took, hold*time.Millisecond+perRequest*time.Millisecond/2, "the run ended with its hold:\n%s", out)
	assert.Contains(t, string(out), "/about at "+l.Addr().String()+" failed", "the first request ran until the hold's end")
	assert.Contains(t, string(out), "not verified: the lock may be held no longer")
	assert.Contains(t, string(out), "finished the interrupted deploy of v1, but it FAILED")
	assert.True(t, lockIsFree(t, s), "the lock is free again")
}
