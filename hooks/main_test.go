package hooks

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/dockerlock"
	"github.com/mythex/infra/internal/needs"
)

// The images every Docker test uses are built once per test binary and
// removed when it ends.
var (
	imagesOnce  sync.Once
	imagesErr   error
	imagesBuilt bool
	testTag     = "hookstest-" + randomHex(4)
	tagsMu      sync.Mutex
	extraTags   []string // every image name the tests added, removed at the end
)

// suiteServers is this suite's budget. Its tests drive Docker without
// pause (deploys, watchdog runs, compose and docker calls one after
// another): with three servers they kept about 75 % of a 2-core machine
// busy, so one more server uses what was left.
const suiteServers = dockerlock.Servers + 1

func TestMain(m *testing.M) {
	if err := dockerlock.SetParallel(suiteServers); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	ctx := context.Background()
	if imagesBuilt {
		if err := RemoveImages(ctx, testTag); err != nil {
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

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	return root
}

// requireDocker fails (never skips) when no engine runs: these tests are the
// proof that the scripts work against a real one.
func requireDocker(t *testing.T) {
	t.Helper()
	needs.Have(t, needs.Docker)
	dockerlock.Hold(t)
}

// parallel lets t run beside the package's other Docker tests, holding
// that many of the machine's budget of simulated servers until it ends
// (dockerlock.Parallel): a test asks for every server it has running at
// once.
func parallel(t *testing.T, servers int) {
	t.Helper()
	requireDocker(t)
	dockerlock.Parallel(t, servers)
}

// Faulty images for the deploy's failure tests, built from the same static
// binary: "unhealthy" serves but its health check cannot run (/service is
// missing), "broken" cannot start at all, and "flapping" serves while its
// health check passes, fails for a while, then passes for good
// (hooks/internal/flapcheck).
const (
	unhealthyDockerfile = "FROM scratch\nCOPY service /svc\nENTRYPOINT [\"/svc\"]\n"
	brokenDockerfile    = "FROM scratch\nCOPY service /svc\nENTRYPOINT [\"/service\"]\n"
	flappingDockerfile  = "FROM scratch\nCOPY service /svc\nCOPY flapcheck /service\nENTRYPOINT [\"/svc\"]\n"
)

func unhealthyImage() string { return "mythex/hookstest-unhealthy:" + testTag }
func brokenImage() string    { return "mythex/hookstest-broken:" + testTag }
func flappingImage() string  { return "mythex/hookstest-flapping:" + testTag }

// images builds the reference service images once and returns their tag.
func images(t *testing.T) string {
	t.Helper()
	requireDocker(t)
	imagesOnce.Do(func() {
		ctx := context.Background()
		root, err := filepath.Abs("..")
		if err != nil {
			imagesErr = err
			return
		}
		if imagesErr = BuildImages(ctx, root, testTag); imagesErr != nil {
			return
		}
		imagesBuilt = true
		dir, err := os.MkdirTemp("", "hookstest-faulty-")
		if err != nil {
			imagesErr = err
			return
		}
		defer os.RemoveAll(dir)
		if imagesErr = buildService(ctx, root, filepath.Join(dir, "service"), ""); imagesErr != nil {
			return
		}
		if imagesErr = buildStatic(ctx, root, "./hooks/internal/flapcheck", filepath.Join(dir, "flapcheck")); imagesErr != nil {
			return
		}
		for image, dockerfile := range map[string]string{unhealthyImage(): unhealthyDockerfile, brokenImage(): brokenDockerfile, flappingImage(): flappingDockerfile} {
			if imagesErr = os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); imagesErr != nil {
				return
			}
			if imagesErr = dockerBuild(ctx, dir, image); imagesErr != nil {
				return
			}
			tagsMu.Lock()
			extraTags = append(extraTags, image)
			tagsMu.Unlock()
		}
	})
	require.NoError(t, imagesErr, "build the test images")
	return testTag
}

// tagImage gives src another name, removed when the test binary ends.
func tagImage(t *testing.T, src, dst string) {
	t.Helper()
	out, err := exec.Command("docker", "tag", src, dst).CombinedOutput()
	require.NoError(t, err, "docker tag %s %s: %s", src, dst, out)
	tagsMu.Lock()
	extraTags = append(extraTags, dst)
	tagsMu.Unlock()
}

// scaledWithoutContainers is Prod scaled by f for scripts that start no
// container. Scaled keeps the container health check's numbers and the
// engine's work, the host's costs; with nothing started they shrink with the
// rest, and the timing stays valid below the scale a real check allows.
func scaledWithoutContainers(f float64) infra.Timing {
	t := infra.Prod().Scaled(f)
	t.ContainerHealthInterval = time.Duration(float64(t.ContainerHealthInterval) * f)
	t.ContainerHealthTimeout = t.ContainerHealthInterval
	// The lock wait keeps its margin past the watchdog's hold, and the
	// deploy's hold its margin past its steps.
	margin := t.LockWait - t.WatchdogHold()
	holdMargin := t.DeployHold - t.DeploySteps() - t.EngineWork
	t.EngineWork = time.Duration(float64(t.EngineWork) * f)
	t.LockWait = t.WatchdogHold() + margin
	t.DeployHold = t.DeploySteps() + t.EngineWork + holdMargin
	return t
}

// ports are the ports freePort handed out: nothing listens on one until
// its test's first deploy, so the kernel may offer it again to a test
// running beside.
var ports = struct {
	sync.Mutex
	given map[int]bool
}{given: map[int]bool{}}

// freePort asks the kernel for a loopback port nobody listens on and no
// other test of this binary was given.
func freePort(t *testing.T) int {
	t.Helper()
	ports.Lock()
	defer ports.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := l.Addr().(*net.TCPAddr).Port
		require.NoError(t, l.Close())
		if !ports.given[port] {
			ports.given[port] = true
			return port
		}
	}
}

