package infra_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

// These tests depend on timing.go and transition.go alone, like
// timing_test.go, so the mutation run tests them in isolation.

// TestEveryFieldHasASide: a field added to Timing without a `side` tag
// fails here, found by reflection.
func TestEveryFieldHasASide(t *testing.T) {
	sides, err := infra.FieldSides()
	require.NoError(t, err)
	typ := reflect.TypeOf(infra.Timing{})
	require.Len(t, sides, typ.NumField())
	for i, s := range sides {
		assert.Equal(t, typ.Field(i).Name, s.Field, "field order")
		assert.Containsf(t, []infra.Side{infra.SideBalancer, infra.SideServers}, s.Side, "%s", s.Field)
		assert.Falsef(t, s.Process && s.Side != infra.SideServers, "%s: only a servers field is held by a process", s.Field)
	}
}

func TestSidesOfNamesEveryFieldWithoutOne(t *testing.T) {
	type partial struct {
		A time.Duration `side:"balancer"`
		B time.Duration
		C time.Duration `side:"servers,process"`
		D int           `side:"server"`
		E int           `side:"servers"`
	}
	_, err := infra.SidesOf(reflect.TypeOf(partial{}))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `partial: each field needs a tag`)
	assert.Contains(t, err.Error(), `missing or unknown on B (side ""), D (side "server")`)

	type full struct {
		A time.Duration `side:"balancer"`
		C time.Duration `side:"servers,process"`
		E int           `side:"servers"`
	}
	got, err := infra.SidesOf(reflect.TypeOf(full{}))
	require.NoError(t, err)
	assert.Equal(t, []infra.FieldSide{
		{Field: "A", Side: infra.SideBalancer},
		{Field: "C", Side: infra.SideServers, Process: true},
		{Field: "E", Side: infra.SideServers},
	}, got)
}

// TestProcessFieldsAreWhatTheContainerTakes: every field the drain library's
// config reads (the environment a container starts with) is marked as held
// by the process; found by changing each field in turn.
// evidenceCopies are the balancer's numbers a container also takes, so its
// evidence drain knows what the balancer's checks prove. They stay the
// balancer's: a container with a stale copy checks its evidence against old
// numbers, and the relations, which judge what the balancer does, hold or
// break with the balancer's own values.
var evidenceCopies = map[string]bool{"HealthCheckInterval": true, "HealthCheckTimeout": true, "UnhealthyThreshold": true}

func TestProcessFieldsAreWhatTheContainerTakes(t *testing.T) {
	sides, err := infra.FieldSides()
	require.NoError(t, err)
	p := infra.Prod()
	for i, s := range sides {
		tm := p
		f := reflect.ValueOf(&tm).Elem().Field(i)
		f.SetInt(f.Int() + 1)
		if tm.DrainConfig() != p.DrainConfig() && !evidenceCopies[s.Field] {
			assert.Truef(t, s.Process && s.Side == infra.SideServers, "%s reaches the container's environment: tag it servers,process", s.Field)
		}
	}
}

// change returns Prod() with changes applied, like with() in timing_test.go,
// checked to be valid: a transition is judged between valid timings.
func change(t *testing.T, changes map[string]any) infra.Timing {
	t.Helper()
	tm := with(t, changes)
	require.NoErrorf(t, tm.Validate(), "row timing %v", changes)
	return tm
}

// transitionRow is one change of the timing and what rolling it out risks.
type transitionRow struct {
	name     string
	old, new map[string]any
	order    infra.Order
	// broken are the rules each order's states break.
	serversFirst, balancerFirst []infra.Rule
}

// The example: the interval doubles, the drain follows it; the grace
// period makes room for the longer drain.
var (
	slowChecks = map[string]any{"HealthCheckInterval": 10 * time.Second, "Drain": 25 * time.Second}
	fastChecks = map[string]any{}
)

