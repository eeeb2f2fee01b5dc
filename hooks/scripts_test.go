package hooks

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

func TestBootstrapInstallsDefinitionHooksAndUnits(t *testing.T) {
	s := newServer(t, infra.Prod().Scaled(0.2))
	res := run(t, s, nil, "bootstrap")
	require.Equal(t, 0, res.code, "%s", res)

	release := func(name string) string { return string(mustRead(t, filepath.Join(s.ReleaseDir, name))) }
	installed := func(name string) string { return string(mustRead(t, filepath.Join(s.Root, name))) }
	assert.NoFileExists(t, filepath.Join(s.Root, "current"), "bootstrap changes no running release")
	assert.Equal(t, release(TimingEnvFile), installed("hooks/timing.env"), "the timing the release was rendered from")
	for _, name := range []string{"deploy", "watchdog", "bootstrap", "lib.sh"} {
		assert.Equal(t, string(mustRead(t, name)), installed("hooks/"+name), name)
	}
	fi, err := os.Stat(filepath.Join(s.Root, "hooks", "watchdog"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), fi.Mode().Perm())

	unit := installed("systemd/mythex-watchdog.service")
	assert.Contains(t, unit, `ExecStart="`+s.Root+`/hooks/watchdog"`+"\n")
	assert.Contains(t, unit, `Environment="MYTHEX_ROOT=`+s.Root+`"`+"\n")
	assert.NotContains(t, unit, "@MYTHEX_ROOT@")
	assert.Equal(t, string(mustRead(t, TimerFile)), installed("systemd/"+TimerFile))
	assert.Contains(t, res.stdout, "not enabling them", "units outside systemd's directory are not enabled")

	out, err := exec.Command(systemdAnalyze(t), "verify", "--man=no",
		filepath.Join(s.Root, "systemd", ServiceFile),
		filepath.Join(s.Root, "systemd", TimerFile)).CombinedOutput()
	assert.NoError(t, err, "systemd-analyze verify:\n%s", out)

	// The installed watchdog runs on its own, with the timing beside it.
	cmd := exec.Command(filepath.Join(s.Root, "hooks", "watchdog"))
	cmd.Env = append(os.Environ(), "MYTHEX_ROOT="+s.Root)
	out, err = cmd.CombinedOutput()
	assert.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "nothing deployed on this server yet")

	// Again: bootstrap is safe to repeat and leaves no temp file behind.
	res = run(t, s, nil, "bootstrap")
	require.Equal(t, 0, res.code, "%s", res)
	leftovers, err := filepath.Glob(filepath.Join(s.Root, "*", ".*"))
	require.NoError(t, err)
	dot, err := filepath.Glob(filepath.Join(s.Root, ".*"))
	require.NoError(t, err)
	assert.Empty(t, append(leftovers, dot...), "temp files left behind")
}

