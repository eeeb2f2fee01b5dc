package rollout_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/rollout"
)

// syncLog is a log the rollout writes from its batches' goroutines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// servers names s1..sn.
func servers(n int) []string {
	var out []string
	for i := 1; i <= n; i++ {
		out = append(out, fmt.Sprintf("s%d", i))
	}
	return out
}

// onV1 is a fleet of n healthy servers on v1.
func onV1(n int) map[string]server {
	states := map[string]server{}
	for _, s := range servers(n) {
		states[s] = healthy()
	}
	return states
}

// assertPhases asserts calls are the phases' calls, phase after phase, in
// any order within a phase (a batch's servers run side by side).
func assertPhases(t *testing.T, phases [][]string, calls []string) {
	t.Helper()
	all := calls
	for i, phase := range phases {
		if !assert.GreaterOrEqual(t, len(calls), len(phase), "phase %d %v: calls left %v (all: %v)", i, phase, calls, all) {
			return
		}
		assert.ElementsMatch(t, phase, calls[:len(phase)], "phase %d (all: %v)", i, all)
		calls = calls[len(phase):]
	}
	assert.Empty(t, calls, "calls after the last phase (all: %v)", all)
}

func (f *fleet) allCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

const (
	deployed   = "deploy: verified and back in service"
	rolledBack = "rollback: verified and back in service"
)

