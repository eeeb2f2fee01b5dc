package rollout_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/rollout"
)

// server is one stand-in server: what it runs, and whether the balancer
// has it in service.
type server struct {
	release, previous string
	verified          bool
	out               bool // out of service, as the balancer sees it
}

// fleet is a stand-in fleet behind the Transport and Balancer interfaces the
// ssh transport and the ELB client implement. Its deploys and rollbacks are
// scripted per server; it counts how many servers are out at once, from its
// own view, not the rollout's.
type fleet struct {
	mu      sync.Mutex
	servers map[string]*server
	// locks are the servers' locks: a deploy or rollback holds its
	// server's, and --status waits for it, as remote-deploy's do.
	locks    map[string]*sync.Mutex
	maxOut   int
	calls    []string // "deploy s1", "rollback s2", in start order
	deadline map[string]time.Duration

	deployFails   map[string]bool
	rollbackFails map[string]bool
	// switchFails: the deploy fails after switching, leaving the server on
	// the new release, unverified.
	switchFails map[string]bool
	// rolledBackTo is every rollback's target, "s1 v1", in start order.
	rolledBackTo []string
	// block, when set for a server, holds its deploy until closed; the
	// deploy notes whether its context was cut meanwhile.
	block   map[string]chan struct{}
	started chan string
	cut     map[string]bool

	// neverBack servers are never back in service, verified or not.
	neverBack map[string]bool
	// statusErr servers answer --status with this failure.
	statusErr map[string]error
	// together are groups of servers whose deploys must overlap: each
	// waits until its whole group has started, so a batch shows as one
	// however the goroutines are scheduled, and a rollout that does not
	// batch them fails their deploys.
	together [][]string
	// deploying is closed when the server's first deploy starts.
	deploying map[string]chan struct{}
	// recorded is closed and replaced whenever a call is recorded.
	recorded chan struct{}

	// drop, when set for a server, drops its deploy's connection once the
	// deploy has started: the call fails as ssh's does (ErrSSH) while the
	// deploy runs on, on the server, holding its lock until the channel is
	// closed, then ends as scripted. dropped gets the server's name once
	// the call has returned.
	drop    map[string]chan struct{}
	dropped chan string
	// unreachable servers answer no Attach: ssh fails every time.
	unreachable map[string]bool
	// last is each server's record of how its last deploy ended.
	last map[string]string
}

func newFleet(states map[string]server) *fleet {
	f := &fleet{servers: map[string]*server{}, deployFails: map[string]bool{}, rollbackFails: map[string]bool{}, switchFails: map[string]bool{},
		block: map[string]chan struct{}{}, started: make(chan string, 64), cut: map[string]bool{}, deadline: map[string]time.Duration{},
		locks: map[string]*sync.Mutex{}, neverBack: map[string]bool{}, statusErr: map[string]error{},
		deploying: map[string]chan struct{}{}, recorded: make(chan struct{}),
		drop: map[string]chan struct{}{}, dropped: make(chan string, 64), unreachable: map[string]bool{}, last: map[string]string{}}
	for name, s := range states {
		s.out = !s.verified
		f.servers[name] = &s
		f.locks[name] = &sync.Mutex{}
		f.deploying[name] = make(chan struct{})
	}
	f.count()
	return f
}

// count notes how many servers are out now; f.mu held.
func (f *fleet) count() {
	n := 0
	for _, s := range f.servers {
		if s.out {
			n++
		}
	}
	f.maxOut = max(f.maxOut, n)
}

func (f *fleet) Status(_ context.Context, name string) (rollout.Status, error) {
	f.locks[name].Lock()
	defer f.locks[name].Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.statusErr[name]; err != nil {
		return rollout.Status{}, err
	}
	s := f.servers[name]
	return rollout.Status{Release: s.release, Previous: s.previous, Verified: s.verified}, nil
}

// record notes a call; f.mu held.
func (f *fleet) record(call string) {
	f.calls = append(f.calls, call)
	close(f.recorded)
	f.recorded = make(chan struct{})
}

// awaitCall returns once call has been recorded n times in all.
func (f *fleet) awaitCall(t *testing.T, call string, n int) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		f.mu.Lock()
		got := 0
		for _, c := range f.calls {
			if c == call {
				got++
			}
		}
		ch := f.recorded
		f.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			require.Failf(t, "no call", "%q was not made %d time(s) within 10s", call, n)
		}
	}
}

