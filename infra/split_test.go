package infra_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

// TestProposeSplit: every change with no safe order gets a two-step
// proposal, and each step is itself safe, checked again from scratch.
func TestProposeSplit(t *testing.T) {
	unsafe := 0
	for _, tt := range transitionRows() {
		if tt.order != infra.NoSafeOrder {
			continue
		}
		unsafe++
		t.Run(tt.name, func(t *testing.T) {
			old, new := change(t, tt.old), change(t, tt.new)
			split, ok, err := infra.ProposeSplit(old, new)
			require.NoError(t, err)
			require.True(t, ok, "no two-step proposal")
			require.NoError(t, split.Mid.Validate(), "the intermediate timing is valid, AWS's limits included")
			assert.NotEqual(t, old, split.Mid)
			assert.NotEqual(t, new, split.Mid)
			for i, step := range [][2]infra.Timing{{old, split.Mid}, {split.Mid, new}} {
				tr, err := infra.CheckTransition(step[0], step[1])
				require.NoError(t, err)
				assert.NotEqualf(t, infra.NoSafeOrder, tr.Order, "step %d is safe in some order", i+1)
			}
			assert.Equal(t, split.Mid, split.First.New)
			assert.Equal(t, split.Mid, split.Next.Old)
			// Every field of the intermediate is one end's value.
			o, n, m := reflect.ValueOf(old), reflect.ValueOf(new), reflect.ValueOf(split.Mid)
			for i := 0; i < m.NumField(); i++ {
				v := m.Field(i).Interface()
				assert.Truef(t, v == o.Field(i).Interface() || v == n.Field(i).Interface(), "%s", m.Type().Field(i).Name)
			}
		})
	}
	assert.GreaterOrEqual(t, unsafe, 3)
}

// TestProposeSplitTheExample: slower checks with a shorter idle timeout
// split into the smallest first step that works: the longer drain alone
// (safe in any order: the grace already holds a drain as long as MaxDrain),
// then the rest (balancer first).
func TestProposeSplitTheExample(t *testing.T) {
	old := change(t, nil)
	new := change(t, merge(slowChecks, map[string]any{"LBIdleTimeout": 30 * time.Second, "AppKeepAlive": 40 * time.Second}))
	split, ok, err := infra.ProposeSplit(old, new)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, infra.AnyOrder, split.First.Order)
	assert.Equal(t, infra.BalancerFirst, split.Next.Order)
	want := old
	want.Drain = new.Drain
	assert.Equal(t, want, split.Mid)
}

func TestProposeSplitRefuses(t *testing.T) {
	bad := infra.Prod()
	bad.Drain = time.Second
	_, ok, err := infra.ProposeSplit(infra.Prod(), bad)
	assert.False(t, ok)
	assert.ErrorContains(t, err, "new timing: invalid timing")

	// Every duration × 2 and two counts up: valid, and too many fields
	// changed at once to search.
	new := infra.Prod().Scaled(2)
	new.HealthyThreshold++
	new.WatchdogStrikes++
	require.NoError(t, new.ValidateInvariants())
	_, ok, err = infra.ProposeSplit(infra.Prod(), new)
	assert.False(t, ok)
	assert.ErrorContains(t, err, "fields changed at once, more than the 16 a split is searched for")
}
