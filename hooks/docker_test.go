package hooks

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain"
	"github.com/mythex/infra/infra"
)

// dockerTiming is the production timeline at a fifth of its length: the stop
// grace period stays whole seconds (6 s), as the Docker engine needs.
var dockerTiming = infra.Prod().Scaled(0.2)

// docker runs the docker CLI and returns its trimmed output.
func docker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	require.NoError(t, err, "docker %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

// containers maps each role to its container id on s.
func containers(t *testing.T, s Server) map[string]string {
	t.Helper()
	ids := map[string]string{}
	for _, role := range Roles {
		out := docker(t, "ps", "-a", "-q", "--no-trunc",
			"--filter", "label=com.docker.compose.project="+s.Project,
			"--filter", "label=com.docker.compose.service="+role)
		if out != "" {
			require.NotContains(t, out, "\n", "one container per role")
			ids[role] = out
		}
	}
	return ids
}

type about struct {
	Role, Version, Phase string
}

// ask fetches a container's /about through the port Docker published, as a
// client on the server would, independent of the deploy's own check.
func ask(t *testing.T, id string) about {
	t.Helper()
	line := strings.SplitN(docker(t, "port", id), "\n", 2)[0]
	addr := line[strings.LastIndex(line, " ")+1:]
	addr = strings.Replace(addr, "0.0.0.0", "127.0.0.1", 1)
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/about")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var a about
	require.NoError(t, json.Unmarshal(body, &a), "%s", body)
	return a
}

func state(t *testing.T, id string) string {
	t.Helper()
	return docker(t, "inspect", "--format", "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}", id)
}

// deploy runs deploy on s and requires it to succeed.
func deploy(t *testing.T, s Server, version string) result {
	t.Helper()
	res := run(t, s, nil, "deploy", version)
	require.Equal(t, 0, res.code, "deploy %s: %s", version, res)
	return res
}

func TestDeployReplacesAllFour(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	next := tag + "-next"
	buildVersion(t, next)
	s := newServer(t, dockerTiming)
	res := deploy(t, s, tag)
	assert.Contains(t, res.stdout, "verified: api orchestrator gateway publish-worker")
	old := containers(t, s)
	require.Len(t, old, len(Roles))

	// Wait on every old container ourselves: its exit code is the proof its
	// drain fit inside the grace period (a SIGKILL shows as 137). One waiter
	// each, as the deploy's own: compose stops them in parallel and removes
	// each as soon as it stops, so one `docker wait` asking about them in
	// turn can find a later one gone.
	waiters := map[string]*exec.Cmd{}
	codes := map[string]*strings.Builder{}
	for _, role := range Roles {
		w := exec.Command("docker", "wait", old[role])
		codes[role] = &strings.Builder{}
		w.Stdout, w.Stderr = codes[role], codes[role]
		require.NoError(t, w.Start())
		waiters[role] = w
	}

	start := time.Now()
	res = deploy(t, s, next)
	took := time.Since(start)
	for _, role := range Roles {
		require.NoError(t, waiters[role].Wait(), "docker wait %s: %s", role, codes[role])
		assert.Equal(t, "0", strings.TrimSpace(codes[role].String()), "%s's old container exited 0, not 137", role)
	}

	fresh := containers(t, s)
	require.Len(t, fresh, len(Roles))
	for _, role := range Roles {
		assert.NotEqual(t, old[role], fresh[role], "%s was replaced", role)
		assert.Equal(t, "running healthy", state(t, fresh[role]), role)
		got := ask(t, fresh[role])
		assert.Equal(t, role, got.Role)
		assert.Equal(t, next, got.Version, role)
		// And how its drain ended, from the drain library's own line: no
		// balancer checks these containers, so nothing is waited for once
		// they have run long enough for a node's check to have been seen
		// (drain.ReasonUnwatched); younger, the fixed drain.
		assert.Regexp(t, regexp.QuoteMeta(role+": old container "+old[role][:12]+" drained and exited 0; its drain lasted ")+
			`\S+s \((`+regexp.QuoteMeta(drain.ReasonUnwatched)+`|`+regexp.QuoteMeta(drain.ReasonDrainElapsed)+`)\)`, res.stdout)
	}
	assert.Contains(t, res.stdout, "verified: api orchestrator gateway publish-worker")
	// The old containers' exits and the verification run inside the settle
	// window, which starts once every new container is healthy: a deploy
	// takes the window once, not the window and then its checks.
	assert.Regexp(t, `(?s)step wait-healthy\n.*all healthy; checking the old containers and verifying while they settle\n.*step check-old-containers\n.*step verify\n.*step settle\n.*watching them stay healthy until `+
		regexp.QuoteMeta(seconds(dockerTiming.Reentry()))+`s after they all were.*step finish\n`, res.stdout)
	assert.GreaterOrEqual(t, took, dockerTiming.EarliestDrainEnd(), "the old containers drained before they stopped")
	t.Logf("one server's deploy took %v (drain %v, grace %v)", took.Round(time.Millisecond), dockerTiming.Drain, dockerTiming.StopGracePeriod)

	assert.Equal(t, "MYTHEX_VERSION="+next+"\nMYTHEX_BIND=127.0.0.1\nMYTHEX_APP_PORT="+fmt.Sprint(s.AppPort)+"\n",
		string(mustRead(t, filepath.Join(s.Root, "current", "deployed.env"))))
	assert.Equal(t, "api 0\norchestrator 0\ngateway 0\npublish-worker 0\n",
		string(mustRead(t, filepath.Join(s.Root, "state", "strikes"))))
}

// Each role alone is unhealthy (it serves, but its health check cannot run)
// or broken (it cannot start at all), and then every role is faulty at once:
// each deploy fails naming exactly its faulty services, all at once, and no
// healthy one.
func TestDeployNamesEachBrokenService(t *testing.T) {
	// The cases hold the servers, one each.
	t.Parallel()
	tag := images(t)
	tests := []struct {
		unhealthy, broken []string
	}{
		{unhealthy: []string{"api"}},
		{broken: []string{"orchestrator"}},
		{unhealthy: []string{"gateway"}},
		{broken: []string{"publish-worker"}},
		{unhealthy: []string{"api", "gateway"}, broken: []string{"orchestrator", "publish-worker"}},
		{unhealthy: []string{"orchestrator", "publish-worker"}, broken: []string{"api", "gateway"}},
	}
	for i, tt := range tests {
		t.Run(fmt.Sprintf("unhealthy %v, broken %v", tt.unhealthy, tt.broken), func(t *testing.T) {
			parallel(t, 1)
			version := fmt.Sprintf("%s-bad%d", tag, i)
			buildVersion(t, version)
			for _, role := range Roles {
				if slices.Contains(tt.unhealthy, role) {
					tagImage(t, unhealthyImage(), ImageName(DefaultImagePrefix, role, version))
				} else if slices.Contains(tt.broken, role) {
					tagImage(t, brokenImage(), ImageName(DefaultImagePrefix, role, version))
				}
			}
			s := newServer(t, dockerTiming)
			res := run(t, s, nil, "deploy", version)
			require.Equal(t, 1, res.code, "%s", res)
			for _, role := range tt.unhealthy {
				assert.Contains(t, res.stderr, "  "+role+": container health is unhealthy", "%s", res)
			}
			for _, role := range tt.broken {
				assert.Contains(t, res.stderr, "  "+role+": container not running (state created", "%s", res)
			}
			// A faulty image is built once and tagged for every case, so an
			// unhealthy one that still answers is also named for the version
			// built into it; a healthy role is never named.
			for _, role := range Roles {
				n := strings.Count(res.stderr, "\n  "+role+": ")
				if slices.Contains(tt.unhealthy, role) || slices.Contains(tt.broken, role) {
					assert.Positive(t, n, "%s is faulty and must be named: %s", role, res)
				} else {
					assert.Zero(t, n, "%s is healthy and must not be named: %s", role, res)
				}
			}
			assert.NotContains(t, res.stdout, "verified:")
		})
	}
}

// A container that turns unhealthy after it was healthy fails the deploy,
// even when it is healthy again by the time the deploy verifies it: the
// deploy reads Docker's health events over its settle window, not one
// sample. Its neighbours are not named.
func TestDeployFailsAFlappingService(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	version := tag + "-flap"
	buildVersion(t, version)
	tagImage(t, flappingImage(), ImageName(DefaultImagePrefix, "gateway", version))
	s := newServer(t, flapTiming())
	res := run(t, s, nil, "deploy", version)
	require.Equal(t, 1, res.code, "%s", res)
	assert.Regexp(t, `\n  gateway: container [0-9a-f]{12} turned unhealthy after being healthy`, res.stderr)
	for _, role := range Roles {
		if role != "gateway" {
			assert.NotContains(t, res.stderr, "  "+role+": ", "%s is healthy and must not be named", role)
		}
	}
	assert.NotContains(t, res.stdout, "verified:")
}

// flapTiming is dockerTiming with the longest start its planned downtime
// allows. A deploy whose health poll misses the gateway's first healthy
// spell waits until it is healthy again, at its check 1 + FailFor + 1
// (hooks/internal/flapcheck); on a busy machine each check may take an
// interval and its whole timeout, and the deploy must still be waiting then.
func flapTiming() infra.Timing {
	t := dockerTiming
	margin := t.LockWait - t.WatchdogHold()
	holdMargin := t.DeployHold - t.DeploySteps() - t.EngineWork
	t.StartTimeout = t.MaxPlannedDowntime - t.StopGracePeriod
	t.LockWait = t.WatchdogHold() + margin
	t.DeployHold = t.DeploySteps() + t.EngineWork + holdMargin
	return t
}

// A grace period shorter than the drain kills the old containers: the
// deploy sees exit code 137 and fails.
func TestDeployReportsKilledDrain(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	next := tag + "-killed"
	buildVersion(t, next)
	s := newServer(t, dockerTiming)
	deploy(t, s, tag)

	compose := string(mustRead(t, filepath.Join(s.ReleaseDir, ComposeFile)))
	grace := "stop_grace_period: " + span(dockerTiming.StopGracePeriod)
	require.Contains(t, compose, grace)
	compose = strings.ReplaceAll(compose, grace, "stop_grace_period: 1s")
	require.NoError(t, os.WriteFile(filepath.Join(s.ReleaseDir, ComposeFile), []byte(compose), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(s.ReleaseDir, ChecksumFile), Checksum([]byte(compose)), 0o644))

	res := run(t, s, nil, "deploy", next)
	require.Equal(t, 1, res.code, "%s", res)
	for _, role := range Roles {
		assert.Contains(t, res.stderr, "  "+role+": old container ", role)
	}
	assert.Contains(t, res.stderr, "exited 137: killed after stop_grace_period")
}

// tick runs the watchdog once, as one firing of its timer.
func tick(t *testing.T, s Server) result {
	t.Helper()
	res := run(t, s, nil, "watchdog")
	require.Equal(t, 0, res.code, "watchdog: %s", res)
	return res
}

func strikes(t *testing.T, s Server) string {
	t.Helper()
	return string(mustRead(t, filepath.Join(s.Root, "state", "strikes")))
}

// waitFor polls cond until it holds or the deadline passes, ten times per
// drain: a phase as short as the drain is not stepped over.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "%s: not within %v", what, within)
		time.Sleep(dockerTiming.Drain / 10)
	}
}

