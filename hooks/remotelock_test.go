package hooks

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// remoteHooks copies the scripts remote-deploy runs, with the units
// bootstrap installs, into a directory of the test's own, as the rollout
// unpacks them: remote-deploy writes its log beside itself.
func remoteHooks(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"remote-deploy", "bootstrap", "deploy", "watchdog"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), mustRead(t, name), 0o755))
	}
	for _, name := range []string{"lib.sh", ServiceFile, TimerFile} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), mustRead(t, name), 0o644))
	}
	return dir
}

// remoteLogs lists the logs remote-deploy wrote into dir.
func remoteLogs(t *testing.T, dir string) []string {
	t.Helper()
	logs, err := filepath.Glob(filepath.Join(dir, "remote-deploy.*.log"))
	require.NoError(t, err)
	return logs
}

// remote-deploy applies deploy's rule for VERSION before anything: a bad
// one is refused with exit 2, before bootstrap installs hooks or units,
// before the lock file exists, and before the detached half writes a log.
func TestRemoteDeployRefusesBadVersionBeforeBootstrap(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"shell text", []string{"v1; rm -rf /"}, "VERSION 'v1; rm -rf /' is not a valid image tag; nothing installed"},
		{"a path", []string{"../v1"}, "VERSION '../v1' is not a valid image tag"},
		{"empty", []string{""}, "VERSION '' is not a valid image tag"},
		{"too long", []string{strings.Repeat("v", 129)}, "is not a valid image tag"},
		{"an option", []string{"-v1"}, "usage: remote-deploy"},
		{"detached, shell text", []string{"--detached", "v1 && reboot"}, "VERSION 'v1 && reboot' is not a valid image tag"},
		{"rollback, a path", []string{"--rollback", "../../etc"}, "VERSION '../../etc' is not a valid image tag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, dockerTiming)
			s.HooksDir = remoteHooks(t)
			res := run(t, s, nil, "remote-deploy", tc.args...)
			assert.Equal(t, 2, res.code, "%s", res)
			assert.Contains(t, res.stderr, tc.want)
			assert.NoDirExists(t, s.Root, "nothing installed, not even the lock")
			assert.NoDirExists(t, filepath.Join(s.Root, "systemd"), "no unit installed")
			assert.Empty(t, remoteLogs(t, s.HooksDir), "the detached half never started")
		})
	}
}

// remote-deploy holds the server lock once, across bootstrap and deploy:
// a watchdog run in between finds it held and does nothing. The release's
// deploy is preceded by a pause (a wrapper that reports bootstrap done and
// waits for the test) and does no Docker work; remote-deploy and bootstrap
// are the real ones. A remote-deploy that let go of the lock between the
// two (bootstrap and deploy each taking it for itself) lets the watchdog
// run there, with the new hooks and the old release.
func TestRemoteDeployKeepsWatchdogOutBetweenBootstrapAndDeploy(t *testing.T) {
	s := newServer(t, dockerTiming)
	s.HooksDir = remoteHooks(t)
	watchdogBetween(t, s)
}

// watchdogBetween runs remote-deploy on s, whose hooks directory it
// instruments, and a watchdog between its bootstrap and its deploy.
func watchdogBetween(t *testing.T, s Server) {
	t.Helper()
	require.NoError(t, os.Rename(filepath.Join(s.HooksDir, "deploy"), filepath.Join(s.HooksDir, "deploy.real")))
	resume := filepath.Join(t.TempDir(), "resume")
	require.NoError(t, syscall.Mkfifo(resume, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(s.HooksDir, "deploy"), []byte(`#!/bin/sh
echo "between bootstrap and deploy"
read -r _ <"$RESUME_FIFO"
MYTHEX_CRITICAL_SECTION_CMD=true exec "${0%/*}/deploy.real" "$@"
`), 0o755))
	cmd := s.Command(context.Background(), "remote-deploy", "--detached", "v1")
	cmd.Env = append(cmd.Env, "RESUME_FIFO="+resume)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	var stdout strings.Builder
	sc := bufio.NewScanner(out)
	between := false
	for !between && sc.Scan() {
		stdout.WriteString(sc.Text() + "\n")
		between = sc.Text() == "between bootstrap and deploy"
	}
	require.True(t, between, "remote-deploy never got past bootstrap:\n%s%s", stdout.String(), stderr.String())
	link, err := os.Readlink(filepath.Join(s.Root, "hooks"))
	require.NoError(t, err, "bootstrap has installed the hooks")
	require.NoFileExists(t, filepath.Join(s.Root, "state", "strikes"))

	// Under the watchdog's unit: its own process, the installed hooks.
	watchdog := exec.Command(filepath.Join(s.Root, link, "watchdog"))
	watchdog.Env = s.Environ()
	b, err := watchdog.CombinedOutput()
	assert.NoError(t, err, "%s", b)
	assert.Contains(t, string(b), "deploy in progress", "the watchdog stood aside")
	assert.NotContains(t, string(b), "nothing deployed", "the watchdog ran between bootstrap and deploy")

	require.NoError(t, os.WriteFile(resume, []byte("go\n"), 0))
	for sc.Scan() {
		stdout.WriteString(sc.Text() + "\n")
	}
	require.NoError(t, cmd.Wait(), "%s%s", stdout.String(), stderr.String())
	assert.Contains(t, stdout.String(), "deploy.real: running MYTHEX_CRITICAL_SECTION_CMD", "deploy ran, under the same hold")
	res := run(t, s, nil, "watchdog")
	assert.Equal(t, 0, res.code, "%s", res)
	assert.Contains(t, res.stdout, "nothing deployed on this server yet", "with remote-deploy done the watchdog runs")
}

