package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/dockerlock"
	"github.com/mythex/infra/internal/needs"
)

// containerPort is the port the service listens on inside its container;
// any port works, the test publishes it on loopback.
const containerPort = "8080"

func docker(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// The image as production runs it: FROM scratch, its own health check, and
// Docker's stop signal starting a drain that ends in exit 0, not 137.
func TestImageDrainsOnDockerStop(t *testing.T) {
	t.Parallel()
	needs.Have(t, needs.Docker)
	dockerlock.Hold(t)
	// Bounded from here: the wait for the other Docker suites is go test's
	// to bound (-timeout), not this test's.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	timing := infra.Prod().Scaled(0.2)

	// The build context is the static binary and the Dockerfile alone.
	buildDir := t.TempDir()
	bin, err := os.ReadFile(binary)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(buildDir, "service"), bin, 0o755))
	dockerfile, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(buildDir, "Dockerfile"), dockerfile, 0o644))
	name := fmt.Sprintf("mythex-service-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	image := name + ":test"
	_, err = docker(ctx, "build", "--quiet", "--tag", image, buildDir)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = docker(context.Background(), "rmi", "--force", image) })

	args := []string{"run", "--detach", "--name", name,
		"--publish", "127.0.0.1::" + containerPort,
		// The interval compose sets from the contract; the command is the
		// image's own HEALTHCHECK.
		"--health-interval", timing.ContainerHealthInterval.String(),
		"--env", "MYTHEX_ROLE=publish-worker", "--env", "MYTHEX_VERSION=v-image", "--env", "MYTHEX_PORT=" + containerPort}
	for _, kv := range timing.DrainConfig().Environ() {
		args = append(args, "--env", kv)
	}
	_, err = docker(ctx, append(args, image)...)
	t.Cleanup(func() { _, _ = docker(context.Background(), "rm", "--force", name) })
	require.NoError(t, err)

	// Healthy within the start timeout a deploy allows.
	require.Eventually(t, func() bool {
		status, err := docker(ctx, "inspect", "--format", "{{.State.Health.Status}}", name)
		return err == nil && status == "healthy"
	}, infra.Prod().StartTimeout, timing.ContainerHealthInterval, "container never healthy")
	health, err := docker(ctx, "inspect", "--format", "{{json .State.Health}}", name)
	require.NoError(t, err)
	assert.Contains(t, health, "healthy: GET http://127.0.0.1:"+containerPort+infra.HealthPath+" answered 200")

	published, err := docker(ctx, "port", name, containerPort)
	require.NoError(t, err)
	addr := strings.Split(published, "\n")[0]
	host, _, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", host, "published on loopback only")
	a, err := fetch(addr, "/about")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, a.Status)
	var about map[string]any
	require.NoError(t, json.Unmarshal([]byte(a.Body), &about))
	assert.Equal(t, "publish-worker", about["role"])
	assert.Equal(t, builtVersion, about["version"], "the binary's own version")
	assert.Equal(t, "v-image", about["release"])
	assert.Equal(t, "serving", about["phase"])

	grace := strconv.Itoa(int(math.Ceil(timing.StopGracePeriod.Seconds())))
	stopped := time.Now()
	_, err = docker(ctx, "stop", "--time", grace, name)
	require.NoError(t, err)
	elapsed := time.Since(stopped)

	state, err := docker(ctx, "inspect", "--format", "{{.State.ExitCode}} {{.State.OOMKilled}}", name)
	require.NoError(t, err)
	assert.Equal(t, "0 false", state, "a clean drain exits 0; 137 means Docker killed it")
	assert.GreaterOrEqual(t, elapsed, timing.Drain, "stopped without draining")
	assert.Less(t, elapsed, timing.StopGracePeriod, "stop took %v", elapsed)

	logs, err := docker(ctx, "logs", name)
	require.NoError(t, err)
	for _, phase := range []string{"draining", "shutting-down", "stopped"} {
		assert.Contains(t, logs, `"msg":"phase `+phase+`"`)
	}
	assert.Contains(t, logs, `"reason":"SIGTERM"`)
}