// The batches, the canary and the rollback as the fleet sees them, call by
// call: which servers go together, in which order, what each ends on, and
// how many are out at once. A rollback that fails stops the rollback: no
// healthy server is taken out after it, nor while a server is out.
func TestBatches(t *testing.T) {
	type row struct {
		Before, Now, Verified string
		What                  []string
	}
	for _, tc := range []struct {
		name           string
		servers        int
		states         map[string]server // the servers not on v1, healthy
		maxUnavailable int
		noRollback     bool
		deployFails    []string
		rollbackFails  []string
		neverBack      []string
		together       [][]string
		outcome        string
		phases         [][]string
		maxOut         int
		rows           map[string]row
		log            []string
	}{
		{name: "one at a time", servers: 3, maxUnavailable: 1, outcome: rollout.Deployed,
			phases: [][]string{{"deploy s1"}, {"wait s1"}, {"deploy s2"}, {"wait s2"}, {"deploy s3"}, {"wait s3"}}, maxOut: 1,
			rows: map[string]row{"s3": {"v1", "v2", "yes", []string{deployed}}}},
		{name: "a canary, then two at once", servers: 6, maxUnavailable: 2, together: [][]string{{"s2", "s3"}, {"s4", "s5"}},
			outcome: rollout.Deployed,
			phases: [][]string{{"deploy s1"}, {"wait s1"}, {"deploy s2", "deploy s3", "wait s2", "wait s3"},
				{"deploy s4", "deploy s5", "wait s4", "wait s5"}, {"deploy s6"}, {"wait s6"}}, maxOut: 2,
			log: []string{"deploying v2 to [s1] (batch 1, the canary)", "deploying v2 to [s2 s3] (batch 2)", "deploying v2 to [s6] (batch 4)"}},
		{name: "the canary fails: it alone goes back", servers: 4, maxUnavailable: 2, deployFails: []string{"s1"},
			outcome: rollout.Failed,
			phases:  [][]string{{"deploy s1"}, {"rollback s1"}, {"wait s1"}}, maxOut: 1,
			rows: map[string]row{
				"s1": {"v1", "v1", "yes", []string{"deploy FAILED: deploy exit 1", rolledBack}},
				"s2": {"v1", "v1", "yes", []string{"not started"}},
			}},
		{name: "a later batch fails: every touched server goes back, in reverse", servers: 5, maxUnavailable: 2,
			deployFails: []string{"s4"}, together: [][]string{{"s2", "s3"}, {"s4", "s5"}}, outcome: rollout.Failed,
			phases: [][]string{{"deploy s1"}, {"wait s1"}, {"deploy s2", "deploy s3", "wait s2", "wait s3"},
				{"deploy s4", "deploy s5", "wait s5"},
				{"rollback s4", "rollback s5", "wait s4", "wait s5"},
				{"rollback s2", "rollback s3", "wait s2", "wait s3"},
				{"rollback s1"}, {"wait s1"}}, maxOut: 2,
			rows: map[string]row{
				"s1": {"v1", "v1", "yes", []string{deployed, rolledBack}},
				"s4": {"v1", "v1", "yes", []string{"deploy FAILED: deploy exit 1", rolledBack}},
			}},
		// The bash rollout rolled s1 back here too, with s2 out: two
		// servers of three out at once under -max-unavailable 1.
		{name: "a server never back: its rollback fails too, and nothing healthy goes out after it", servers: 3,
			maxUnavailable: 1, neverBack: []string{"s2"}, outcome: rollout.Failed,
			phases: [][]string{{"deploy s1"}, {"wait s1"}, {"deploy s2"}, {"wait s2"}, {"rollback s2"}, {"wait s2"}}, maxOut: 1,
			rows: map[string]row{
				"s1": {"v1", "v2", "yes", []string{deployed, "not rolled back: a rollback failed"}},
				"s2": {"v1", "v1", "yes", []string{"deploy: not back in service: s2 unhealthy", "rollback: not back in service: s2 unhealthy"}},
				"s3": {"v1", "v1", "yes", []string{"not started"}},
			},
			log: []string{"rollback of [s2] failed; stopping"}},
		// Only a server already out may go back while another is out. s2,
		// left on v2 by an earlier run, keeps no release before it.
		{name: "a server left out: nothing healthy goes back while it is", servers: 3, maxUnavailable: 1,
			states:      map[string]server{"s1": {release: "v1"}, "s2": {release: "v2"}},
			deployFails: []string{"s2"}, outcome: rollout.Failed,
			phases: [][]string{{"deploy s1"}, {"wait s1"}, {"deploy s2"}}, maxOut: 2,
			rows: map[string]row{
				"s1": {"v1", "v2", "yes", []string{deployed, "not rolled back: too many servers out"}},
				"s2": {"v2", "v2", "no", []string{"deploy FAILED: deploy exit 1",
					"on v2, unverified, since an earlier run, and it keeps no release before it: nothing to roll back to"}},
				"s3": {"v1", "v1", "yes", []string{"not started"}},
			},
			log: []string{"not rolling back [s1]: 1 server(s) out already, -max-unavailable 1"}},
		// The same server keeping v1, the release before the first run: it
		// goes back to it, and once it is back in service the healthy one
		// may go out.
		{name: "a server left out on the release goes back to the one before the first run, then the rest", servers: 3,
			maxUnavailable: 1,
			states:         map[string]server{"s1": {release: "v1"}, "s2": {release: "v2", previous: "v1"}},
			deployFails:    []string{"s2"}, outcome: rollout.Failed,
			phases: [][]string{{"deploy s1"}, {"wait s1"}, {"deploy s2"}, {"rollback s2"}, {"wait s2"}, {"rollback s1"},
				{"wait s1"}}, maxOut: 2,
			rows: map[string]row{
				"s1": {"v1", "v1", "yes", []string{deployed, rolledBack}},
				"s2": {"v2", "v1", "yes", []string{"deploy FAILED: deploy exit 1",
					"on v2, unverified, since an earlier run: rolling back to v1, the release before the first run of v2",
					rolledBack}},
				"s3": {"v1", "v1", "yes", []string{"not started"}},
			}},
		{name: "-no-rollback stops where it failed", servers: 3, maxUnavailable: 1, noRollback: true, deployFails: []string{"s2"},
			outcome: rollout.Failed,
			phases:  [][]string{{"deploy s1"}, {"wait s1"}, {"deploy s2"}}, maxOut: 1,
			rows: map[string]row{
				"s1": {"v1", "v2", "yes", []string{deployed}},
				"s2": {"v1", "v1", "no", []string{"deploy FAILED: deploy exit 1"}},
				"s3": {"v1", "v1", "yes", []string{"not started"}},
			},
			log: []string{"-no-rollback: leaving every server where it is"}},
		// The bash rollout went on to roll s1 back, healthy, after s2's
		// rollback had failed.
		{name: "a failed rollback stops the rollback", servers: 3, maxUnavailable: 1,
			deployFails: []string{"s3"}, rollbackFails: []string{"s2"}, outcome: rollout.Failed,
			phases: [][]string{{"deploy s1"}, {"wait s1"}, {"deploy s2"}, {"wait s2"}, {"deploy s3"},
				{"rollback s3"}, {"wait s3"}, {"rollback s2"}}, maxOut: 1,
			rows: map[string]row{
				"s1": {"v1", "v2", "yes", []string{deployed, "not rolled back: a rollback failed"}},
				"s2": {"v1", "v2", "no", []string{deployed, "rollback FAILED: rollback exit 1"}},
				"s3": {"v1", "v1", "yes", []string{"deploy FAILED: deploy exit 1", rolledBack}},
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			states := onV1(tc.servers)
			maps.Copy(states, tc.states)
			f := newFleet(states)
			for _, s := range tc.deployFails {
				f.deployFails[s] = true
			}
			for _, s := range tc.rollbackFails {
				f.rollbackFails[s] = true
			}
			for _, s := range tc.neverBack {
				f.neverBack[s] = true
			}
			f.together = tc.together
			var log syncLog
			c := cfg(f, tc.maxUnavailable, servers(tc.servers)...)
			c.NoRollback, c.Log = tc.noRollback, &log
			require.NoError(t, c.Check())
			rep := rollout.Run(context.Background(), c)
			assert.Equal(t, tc.outcome, rep.Outcome, "log:\n%s", log.String())
			assertPhases(t, tc.phases, f.allCalls())
			assert.Equal(t, tc.maxOut, f.maxOut, "servers out at once, as the fleet saw them")
			got := byServer(rep)
			for s, want := range tc.rows {
				assert.Equal(t, want, row{got[s].Before, got[s].Now, got[s].Verified, got[s].What}, s)
			}
			for _, w := range tc.log {
				assert.Contains(t, log.String(), w)
			}
			if tc.outcome == rollout.Deployed {
				for _, s := range rep.Servers {
					assert.Equal(t, "v2", s.Now, s.Server)
					assert.Equal(t, "yes", s.Verified, s.Server)
				}
				assert.Contains(t, log.String(), fmt.Sprintf("deployed v2 to all %d server(s)", tc.servers))
			}
		})
	}
}