// gather holds a deploy of name until every server of its group (together)
// has started deploying; it fails when the group never gathers.
func (f *fleet) gather(name string) error {
	for _, group := range f.together {
		if !slices.Contains(group, name) {
			continue
		}
		timeout := time.After(10 * time.Second)
		for _, member := range group {
			select {
			case <-f.deploying[member]:
			case <-timeout:
				return fmt.Errorf("%v never deployed at once", group)
			}
		}
	}
	return nil
}

// start begins a call; it returns the call's context's error when a
// blocked deploy was cut.
func (f *fleet) start(ctx context.Context, kind, name string) error {
	f.mu.Lock()
	f.record(kind + " " + name)
	if kind == "deploy" {
		select {
		case <-f.deploying[name]:
		default:
			close(f.deploying[name])
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		f.deadline[kind+" "+name] = time.Until(dl)
	}
	// The drain: the server leaves service as its deploy starts.
	f.servers[name].out = true
	f.count()
	b := f.block[name]
	f.mu.Unlock()
	f.started <- kind + " " + name
	if b != nil && kind == "deploy" {
		select {
		case <-b:
		case <-ctx.Done():
		}
		f.mu.Lock()
		f.cut[name] = ctx.Err() != nil
		f.mu.Unlock()
		return ctx.Err()
	}
	return nil
}

func (f *fleet) Deploy(ctx context.Context, name, version string) error {
	f.locks[name].Lock()
	err := f.start(ctx, "deploy", name)
	if err == nil {
		err = f.gather(name)
	}
	f.mu.Lock()
	drop := f.drop[name]
	f.mu.Unlock()
	if drop != nil && err == nil {
		// The deploy is detached from the connection: it runs on.
		go func() {
			defer f.locks[name].Unlock()
			<-drop
			_ = f.end(name, version, nil)
		}()
		f.dropped <- name
		return fmt.Errorf("%s %s: %w (exit 255)", name, version, rollout.ErrSSH)
	}
	defer f.locks[name].Unlock()
	return f.end(name, version, err)
}

// end ends a deploy of version on name as scripted, recording how, as
// deploy does in state/last-deploy.
func (f *fleet) end(name, version string, err error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.servers[name]
	if err != nil {
		s.verified = false
		f.last[name] = version + ": FAILED"
		return err
	}
	if f.deployFails[name] {
		s.verified = false
		f.last[name] = version + ": FAILED before changing anything"
		return errors.New("deploy exit 1")
	}
	s.switchTo(version)
	if f.switchFails[name] {
		s.verified = false
		f.last[name] = version + ": FAILED after changing this server"
		return errors.New("deploy exit 1 after switching")
	}
	s.verified = true
	f.last[name] = version + ": deployed and verified"
	return nil
}

// Attach waits for the server's lock, as remote-deploy --attach does, then
// answers as Status, with the record of a deploy of version.
func (f *fleet) Attach(_ context.Context, name, version string) (rollout.Status, error) {
	f.mu.Lock()
	f.record("attach " + name)
	unreachable := f.unreachable[name]
	f.mu.Unlock()
	if unreachable {
		return rollout.Status{}, fmt.Errorf("%s --attach %s: %w (exit 255)", name, version, rollout.ErrSSH)
	}
	st, err := f.Status(context.Background(), name)
	if err != nil {
		return st, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if last, ok := strings.CutPrefix(f.last[name], version+": "); ok {
		st.Last = "2026-12-07T04:00:00Z " + version + ": " + last
	}
	return st, nil
}

// switchTo is deploy's switch of `current`: the release before moves only
// when the release does.
func (s *server) switchTo(version string) {
	if version != s.release {
		s.previous, s.release = s.release, version
	}
}

func (f *fleet) Rollback(ctx context.Context, name, version string) error {
	f.locks[name].Lock()
	defer f.locks[name].Unlock()
	_ = f.start(ctx, "rollback", name)
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.servers[name]
	f.rolledBackTo = append(f.rolledBackTo, name+" "+version)
	if version != s.release && version != s.previous {
		return fmt.Errorf("no release kept runs %s", version)
	}
	if f.rollbackFails[name] {
		s.verified = false
		return errors.New("rollback exit 1")
	}
	s.switchTo(version)
	s.verified = true
	return nil
}

// WaitInService: a verified server comes back; an unverified one never
// does, nor does one the test keeps out (neverBack).
func (f *fleet) WaitInService(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("wait " + name)
	s := f.servers[name]
	if !s.verified || f.neverBack[name] {
		return fmt.Errorf("%s unhealthy", name)
	}
	s.out = false
	return nil
}

func (f *fleet) callsOf(kind string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if k, name, _ := cut(c); k == kind {
			out = append(out, name)
		}
	}
	return out
}

func cut(c string) (string, string, bool) {
	for i := range c {
		if c[i] == ' ' {
			return c[:i], c[i+1:], true
		}
	}
	return c, "", false
}

func cfg(f *fleet, maxUnavailable int, servers ...string) rollout.Config {
	return rollout.Config{Version: "v2", Servers: servers, MaxUnavailable: maxUnavailable,
		Timing: infra.Prod(), Transport: f, Balancer: f}
}

func byServer(r rollout.Report) map[string]rollout.ServerReport {
	m := map[string]rollout.ServerReport{}
	for _, s := range r.Servers {
		m[s.Server] = s
	}
	return m
}

func healthy() server { return server{release: "v1", previous: "v0", verified: true} }

func TestSoundRolloutCanaryThenBatches(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy(), "s3": healthy(), "s4": healthy(), "s5": healthy()})
	c := cfg(f, 2, "s1", "s2", "s3", "s4", "s5")
	require.NoError(t, c.Check())
	rep := rollout.Run(context.Background(), c)
	assert.Equal(t, rollout.Deployed, rep.Outcome)
	assert.Equal(t, 0, rep.Code())
	assert.Equal(t, []string{"s1", "s2", "s3", "s4", "s5"}, sorted(f.callsOf("deploy")))
	assert.Equal(t, "deploy s1", f.calls[0], "the canary goes alone, first")
	assert.LessOrEqual(t, f.maxOut, 2)
	for _, s := range rep.Servers {
		assert.Equal(t, "v2", s.Now, s.Server)
		assert.Equal(t, "yes", s.Verified, s.Server)
		assert.Equal(t, "v1", s.Before, s.Server)
	}
}