// MYTHEX_LOCK_HELD_FD makes a script use a lock its caller holds instead of
// taking it. A value that is not a descriptor holding the server lock (not
// a number, not open, open on another file, open on the lock but not
// holding it, whether the lock is free or another process holds it) is
// refused at once with a clear error, before the script does anything
// under the lock. Before, a descriptor open on the lock file passed even
// when it did not hold the lock: the script then took the lock on its
// caller's open file and, leaving the release to its caller, left it held
// after it ended; or, the lock held elsewhere, it waited the whole lock
// wait and blamed another deploy.
func TestHeldLockDescriptorIsChecked(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		// fd3 opens the file given to the script as descriptor 3, and
		// takes or not the lock on it.
		fd3  func(t *testing.T, s Server) *os.File
		code int
		want string
	}{
		{"not a number", "3x", nil, 1, "MYTHEX_LOCK_HELD_FD '3x' is not a descriptor number"},
		{"not open", "87", nil, 1, "MYTHEX_LOCK_HELD_FD 87 is not an open descriptor of the server lock"},
		{"another file", "3", func(t *testing.T, s Server) *os.File {
			return openFile(t, filepath.Join(t.TempDir(), "other.lock"))
		}, 1, "MYTHEX_LOCK_HELD_FD 3 is not an open descriptor of the server lock"},
		{"the lock, free", "3", func(t *testing.T, s Server) *os.File {
			return openFile(t, s.Lock())
		}, 1, "MYTHEX_LOCK_HELD_FD 3 does not hold the server lock " + "%s: nobody holds it"},
		{"the lock, held by another process", "3", func(t *testing.T, s Server) *os.File {
			f := openFile(t, s.Lock())
			holdLock(t, s)
			return f
		}, 1, "MYTHEX_LOCK_HELD_FD 3 does not hold the server lock %s: another process holds it"},
		{"the lock, held on it", "3", func(t *testing.T, s Server) *os.File {
			f := openFile(t, s.Lock())
			require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
			return f
		}, 0, "running MYTHEX_CRITICAL_SECTION_CMD"},
	} {
		for _, script := range []string{"bootstrap", "deploy", "watchdog"} {
			t.Run(tc.name+"/"+script, func(t *testing.T) {
				s := newServer(t, dockerTiming)
				require.NoError(t, os.MkdirAll(s.Root, 0o755))
				marker := filepath.Join(t.TempDir(), "ran")
				cmd := s.Command(context.Background(), script, map[string][]string{"deploy": {"v1"}}[script]...)
				cmd.Env = append(cmd.Env, "MYTHEX_LOCK_HELD_FD="+tc.value, "MYTHEX_CRITICAL_SECTION_CMD=touch "+marker)
				if tc.fd3 != nil {
					cmd.ExtraFiles = []*os.File{tc.fd3(t, s)}
				}
				out, _ := cmd.CombinedOutput()
				assert.Equal(t, tc.code, cmd.ProcessState.ExitCode(), "%s", out)
				want := tc.want
				if strings.Contains(want, "%s") {
					want = strings.ReplaceAll(want, "%s", s.Lock())
				}
				assert.Contains(t, string(out), want)
				if tc.code == 0 {
					assert.FileExists(t, marker)
					assert.False(t, lockIsFree(t, s), "the caller's hold is the caller's to release")
				} else {
					assert.NoFileExists(t, marker, "nothing ran as if under the lock")
				}
			})
		}
	}
}

// openFile opens (creating) name for appending, closed when the test ends.
func openFile(t *testing.T, name string) *os.File {
	t.Helper()
	f, err := os.OpenFile(name, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}
