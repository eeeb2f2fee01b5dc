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
// machine then take turns, whichever clone or checkout they run from, and
// cmd/rehearse takes its turn with them (Take).
package dockerlock

import (
	"context"
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
	if short() {
		// The everyday gate (-short) runs no Docker test; one that reached
		// here checked its needs too late, and would have waited, silently,
		// for whichever Docker suite runs on the machine.
		tb.Fatalf("dockerlock.Hold under -short: a Docker test must call needs.Have(t, needs.Docker) first, which skips it")
		return
	}
	if err := Take(context.Background(), tb.Logf); err != nil {
		tb.Fatalf("the machine-wide Docker test lock: %v", err)
	}
}

// short reports whether the tests run under -short; a variable so this
// package's own tests can hold the lock in the everyday gate.
var short = testing.Short

// Take is Hold for a command that drives Docker as the suites do (the
// rehearsal's): it takes the lock for the rest of the process's life,
// waiting for whatever holds it, so a run beside the test suites takes its
// turn instead of loading the machine twice. logf hears when it waits and
// how long it waited. A ctx that ends while it waits ends the wait with
// ctx's error; the lock, if it comes later, is let go at once.
func Take(ctx context.Context, logf func(format string, args ...any)) error {
	once.Do(func() { holdErr = take(ctx, logf) })
	return holdErr
}

// holding reports whether this process holds the lock.
func holding() bool { return held != nil }

func take(ctx context.Context, logf func(format string, args ...any)) error {
	// The descriptor stays open until the process exits: that is the hold.
	f, err := os.OpenFile(Path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return fmt.Errorf("open %s: %w", Path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		held = f
		return nil
	} else if err != syscall.EWOULDBLOCK {
		_ = f.Close()
		return fmt.Errorf("flock %s: %w", Path, err)
	}
	logf("another test suite or rehearsal drives Docker on this machine; waiting for %s", Path)
	start := time.Now()
	got := make(chan error, 1)
	go func() { got <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-got:
		if err != nil {
			_ = f.Close()
			return fmt.Errorf("flock %s: %w", Path, err)
		}
	case <-ctx.Done():
		// The blocked flock cannot be called off; closing the file once it
		// returns lets the lock go.
		go func() {
			<-got
			_ = f.Close()
		}()
		return fmt.Errorf("waiting for %s: %w", Path, ctx.Err())
	}
	held = f
	logf("took %s after %v", Path, time.Since(start).Round(time.Millisecond))
	return nil
}

// Servers is how many simulated servers (a compose project of four
// containers each) a suite runs at once unless it says otherwise
// (SetParallel). Docker runs every container's health check by exec, about
// 50 ms of CPU each on this 2-core machine kind, once a second: three
// servers' checks take 0.6 of a core before a suite does anything. A suite
// whose tests mostly wait sets a larger budget, with its measured reason.
// The lock above keeps every other suite out meanwhile, so a suite's budget
// is the machine's.
const Servers = 3

// MaxServers bounds any suite's budget: twenty containers' health checks
// alone take about a core.
const MaxServers = 5

// servers is this suite's budget, set by SetParallel.
var servers = Servers

// SetParallel sets the suite's budget to n servers and lets as many of its
// tests run at once as that budget needs: go test runs at most
// -test.parallel of them, by default one per CPU, which on this 2-core
// machine kind would hold two servers of three. A test waiting for servers
// also counts, hence twice the budget. An explicit -test.parallel is kept.
// Call it from TestMain, before m.Run.
func SetParallel(n int) error {
	if n < 1 || n > MaxServers {
		return fmt.Errorf("dockerlock.SetParallel: a budget of %d servers; a suite may run 1 to %d", n, MaxServers)
	}
	servers = n
	if !flag.Parsed() {
		flag.Parse()
	}
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if explicit {
		return nil
	}
	if err := flag.Set("test.parallel", strconv.Itoa(2*n)); err != nil {
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
// and holds n of the suite's servers (its budget) until t ends, waiting until that many
// are free. A test asks for every server it will have running at once, and
// holds them for its whole life: taking them in two steps could deadlock
// two tests that each hold a part. A test whose subtests take servers holds
// none itself.
func Parallel(t *testing.T, n int) {
	t.Helper()
	if n < 1 || n > servers {
		t.Fatalf("dockerlock.Parallel: %d servers; a test may hold 1 to %d", n, servers)
	}
	Hold(t)
	t.Parallel()
	budget.Lock()
	for budget.used+n > servers {
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
