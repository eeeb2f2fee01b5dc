package hooks

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A server whose MYTHEX_ROOT has a component starting with a dash, spaces,
// glob characters, braces, a dollar sign and non-ASCII letters runs the
// whole cycle there on a real Docker engine: bootstrap installs the hooks
// and units, deploy stages, switches, replaces and verifies, the installed
// watchdog counts strikes and restarts a stopped service from the current
// release. A path handed unquoted to a command, or read as an option or a
// pattern, breaks one of these steps.
func TestDeployUnderAnAwkwardRoot(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	s := newServer(t, dockerTiming)
	s.Root = filepath.Join(filepath.Dir(s.Root), "-rf", "my root [a-z]*?", "ünïcødé {a,b} $HOME ~")
	res := run(t, s, nil, "bootstrap")
	require.Equal(t, 0, res.code, "%s", res)
	assert.FileExists(t, filepath.Join(s.Root, "hooks", "watchdog"))

	res = deploy(t, s, tag)
	assert.Contains(t, res.stdout, "verified: api orchestrator gateway publish-worker")
	for role, id := range containers(t, s) {
		assert.Equal(t, "running healthy", state(t, id), role)
		assert.Equal(t, tag, ask(t, id).Version, role)
	}
	assert.Equal(t, tag, currentVersion(t, s))

	// The installed watchdog, as its unit runs it.
	watchdog := func() string {
		t.Helper()
		cmd := exec.Command(filepath.Join(s.Root, "hooks", "watchdog"))
		cmd.Env = s.Environ()
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	assert.NotContains(t, watchdog(), "strike")
	docker(t, "stop", containers(t, s)["gateway"])
	var out string
	for range dockerTiming.WatchdogStrikes {
		out = watchdog()
	}
	assert.Contains(t, out, "gateway: restarted and healthy")
	assert.Equal(t, tag, ask(t, containers(t, s)["gateway"]).Version)

	// Everything stayed under the root.
	for _, stray := range []string{"-rf", "my root", "~"} {
		_, err := os.Stat(stray)
		assert.True(t, os.IsNotExist(err), "%s created in the working directory", stray)
	}
}
