package dockerlock

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The hold outlives garbage collection: another process cannot take the
// lock while this test binary holds it. (A finalized *os.File would close
// the descriptor and release the lock under the suite.)
func TestHoldSurvivesGarbageCollection(t *testing.T) {
	_, err := exec.LookPath("flock")
	require.NoError(t, err, "this test needs flock (apt-get install util-linux)")
	dir := t.TempDir()
	freshHold(t, dir+"/suites.lock")
	Hold(t)
	require.True(t, holding())
	runtime.GC()
	runtime.GC()
	out, err := exec.Command("flock", "-n", Path, "true").CombinedOutput()
	require.Error(t, err, "another process took the lock while this binary holds it: %s", out)
	_, statErr := os.Stat(Path)
	require.NoError(t, statErr, "the lock file is never deleted")
}

// freshHold makes the binary's next Hold take path, as if it were the
// binary's first: Hold holds once per binary, so a run before this one
// (-count, or another test's Parallel) holds another path already. The hold
// before, if any, is back when t ends.
func freshHold(t *testing.T, path string) {
	t.Helper()
	oldPath, oldHeld, oldErr := Path, held, holdErr
	Path, held, holdErr = path, nil, nil
	once = sync.Once{}
	t.Cleanup(func() {
		if held != nil {
			require.NoError(t, held.Close())
		}
		Path, held, holdErr = oldPath, oldHeld, oldErr
		once = sync.Once{}
		if oldHeld != nil || oldErr != nil {
			once.Do(func() {})
		}
	})
}

// Tests that hold servers never hold more than Servers at once, however many
// ask: each subtest below holds two, so no two may overlap. The first to get
// its servers keeps them until another one is waiting for servers, or has
// got them beside it.
func TestParallelKeepsToTheBudget(t *testing.T) {
	Path = t.TempDir() + "/suites.lock"
	const subtests, each = 4, 2
	require.Greater(t, 2*each, Servers, "two subtests must not fit at once")
	parallel, err := strconv.Atoi(flag.Lookup("test.parallel").Value.String())
	require.NoError(t, err)
	require.GreaterOrEqual(t, parallel, 2, "two subtests must run at once to wait for each other: -test.parallel")
	var (
		mu          sync.Mutex
		inUse, most int
		first       atomic.Bool
	)
	overlapped := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return most > each
	}
	waiting := func() int {
		budget.Lock()
		defer budget.Unlock()
		return budget.waiting
	}
	t.Run("group", func(t *testing.T) {
		for i := range subtests {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				Parallel(t, each)
				mu.Lock()
				inUse += each
				most = max(most, inUse)
				mu.Unlock()
				if first.CompareAndSwap(false, true) {
					for waiting() == 0 && !overlapped() {
						runtime.Gosched()
					}
				}
				mu.Lock()
				inUse -= each
				mu.Unlock()
			})
		}
	})
	assert.LessOrEqual(t, most, Servers, "servers held at once")
	budget.Lock()
	defer budget.Unlock()
	assert.Zero(t, budget.used, "every server was given back")
	assert.Zero(t, budget.waiting)
}

func TestMain(m *testing.M) {
	if err := SetParallel(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// SetParallel raised this binary's -test.parallel to twice the budget.
// Run with an explicit -test.parallel N, it keeps N: say so with
// MYTHEX_EXPECT_PARALLEL=N.
func TestSetParallelFillsTheBudget(t *testing.T) {
	want := strconv.Itoa(2 * Servers)
	if n := os.Getenv("MYTHEX_EXPECT_PARALLEL"); n != "" {
		want = n
	}
	assert.Equal(t, want, flag.Lookup("test.parallel").Value.String())
}