func merge(ms ...map[string]any) map[string]any {
	out := map[string]any{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func transitionRows() []transitionRow {
	shortIdle := map[string]any{"LBIdleTimeout": 30 * time.Second, "AppKeepAlive": 40 * time.Second}
	return []transitionRow{
		{name: "nothing changes", order: infra.AnyOrder},
		{name: "servers only: a longer drain and grace", new: map[string]any{"Drain": 20 * time.Second, "MaxDrain": 30 * time.Second, "StopGracePeriod": 45 * time.Second},
			order: infra.AnyOrder},
		{name: "balancer only: a longer check timeout", new: map[string]any{"HealthCheckTimeout": 4 * time.Second},
			order: infra.AnyOrder},
		{name: "both sides, every state holds: longer idle timeout, shorter deregistration", new: map[string]any{"LBIdleTimeout": 70 * time.Second, "DeregistrationDelay": 20 * time.Second},
			order: infra.AnyOrder},
		{name: "the example: interval 5s → 10s, drain 15s → 25s", old: fastChecks, new: slowChecks,
			order: infra.ServersFirst, balancerFirst: []infra.Rule{infra.RuleDrainOutlasts, infra.RuleReentryShort}},
		{name: "the example reversed: interval 10s → 5s, drain 25s → 15s", old: slowChecks, new: fastChecks,
			order: infra.BalancerFirst, serversFirst: []infra.Rule{infra.RuleDrainOutlasts, infra.RuleReentryShort}},
		{name: "one more unhealthy check, a longer drain", new: map[string]any{"UnhealthyThreshold": 3, "Drain": 20 * time.Second},
			order: infra.ServersFirst, balancerFirst: []infra.Rule{infra.RuleDrainOutlasts}},
		{name: "idle timeout and keep-alive both up", new: map[string]any{"LBIdleTimeout": 100 * time.Second, "AppKeepAlive": 120 * time.Second},
			order: infra.ServersFirst, balancerFirst: []infra.Rule{infra.RuleKeepAlive}},
		{name: "idle timeout and keep-alive both down", new: shortIdle,
			order: infra.BalancerFirst, serversFirst: []infra.Rule{infra.RuleKeepAlive}},
		{name: "a longer shutdown timeout needs the deregistration delay first",
			new: map[string]any{"ShutdownTimeout": 50 * time.Second, "DeregistrationDelay": 50 * time.Second, "StopGracePeriod": 80 * time.Second,
				"LockWait": 155 * time.Second},
			order: infra.BalancerFirst, serversFirst: []infra.Rule{infra.RuleDeregCovers}},
		{name: "slower checks and a shorter idle timeout at once", new: merge(slowChecks, shortIdle),
			order:        infra.NoSafeOrder,
			serversFirst: []infra.Rule{infra.RuleKeepAlive}, balancerFirst: []infra.Rule{infra.RuleDrainOutlasts, infra.RuleReentryShort}},
		{name: "drain and grace down together: old containers stop under the new grace",
			new:   map[string]any{"Drain": 14 * time.Second, "MaxDrain": 14 * time.Second, "StopGracePeriod": 29 * time.Second},
			order: infra.NoSafeOrder, serversFirst: []infra.Rule{infra.RuleFitsGrace, infra.RuleMaxDrainFits},
			balancerFirst: []infra.Rule{infra.RuleFitsGrace, infra.RuleMaxDrainFits}},
		{name: "faster checks, shorter drain, max drain and grace",
			old:           merge(slowChecks, map[string]any{"MaxDrain": 35 * time.Second, "StopGracePeriod": 50 * time.Second, "LockWait": 125 * time.Second}),
			new:           map[string]any{},
			order:         infra.NoSafeOrder,
			serversFirst:  []infra.Rule{infra.RuleDrainOutlasts, infra.RuleReentryShort, infra.RuleMaxDrainFits},
			balancerFirst: []infra.Rule{infra.RuleMaxDrainFits}},
		// The slots design (docs/capacity.md): the target group checks the
		// second port before a server hands over to it; every server is
		// back on one slot before the second registration goes.
		{name: "one slot to two: the balancer registers the second first", new: map[string]any{"Slots": 2, "RegisteredSlots": 2},
			order: infra.BalancerFirst, serversFirst: []infra.Rule{infra.RuleSlotsRegistered}},
		{name: "two slots to one: the servers leave the second first", old: map[string]any{"Slots": 2, "RegisteredSlots": 2}, new: map[string]any{},
			order: infra.ServersFirst, balancerFirst: []infra.Rule{infra.RuleSlotsRegistered}},
	}
}

func rules(states []infra.State) []infra.Rule {
	seen := map[infra.Rule]bool{}
	var out []infra.Rule
	for _, s := range states {
		for _, v := range s.Broken {
			if !seen[v.Rule] {
				seen[v.Rule] = true
				out = append(out, v.Rule)
			}
		}
	}
	return out
}

func TestCheckTransition(t *testing.T) {
	seen := map[infra.Order]bool{}
	for _, tt := range transitionRows() {
		t.Run(tt.name, func(t *testing.T) {
			old, new := change(t, tt.old), change(t, tt.new)
			tr, err := infra.CheckTransition(old, new)
			require.NoError(t, err)
			assert.Equal(t, tt.order, tr.Order)
			assert.ElementsMatch(t, tt.serversFirst, rules(tr.Breaks(infra.ServersFirst)), "servers first breaks")
			assert.ElementsMatch(t, tt.balancerFirst, rules(tr.Breaks(infra.BalancerFirst)), "balancer first breaks")
			assert.Equal(t, old, tr.Old)
			assert.Equal(t, new, tr.New)
			seen[tr.Order] = true
		})
	}
	assert.Len(t, transitionRows(), 15)
	for _, o := range []infra.Order{infra.AnyOrder, infra.ServersFirst, infra.BalancerFirst, infra.NoSafeOrder} {
		assert.Truef(t, seen[o], "no row has the verdict %q", o)
	}
}

// TestMixedStates pins down which release each side of each state is at:
// the example's values make every side tell.
func TestMixedStates(t *testing.T) {
	old := change(t, fastChecks)
	new := change(t, merge(slowChecks, map[string]any{"LBIdleTimeout": 50 * time.Second, "AppKeepAlive": 70 * time.Second}))
	tr, err := infra.CheckTransition(old, new)
	require.NoError(t, err)
	require.Len(t, tr.States, 4)
	type at struct {
		order                       infra.Order
		interval, idle              time.Duration // balancer
		drain, keepAlive, stopGrace time.Duration // process, process, definition
		nameHas                     string
	}
	want := []at{
		{infra.ServersFirst, old.HealthCheckInterval, old.LBIdleTimeout, old.Drain, old.AppKeepAlive, new.StopGracePeriod, "old containers stop under the new definition"},
		{infra.ServersFirst, old.HealthCheckInterval, old.LBIdleTimeout, new.Drain, new.AppKeepAlive, new.StopGracePeriod, "before `pulumi up`"},
		{infra.BalancerFirst, new.HealthCheckInterval, new.LBIdleTimeout, old.Drain, old.AppKeepAlive, old.StopGracePeriod, "before the rollout"},
		{infra.BalancerFirst, new.HealthCheckInterval, new.LBIdleTimeout, old.Drain, old.AppKeepAlive, new.StopGracePeriod, "old containers stop under the new definition"},
	}
	for i, w := range want {
		s := tr.States[i]
		assert.Equal(t, w.order, s.Order, "state %d", i)
		assert.Equal(t, w.interval, s.Timing.HealthCheckInterval, "state %d: %s", i, s.Name)
		assert.Equal(t, w.idle, s.Timing.LBIdleTimeout, "state %d: %s", i, s.Name)
		assert.Equal(t, w.drain, s.Timing.Drain, "state %d: %s", i, s.Name)
		assert.Equal(t, w.keepAlive, s.Timing.AppKeepAlive, "state %d: %s", i, s.Name)
		assert.Equal(t, w.stopGrace, s.Timing.StopGracePeriod, "state %d: %s", i, s.Name)
		assert.Contains(t, s.Name, w.nameHas)
		assert.Contains(t, s.Name, strings.ToLower(string(w.order))[:8])
		// The state's violations are Validate's own, with its messages.
		if len(s.Broken) > 0 {
			assert.Equal(t, s.Timing.Violations(), s.Broken, "state %d", i)
		}
	}
	assert.Equal(t, []infra.Rule{infra.RuleDrainOutlasts, infra.RuleReentryShort}, rules(tr.Breaks(infra.BalancerFirst)))
	assert.Empty(t, tr.Breaks(infra.ServersFirst))
	assert.Empty(t, tr.Breaks(infra.AnyOrder), "no state belongs to AnyOrder")
}

func TestCheckTransitionNeedsValidEnds(t *testing.T) {
	bad := infra.Prod()
	bad.Drain = time.Second
	tests := []struct {
		name     string
		old, new infra.Timing
		want     []string
		wantNot  []string
	}{
		{"old broken", bad, infra.Prod(), []string{"old timing: invalid timing", "drain-outlasts-detection"}, []string{"new timing"}},
		{"new broken", infra.Prod(), bad, []string{"new timing: invalid timing"}, []string{"old timing"}},
		{"both broken", bad, bad, []string{"old timing", "new timing"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := infra.CheckTransition(tt.old, tt.new)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "a transition is judged between two valid timings")
			for _, s := range tt.want {
				assert.Contains(t, err.Error(), s)
			}
			for _, s := range tt.wantNot {
				assert.NotContains(t, err.Error(), s)
			}
			assert.True(t, infra.HasRule(err, infra.RuleDrainOutlasts), "the violations stay reachable")
		})
	}
	// A scaled timing keeps the invariants but not AWS's limits: it can be judged.
	s := infra.Prod().Scaled(0.2)
	tr, err := infra.CheckTransition(s, s)
	require.NoError(t, err)
	assert.Equal(t, infra.AnyOrder, tr.Order)
}