// Finding 3: with s2 unverified before the start, the bash rollout began
// with the healthy s1, and both were out at once.
func TestServersAlreadyOutGoFirstAndCount(t *testing.T) {
	for _, tc := range []struct {
		name           string
		maxUnavailable int
		servers        []string
		out            []string
	}{
		{"two servers, one out", 1, []string{"s1", "s2"}, []string{"s2"}},
		{"four servers, two out, max 2", 2, []string{"s1", "s2", "s3", "s4"}, []string{"s3", "s4"}},
		{"four servers, two out, max 1", 1, []string{"s1", "s2", "s3", "s4"}, []string{"s2", "s4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			states := map[string]server{}
			for _, s := range tc.servers {
				states[s] = healthy()
			}
			for _, s := range tc.out {
				states[s] = server{release: "v1", verified: false}
			}
			f := newFleet(states)
			rep := rollout.Run(context.Background(), cfg(f, tc.maxUnavailable, tc.servers...))
			assert.Equal(t, rollout.Deployed, rep.Outcome)
			assert.LessOrEqual(t, f.maxOut, max(tc.maxUnavailable, len(tc.out)),
				"servers out at once, counting those out before the start")
			if len(tc.out) <= tc.maxUnavailable {
				assert.LessOrEqual(t, f.maxOut, tc.maxUnavailable)
			}
			deploys := f.callsOf("deploy")
			assert.ElementsMatch(t, tc.out, deploys[:len(tc.out)], "the servers already out go first")
			for _, s := range tc.out {
				assert.True(t, byServer(rep)[s].OutAtStart, s)
			}
		})
	}
}

