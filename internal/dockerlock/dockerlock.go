// Package dockerlock serialises, machine-wide, the test suites that drive
// the Docker engine.
//
// `go test ./...` runs packages side by side. The hooks' tests, the service
// image test and the rehearsal each start dozens of containers whose health
// checks Docker runs by exec, and each suite's timeline assumes a host that
// keeps up: run together on two cores they starve each other's checks and
// drains, and a healthy container is reported unhealthy. So a suite takes
// this lock before its first container and keeps it until its test binary
// exits; the kernel releases it then, even after a crash. Suites on one
// machine then take turns, whichever clone or checkout they run from.
package dockerlock

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Path is the lock file every suite takes, in the machine's temp directory.
// Like every lock of this project it is never deleted: two processes
// locking two inodes would both go ahead.
var Path = filepath.Join(os.TempDir(), "mythex-docker-suites.lock")

var (
	once    sync.Once
	holdErr error
	// held keeps the locked file referenced: an *os.File the garbage
	// collector finalizes closes its descriptor, and the lock with it.
	held *os.File
)

// Hold takes the lock for the rest of the test binary's life, waiting for
// any other suite that holds it; the wait is bounded by go test's own
// -timeout. It fails tb if the lock cannot be taken at all.
func Hold(tb testing.TB) {
	tb.Helper()
	once.Do(func() { holdErr = take(tb) })
	if holdErr != nil {
		tb.Fatalf("the machine-wide Docker test lock: %v", holdErr)
	}
}

// holding reports whether this process holds the lock.
func holding() bool { return held != nil }

func take(tb testing.TB) error {
	// The descriptor stays open until the process exits: that is the hold.
	f, err := os.OpenFile(Path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return fmt.Errorf("open %s: %w", Path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		held = f
		return nil
	} else if err != syscall.EWOULDBLOCK {
		return fmt.Errorf("flock %s: %w", Path, err)
	}
	tb.Logf("another test suite drives Docker on this machine; waiting for %s", Path)
	start := time.Now()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("flock %s: %w", Path, err)
	}
	held = f
	tb.Logf("took %s after %v", Path, time.Since(start).Round(time.Millisecond))
	return nil
}

// Servers is how many simulated servers (a compose project of four
// containers each) a suite runs at once. Docker runs every container's
// health check by exec, about 50 ms of CPU each on this 2-core machine
// kind, several times a second at the tests' timeline: twelve containers
// (the rehearsal's three servers) are what two cores keep up with while
// the suite's own work runs beside them. The lock above keeps every other
// suite out meanwhile, so this budget is the machine's.
const Servers = 3

// SetParallel lets as many of the suite's tests run at once as the
// budget needs: go test runs at most -test.parallel of them, by default one
// per CPU, which on this 2-core machine kind would hold two servers of the
// three. A test waiting for servers also counts, hence twice the budget.
// An explicit -test.parallel is kept. Call it from TestMain, before m.Run.
func SetParallel() error {
	if !flag.Parsed() {
		flag.Parse()
	}
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if explicit {
		return nil
	}
	if err := flag.Set("test.parallel", strconv.Itoa(2*Servers)); err != nil {
		return fmt.Errorf("set -test.parallel: %w", err)
	}
	return nil
}

var budget = struct {
	sync.Mutex
	cond *sync.Cond
	// used servers, and tests waiting for theirs.
	used, waiting int
}{}

func init() { budget.cond = sync.NewCond(&budget.Mutex) }

// Parallel lets t run beside the suite's other Docker tests (t.Parallel)
// and holds n of the suite's Servers until t ends, waiting until that many
// are free. A test asks for every server it will have running at once, and
// holds them for its whole life: taking them in two steps could deadlock
// two tests that each hold a part. A test whose subtests take servers holds
// none itself.
func Parallel(t *testing.T, n int) {
	t.Helper()
	if n < 1 || n > Servers {
		t.Fatalf("dockerlock.Parallel: %d servers; a test may hold 1 to %d", n, Servers)
	}
	Hold(t)
	t.Parallel()
	budget.Lock()
	for budget.used+n > Servers {
		budget.waiting++
		budget.cond.Wait()
		budget.waiting--
	}
	budget.used += n
	budget.Unlock()
	t.Cleanup(func() {
		budget.Lock()
		budget.used -= n
		budget.Unlock()
		budget.cond.Broadcast()
	})
}
