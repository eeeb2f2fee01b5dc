package hooks

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// standIn writes an executable shell script named name into a new
// directory and returns the PATH that finds it first.
func standIn(t *testing.T, name, body string) (path string) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body), 0o755))
	return "PATH=" + dir + ":" + os.Getenv("PATH")
}

// lockIsFree reports whether nobody holds s's lock, taking and releasing it.
func lockIsFree(t *testing.T, s Server) bool {
	t.Helper()
	f, err := os.Open(s.Lock())
	require.NoError(t, err)
	defer f.Close()
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		return false
	}
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_UN))
	return true
}

// bootstrap enables the timer through systemctl while it holds the server
// lock. A systemd that does not answer (a hung daemon-reload, a job queue
// stuck behind another unit) must not hold the lock forever: both calls
// together are bounded by the start timeout, and the run fails naming the
// command and the bound, with the lock free again. Before, a hung
// systemctl held bootstrap, and the lock, until someone killed it.
func TestBootstrapBoundsSystemctl(t *testing.T) {
	// fastTiming's start timeout is shorter than two stand-in systemctl runs
	// may take on a busy machine; ten times it leaves them room and is still
	// a bound the hang cases can wait out.
	startTimeout := 10 * fastTiming.StartTimeout
	bound := seconds(startTimeout) + "s (the start timeout)"
	for _, tc := range []struct {
		name, hang, fail string
		code             int
		want             string
		calls            []string
	}{
		{"systemd answers", "", "", 0, "installed and enabled mythex-watchdog.timer",
			[]string{"daemon-reload", "enable --now mythex-watchdog.timer"}},
		{"daemon-reload hangs", "daemon-reload", "", 1, "systemctl daemon-reload did not finish within " + bound,
			[]string{"daemon-reload"}},
		{"enable hangs", "enable", "", 1, "systemctl enable --now mythex-watchdog.timer did not finish within " + bound,
			[]string{"daemon-reload", "enable --now mythex-watchdog.timer"}},
		{"enable fails", "", "enable", 1, "systemctl enable --now mythex-watchdog.timer failed (exit 3)",
			[]string{"daemon-reload", "enable --now mythex-watchdog.timer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, dockerTiming)
			env := withTimes(t, mustRender(t, RenderTimingEnv, fastTiming),
				map[string]int64{"MYTHEX_START_TIMEOUT_MS": startTimeout.Milliseconds()})
			require.NoError(t, os.WriteFile(filepath.Join(s.ReleaseDir, TimingEnvFile), env, 0o644))
			calls := filepath.Join(t.TempDir(), "calls")
			path := standIn(t, "systemctl", `echo "$*" >>"$SYSTEMCTL_CALLS"
case "$1" in
"$SYSTEMCTL_HANG") exec sleep 3600 ;;
"$SYSTEMCTL_FAIL") exit 3 ;;
esac
`)
			// Past three bounds, systemctl was not bounded at all.
			ctx, cancel := context.WithTimeout(context.Background(), 3*startTimeout)
			defer cancel()
			cmd := s.Command(ctx, "bootstrap")
			cmd.Env = append(cmd.Env, path, "MYTHEX_SYSTEMD_ENABLE=yes", "SYSTEMCTL_CALLS="+calls,
				"SYSTEMCTL_HANG="+tc.hang, "SYSTEMCTL_FAIL="+tc.fail)
			cmd.WaitDelay = time.Second
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			_ = cmd.Run()
			took := time.Since(start)
			require.NoError(t, ctx.Err(), "bootstrap hung on systemctl:\n%s", out.String())
			assert.Equal(t, tc.code, cmd.ProcessState.ExitCode(), "%s", out.String())
			assert.Contains(t, out.String(), tc.want)
			assert.Equal(t, tc.calls, lines(string(mustRead(t, calls))))
			if tc.hang != "" {
				assert.GreaterOrEqual(t, took, startTimeout, "systemctl had its whole bound")
				assert.Less(t, took, 2*startTimeout, "and was killed at its end")
			}
			assert.True(t, lockIsFree(t, s), "the lock is free again")
			assert.FileExists(t, filepath.Join(s.Root, "systemd", ServiceFile), "the units are installed before they are enabled")
		})
	}
}

// modeLogger is a chmod that first records the mode of every path it is
// asked to change ("MODE PATH" lines in $CHMOD_LOG), then does it: what it
// records is the mode each path had from its creation to that chmod.
const modeLogger = `for a; do
  [ -e "$a" ] && stat -c '%a %n' -- "$a" >>"$CHMOD_LOG"
done
exec /bin/chmod "$@"
`