// More servers out than -max-unavailable: they go first, and no healthy
// server is taken out until they are back.
func TestNoHealthyServerOutWhileTooManyAreOut(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy(), "s2": {release: "v1"}, "s3": {release: "v1"}})
	rep := rollout.Run(context.Background(), cfg(f, 1, "s1", "s2", "s3"))
	assert.Equal(t, rollout.Deployed, rep.Outcome)
	assert.Equal(t, "s1", f.callsOf("deploy")[2], "the healthy server goes last")
	assert.Equal(t, 2, f.maxOut, "never more out than were out at the start")
}

func TestNeverEveryServer(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy()})
	err := cfg(f, 2, "s1", "s2").Check()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "maxUnavailable 2 must be below servers 2")
	assert.NoError(t, cfg(f, 1, "s1").Check(), "a lone server is the whole fleet")
}

func TestBadInputNamesEveryProblem(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy()})
	c := cfg(f, 0, "s1", "s1", "")
	c.Version = ""
	err := c.Check()
	require.Error(t, err)
	for _, want := range []string{"no VERSION", "named twice", "is empty", "maxUnavailable 0"} {
		assert.Contains(t, err.Error(), want)
	}
}

// Finding 3, second half: s3's deploy and then its rollback fail; the
// bash rollout went on to roll back the healthy servers. Here nothing
// healthy is taken out after a failed rollback.
func TestFailedRollbackStops(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy(), "s3": healthy()})
	f.deployFails["s3"] = true
	f.rollbackFails["s3"] = true
	rep := rollout.Run(context.Background(), cfg(f, 1, "s1", "s2", "s3"))
	assert.Equal(t, rollout.Failed, rep.Outcome)
	assert.Equal(t, 1, rep.Code())
	assert.Equal(t, []string{"s3"}, f.callsOf("rollback"), "nothing healthy rolled back after a failed rollback")
	assert.LessOrEqual(t, f.maxOut, 1)
	m := byServer(rep)
	assert.Equal(t, "v2", m["s1"].Now)
	assert.Equal(t, "yes", m["s1"].Verified)
	assert.Contains(t, m["s1"].What, "not rolled back: a rollback failed")
	assert.Equal(t, "no", m["s3"].Verified)
}

func TestFailedServerRollsBackInReverse(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy(), "s3": healthy(), "s4": healthy()})
	f.deployFails["s3"] = true
	rep := rollout.Run(context.Background(), cfg(f, 1, "s1", "s2", "s3", "s4"))
	assert.Equal(t, rollout.Failed, rep.Outcome)
	assert.Equal(t, []string{"s3", "s2", "s1"}, f.callsOf("rollback"))
	assert.NotContains(t, f.callsOf("deploy"), "s4")
	assert.LessOrEqual(t, f.maxOut, 1)
	for _, s := range []string{"s1", "s2", "s3"} {
		assert.Equal(t, "v1", byServer(rep)[s].Now, s)
	}
	assert.Equal(t, []string{"not started"}, byServer(rep)["s4"].What)
}

// A cancel's table asks no server again: it says what the run learned. A
// server whose deploy succeeded runs the release, verified; one in flight
// runs either release until its deploy ends. Before, both showed the
// release before, as if the canary had never been deployed.
func TestCancelTableSaysWhatTheRunLearned(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy(), "s3": healthy()})
	release := make(chan struct{})
	defer close(release)
	f.block["s2"] = release
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan rollout.Report)
	go func() { done <- rollout.Run(ctx, cfg(f, 1, "s1", "s2", "s3")) }()
	require.Equal(t, "deploy s1", <-f.started)
	require.Equal(t, "deploy s2", <-f.started)
	cancel()
	rep := <-done
	require.Equal(t, rollout.Cancelled, rep.Outcome)
	m := byServer(rep)
	for _, tc := range []struct{ server, before, now, verified string }{
		{"s1", "v1", "v2", "yes"},
		{"s2", "v1", "?", "unknown"},
		{"s3", "v1", "v1", "yes"},
	} {
		assert.Equal(t, []string{tc.before, tc.now, tc.verified}, []string{m[tc.server].Before, m[tc.server].Now, m[tc.server].Verified}, tc.server)
	}
}

