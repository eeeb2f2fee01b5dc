package hooks

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/needs"
)

// fastTiming drives the scripts where no container starts: every bound is
// a fraction of a second. compose.yaml cannot be rendered from it (Docker
// takes whole seconds), so tests write its timing.env over a release
// rendered from dockerTiming.
var fastTiming = scaledWithoutContainers(0.01)

// useTiming makes s's scripts read their numbers from timing.
func useTiming(t *testing.T, s Server, timing infra.Timing) {
	t.Helper()
	env, err := RenderTimingEnv(timing)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(s.ReleaseDir, TimingEnvFile), env, 0o644))
}

// installRelease lays out a current release on s the way deploy does, with
// version's values, without starting anything.
func installRelease(t *testing.T, s Server, version string) {
	t.Helper()
	dir := filepath.Join(s.Root, "releases", version+"-test")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, name := range []string{ComposeFile, ChecksumFile} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), mustRead(t, filepath.Join(s.ReleaseDir, name)), 0o444))
	}
	values := fmt.Sprintf("MYTHEX_VERSION=%s\nMYTHEX_BIND=127.0.0.1\nMYTHEX_APP_PORT=%d\n", version, s.AppPort)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "deployed.env"), []byte(values), 0o444))
	require.NoError(t, os.MkdirAll(filepath.Join(s.Root, "state"), 0o755))
	require.NoError(t, os.Symlink("releases/"+version+"-test", filepath.Join(s.Root, "current")))
}

// Item 7: timing.env is data. A key the scripts do not know, above all the
// test seam that runs a command as root, is refused with the rest.
func TestTimingFileSetsTimingKeysOnly(t *testing.T) {
	s := newServer(t, dockerTiming)
	marker := filepath.Join(t.TempDir(), "ran")
	env := string(mustRead(t, filepath.Join(s.ReleaseDir, TimingEnvFile)))
	env += "MYTHEX_CRITICAL_SECTION_CMD=touch " + marker + "\n"
	env += "MYTHEX_ROOT=/\n"
	env += "MYTHEX_WATCHDOG_STRIKES=1\n"
	require.NoError(t, os.WriteFile(filepath.Join(s.ReleaseDir, TimingEnvFile), []byte(env), 0o644))
	for _, script := range []string{"watchdog", "deploy", "bootstrap"} {
		t.Run(script, func(t *testing.T) {
			res := run(t, s, nil, script, map[string][]string{"deploy": {"v1"}}[script]...)
			assert.Equal(t, 1, res.code, "%s", res)
			assert.Contains(t, res.stderr, "sets MYTHEX_CRITICAL_SECTION_CMD, which is not a timing key")
			assert.Contains(t, res.stderr, "sets MYTHEX_ROOT, which is not a timing key")
			assert.Contains(t, res.stderr, "sets MYTHEX_WATCHDOG_STRIKES a second time")
			assert.NoFileExists(t, marker, "the command from timing.env never ran")
			assert.NoFileExists(t, s.Lock(), "stopped before taking the lock")
		})
	}
}

// Item 9: the lock file is the server's alone. flock needs only read
// access, so a lock file others may read is one they may hold.
func TestLockFileIsPrivate(t *testing.T) {
	needs.Have(t, needs.Setpriv)
	nobody, err := exec.LookPath("setpriv")
	require.NoError(t, err)
	s := newServer(t, dockerTiming)
	// Let another user reach the server's directory, as under /opt.
	for dir := filepath.Dir(s.Root); dir != os.TempDir() && dir != "/"; dir = filepath.Dir(dir) {
		require.NoError(t, os.Chmod(dir, 0o755))
	}
	require.NoError(t, os.MkdirAll(s.Root, 0o755))
	// An older release left the lock readable by everyone.
	require.NoError(t, os.WriteFile(s.Lock(), nil, 0o644))

	res := run(t, s, nil, "bootstrap")
	require.Equal(t, 0, res.code, "%s", res)
	fi, err := os.Stat(s.Lock())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the lock file is readable by root alone")
	for _, dir := range []string{s.Root, filepath.Join(s.Root, "state"), filepath.Join(s.Root, "releases")} {
		fi, err := os.Stat(dir)
		require.NoError(t, err)
		assert.Zero(t, fi.Mode().Perm()&0o022, "%s is writable by root alone: %v", dir, fi.Mode())
	}

	out, err := exec.Command(nobody, "--reuid=65534", "--regid=65534", "--clear-groups",
		"flock", "--nonblock", s.Lock(), "true").CombinedOutput()
	assert.Error(t, err, "another user took the server lock: %s", out)
	assert.Contains(t, string(out), "Permission denied")

	// A lock in a directory others may write to could be swapped: refused.
	open := filepath.Join(t.TempDir(), "shared")
	require.NoError(t, os.Mkdir(open, 0o777))
	require.NoError(t, os.Chmod(open, 0o777))
	res = run(t, s, []string{"MYTHEX_LOCK=" + filepath.Join(open, "mythex.lock")}, "bootstrap")
	assert.Equal(t, 1, res.code, "%s", res)
	assert.Contains(t, res.stderr, open+" has mode 777: group or others may write to it")
}

