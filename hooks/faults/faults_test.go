// Package faults kills the real deploy at each of its steps on a real
// compose project and checks that the next watchdog run brings the server
// back to the state a clean deploy leaves. It is a package of its own: it
// runs for minutes, and the hooks' other tests have their own.
package faults

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
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

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/dockerlock"
	"github.com/mythex/infra/internal/needs"
)

// timing is the production timeline at a fifth of its length, as in the
// hooks' own Docker tests: the stop grace period stays whole seconds.
var timing = infra.Prod().Scaled(0.2)

var (
	tag       = "faultstest-" + randomHex(4)
	buildOnce sync.Once
	buildErr  error
	built     bool
	tagsMu    sync.Mutex
	extraTags []string
)

// suiteServers is this suite's budget: the kill points' chains and the
// renames' server, side by side. A deploy killed and a watchdog run wait on
// drains and health checks far more than they compute: with three servers
// the suite kept about 65 % of a 2-core machine busy.
const suiteServers = 2*killChains + 1

func TestMain(m *testing.M) {
	if err := dockerlock.SetParallel(suiteServers); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	ctx := context.Background()
	if built {
		if err := hooks.RemoveImages(ctx, tag); err != nil {
			fmt.Fprintln(os.Stderr, "cleanup:", err)
		}
	}
	if len(extraTags) > 0 {
		args := append([]string{"rmi", "--force"}, extraTags...)
		if out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "cleanup: docker rmi: %v\n%s", err, out)
		}
	}
	os.Exit(code)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// images builds the reference service's images once; it fails (never
// skips) without a Docker engine.
func images(t *testing.T) string {
	t.Helper()
	needs.Have(t, needs.Docker)
	dockerlock.Hold(t)
	buildOnce.Do(func() {
		root, err := filepath.Abs("../..")
		if err != nil {
			buildErr = err
			return
		}
		if buildErr = hooks.BuildImages(context.Background(), root, tag); buildErr == nil {
			built = true
		}
	})
	require.NoError(t, buildErr, "build the test images")
	return tag
}

// buildImages builds every role's image with version built in (/about
// reports the version of the binary, not of the tag) and has TestMain
// remove them.
func buildImages(version string) error {
	root, err := filepath.Abs("../..")
	if err != nil {
		return err
	}
	if err := hooks.BuildImages(context.Background(), root, version); err != nil {
		return fmt.Errorf("build images %s: %w", version, err)
	}
	tagsMu.Lock()
	defer tagsMu.Unlock()
	for _, role := range hooks.Roles {
		extraTags = append(extraTags, hooks.ImageName(hooks.DefaultImagePrefix, role, version))
	}
	return nil
}

func newServer(t *testing.T) hooks.Server {
	t.Helper()
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	require.NoError(t, os.Mkdir(release, 0o755))
	require.NoError(t, hooks.WriteRelease(release, timing))
	hooksDir, err := filepath.Abs("..")
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	s := hooks.Server{HooksDir: hooksDir, Root: filepath.Join(dir, "root"), Project: "faultstest" + randomHex(4),
		ReleaseDir: release, AppPort: port, Bind: "127.0.0.1"}
	t.Cleanup(func() {
		if err := s.Remove(context.Background()); err != nil {
			t.Errorf("clean up %s: %v", s.Project, err)
		}
	})
	return s
}

type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