// Finding 4: the bash rollout, re-parented by the runner's signal to its
// shell, went on to deploy the next server. A cancel here starts nothing
// new, leaves the deploy in flight to finish (its context is not cut), and
// the report says what the rollout knows, at once.
func TestCancelStartsNothingNew(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy(), "s3": healthy()})
	release := make(chan struct{})
	f.block["s1"] = release
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan rollout.Report)
	go func() { done <- rollout.Run(ctx, cfg(f, 1, "s1", "s2", "s3")) }()
	require.Equal(t, "deploy s1", <-f.started)
	cancel()
	rep := <-done
	assert.Equal(t, rollout.Cancelled, rep.Outcome)
	m := byServer(rep)
	assert.Contains(t, m["s1"].What, "deploy in flight when cancelled: it runs on to its end on the server")
	assert.Contains(t, m["s2"].What, "not started (cancelled)")
	close(release)
	// The deploy in flight ends on its own, uncut.
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		_, ok := f.cut["s1"]
		return ok
	}, 10*time.Second, time.Millisecond)
	f.mu.Lock()
	assert.False(t, f.cut["s1"], "a cancel does not cut a deploy in flight")
	f.mu.Unlock()
	assert.Equal(t, []string{"s1"}, f.callsOf("deploy"), "nothing new started after the cancel")
	assert.Empty(t, f.callsOf("rollback"))
}

// After a cancel the next run goes on at once: it waits for the deploy the
// cancelled run left finishing (the server's lock), skips the server it
// verified, and deploys the rest; across both runs no more than
// -max-unavailable servers were out at once.
func TestRunAfterCancelConverges(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy(), "s3": healthy()})
	release := make(chan struct{})
	f.block["s1"] = release
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan rollout.Report)
	go func() { first <- rollout.Run(ctx, cfg(f, 1, "s1", "s2", "s3")) }()
	require.Equal(t, "deploy s1", <-f.started)
	cancel()
	require.Equal(t, rollout.Cancelled, (<-first).Outcome)

	f.mu.Lock()
	delete(f.block, "s1")
	f.mu.Unlock()
	second := make(chan rollout.Report)
	go func() { second <- rollout.Run(context.Background(), cfg(f, 1, "s1", "s2", "s3")) }()
	close(release) // the first run's deploy ends while the second asks
	rep := <-second
	assert.Equal(t, rollout.Deployed, rep.Outcome)
	assert.Equal(t, []string{"skipped: already on v2"}, byServer(rep)["s1"].What)
	assert.Equal(t, []string{"s1", "s2", "s3"}, f.callsOf("deploy"), "s1 deployed once, by the cancelled run")
	assert.LessOrEqual(t, f.maxOut, 1)
}

// Finding 1: a batch's bound was armed only after a signal. Here every
// remote call carries the contract's bound, signal or not.
func TestEveryCallIsBounded(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy()})
	f.deployFails["s2"] = true
	rollout.Run(context.Background(), cfg(f, 1, "s1", "s2"))
	tm := infra.Prod()
	for _, call := range []string{"deploy s1", "deploy s2", "rollback s2", "rollback s1"} {
		d, ok := f.deadline[call]
		require.Truef(t, ok, "%s ran with no deadline", call)
		assert.LessOrEqual(t, d, tm.RemoteDeployMax(), call)
		assert.Greater(t, d, tm.RemoteDeployMax()-time.Minute, call)
	}
}

