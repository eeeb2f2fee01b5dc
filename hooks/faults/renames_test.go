package faults

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain"
	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/internal/dockerlock"
	"github.com/mythex/infra/internal/needs"
)

// changedDefinition is s publishing another release: the same images and
// timing.env, a compose definition that differs in the read-header bound,
// so a deploy of it changes what runs without building images.
func changedDefinition(t *testing.T, s hooks.Server) hooks.Server {
	t.Helper()
	next := timing
	next.ReadHeaderTimeout -= next.ReadHeaderTimeout / 4
	n := s
	n.ReleaseDir = filepath.Join(t.TempDir(), "release")
	require.NoError(t, os.Mkdir(n.ReleaseDir, 0o755))
	require.NoError(t, hooks.WriteRelease(n.ReleaseDir, next))
	require.NotEqual(t, readHeaderIn(t, filepath.Join(s.ReleaseDir, hooks.ComposeFile)), readHeaderIn(t, filepath.Join(n.ReleaseDir, hooks.ComposeFile)))
	require.Equal(t, mustRead(t, filepath.Join(s.ReleaseDir, hooks.TimingEnvFile)), mustRead(t, filepath.Join(n.ReleaseDir, hooks.TimingEnvFile)))
	return n
}

// readHeaderIn is the read-header bound a compose definition sets.
func readHeaderIn(t *testing.T, compose string) string {
	t.Helper()
	_, v, ok := strings.Cut(string(mustRead(t, compose)), drain.EnvReadHeader+"=")
	require.True(t, ok, "%s sets no %s", compose, drain.EnvReadHeader)
	v, _, _ = strings.Cut(v, `"`)
	return v
}

// readHeaderOf is the read-header bound a container runs with.
func readHeaderOf(t *testing.T, id string) string {
	t.Helper()
	for _, kv := range lines(docker(t, "inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", id)) {
		if v, ok := strings.CutPrefix(kv, drain.EnvReadHeader+"="); ok {
			return v
		}
	}
	require.Fail(t, "no "+drain.EnvReadHeader, "container %s", id)
	return ""
}

// installedDefinition is the compose definition s's watchdog restarts from.
func installedDefinition(s hooks.Server) string {
	return filepath.Join(s.Root, "current", hooks.ComposeFile)
}

// killingMv writes an mv that renames as mv does and then, right after a
// rename onto a path matching the pattern in $KILL_AFTER_RENAME_TO, writes
// that path to $KILLED_AT and SIGKILLs its process group: the deploy,
// started as a group of its own, and whatever it runs at that moment. It
// returns the directory to put first on PATH.
func killingMv(t *testing.T) string {
	t.Helper()
	mv, err := exec.LookPath("mv")
	require.NoError(t, err)
	dir := t.TempDir()
	script := fmt.Sprintf(`#!/bin/sh
'%s' "$@" || exit
for dst; do :; done
case "$dst" in
$KILL_AFTER_RENAME_TO)
  printf '%%s\n' "$dst" >"$KILLED_AT"
  kill -KILL 0 ;;
esac
`, mv)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mv"), []byte(script), 0o755))
	return dir
}

// deployKilledAfterRename runs deploy on s with killingMv first on PATH and
// returns the path whose rename it was killed right after; it fails the
// test if the deploy was not killed there.
func deployKilledAfterRename(t *testing.T, s hooks.Server, version, mvDir, pattern string) string {
	t.Helper()
	killedAt := filepath.Join(t.TempDir(), "killed-at")
	cmd := s.Command(context.Background(), "deploy", version)
	cmd.Env = append(cmd.Env, "PATH="+mvDir+":"+os.Getenv("PATH"),
		"KILL_AFTER_RENAME_TO="+pattern, "KILLED_AT="+killedAt)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = timing.DeployDowntime()
	_ = cmd.Run()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL,
		"deploy was not killed after a rename to %s: %v\n%s", pattern, cmd.ProcessState, out.String())
	t.Logf("deploy, killed right after a rename to %s:\n%s", pattern, out.String())
	return strings.TrimSpace(string(mustRead(t, killedAt)))
}

// Item 3: a release is installed by renames, and the deploy is SIGKILLed
// right after each rename that puts part of the new release in place (its
// definition, checksum and values; the release directory; the switch of
// `current`). After each kill the server runs one release, and the
// watchdog still restarts a crashed service from it: at its fourth strike,
// healthy, with the definition `current` names. Before, compose.yaml and
// its checksum were installed by two renames: killed between them, the
// watchdog refused every restart until someone deployed again.
func TestDeployKilledAfterEachRename(t *testing.T) {
	needs.Have(t, needs.Docker)
	dockerlock.Parallel(t, 1)
	tag := images(t)
	s := newServer(t)
	next := changedDefinition(t, s)
	deploy(t, s, tag)
	mvDir := killingMv(t)
	for _, p := range []struct{ name, pattern string }{
		{"definition", "*/" + hooks.ComposeFile},
		{"checksum", "*/" + hooks.ChecksumFile},
		{"values", "*/deployed.env"},
		{"release", s.Root + "/releases/[!.]*"},
		{"current", s.Root + "/current"},
	} {
		// Each kill point starts from where the one before left the
		// server: past a failed one, the rest would only repeat it.
		ok := t.Run(p.name, func(t *testing.T) {
			killedAt := deployKilledAfterRename(t, next, tag, mvDir, p.pattern)
			awaitLockFree(t, s, 2*timing.DeployDowntime())
			res := tick(t, s)
			t.Logf("killed right after the rename to %s; the next watchdog run:\n%s", killedAt, res.stdout)

			docker(t, "stop", "--time", "0", containers(t, s)["gateway"])
			for range timing.WatchdogStrikes {
				res = tick(t, s)
			}
			t.Logf("gateway stopped; the watchdog's fourth run after that:\n%s", res.stdout)
			assert.Contains(t, res.stdout, "gateway: restarted and healthy")
			want := readHeaderIn(t, installedDefinition(s))
			for role, id := range containers(t, s) {
				assert.Equal(t, "running healthy", state(t, id), role)
				a := ask(t, id)
				assert.Equal(t, about{Role: role, Version: tag}, about{Role: a.Role, Version: a.Version}, role)
				assert.Equal(t, want, readHeaderOf(t, id), "%s runs the definition the server restarts from", role)
			}
			noLeftovers(t, s)
		})
		require.True(t, ok, "killed after the rename to %s, the server did not come back", p.name)
	}
}