// Item 9: a lock held past the longest anything may hold it (RemoteHold: a
// remote deploy's bootstrap and deploy under one hold) fails the watchdog's
// unit, naming the lock; until then the watchdog stands aside.
func TestWatchdogReportsAStuckLock(t *testing.T) {
	s := newServer(t, dockerTiming)
	useTiming(t, s, fastTiming)
	holdLock(t, s)
	start := time.Now()
	var last result
	for time.Since(start) < 10*fastTiming.RemoteHold() {
		last = run(t, s, nil, "watchdog")
		if last.code != 0 {
			break
		}
		assert.Contains(t, last.stdout, "deploy in progress")
		time.Sleep(fastTiming.ContainerHealthInterval)
	}
	require.Equal(t, 1, last.code, "the watchdog never reported the stuck lock: %s", last)
	assert.GreaterOrEqual(t, time.Since(start), fastTiming.RemoteHold(), "not before a deploy could have held it")
	assert.Contains(t, last.stderr, "the server lock "+s.Lock()+" has been held for more than")
	assert.Contains(t, last.stderr, "longer than any deploy may hold it")
	assert.Contains(t, last.stderr, "fuser -v "+s.Lock())
}

// Item 6: a wedged Docker engine (its CLI never answers) holds nothing
// forever: every call is bounded from the timing, and the lock is free
// again once the script gives up.
func TestWedgedDockerIsBounded(t *testing.T) {
	bin := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bin, "docker"), []byte("#!/bin/sh\nexec sleep 3600\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "docker-compose"), []byte("#!/bin/sh\nexec sleep 3600\n"), 0o755))
	path := "PATH=" + bin + ":" + os.Getenv("PATH")
	for _, tc := range []struct {
		script string
		args   []string
		want   string
	}{
		{"watchdog", nil, "docker ps failed or timed out"},
		{"deploy", []string{"v2"}, "compose config failed"},
	} {
		t.Run(tc.script, func(t *testing.T) {
			s := newServer(t, dockerTiming)
			useTiming(t, s, fastTiming)
			installRelease(t, s, "v1")
			ctx, cancel := context.WithTimeout(context.Background(), 20*fastTiming.ServerDeployMax())
			defer cancel()
			cmd := s.Command(ctx, tc.script, tc.args...)
			cmd.Env = append(cmd.Env, path)
			cmd.WaitDelay = time.Second
			out, err := cmd.CombinedOutput()
			require.NoError(t, ctx.Err(), "%s hung on a wedged Docker engine:\n%s", tc.script, out)
			assert.Error(t, err)
			assert.Equal(t, 1, cmd.ProcessState.ExitCode(), "%s", out)
			assert.Contains(t, string(out), tc.want)
			target, err := os.Readlink(filepath.Join(s.Root, "current"))
			require.NoError(t, err)
			assert.Equal(t, "releases/v1-test", target, "the running release is unchanged")
			f, err := os.Open(s.Lock())
			require.NoError(t, err)
			defer f.Close()
			assert.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB), "the lock is free again")
		})
	}
}

// Item 2: a write that fails (here past a file size limit, as on a full
// disk) leaves the file it was replacing whole, and the run fails. Strikes
// truncated to nothing would keep the watchdog from ever reaching its
// fourth strike.
func TestFailedWriteKeepsStrikes(t *testing.T) {
	requireDocker(t)
	s := newServer(t, dockerTiming)
	useTiming(t, s, fastTiming)
	installRelease(t, s, "v1")
	strikesFile := filepath.Join(s.Root, "state", "strikes")
	before := "api 2\norchestrator 2\ngateway 2\npublish-worker 2\n"
	require.NoError(t, os.WriteFile(strikesFile, []byte(before), 0o644))

	// Nothing runs for this project: every service gets a strike, and the
	// strikes cannot be written. SIGXFSZ ignored, a write past the limit
	// fails with an error, as on a full disk (ENOSPC), instead of killing.
	cmd := exec.Command("bash", "-c", `trap "" XFSZ && ulimit -f 0 && exec "$0"`, filepath.Join(s.HooksDir, "watchdog"))
	cmd.Env = s.Environ()
	out, err := cmd.CombinedOutput()
	assert.Error(t, err, "%s", out)
	assert.Equal(t, 1, cmd.ProcessState.ExitCode(), "%s", out)
	assert.Contains(t, string(out), "api: strike 3/4")
	assert.Contains(t, string(out), "cannot write "+strikesFile)
	assert.Equal(t, before, string(mustRead(t, strikesFile)), "the strikes file is whole")
	left, err := filepath.Glob(filepath.Join(s.Root, "state", ".*"))
	require.NoError(t, err)
	assert.Empty(t, left, "no temp file left behind")

	// With room to write, the same run counts the strike.
	res := run(t, s, nil, "watchdog")
	assert.Contains(t, res.stdout, "api: strike 3/4")
	assert.Contains(t, string(mustRead(t, strikesFile)), "api 3\n")
}