// The lock file is never open to others, not even for the instant between
// its creation and a chmod: whoever opens it then keeps a descriptor that
// can hold the lock later. Each script creates it on a fresh server under
// umask 000 (the loosest a caller can pass on) and a chmod that records
// the modes it finds: the lock is 0600 from its creation, and no file or
// directory the hooks make is ever writable by others. Before, the lock
// was created 0666 and tightened a moment later, and the directories 0777.
func TestLockFileIsCreatedPrivate(t *testing.T) {
	for _, tc := range []struct {
		script string
		args   []string
	}{
		{"watchdog", nil},
		{"deploy", []string{"v1"}},
		{"bootstrap", nil},
	} {
		t.Run(tc.script, func(t *testing.T) {
			s := newServer(t, dockerTiming)
			chmodLog := filepath.Join(t.TempDir(), "chmod.log")
			cmd := exec.Command("bash", append([]string{"-c", `umask 000 && exec "$0" "$@"`,
				filepath.Join(s.HooksDir, tc.script)}, tc.args...)...)
			cmd.Env = append(s.Environ(), standIn(t, "chmod", modeLogger), "CHMOD_LOG="+chmodLog)
			if tc.script != "bootstrap" {
				cmd.Env = append(cmd.Env, "MYTHEX_CRITICAL_SECTION_CMD=true")
			}
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)

			fi, err := os.Stat(s.Lock())
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the lock file")
			logged, err := os.ReadFile(chmodLog)
			require.True(t, err == nil || os.IsNotExist(err), "%v", err)
			for _, l := range lines(string(logged)) {
				mode, path, ok := strings.Cut(l, " ")
				require.True(t, ok, "%q", l)
				m, err := strconv.ParseUint(mode, 8, 32)
				require.NoError(t, err, "%q", l)
				if path == s.Lock() {
					assert.Zero(t, m&0o077, "the lock was %s before its chmod", mode)
				}
				assert.Zero(t, m&0o022, "%s was %s, writable by others, before its chmod", path, mode)
			}
			require.NoError(t, filepath.Walk(s.Root, func(path string, fi os.FileInfo, err error) error {
				if err != nil || fi.Mode()&os.ModeSymlink != 0 {
					return err
				}
				assert.Zero(t, fi.Mode().Perm()&0o022, "%s is %v", path, fi.Mode())
				return nil
			}))
		})
	}
}

// killingCmd writes a stand-in for the command name that runs the real one
// and then, when its last argument matches the pattern in $KILL_AFTER
// (and $KILL_CMD names it), SIGKILLs its process group: the script under
// test, started as a group of its own, and whatever it runs. It writes the
// path to $KILLED_AT first. It returns the directory to put first on PATH.
func killingCmd(t *testing.T, dir, name string) {
	t.Helper()
	real, err := exec.LookPath(name)
	require.NoError(t, err)
	script := fmt.Sprintf(`#!/bin/sh
'%s' "$@" || exit
[ "$KILL_CMD" = %s ] || exit 0
for last; do :; done
case "$last" in
$KILL_AFTER)
  printf '%%s\n' "$last" >"$KILLED_AT"
  kill -KILL 0 ;;
esac
`, real, name)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755))
}

// tree lists every path under dir, relative, with its mode and, for a
// symlink, its target, for a file a hash of its content with the server's
// root written as $ROOT.
func tree(t *testing.T, dir, root string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			out = append(out, rel+" -> "+target)
		case fi.IsDir():
			out = append(out, rel+"/ "+fi.Mode().Perm().String())
		default:
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(bytes.ReplaceAll(b, []byte(root), []byte("$ROOT")))
			out = append(out, fmt.Sprintf("%s %v %x", rel, fi.Mode().Perm(), sum[:8]))
		}
		return nil
	}))
	sort.Strings(out)
	return out
}

// installed is what bootstrap leaves under a server's root, the files it
// owns (the lock and its state aside).
func installed(t *testing.T, s Server) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"hooks", "hook-releases", "systemd"} {
		for _, l := range tree(t, filepath.Join(s.Root, dir), s.Root) {
			out = append(out, dir+"/"+l)
		}
	}
	dot, err := filepath.Glob(filepath.Join(s.Root, ".*"))
	require.NoError(t, err)
	for _, f := range dot {
		out = append(out, "left behind: "+filepath.Base(f))
	}
	return out
}

