package hooks

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// buildTool compiles one of the tests' commands (a main package under
// hooks/internal) and returns its path.
func buildTool(t *testing.T, pkg string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(pkg))
	require.NoError(t, buildStatic(context.Background(), repoRoot(t), pkg, out))
	return out
}

// changedDefinition is s publishing another release: the same images and
// timing.env, a compose definition that differs in one drain bound, so a
// deploy of it changes what runs without building images.
func changedDefinition(t *testing.T, s Server) Server {
	t.Helper()
	timing := dockerTiming
	timing.ReadHeaderTimeout -= timing.ReadHeaderTimeout / 4
	next := s
	next.ReleaseDir = filepath.Join(t.TempDir(), "release")
	require.NoError(t, os.Mkdir(next.ReleaseDir, 0o755))
	require.NoError(t, WriteRelease(next.ReleaseDir, timing))
	require.NotEqual(t, mustRead(t, filepath.Join(s.ReleaseDir, ComposeFile)), mustRead(t, filepath.Join(next.ReleaseDir, ComposeFile)))
	require.Equal(t, mustRead(t, filepath.Join(s.ReleaseDir, TimingEnvFile)), mustRead(t, filepath.Join(next.ReleaseDir, TimingEnvFile)))
	return next
}

// Item 2: a deploy that cannot make the directory where it records how the
// old containers end (mkdir refused under state/, root or not) stops, says
// why, and leaves the server as it was: nothing replaced, nothing switched,
// nothing for the watchdog to finish, and nothing written outside the
// server's directory. Before, the failed mktemp -d went unnoticed inside a
// function called from `||`: the directory's name was empty and the
// waiters wrote their records into /.
func TestDeployThatCannotRecordTheOldContainersChangesNothing(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	nomkdir := buildTool(t, "./hooks/internal/nomkdir")
	s := newServer(t, dockerTiming)
	deploy(t, s, tag)
	before := containers(t, s)
	release, err := os.Readlink(filepath.Join(s.Root, "current"))
	require.NoError(t, err)
	// Where a waiter with an empty directory name writes; removed if it did.
	var strays []string
	for role, id := range before {
		for _, suffix := range []string{"", ".log"} {
			strays = append(strays, filepath.Join("/", role+"."+id[:12]+suffix))
		}
	}
	t.Cleanup(func() {
		for _, f := range strays {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("remove %s: %v", f, err)
			}
		}
	})

	next := changedDefinition(t, s)
	cmd := exec.Command(nomkdir, filepath.Join(s.Root, "state"), filepath.Join(s.HooksDir, "deploy"), tag)
	cmd.Env = next.Environ()
	out, err := cmd.CombinedOutput()
	for _, f := range strays {
		assert.NoFileExists(t, f, "a waiter wrote its record outside the server's directory")
	}
	require.Error(t, err, "%s", out)
	assert.Equal(t, 1, cmd.ProcessState.ExitCode(), "%s", out)
	assert.Contains(t, string(out), "cannot create a directory for the old containers' exit codes")
	assert.Equal(t, before, containers(t, s), "no container replaced")
	for role, id := range before {
		assert.Equal(t, "running healthy", state(t, id), role)
	}
	after, err := os.Readlink(filepath.Join(s.Root, "current"))
	require.NoError(t, err)
	assert.Equal(t, release, after, "the running release is still current")
	assert.NoFileExists(t, filepath.Join(s.Root, "state", "deploying"), "nothing left for the watchdog to finish")
	assert.Contains(t, string(mustRead(t, filepath.Join(s.Root, "state", "last-deploy"))),
		tag+": FAILED before changing anything; this server still runs "+tag)
	left, err := filepath.Glob(filepath.Join(s.Root, "state", ".*"))
	require.NoError(t, err)
	assert.Empty(t, left, "no temp file left behind")

	res := tick(t, s)
	assert.NotContains(t, res.stdout, "interrupted")
	assert.Equal(t, before, containers(t, s), "the watchdog had nothing to do")
}

// A release directory that lacks its values (what a deploy killed while
// pruning it leaves: rm removes a directory's files one by one) is staged
// again, never used as it is. Used as it was, compose could not read the
// values, and every deploy of that release failed the same way until
// someone removed the directory. The images' registry refuses at once, so
// each deploy stops at the pull, before any container.
func TestHalfRemovedReleaseIsStagedAgain(t *testing.T) {
	requireDocker(t)
	s := newServer(t, dockerTiming)
	s.ImagePrefix = "127.0.0.1:1/mythex"
	res := run(t, s, nil, "deploy", "v1")
	require.Equal(t, 1, res.code, "%s", res)
	require.Contains(t, res.stderr, "cannot pull 127.0.0.1:1/mythex/")
	staged, err := filepath.Glob(filepath.Join(s.Root, "releases", "v1-*"))
	require.NoError(t, err)
	require.Len(t, staged, 1, "the release was staged")
	values := filepath.Join(staged[0], "deployed.env")
	want := mustRead(t, values)
	require.NoError(t, os.Remove(values))

	res = run(t, s, nil, "deploy", "v1")
	assert.Equal(t, 1, res.code, "%s", res)
	assert.NotContains(t, res.stderr, "compose config failed")
	assert.Contains(t, res.stderr, "cannot pull 127.0.0.1:1/mythex/", "the deploy got as far as before")
	assert.Equal(t, string(want), string(mustRead(t, values)), "the release is whole again")
}

// An old container's log that Docker cannot read (its logging driver has
// no read support, as "none", or a remote driver with its local cache
// turned off) cannot show the requests the container cut at its shutdown
// timeout: the deploy fails naming it, rather than report a clean drain it
// could not check. Before, the failed `docker logs` went unnoticed and the
// deploy passed.
func TestDeployFailsWhenOldLogsCannotBeRead(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	s := newServer(t, dockerTiming)
	compose := mustRender(t, RenderCompose, dockerTiming)
	api := []byte("\n  " + BalancerRole + ":\n")
	require.Contains(t, string(compose), string(api))
	compose = bytes.Replace(compose, api, append(api, "    logging:\n      driver: none\n"...), 1)
	require.NoError(t, os.WriteFile(filepath.Join(s.ReleaseDir, ComposeFile), compose, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(s.ReleaseDir, ChecksumFile), Checksum(compose), 0o644))
	deploy(t, s, tag)
	old := containers(t, s)

	res := run(t, s, nil, "deploy", tag)
	assert.Equal(t, 1, res.code, "%s", res)
	assert.Contains(t, res.stderr, BalancerRole+": old container "+old[BalancerRole][:12]+" exited 0 but its log could not be read: cannot tell whether it cut requests")
	assert.Contains(t, res.stderr, "configured logging driver does not support reading")
	for _, role := range Roles {
		if role != BalancerRole {
			assert.NotContains(t, res.stderr, role+": old container", "only api's log is unreadable")
		}
	}
}