// Item 11: a root with a space, | or & is fine in bootstrap and in the
// unit systemd reads; one with a quote, a backslash or a newline is refused
// before anything is done.
func TestAwkwardRootIsQuotedOrRefused(t *testing.T) {
	analyze := systemdAnalyze(t)
	for _, name := range []string{"my root", "a|b&c", "50%$HOME x"} {
		t.Run(name, func(t *testing.T) {
			s := newServer(t, dockerTiming)
			s.Root = filepath.Join(filepath.Dir(s.Root), name)
			res := run(t, s, nil, "bootstrap")
			require.Equal(t, 0, res.code, "%s", res)
			unit := filepath.Join(s.Root, "systemd", ServiceFile)
			out, err := exec.Command(analyze, "verify", "--man=no", unit, filepath.Join(s.Root, "systemd", TimerFile)).CombinedOutput()
			assert.NoError(t, err, "systemd-analyze verify:\n%s", out)
			assert.Empty(t, strings.TrimSpace(string(out)))
			assert.Contains(t, string(mustRead(t, unit)), `ExecStart="`+strings.ReplaceAll(s.Root, "%", "%%")+`/hooks/watchdog"`)

			cmd := exec.Command(filepath.Join(s.Root, "hooks", "watchdog"))
			cmd.Env = append(os.Environ(), "MYTHEX_ROOT="+s.Root)
			out, err = cmd.CombinedOutput()
			assert.NoError(t, err, "%s", out)
			assert.Contains(t, string(out), "nothing deployed on this server yet")
		})
	}
	for _, tc := range []struct{ name, want string }{
		{`say "hi"`, `must not contain "`},
		{"back\\slash", `must not contain \`},
		{"new\nline", "must not contain control characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, dockerTiming)
			s.Root = filepath.Join(filepath.Dir(s.Root), tc.name)
			for _, script := range []string{"bootstrap", "watchdog", "deploy"} {
				res := run(t, s, nil, script, map[string][]string{"deploy": {"v1"}}[script]...)
				assert.NotZero(t, res.code, "%s", res)
				assert.Contains(t, res.stderr, tc.want, script)
				assert.NoDirExists(t, s.Root, "%s did nothing", script)
			}
		})
	}
}

// systemdAnalyze finds systemd-analyze or fails naming how to install it.
func systemdAnalyze(t *testing.T) string {
	t.Helper()
	needs.Have(t, needs.SystemdAnalyze)
	path, err := exec.LookPath("systemd-analyze")
	require.NoError(t, err, "systemd-analyze is needed to check the units: apt-get install systemd")
	return path
}

// Item 10: the watchdog is a root oneshot talking to Docker; its unit takes
// away what it does not need, and systemd accepts every directive.
func TestWatchdogUnitIsHardened(t *testing.T) {
	analyze := systemdAnalyze(t)
	want := map[string]string{
		"NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "ProtectSystem": "strict",
		"PrivateTmp": "yes", "PrivateDevices": "yes", "ProtectHome": "read-only",
		"ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
		"RestrictSUIDSGID": "yes", "RestrictNamespaces": "yes", "LockPersonality": "yes",
		"SystemCallArchitectures": "native",
	}
	for name, timing := range testTimings {
		t.Run(name, func(t *testing.T) {
			out, err := RenderService(timing)
			require.NoError(t, err)
			keys := unitKeys(string(out))
			for k, v := range want {
				assert.Equal(t, v, keys[k], k)
			}
			assert.Equal(t, `"@MYTHEX_ROOT@"`, keys["ReadWritePaths"], "the state, releases and lock stay writable")
		})
	}
	s := newServer(t, dockerTiming)
	res := run(t, s, nil, "bootstrap")
	require.Equal(t, 0, res.code, "%s", res)
	out, err := exec.Command(analyze, "verify", "--man=no",
		filepath.Join(s.Root, "systemd", ServiceFile), filepath.Join(s.Root, "systemd", TimerFile)).CombinedOutput()
	assert.NoError(t, err, "systemd-analyze verify:\n%s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "systemd-analyze verify has warnings")
}

// Item 6: systemd bounds a watchdog run: past its own lock-hold bound
// (WatchdogHold) and, with the stop timeout, within the lock wait, so a
// wedged watchdog lets go before a deploy waiting on it gives up.
func TestWatchdogUnitBoundsItsRun(t *testing.T) {
	for name, timing := range testTimings {
		t.Run(name, func(t *testing.T) {
			out, err := RenderService(timing)
			require.NoError(t, err)
			keys := unitKeys(string(out))
			start := mustDuration(t, keys["TimeoutStartSec"])
			stop := mustDuration(t, keys["TimeoutStopSec"])
			assert.Equal(t, "oneshot", keys["Type"])
			assert.Greater(t, start, timing.WatchdogHold(), "the watchdog's own bound fires first")
			assert.Positive(t, stop)
			assert.LessOrEqual(t, start+stop, timing.LockWait, "killed before a waiting deploy gives up")
		})
	}
}

// unitKeys maps each Key=value of a unit file, comments aside.
func unitKeys(unit string) map[string]string {
	keys := map[string]string{}
	for _, l := range strings.Split(unit, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
			keys[k] = v
		}
	}
	return keys
}