// A deploy that never ends is cut at its bound and the batch fails.
func TestHungDeployEndsAtItsBound(t *testing.T) {
	if testing.Short() {
		t.Skip("waits a scaled deploy bound; run without -short")
	}
	tm := infra.Prod().Scaled(0.01)
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy()})
	f.block["s1"] = make(chan struct{}) // never released
	c := cfg(f, 1, "s1", "s2")
	c.Timing = tm
	start := time.Now()
	rep := rollout.Run(context.Background(), c)
	took := time.Since(start)
	assert.Equal(t, rollout.Failed, rep.Outcome)
	assert.GreaterOrEqual(t, took, tm.RemoteDeployMax())
	assert.Less(t, took, tm.RolloutBatchMax()*3, "a batch and a rollback's, at most")
	f.mu.Lock()
	assert.True(t, f.cut["s1"])
	f.mu.Unlock()
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// Finding 2, the rollout's half: a server an earlier run left on VERSION,
// unverified, is deployed first by the next run; when it fails again, the
// release it ran when that run started is VERSION itself, and the rollout
// skipped its rollback without a word. Now it goes back to the release
// before the first run, the server's previous one, and the table says so.
func TestRerunRollsBackToTheReleaseBeforeTheFirstRun(t *testing.T) {
	servers := []string{"s1", "s2", "s3"}
	for _, tc := range []struct {
		name string
		// first is the earlier run: it leaves s1, the canary, on v2,
		// unverified.
		first func(t *testing.T, f *fleet)
	}{
		{"-no-rollback", func(t *testing.T, f *fleet) {
			c := cfg(f, 1, servers...)
			c.NoRollback = true
			require.Equal(t, rollout.Failed, rollout.Run(context.Background(), c).Outcome)
		}},
		{"a failed rollback", func(t *testing.T, f *fleet) {
			f.rollbackFails["s1"] = true
			require.Equal(t, rollout.Failed, rollout.Run(context.Background(), cfg(f, 1, servers...)).Outcome)
			f.mu.Lock()
			f.rollbackFails["s1"] = false
			f.mu.Unlock()
		}},
		{"a cancel", func(t *testing.T, f *fleet) {
			release := make(chan struct{})
			f.block["s1"] = release
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan rollout.Report)
			go func() { done <- rollout.Run(ctx, cfg(f, 1, servers...)) }()
			require.Equal(t, "deploy s1", <-f.started)
			cancel()
			require.Equal(t, rollout.Cancelled, (<-done).Outcome)
			f.mu.Lock()
			delete(f.block, "s1")
			f.mu.Unlock()
			close(release) // the deploy left running ends, after its switch, unverified
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(map[string]server{"s1": healthy(), "s2": healthy(), "s3": healthy()})
			f.switchFails["s1"] = true
			tc.first(t, f)
			st, err := f.Status(context.Background(), "s1")
			require.NoError(t, err)
			require.Equal(t, rollout.Status{Release: "v2", Previous: "v1"}, st, "the earlier run left s1 on v2, unverified")
			f.mu.Lock()
			earlier := len(f.rolledBackTo)
			f.mu.Unlock()

			rep := rollout.Run(context.Background(), cfg(f, 1, servers...))
			assert.Equal(t, rollout.Failed, rep.Outcome)
			f.mu.Lock()
			assert.Equal(t, []string{"s1 v1"}, f.rolledBackTo[earlier:], "back to the release before the first run")
			f.mu.Unlock()
			assert.Equal(t, []string{"s1", "s1"}, f.callsOf("deploy"), "s2 and s3 never taken out")
			assert.LessOrEqual(t, f.maxOut, 1)
			m := byServer(rep)
			assert.Equal(t, rollout.ServerReport{Server: "s1", Before: "v2", Now: "v1", Verified: "yes", OutAtStart: true,
				What: []string{"deploy FAILED: deploy exit 1 after switching",
					"on v2, unverified, since an earlier run: rolling back to v1, the release before the first run of v2",
					"rollback: verified and back in service"}}, m["s1"])
			var table bytes.Buffer
			require.NoError(t, rep.WriteTable(&table))
			assert.Regexp(t, `(?m)^s1\s+v2\s+v1\s+yes\s+deploy FAILED: deploy exit 1 after switching; on v2, unverified, since an earlier run: rolling back to v1, the release before the first run of v2; rollback: verified and back in service$`, table.String())
			for _, s := range []string{"s2", "s3"} {
				assert.Equal(t, "v1", m[s].Now, s)
				assert.Equal(t, []string{"not started"}, m[s].What, s)
			}
		})
	}
}

// A server an earlier run left on VERSION that keeps no release before it
// (VERSION was its first) has nothing to go back to, and the table says so.
func TestRerunWithNoReleaseBeforeTheFirstRun(t *testing.T) {
	f := newFleet(map[string]server{"s1": {release: "v2"}, "s2": healthy()})
	f.deployFails["s1"] = true
	rep := rollout.Run(context.Background(), cfg(f, 1, "s1", "s2"))
	assert.Equal(t, rollout.Failed, rep.Outcome)
	assert.Empty(t, f.callsOf("rollback"))
	assert.Contains(t, byServer(rep)["s1"].What, "on v2, unverified, since an earlier run, and it keeps no release before it: nothing to roll back to")
}