func TestTamperedDefinitionIsRefused(t *testing.T) {
	tests := []struct {
		name    string
		tamper  func(t *testing.T, release string)
		wantErr string
	}{
		{"changed compose file", func(t *testing.T, release string) {
			f, err := os.OpenFile(filepath.Join(release, ComposeFile), os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteString("  rogue:\n    image: busybox\n")
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}, "but the published checksum is"},
		{"checksum of another file", func(t *testing.T, release string) {
			require.NoError(t, os.WriteFile(filepath.Join(release, ChecksumFile), Checksum([]byte("something else")), 0o644))
		}, "but the published checksum is"},
		{"no checksum", func(t *testing.T, release string) {
			require.NoError(t, os.Remove(filepath.Join(release, ChecksumFile)))
		}, "no published checksum"},
		{"checksum file without a checksum", func(t *testing.T, release string) {
			require.NoError(t, os.WriteFile(filepath.Join(release, ChecksumFile), []byte("TODO\n"), 0o644))
		}, "holds no SHA-256"},
	}
	for _, tt := range tests {
		for _, script := range []string{"deploy", "bootstrap"} {
			t.Run(tt.name+"/"+script, func(t *testing.T) {
				s := newServer(t, infra.Prod().Scaled(0.2))
				// A good release bootstraps first.
				res := run(t, s, nil, "bootstrap")
				require.Equal(t, 0, res.code, "%s", res)
				hooksBefore, err := os.Readlink(filepath.Join(s.Root, "hooks"))
				require.NoError(t, err)

				// Then a tampered one is published (a new release, new timing).
				tt.tamper(t, s.ReleaseDir)
				require.NoError(t, os.WriteFile(filepath.Join(s.ReleaseDir, TimingEnvFile),
					mustRender(t, RenderTimingEnv, infra.Prod().Scaled(0.4)), 0o644))
				args := map[string][]string{"deploy": {"v2"}}[script]
				res = run(t, s, nil, script, args...)
				assert.Equal(t, 1, res.code, "%s", res)
				assert.Contains(t, res.stderr, tt.wantErr)
				assert.NoFileExists(t, filepath.Join(s.Root, "current"), "no release switched in")
				releases, err := os.ReadDir(filepath.Join(s.Root, "releases"))
				require.NoError(t, err)
				assert.Empty(t, releases, "no release staged")
				hooksAfter, err := os.Readlink(filepath.Join(s.Root, "hooks"))
				require.NoError(t, err)
				assert.Equal(t, hooksBefore, hooksAfter, "the hooks of the tampered release are not installed")
				dot, err := filepath.Glob(filepath.Join(s.Root, ".*"))
				require.NoError(t, err)
				assert.Empty(t, dot, "no temp file left behind")
			})
		}
	}
}

func TestDeployRefusesBadInput(t *testing.T) {
	s := newServer(t, infra.Prod().Scaled(0.2))
	s.AppPort = 0
	res := run(t, s, []string{"MYTHEX_IMAGE_PREFIX=Not A Prefix"}, "deploy", "v1; rm -rf /")
	assert.Equal(t, 2, res.code, "%s", res)
	for _, want := range []string{
		"VERSION 'v1; rm -rf /' is not a valid image tag",
		"MYTHEX_APP_PORT '0' must be a port number",
		"MYTHEX_IMAGE_PREFIX 'Not A Prefix' is not an image prefix",
	} {
		assert.Contains(t, res.stderr, want, "every problem is named at once")
	}
	assert.NoDirExists(t, s.Root, "nothing done")

	res = run(t, s, nil, "deploy")
	assert.Equal(t, 2, res.code, "%s", res)
	assert.Contains(t, res.stderr, "usage: deploy VERSION")
}

func TestScriptsRefuseBrokenTimingFile(t *testing.T) {
	tm := infra.Prod().Scaled(0.2)
	s := newServer(t, tm)
	env := string(mustRead(t, filepath.Join(s.ReleaseDir, TimingEnvFile)))
	lockWait := fmt.Sprintf("MYTHEX_LOCK_WAIT_MS=%d\n", tm.LockWait.Milliseconds())
	require.Contains(t, env, lockWait)
	env = strings.Replace(env, lockWait, "MYTHEX_LOCK_WAIT_MS=24s\n", 1)
	require.Contains(t, env, "MYTHEX_WATCHDOG_STRIKES=4\n")
	env = strings.Replace(env, "MYTHEX_WATCHDOG_STRIKES=4\n", "", 1)
	env += "not a setting\n"
	require.NoError(t, os.WriteFile(filepath.Join(s.ReleaseDir, TimingEnvFile), []byte(env), 0o644))
	for _, script := range []string{"deploy", "watchdog", "bootstrap"} {
		t.Run(script, func(t *testing.T) {
			res := run(t, s, nil, script, map[string][]string{"deploy": {"v1"}}[script]...)
			assert.Equal(t, 1, res.code, "%s", res)
			for _, want := range []string{
				"MYTHEX_LOCK_WAIT_MS=24s must be a positive integer",
				"MYTHEX_WATCHDOG_STRIKES is missing",
				"is not KEY=value: not a setting",
			} {
				assert.Contains(t, res.stderr, want)
			}
			assert.NoFileExists(t, s.Lock(), "stopped before taking the lock")
		})
	}
}

// mustRender renders one generated file for timing.
func mustRender(t *testing.T, render func(infra.Timing) ([]byte, error), timing infra.Timing) []byte {
	t.Helper()
	out, err := render(timing)
	require.NoError(t, err)
	return out
}

// What the rollout ships and runs on a server is executable in the
// repository itself, not only in a test's copy: the release's archive
// carries the mode over.
func TestShippedScriptsAreExecutableInGit(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "-s", "--", "remote-deploy", "deploy", "bootstrap", "watchdog").Output()
	require.NoError(t, err)
	got := lines(string(out))
	require.Len(t, got, 4)
	for _, l := range got {
		assert.True(t, strings.HasPrefix(l, "100755 "), "not executable in git: %s", l)
	}
}
