package rollout_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	// block, when set for a server, holds its deploy until closed; the
	// deploy notes whether its context was cut meanwhile.
	block   map[string]chan struct{}
	started chan string
	cut     map[string]bool
}

func newFleet(states map[string]server) *fleet {
	f := &fleet{servers: map[string]*server{}, deployFails: map[string]bool{}, rollbackFails: map[string]bool{},
		block: map[string]chan struct{}{}, started: make(chan string, 16), cut: map[string]bool{}, deadline: map[string]time.Duration{},
		locks: map[string]*sync.Mutex{}}
	for name, s := range states {
		s.out = !s.verified
		f.servers[name] = &s
		f.locks[name] = &sync.Mutex{}
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
	s := f.servers[name]
	return rollout.Status{Release: s.release, Previous: s.previous, Verified: s.verified}, nil
}

// start begins a call; it returns the call's context's error when a
// blocked deploy was cut.
func (f *fleet) start(ctx context.Context, kind, name string) error {
	f.mu.Lock()
	f.calls = append(f.calls, kind+" "+name)
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
	defer f.locks[name].Unlock()
	err := f.start(ctx, "deploy", name)
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.servers[name]
	if err != nil {
		s.verified = false
		return err
	}
	if f.deployFails[name] {
		s.verified = false
		return errors.New("deploy exit 1")
	}
	s.previous, s.release, s.verified = s.release, version, true
	return nil
}

func (f *fleet) Rollback(ctx context.Context, name, version string) error {
	f.locks[name].Lock()
	defer f.locks[name].Unlock()
	_ = f.start(ctx, "rollback", name)
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.servers[name]
	if f.rollbackFails[name] {
		s.verified = false
		return errors.New("rollback exit 1")
	}
	s.release, s.verified = version, true
	return nil
}

// WaitInService: a verified server comes back; an unverified one never does.
func (f *fleet) WaitInService(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.servers[name]
	if !s.verified {
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