func run(t *testing.T, s hooks.Server, script string, args ...string) result {
	t.Helper()
	cmd := s.Command(context.Background(), script, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		require.NoError(t, err, "run %s", script)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

func deploy(t *testing.T, s hooks.Server, version string) {
	t.Helper()
	res := run(t, s, "deploy", version)
	require.Equal(t, 0, res.code, "deploy %s: %s", version, res)
}

func tick(t *testing.T, s hooks.Server) result {
	t.Helper()
	res := run(t, s, "watchdog")
	require.Equal(t, 0, res.code, "watchdog: %s", res)
	return res
}

func docker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	require.NoError(t, err, "docker %v: %s", args, out)
	return strings.TrimSpace(string(out))
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	return b
}

func containers(t *testing.T, s hooks.Server) map[string]string {
	t.Helper()
	ids := map[string]string{}
	for _, role := range hooks.Roles {
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

func state(t *testing.T, id string) string {
	t.Helper()
	return docker(t, "inspect", "--format", "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}", id)
}

type about struct {
	Role, Version, Phase string
}

// ask fetches a container's /about through the port Docker published.
func ask(t *testing.T, id string) about {
	t.Helper()
	line := strings.SplitN(docker(t, "port", id), "\n", 2)[0]
	addr := strings.Replace(line[strings.LastIndex(line, " ")+1:], "0.0.0.0", "127.0.0.1", 1)
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

func strikes(t *testing.T, s hooks.Server) string {
	t.Helper()
	return string(mustRead(t, filepath.Join(s.Root, "state", "strikes")))
}

// currentVersion is the version s's current release runs.
func currentVersion(t *testing.T, s hooks.Server) string {
	t.Helper()
	for _, l := range lines(string(mustRead(t, filepath.Join(s.Root, "current", "deployed.env")))) {
		if v, ok := strings.CutPrefix(l, "MYTHEX_VERSION="); ok {
			return v
		}
	}
	require.Fail(t, "no MYTHEX_VERSION in the current release")
	return ""
}

// serverState is what a deploy leaves on a server, compared between a clean
// deploy and one recovered after a kill: per role, the container's compose
// config hash (the definition, the values and the image id), its state and
// what it answers; and the current release's files.
type serverState struct {
	Version   string
	Hashes    map[string]string
	States    map[string]string
	Answers   map[string]about
	Release   map[string]string
	Strikes   string
	Deploying bool
}

func stateOf(t *testing.T, s hooks.Server) serverState {
	t.Helper()
	st := serverState{Version: currentVersion(t, s), Hashes: map[string]string{}, States: map[string]string{},
		Answers: map[string]about{}, Release: map[string]string{}}
	all := docker(t, "ps", "-a", "-q", "--filter", "label=com.docker.compose.project="+s.Project)
	assert.Len(t, lines(all), len(hooks.Roles), "one container per role and nothing else:\n%s", all)
	for role, id := range containers(t, s) {
		st.Hashes[role] = docker(t, "inspect", "--format", `{{index .Config.Labels "com.docker.compose.config-hash"}}`, id)
		st.States[role] = state(t, id)
		a := ask(t, id)
		a.Phase = ""
		st.Answers[role] = a
	}
	for _, name := range []string{hooks.ComposeFile, hooks.ChecksumFile, "deployed.env"} {
		st.Release[name] = string(mustRead(t, filepath.Join(s.Root, "current", name)))
	}
	st.Strikes = strikes(t, s)
	_, err := os.Stat(filepath.Join(s.Root, "state", "deploying"))
	st.Deploying = err == nil
	return st
}

// noLeftovers asserts no temp file or staging directory is left.
func noLeftovers(t *testing.T, s hooks.Server) {
	t.Helper()
	for _, dir := range []string{s.Root, filepath.Join(s.Root, "state"), filepath.Join(s.Root, "releases")} {
		dot, err := filepath.Glob(filepath.Join(dir, ".*"))
		require.NoError(t, err)
		assert.Empty(t, dot, "left behind in %s", dir)
	}
}

// awaitLockFree blocks until nothing holds s's lock (a killed deploy's
// compose may still be finishing, holding it), then lets go.
func awaitLockFree(t *testing.T, s hooks.Server, within time.Duration) {
	t.Helper()
	f, err := os.Open(s.Lock())
	require.NoError(t, err)
	defer f.Close()
	done := make(chan error, 1)
	go func() { done <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-done:
		require.NoError(t, err)
		require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_UN))
	case <-time.After(within):
		require.Fail(t, "the lock stayed held", "for %v", within)
	}
}

// startDeploy starts deploy, with env added to its environment, and sends
// each stdout line to the returned channel, closed at EOF.
func startDeploy(t *testing.T, s hooks.Server, version string, env ...string) (*exec.Cmd, <-chan string, *strings.Builder) {
	t.Helper()
	cmd := s.Command(context.Background(), "deploy", version)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.WaitDelay = 2 * timing.DeployDowntime()
	require.NoError(t, cmd.Start())
	ch := make(chan string, 1000)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return cmd, ch, &stderr
}

// events follows the compose project's container events from now on and
// sends the action of each. --since replays those that came before the
// engine had the subscription: a deploy started at once may beat it.
func events(t *testing.T, s hooks.Server) <-chan string {
	t.Helper()
	since := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "docker", "events", "--format", "{{.Action}}",
		"--since", fmt.Sprintf("%d.%09d", since.Unix(), since.Nanosecond()),
		"--filter", "type=container", "--filter", "label=com.docker.compose.project="+s.Project)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	ch := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}

// A point in a deploy where it is killed: a line it logs, the first
// Docker event of the kind while compose replaces the containers, or the
// mv that puts a file (mv, relative to the server's root) in place. At an
// mv the deploy signals itself (signallingMv): its last steps take
// milliseconds, and a signal sent on reading a line could land after them.
type killPoint struct {
	name, line, event, mv string
}

var killPoints = []killPoint{
	{name: "lock", line: "holding the server lock"},
	{name: "stage", line: "step stage"},
	{name: "pull", line: "step pull"},
	{name: "switch", line: "step switch"},
	{name: "replace", line: "step replace"},
	{name: "old container stopping", event: "kill"},
	{name: "new container created", event: "create"},
	{name: "new container started", event: "start"},
	{name: "wait-healthy", line: "step wait-healthy"},
	{name: "verify", line: "step verify"},
	// The first thing step finish does is reset the strikes.
	{name: "finish", mv: "state/strikes"},
}

// signallingMv puts in dir a stand-in for mv that runs the real one and
// then, once it has put $KILL_AFTER in place, writes its parent's pid to
// $KILLED_AT and sends that process signal number $KILL_SIG: the script
// is signalled while it waits for this mv, before its next command.
func signallingMv(t *testing.T, dir string) {
	t.Helper()
	real, err := exec.LookPath("mv")
	require.NoError(t, err)
	script := fmt.Sprintf(`#!/bin/sh
'%s' "$@" || exit
for last; do :; done
[ "$last" = "$KILL_AFTER" ] || exit 0
echo "$PPID" >"$KILLED_AT"
kill -"$KILL_SIG" "$PPID"
`, real)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mv"), []byte(script), 0o755))
}

// Items 3 and 4: a deploy killed at any step, by SIGKILL or SIGTERM,
// leaves a server the next watchdog run brings back to one running,
// healthy, verified release, in the same state a clean deploy of that
// release leaves. SIGTERM never needs the watchdog: the deploy stops
// before changing anything, or finishes, and says which.
func TestDeployKilledAtEachStep(t *testing.T) {
	// Each chain's server holds one of the suite's servers.
	t.Parallel()
	tag := images(t)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		a, b := fmt.Sprintf("%s-%da", tag, sig), fmt.Sprintf("%s-%db", tag, sig)
		// The signal's two versions, built once for its chains.
		build := sync.OnceValue(func() error {
			return errors.Join(buildImages(a), buildImages(b))
		})
		// Each signal's kill points run as killChains chains, each on a
		// server of its own, side by side: a case waits on drains and
		// health checks far more than it computes.
		for chain := range killChains {
			t.Run(fmt.Sprintf("%s/%d", sig, chain+1), func(t *testing.T) {
				dockerlock.Parallel(t, 1)
				require.NoError(t, build())
				killAtEachStep(t, a, b, sig, chainPoints(chain))
			})
		}
	}
}