// serverTools are the commands the hooks run on a server, each with the
// Debian package that installs it.
var serverTools = []needs.Need{
	needs.Tool("flock", "apt-get install util-linux"),
	needs.Tool("curl", "apt-get install curl"),
	needs.Tool("jq", "apt-get install jq"),
	needs.Tool("sha256sum", "apt-get install coreutils"),
	needs.Tool("timeout", "apt-get install coreutils"),
}

// requireServerTools fails at once, naming the install command, when this
// machine lacks a command the hooks need: the scripts would fail later and
// less clearly. The scripts' tests are the full run's: -short skips them.
func requireServerTools(t *testing.T) {
	t.Helper()
	needs.Have(t, serverTools...)
}

// newServer sets up one simulated server whose release is rendered from
// timing, and removes its containers when the test ends.
func newServer(t *testing.T, timing infra.Timing) Server {
	t.Helper()
	requireServerTools(t)
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	require.NoError(t, os.Mkdir(release, 0o755))
	require.NoError(t, WriteRelease(release, timing))
	hooksDir, err := filepath.Abs(".")
	require.NoError(t, err)
	s := Server{
		HooksDir:   hooksDir,
		Root:       filepath.Join(dir, "root"),
		Project:    "hookstest" + randomHex(4),
		ReleaseDir: release,
		AppPort:    freePort(t),
		Bind:       "127.0.0.1",
	}
	t.Cleanup(func() {
		if _, err := exec.LookPath("docker"); err != nil {
			return
		}
		if err := s.Remove(context.Background()); err != nil {
			t.Errorf("clean up %s: %v", s.Project, err)
		}
	})
	return s
}

// result is one finished run of a script.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// run runs a script for s and returns how it ended; extra is added to its
// environment.
func run(t *testing.T, s Server, extra []string, script string, args ...string) result {
	t.Helper()
	cmd := s.Command(context.Background(), script, args...)
	cmd.Env = append(cmd.Env, extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		require.NoError(t, err, "run %s", script)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// lines returns the non-empty lines of s.
func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

// runScript is run for goroutines other than the test's: it never calls
// require.
func runScript(s Server, extra []string, script string, args ...string) result {
	cmd := s.Command(context.Background(), script, args...)
	cmd.Env = append(cmd.Env, extra...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	if err != nil && code == -1 {
		stderr.WriteString(err.Error())
	}
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// execBash runs a command line through bash with $0 set to name.
func execBash(line, name string) ([]byte, error) {
	return exec.Command("bash", "-c", line, name).CombinedOutput()
}