// A server that cannot say what it runs, or answers something that is no
// status, stops the rollout before anything changes; the table says which.
func TestServerThatCannotAnswerStopsTheRollout(t *testing.T) {
	_, unreadable := rollout.ParseStatus("hello\n")
	require.Error(t, unreadable)
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"down", fmt.Errorf("s2 --status: %w (exit 255)", rollout.ErrSSH), "cannot tell what it runs: s2 --status: ssh failed or the connection dropped (exit 255)"},
		{"an answer that is not a status", unreadable, `cannot tell what it runs: --status answered something unreadable: "hello"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(onV1(3))
			f.statusErr["s2"] = tc.err
			var log syncLog
			c := cfg(f, 1, servers(3)...)
			c.Log = &log
			rep := rollout.Run(context.Background(), c)
			assert.Equal(t, rollout.Failed, rep.Outcome)
			assert.Empty(t, f.allCalls(), "no server touched")
			got := byServer(rep)
			assert.Equal(t, []string{"?", "?", "unknown"}, []string{got["s2"].Before, got["s2"].Now, got["s2"].Verified})
			assert.Equal(t, []string{tc.want}, got["s2"].What)
			assert.Equal(t, []string{"v1", "v1", "yes"}, []string{got["s1"].Before, got["s1"].Now, got["s1"].Verified})
			assert.Contains(t, log.String(), "cannot tell what runs on [s2]; nothing deployed")
		})
	}
}

// Running the same rollout again converges: a server already on the
// release and verified is checked in service and skipped, not redeployed;
// one on the release but unverified is out, and goes first. A skipped
// server the balancer does not have in service stops the rollout before
// anything changes.
func TestSkipsServersAlreadyOnTheRelease(t *testing.T) {
	f := newFleet(map[string]server{
		"s1": {release: "v2", previous: "v1", verified: true},
		"s2": healthy(),
		"s3": {release: "v2", previous: "v1"},
	})
	rep := rollout.Run(context.Background(), cfg(f, 1, servers(3)...))
	require.Equal(t, rollout.Deployed, rep.Outcome)
	assertPhases(t, [][]string{{"wait s1"}, {"deploy s3"}, {"wait s3"}, {"deploy s2"}, {"wait s2"}}, f.allCalls())
	assert.Equal(t, []string{"skipped: already on v2"}, byServer(rep)["s1"].What)
	assert.True(t, byServer(rep)["s3"].OutAtStart)

	f = newFleet(map[string]server{
		"s1": {release: "v2", previous: "v1", verified: true},
		"s2": {release: "v2", previous: "v1", verified: true},
		"s3": healthy(),
	})
	f.neverBack["s1"] = true
	var log syncLog
	c := cfg(f, 1, servers(3)...)
	c.Log = &log
	rep = rollout.Run(context.Background(), c)
	require.Equal(t, rollout.Failed, rep.Outcome)
	assertPhases(t, [][]string{{"wait s1", "wait s2"}}, f.allCalls())
	assert.Contains(t, log.String(), "deploying others now could take too many servers out")
	assert.Equal(t, "v1", byServer(rep)["s3"].Now)
}

// A server that ran nothing before has nothing to roll back to: the table
// says so, and the servers that ran a release go back to it.
func TestRollbackOfAFirstDeploy(t *testing.T) {
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy(), "s3": {}})
	f.deployFails["s2"] = true
	rep := rollout.Run(context.Background(), cfg(f, 1, servers(3)...))
	require.Equal(t, rollout.Failed, rep.Outcome)
	assertPhases(t, [][]string{{"deploy s3"}, {"wait s3"}, {"deploy s1"}, {"wait s1"}, {"deploy s2"},
		{"rollback s2"}, {"wait s2"}, {"rollback s1"}, {"wait s1"}}, f.allCalls())
	got := byServer(rep)
	assert.Equal(t, []string{deployed, "no release before this rollout: nothing to roll back to"}, got["s3"].What)
	assert.Equal(t, []string{"", "v2", "yes"}, []string{got["s3"].Before, got["s3"].Now, got["s3"].Verified})
	assert.Equal(t, []string{deployed, rolledBack}, got["s1"].What)
	assert.Equal(t, "v1", got["s1"].Now)
	assert.LessOrEqual(t, f.maxOut, 1)
}

// A server whose first deploy fails has nothing to roll back to: the table
// says so, and the servers this rollout deployed before it still go back
// when there is room. s1 was out (unverified on v1) and went first; s2, on
// nothing, failed; s3 was never started.
func TestFailedFirstDeployHasNothingToRollBackTo(t *testing.T) {
	f := newFleet(map[string]server{"s1": {release: "v1"}, "s2": {}, "s3": healthy()})
	f.deployFails["s2"] = true
	rep := rollout.Run(context.Background(), cfg(f, 2, servers(3)...))
	require.Equal(t, rollout.Failed, rep.Outcome)
	assertPhases(t, [][]string{{"deploy s1"}, {"wait s1"}, {"deploy s2"}, {"rollback s1"}, {"wait s1"}}, f.allCalls())
	got := byServer(rep)
	assert.Equal(t, []string{"", "", "no"}, []string{got["s2"].Before, got["s2"].Now, got["s2"].Verified})
	assert.Equal(t, []string{"deploy FAILED: deploy exit 1", "no release before this rollout: nothing to roll back to"}, got["s2"].What)
	assert.Equal(t, []string{"v1", "v1", "yes"}, []string{got["s1"].Before, got["s1"].Now, got["s1"].Verified})
	assert.Equal(t, []string{deployed, rolledBack}, got["s1"].What)
	assert.Equal(t, []string{"not started"}, got["s3"].What)
	assert.LessOrEqual(t, f.maxOut, 2)
}

// A cancel in the middle of a batch (a cancelled CI job): nothing new
// starts, the batch's deploys run on to their end, and the same rollout
// run again converges, deploying only what the first did not, never with
// more than -max-unavailable servers out across both runs.
func TestCancelMidBatchThenRerunConverges(t *testing.T) {
	f := newFleet(onV1(6))
	release := make(chan struct{})
	f.block["s2"], f.block["s3"] = release, release
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan rollout.Report)
	go func() { first <- rollout.Run(ctx, cfg(f, 2, servers(6)...)) }()
	f.awaitCall(t, "deploy s2", 1)
	f.awaitCall(t, "deploy s3", 1)
	cancel()
	rep := <-first
	require.Equal(t, rollout.Cancelled, rep.Outcome)
	got := byServer(rep)
	for _, s := range []string{"s2", "s3"} {
		assert.Contains(t, got[s].What, "deploy in flight when cancelled: it runs on to its end on the server", s)
	}
	for _, s := range []string{"s4", "s5", "s6"} {
		assert.Equal(t, []string{"not started (cancelled)"}, got[s].What, s)
	}
	assertPhases(t, [][]string{{"deploy s1"}, {"wait s1"}, {"deploy s2", "deploy s3"}}, f.allCalls())

	// The batch in flight ends on its servers, uncut, and is waited back
	// into service, before the run again.
	close(release)
	f.awaitCall(t, "wait s2", 1)
	f.awaitCall(t, "wait s3", 1)
	f.mu.Lock()
	assert.False(t, f.cut["s2"] || f.cut["s3"], "a cancel does not cut a deploy in flight")
	delete(f.block, "s2")
	delete(f.block, "s3")
	before := len(f.calls)
	f.mu.Unlock()

	rep = rollout.Run(context.Background(), cfg(f, 2, servers(6)...))
	require.Equal(t, rollout.Deployed, rep.Outcome)
	assertPhases(t, [][]string{{"wait s1", "wait s2", "wait s3"}, {"deploy s4"}, {"wait s4"},
		{"deploy s5", "deploy s6", "wait s5", "wait s6"}}, f.allCalls()[before:])
	for _, s := range rep.Servers {
		assert.Equal(t, "v2", s.Now, s.Server)
	}
	assert.LessOrEqual(t, f.maxOut, 2, "across both runs")
}

// The rollout and the contract (infra, which the dry plan, TIMING.md and
// the rollout's bounds read) agree on every fleet of up to seven servers:
// the rollout refuses the shapes the contract refuses, and runs the others
// in the contract's number of batches, never with more servers out than
// allowed.
func TestAgreesWithTheContract(t *testing.T) {
	for k := 1; k <= 7; k++ {
		for n := 1; n <= 8; n++ {
			t.Run(fmt.Sprintf("%d servers, %d at once", k, n), func(t *testing.T) {
				f := newFleet(onV1(k))
				var log syncLog
				c := cfg(f, n, servers(k)...)
				c.Log = &log
				if err := infra.CheckRollout(k, n); err != nil {
					assert.ErrorContains(t, c.Check(), err.Error(), "refused as the contract refuses it")
					return
				}
				require.NoError(t, c.Check())
				rep := rollout.Run(context.Background(), c)
				require.Equal(t, rollout.Deployed, rep.Outcome, "log:\n%s", log.String())
				assert.Equal(t, infra.RolloutBatches(k, n), strings.Count(log.String(), "deploying v2 to"), "batches:\n%s", log.String())
				assert.LessOrEqual(t, f.maxOut, n)
			})
		}
	}
}

// The contract's worst cases are the rollout's: over every start of fleets
// of up to six servers (each already on the release and verified, out of
// service on the release before, or in service on it), a rollout runs no
// more batches (the check of the servers already on the release, then its
// deploys) than infra.RolloutBatchesMax, and a rollout whose last deploy
// fails rolls back in no more than infra.RollbackBatchesMax; some start
// reaches each, so neither counts a batch the rollout never runs.
func TestWorstCaseBatchesAreTheContracts(t *testing.T) {
	for k := 1; k <= 6; k++ {
		for n := 1; n <= max(1, k-1); n++ {
			t.Run(fmt.Sprintf("%d servers, %d at once", k, n), func(t *testing.T) {
				require.NoError(t, infra.CheckRollout(k, n))
				most, rollbackMost := 0, 0
				for done := 0; done <= k; done++ {
					for out := 0; done+out <= k; out++ {
						states := map[string]server{}
						names := servers(k)
						for i, s := range names {
							switch {
							case i < done:
								states[s] = server{release: "v2", previous: "v1", verified: true}
							case i < done+out:
								states[s] = server{release: "v1", previous: "v0"}
							default:
								states[s] = healthy()
							}
						}
						start := fmt.Sprintf("%d on v2, %d out, %d in service", done, out, k-done-out)

						var log syncLog
						c := cfg(newFleet(states), n, names...)
						c.Log = &log
						rep := rollout.Run(context.Background(), c)
						require.Equal(t, rollout.Deployed, rep.Outcome, "%s:\n%s", start, log.String())
						batches := strings.Count(log.String(), "checking the balancer has them in service") +
							strings.Count(log.String(), "deploying v2 to")
						assert.LessOrEqual(t, batches, infra.RolloutBatchesMax(k, n), "%s:\n%s", start, log.String())
						most = max(most, batches)

						if done == k {
							continue // nothing to deploy, nothing to fail
						}
						f := newFleet(states)
						f.deployFails[names[k-1]] = true // deployed last, wherever it starts
						log = syncLog{}
						c = cfg(f, n, names...)
						c.Log = &log
						rep = rollout.Run(context.Background(), c)
						require.Equal(t, rollout.Failed, rep.Outcome, "%s:\n%s", start, log.String())
						back := strings.Count(log.String(), "rolling back")
						assert.LessOrEqual(t, back, infra.RollbackBatchesMax(k, n), "%s:\n%s", start, log.String())
						rollbackMost = max(rollbackMost, back)
					}
				}
				assert.Equal(t, infra.RolloutBatchesMax(k, n), most, "the most batches of any start")
				assert.Equal(t, infra.RollbackBatchesMax(k, n), rollbackMost, "the most rollback batches of any start")
			})
		}
	}
}