func TestWatchdogRestartsOnlyAtTheFourthStrike(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	s := newServer(t, dockerTiming)
	deploy(t, s, tag)
	n := dockerTiming.WatchdogStrikes
	require.Equal(t, 4, n, "the article's four strikes")
	compose := mustRead(t, filepath.Join(s.Root, "current", ComposeFile))

	for _, role := range []string{"api", "publish-worker"} {
		t.Run(role, func(t *testing.T) {
			id := containers(t, s)[role]
			docker(t, "stop", id)
			require.Equal(t, "exited unhealthy", state(t, id), "really stopped")

			for k := 1; k < n; k++ {
				res := tick(t, s)
				assert.Contains(t, res.stdout, fmt.Sprintf("%s: strike %d/%d: container not running (state exited", role, k, n))
				assert.NotContains(t, res.stdout, "restarting")
				assert.Contains(t, strikes(t, s), fmt.Sprintf("%s %d\n", role, k))
				assert.Equal(t, "exited unhealthy", state(t, id), "strike %d: not restarted yet", k)
			}

			// A success in between resets the count.
			docker(t, "start", id)
			waitFor(t, dockerTiming.StartTimeout, role+" healthy", func() bool { return state(t, id) == "running healthy" })
			res := tick(t, s)
			assert.Contains(t, res.stdout, fmt.Sprintf("%s: healthy again; strikes reset after %d", role, n-1))
			assert.Contains(t, strikes(t, s), role+" 0\n")

			docker(t, "stop", id)
			for k := 1; k < n; k++ {
				res := tick(t, s)
				assert.Contains(t, res.stdout, fmt.Sprintf("%s: strike %d/%d", role, k, n))
				assert.Equal(t, "exited unhealthy", state(t, id), "after a reset, strike %d does not restart", k)
			}
			res = tick(t, s)
			assert.Contains(t, res.stdout, fmt.Sprintf("%s: strike %d/%d", role, n, n))
			assert.Contains(t, res.stdout, role+": restarting after 4 consecutive failed checks")
			assert.Contains(t, res.stdout, role+": restarted and healthy")
			fresh := containers(t, s)[role]
			assert.Equal(t, "running healthy", state(t, fresh))
			got := ask(t, fresh)
			assert.Equal(t, about{role, tag, got.Phase}, got, "restarted from the installed definition at the deployed version")
			assert.Contains(t, strikes(t, s), role+" 0\n")

			res = tick(t, s)
			assert.NotContains(t, res.stdout, "strike")
		})
	}
	assert.Equal(t, string(compose), string(mustRead(t, filepath.Join(s.Root, "current", ComposeFile))), "the watchdog never writes the definition")
}