// killChains is how many chains a signal's kill points are dealt into.
const killChains = 2

// chainPoints deals the kill points round the chains: each chain gets early
// steps, which end fast (nothing changed yet), and late ones, which need the
// watchdog, so the chains take about as long.
func chainPoints(chain int) []killPoint {
	var points []killPoint
	for i := chain; i < len(killPoints); i += killChains {
		points = append(points, killPoints[i])
	}
	return points
}

func killAtEachStep(t *testing.T, a, b string, sig syscall.Signal, points []killPoint) {
	s := newServer(t)
	deploy(t, s, b)
	clean := map[string]serverState{b: stateOf(t, s)}
	deploy(t, s, a)
	clean[a] = stateOf(t, s)
	require.NotEqual(t, clean[a].Hashes, clean[b].Hashes)

	for _, p := range points {
		t.Run(p.name, func(t *testing.T) {
			from := currentVersion(t, s)
			to := map[string]string{a: b, b: a}[from]
			var evs <-chan string
			if p.event != "" {
				evs = events(t, s)
			}
			var env []string
			killedAt := filepath.Join(t.TempDir(), "killed-at")
			if p.mv != "" {
				bin := t.TempDir()
				signallingMv(t, bin)
				env = []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "KILL_AFTER=" + filepath.Join(s.Root, p.mv),
					"KILL_SIG=" + strconv.Itoa(int(sig)), "KILLED_AT=" + killedAt}
			}
			cmd, out, stderr := startDeploy(t, s, to, env...)
			var logged strings.Builder
			killed := false
			kill := func() {
				if !killed {
					require.NoError(t, cmd.Process.Signal(sig))
					killed = true
				}
			}
			for open := true; open; {
				select {
				case l, ok := <-out:
					if !ok {
						open = false
						break
					}
					logged.WriteString(l + "\n")
					if p.line != "" && strings.Contains(l, p.line) {
						kill()
					}
				case e := <-evs:
					if e == p.event {
						kill()
					}
				}
			}
			err := cmd.Wait()
			if p.mv != "" {
				if pid, rerr := os.ReadFile(killedAt); rerr == nil {
					killed = true
					require.Equal(t, strconv.Itoa(cmd.Process.Pid), strings.TrimSpace(string(pid)), "mv signalled the deploy itself")
				}
			}
			require.True(t, killed, "never reached %s:\n%s%s", p.name, logged.String(), stderr.String())
			t.Logf("deploy %s → %s: %v\n%s%s", from, to, err, logged.String(), stderr.String())

			if sig == syscall.SIGTERM {
				code := cmd.ProcessState.ExitCode()
				if code == 0 {
					assert.Contains(t, stderr.String(), "the deploy finished first")
					assert.Equal(t, to, currentVersion(t, s), "finished")
				} else {
					assert.Contains(t, stderr.String(), "nothing was changed")
					assert.Equal(t, from, currentVersion(t, s), "left as it was")
				}
				assert.Contains(t, string(mustRead(t, filepath.Join(s.Root, "state", "last-deploy"))), to+": ")
			}
			awaitLockFree(t, s, 2*timing.DeployDowntime())
			res := tick(t, s)
			t.Logf("watchdog:\n%s", res.stdout)
			got := stateOf(t, s)
			require.Contains(t, []string{from, to}, got.Version)
			assert.Equal(t, clean[got.Version], got, "the state a clean deploy of %s leaves", got.Version)
			noLeftovers(t, s)
		})
	}
	// And the next deploy runs as usual from there.
	deploy(t, s, map[string]string{a: b, b: a}[currentVersion(t, s)])
	noLeftovers(t, s)
}
