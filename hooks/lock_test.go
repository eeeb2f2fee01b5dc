package hooks

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

// criticalSection writes the script the tests run under the lock instead of
// the Docker work: it records entry and exit in an append-only log, which
// gives every write one place in a single order.
func criticalSection(t *testing.T, dir string) (cmd, log string) {
	t.Helper()
	log = filepath.Join(dir, "critical.log")
	script := filepath.Join(dir, "critical")
	require.NoError(t, os.WriteFile(script, []byte(`#!/usr/bin/env bash
set -euo pipefail
echo "enter $1 $$" >>"`+log+`"
sleep 0.005
echo "exit $1 $$" >>"`+log+`"
`), 0o755))
	return script + ` "$0"`, log
}

// overlaps reads the critical section log and counts every entry made while
// another run was still inside, and every exit that does not close the run
// that entered last.
func overlaps(t *testing.T, log string) (entries map[string]int, overlapping int) {
	t.Helper()
	f, err := os.Open(log)
	require.NoError(t, err)
	defer f.Close()
	entries = map[string]int{}
	inside := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		require.Len(t, fields, 3, "log line %q", sc.Text())
		who := fields[1] + " " + fields[2]
		switch fields[0] {
		case "enter":
			entries[fields[1]]++
			if inside != "" {
				overlapping++
			}
			inside = who
		case "exit":
			if inside != who {
				overlapping++
			}
			inside = ""
		}
	}
	require.NoError(t, sc.Err())
	return entries, overlapping
}

// The detector sees overlaps when nothing serialises the runs, so a zero
// below means the lock did it.
func TestOverlapDetectorSeesUnlockedRuns(t *testing.T) {
	dir := t.TempDir()
	cmd, log := criticalSection(t, dir)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			out, err := execBash(cmd, "unlocked")
			assert.NoError(t, err, "%s", out)
		})
	}
	wg.Wait()
	entries, n := overlaps(t, log)
	assert.Equal(t, 20, entries["unlocked"])
	assert.Positive(t, n, "20 unlocked runs at once must overlap")
}

func TestLockSerialisesDeployWatchdogBootstrap(t *testing.T) {
	const perScript = 70 // 210 concurrent runs in all
	s := newServer(t, infra.Prod().Scaled(0.2))
	// The last of the 140 deploys and bootstraps waits out every run before
	// it: the runs' cost is the machine's, not the timeline's, and on a busy
	// machine their sum comes near the scaled lock wait. This test is about
	// exclusion (TestLockHeldTooLong is about the bound), so it waits as long
	// as production does.
	envFile := filepath.Join(s.ReleaseDir, TimingEnvFile)
	env := withTimes(t, mustRead(t, envFile), map[string]int64{
		"MYTHEX_LOCK_WAIT_MS": infra.Prod().LockWait.Milliseconds()})
	require.NoError(t, os.WriteFile(envFile, env, 0o644))
	cmd, log := criticalSection(t, t.TempDir())
	extra := []string{"MYTHEX_CRITICAL_SECTION_CMD=" + cmd}

	type run struct {
		script string
		res    result
	}
	runs := make(chan run, 3*perScript)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 3 * perScript {
		script := []string{"deploy", "watchdog", "bootstrap"}[i%3]
		args := map[string][]string{"deploy": {"v1"}}[script]
		wg.Go(func() {
			<-start
			runs <- run{script, runScript(s, extra, script, args...)}
		})
	}
	close(start)
	wg.Wait()
	close(runs)

	skipped := 0
	for r := range runs {
		require.Equal(t, 0, r.res.code, "%s: %s", r.script, r.res)
		if r.script == "watchdog" && strings.Contains(r.res.stdout, "deploy in progress") {
			skipped++
		}
	}
	entries, n := overlaps(t, log)
	assert.Zero(t, n, "runs overlapped inside the lock")
	assert.Equal(t, perScript, entries["deploy"], "every deploy waited for the lock and ran once")
	assert.Equal(t, perScript, entries["bootstrap"], "every bootstrap waited for the lock and ran once")
	assert.Equal(t, perScript, entries["watchdog"]+skipped, "every watchdog ran or stood aside, never waited")
	t.Logf("%d runs, 0 overlaps; %d watchdog runs found the lock held", 3*perScript, skipped)
	_, err := os.Stat(s.Lock())
	assert.NoError(t, err, "the lock file is never deleted")
}

// holdLock takes the server's lock the way flock(1) does, until release.
func holdLock(t *testing.T, s Server) (release func()) {
	t.Helper()
	require.NoError(t, os.MkdirAll(s.Root, 0o755))
	f, err := os.OpenFile(s.Lock(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX))
	var once sync.Once
	release = func() { once.Do(func() { f.Close() }) }
	t.Cleanup(release)
	return release
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestLockHeldTooLong(t *testing.T) {
	// Docker is not involved: a timing too fine for compose keeps the wait short.
	timing := scaledWithoutContainers(0.01) // LockWait 1.2 s
	s := newServer(t, infra.Prod().Scaled(0.2))
	env, err := RenderTimingEnv(timing)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(s.ReleaseDir, TimingEnvFile), env, 0o644))
	holdLock(t, s)
	ino := inode(t, s.Lock())
	wait := fmt.Sprintf("%.3fs", timing.LockWait.Seconds())
	for _, tc := range []struct {
		script string
		args   []string
	}{{"deploy", []string{"v1"}}, {"bootstrap", nil}} {
		t.Run(tc.script, func(t *testing.T) {
			res := run(t, s, nil, tc.script, tc.args...)
			assert.Equal(t, 75, res.code, "%s", res)
			assert.Contains(t, res.stderr, "gave up after "+wait+" waiting for the server lock "+s.Lock(), "%s", res)
			assert.Contains(t, res.stderr, "fuser -v "+s.Lock())
			assert.NoFileExists(t, filepath.Join(s.Root, ComposeFile), "nothing installed without the lock")
			assert.Equal(t, ino, inode(t, s.Lock()), "the lock file is the same file")
		})
	}
}

func TestWatchdogNeverWaitsForTheLock(t *testing.T) {
	s := newServer(t, infra.Prod().Scaled(0.2))
	require.NoError(t, os.MkdirAll(filepath.Join(s.Root, "state"), 0o755))
	strikes := filepath.Join(s.Root, "state", "strikes")
	before := []byte("api 3\norchestrator 0\ngateway 0\npublish-worker 0\n")
	require.NoError(t, os.WriteFile(strikes, before, 0o644))
	release := holdLock(t, s)

	cmd, log := criticalSection(t, t.TempDir())
	res := run(t, s, []string{"MYTHEX_CRITICAL_SECTION_CMD=" + cmd}, "watchdog")
	assert.Equal(t, 0, res.code, "%s", res)
	assert.Contains(t, res.stdout, "deploy in progress")
	assert.NoFileExists(t, log, "the watchdog did nothing while the lock was held")
	assert.Equal(t, string(before), string(mustRead(t, strikes)), "strikes untouched")

	release()
	res = run(t, s, []string{"MYTHEX_CRITICAL_SECTION_CMD=" + cmd}, "watchdog")
	assert.Equal(t, 0, res.code, "%s", res)
	assert.NotContains(t, res.stdout, "deploy in progress")
	assert.FileExists(t, log, "with the lock free the watchdog runs")
}
