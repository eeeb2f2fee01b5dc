package dockerlock

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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

// holdElsewhere takes the lock on path through a file of its own, as
// another process would (flock locks conflict between open files, even in
// one process), and returns what lets it go.
func holdElsewhere(t *testing.T, path string) (release func()) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
	var once sync.Once
	release = func() { once.Do(func() { require.NoError(t, f.Close()) }) }
	t.Cleanup(release)
	return release
}

// takeInBackground runs Take and returns its outcome, and each line it
// logs as it logs it.
func takeInBackground(ctx context.Context) (done <-chan error, logs <-chan string) {
	d, l := make(chan error, 1), make(chan string, 10)
	go func() {
		d <- Take(ctx, func(format string, args ...any) { l <- fmt.Sprintf(format, args...) })
	}()
	return d, l
}

// A command takes its turn: Take waits, saying so, while another holds
// the lock, and holds it once the other lets go.
func TestTakeWaitsItsTurn(t *testing.T) {
	path := t.TempDir() + "/suites.lock"
	freshHold(t, path)
	release := holdElsewhere(t, path)
	done, logs := takeInBackground(context.Background())
	assert.Contains(t, <-logs, "drives Docker on this machine; waiting for "+path)
	select {
	case err := <-done:
		t.Fatalf("Take returned while another held the lock: %v", err)
	default:
	}
	release()
	require.NoError(t, <-done)
	assert.True(t, holding())
	assert.Contains(t, <-logs, "took "+path+" after ")
}

// A command interrupted while it waits (SIGINT) stops waiting, and the
// lock, when it comes, is let go at once: the suites are not held up by a
// command that has gone.
func TestTakeGivesUpWhenItsContextEnds(t *testing.T) {
	path := t.TempDir() + "/suites.lock"
	freshHold(t, path)
	release := holdElsewhere(t, path)
	ctx, cancel := context.WithCancel(context.Background())
	done, logs := takeInBackground(ctx)
	<-logs
	cancel()
	err := <-done
	require.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "waiting for "+path)
	assert.False(t, holding())
	release()

	f, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	got := make(chan error, 1)
	go func() { got <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-got:
		require.NoError(t, err, "the lock is free again")
	case <-time.After(time.Minute):
		t.Fatal("the lock a given-up Take came to hold was never let go")
	}
}

// freshHold makes the binary's next Hold take path, as if it were the
// binary's first: Hold holds once per binary, so a run before this one
// (-count, or another test's Parallel) holds another path already. The hold
// before, if any, is back when t ends.
func freshHold(t *testing.T, path string) {
	t.Helper()
	oldPath, oldHeld, oldErr, oldShort := Path, held, holdErr, short
	Path, held, holdErr = path, nil, nil
	short = func() bool { return false }
	once = sync.Once{}
	t.Cleanup(func() {
		if held != nil {
			require.NoError(t, held.Close())
		}
		Path, held, holdErr, short = oldPath, oldHeld, oldErr, oldShort
		once = sync.Once{}
		if oldHeld != nil || oldErr != nil {
			once.Do(func() {})
		}
	})
}

// fatalTB records a Fatalf instead of ending the test: Hold returns after
// it, as after any failure.
type fatalTB struct {
	testing.TB
	fatal string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) { f.fatal = fmt.Sprintf(format, args...) }

// Under -short no test may wait for the lock: the everyday gate would sit
// behind whichever Docker suite runs on the machine (a test that held the
// lock before it checked its needs made `go test -short ./...` wait 8
// minutes). Hold fails such a test at once, naming the fix, and takes
// nothing.
func TestHoldUnderShortFailsAtOnce(t *testing.T) {
	oldShort, oldPath := short, Path
	t.Cleanup(func() { short, Path = oldShort, oldPath })
	short = func() bool { return true }
	Path = t.TempDir() + "/suites.lock"

	tb := &fatalTB{TB: t}
	Hold(tb)
	assert.Contains(t, tb.fatal, "needs.Have(t, needs.Docker)")
	_, err := os.Stat(Path)
	assert.True(t, os.IsNotExist(err), "no lock file was even opened")
}

// Tests that hold servers never hold more than Servers at once, however many
// ask: each subtest below holds two, so no two may overlap. The first to get
// its servers keeps them until another one is waiting for servers, or has
// got them beside it.
func TestParallelKeepsToTheBudget(t *testing.T) {
	Path = t.TempDir() + "/suites.lock"
	oldShort := short
	short = func() bool { return false }
	t.Cleanup(func() { short = oldShort })
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
	if err := SetParallel(Servers); err != nil {
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

// A budget outside 1 to MaxServers is refused, and changes nothing.
func TestSetParallelRefusesABudgetOutOfBounds(t *testing.T) {
	parallel := flag.Lookup("test.parallel").Value.String()
	for _, n := range []int{0, -1, MaxServers + 1} {
		err := SetParallel(n)
		assert.ErrorContains(t, err, fmt.Sprintf("a budget of %d servers; a suite may run 1 to %d", n, MaxServers))
	}
	assert.Equal(t, Servers, servers, "the budget is unchanged")
	assert.Equal(t, parallel, flag.Lookup("test.parallel").Value.String(), "-test.parallel is unchanged")
}