// legacyHooks lays out hooks/ as a plain directory, as releases before the
// hooks symlink installed them.
func legacyHooks(t *testing.T, s Server) {
	t.Helper()
	dir := filepath.Join(s.Root, "hooks")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for _, name := range []string{"deploy", "watchdog", "bootstrap", "lib.sh"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\necho legacy "+name+"\n"), 0o755))
	}
}

// A bootstrap killed at any point leaves a server the next bootstrap
// brings to the state a whole one leaves: hooks/ a link to one whole
// hooks directory, both units, nothing left over. Each case kills it
// (SIGKILL to its process group) right after one step: a rename that
// installs something (moving the legacy hooks/ aside, the staged hooks
// into place, the link, each unit), the link made at its temp name, a
// unit's temp file written. Before, a kill between the link's ln and its
// rename, or beside a unit, left temp files that no run removed.
func TestBootstrapKilledAtEachStepConverges(t *testing.T) {
	want := func(t *testing.T, s Server) []string {
		t.Helper()
		clean := s
		clean.Root = filepath.Join(t.TempDir(), "root")
		legacyHooks(t, clean)
		res := run(t, clean, nil, "bootstrap")
		require.Equal(t, 0, res.code, "%s", res)
		return installed(t, clean)
	}
	for _, tc := range []struct{ name, cmd, pattern string }{
		{"legacy hooks moved aside", "mv", "*/hook-releases/plain.*"},
		{"staged hooks in place", "mv", "*/hook-releases/[0-9a-f]*"},
		{"link made at its temp name", "ln", "*/.hooks.*.link"},
		{"link switched", "mv", "*/root/hooks"},
		// The hooks directory keeps a copy of the unit too: the one beside
		// systemd's units is meant.
		{"service unit written to its temp file", "chmod", "*/systemd/.mythex-watchdog.service.*"},
		{"service unit installed", "mv", "*/systemd/mythex-watchdog.service"},
		{"timer installed", "mv", "*/systemd/mythex-watchdog.timer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, dockerTiming)
			legacyHooks(t, s)
			bin := t.TempDir()
			for _, name := range []string{"mv", "ln", "chmod"} {
				killingCmd(t, bin, name)
			}
			killedAt := filepath.Join(t.TempDir(), "killed-at")
			cmd := s.Command(context.Background(), "bootstrap")
			cmd.Env = append(cmd.Env, "PATH="+bin+":"+os.Getenv("PATH"),
				"KILL_CMD="+tc.cmd, "KILL_AFTER="+tc.pattern, "KILLED_AT="+killedAt)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			out, _ := cmd.CombinedOutput()
			ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
			require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL,
				"bootstrap was not killed after %s %s: %v\n%s", tc.cmd, tc.pattern, cmd.ProcessState, out)
			t.Logf("killed right after %s %s", tc.cmd, strings.TrimSpace(string(mustRead(t, killedAt))))

			res := run(t, s, nil, "bootstrap")
			require.Equal(t, 0, res.code, "%s", res)
			assert.Equal(t, want(t, s), installed(t, s), "the state a whole bootstrap leaves")
			cmd = exec.Command(filepath.Join(s.Root, "hooks", "watchdog"))
			cmd.Env = append(os.Environ(), "MYTHEX_ROOT="+s.Root)
			b, err := cmd.CombinedOutput()
			assert.NoError(t, err, "%s", b)
			assert.Contains(t, string(b), "nothing deployed on this server yet", "the installed watchdog runs")
		})
	}
}

// A hooks directory that lost files (a kill while a later bootstrap pruned
// it as old) is staged again when its release is bootstrapped anew, never
// linked as it is. Before, bootstrap found the directory by its name and
// linked it: the installed watchdog had no lib.sh and failed every run.
func TestBootstrapRestagesHalfRemovedHooks(t *testing.T) {
	s := newServer(t, dockerTiming)
	res := run(t, s, nil, "bootstrap")
	require.Equal(t, 0, res.code, "%s", res)
	want := installed(t, s)
	target, err := os.Readlink(filepath.Join(s.Root, "hooks"))
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(s.Root, target, "lib.sh")))

	res = run(t, s, nil, "bootstrap")
	require.Equal(t, 0, res.code, "%s", res)
	assert.Equal(t, want, installed(t, s), "the hooks are whole again")
	cmd := exec.Command(filepath.Join(s.Root, "hooks", "watchdog"))
	cmd.Env = append(os.Environ(), "MYTHEX_ROOT="+s.Root)
	out, err := cmd.CombinedOutput()
	assert.NoError(t, err, "%s", out)
}