// While a real deploy holds the lock, the watchdog does nothing, even for a
// service one strike away from a restart.
func TestWatchdogStandsAsideDuringDeploy(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	next := tag + "-during"
	buildVersion(t, next)
	s := newServer(t, dockerTiming)
	deploy(t, s, tag)
	id := containers(t, s)["gateway"]
	docker(t, "stop", id)
	for range dockerTiming.WatchdogStrikes - 1 {
		tick(t, s)
	}
	before := strikes(t, s)
	require.Contains(t, before, fmt.Sprintf("gateway %d\n", dockerTiming.WatchdogStrikes-1))

	cmd := s.Command(context.Background(), "deploy", next)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	// locked gets whether the deploy said it holds the lock before its
	// output ended.
	locked := make(chan bool, 1)
	// ended closes when the output has been read to its end: Wait closes
	// the pipe, and lines not read by then are lost.
	ended := make(chan struct{})
	var out strings.Builder
	go func() {
		defer close(ended)
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if !signalled && strings.Contains(sc.Text(), "holding the server lock") {
				locked <- true
				signalled = true
			}
		}
		if !signalled {
			locked <- false
		}
	}()
	require.True(t, <-locked, "the deploy never said it holds the lock")

	// Stopped, the deploy keeps the lock and resets no strike while the
	// watchdog runs, however long a busy machine takes to run it.
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	resume := func() { _ = cmd.Process.Signal(syscall.SIGCONT) }
	defer resume()
	res := tick(t, s)
	assert.Contains(t, res.stdout, "deploy in progress")
	assert.NotContains(t, res.stdout, "strike")
	assert.Equal(t, before, strikes(t, s), "the watchdog changed nothing")
	resume()

	<-ended
	require.NoError(t, cmd.Wait(), "deploy: %s%s", out.String(), stderr.String())
	assert.Contains(t, out.String(), "verified: api orchestrator gateway publish-worker")
	assert.Contains(t, strikes(t, s), "gateway 0\n", "the deploy reset the strikes")
	res = tick(t, s)
	assert.NotContains(t, res.stdout, "strike", "after the deploy every service is healthy")
}
