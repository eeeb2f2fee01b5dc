package contract_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
)

// example is the change the rollout order exists for: the interval doubles,
// the drain, its upper bound and the grace period make room for it.
func example() (old, new infra.Timing) {
	old = infra.Prod()
	new = old
	new.HealthCheckInterval = 10 * time.Second
	new.Drain = 30 * time.Second
	new.MaxDrain = 30 * time.Second
	new.StopGracePeriod = 45 * time.Second
	return old, new
}

func verdictText(t *testing.T, v contract.Verdict) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, contract.WriteVerdict(&b, v))
	return b.String()
}

func TestVerdict(t *testing.T) {
	old, new := example()
	unsafe := new
	unsafe.LBIdleTimeout, unsafe.AppKeepAlive = 30*time.Second, 40*time.Second
	broken := old
	broken.Drain = time.Second
	// Back to a 5s interval and a 15s drain; the grace period stays, since
	// old containers with the 30s drain stop under it.
	back := old
	back.StopGracePeriod = new.StopGracePeriod
	tests := []struct {
		name         string
		old, new     infra.Timing
		slug, pulumi string
		safe         bool
		want         []string
		wantNot      []string
	}{
		{"no change", old, old, "any-order", "before", true,
			[]string{"#### Rollout order: **any order**", "every state between the two releases keeps every invariant",
				"`pulumi up` changes the balancer: nothing. The rollout changes the servers, one at a time: nothing."},
			[]string{"breaks:", "Split"}},
		{"the example", old, new, "servers-first", "after", true,
			[]string{"#### Rollout order: **servers first**",
				"servers first: roll the servers out, then run `pulumi up`; balancer first would break `drain-outlasts-detection`, `reentry-short`.",
				"`pulumi up` changes the balancer: `HealthCheckInterval` 5s → 10s. The rollout changes the servers, one at a time: `Drain` 15s → 30s, `MaxDrain` 25s → 30s, `StopGracePeriod` 40s → 45s.",
				"Balancer first breaks:\n\n- balancer first, before the rollout: the new balancer; servers of the old release: `drain-outlasts-detection`: Drain 15s must exceed worst-case detection 23s",
			},
			[]string{"Servers first breaks", "Split"}},
		{"the example reversed", new, back, "balancer-first", "before", true,
			[]string{"#### Rollout order: **balancer first**", "balancer first: run `pulumi up`, then roll the servers out; servers first would break `drain-outlasts-detection`, `reentry-short`.",
				"Servers first breaks:"},
			[]string{"Balancer first breaks"}},
		{"no safe order", old, unsafe, "unsafe", "", false,
			[]string{"#### Rollout order: **unsafe**",
				"unsafe in either order: servers first would break `keepalive-outlasts-idle`, balancer first `drain-outlasts-detection`, `reentry-short`; split the change in two.",
				"**Split it in two changes, each deployed on its own:**\n\n1. change `LBIdleTimeout` 1m → 30s (**any order**)\n2. then change `HealthCheckInterval` 5s → 10s, `Drain` 15s → 30s, `MaxDrain` 25s → 30s, `StopGracePeriod` 40s → 45s, `AppKeepAlive` 1m15s → 40s (**servers first**)\n"},
			nil},
		{"the example reversed, grace period too: old containers would be killed", new, old, "unsafe", "", false,
			[]string{"- servers first, mid-rollout: the old balancer; a server's old containers stop under the new definition: `drain-fits-grace`: Drain 30s + ShutdownTimeout 10s + KillMargin 5s = 45s must fit inside StopGracePeriod 40s",
				"1. change `HealthCheckInterval` 10s → 5s, `Drain` 30s → 15s, `MaxDrain` 30s → 25s (**balancer first**)\n2. then change `StopGracePeriod` 45s → 40s (**any order**)\n"},
			nil},
		{"a broken end", old, broken, "not-judged", "", false,
			[]string{"#### Rollout order: not judged\n\na transition is judged between two valid timings: new timing: invalid timing: 2 rule(s) broken - drain-outlasts-detection: Drain 1s"},
			[]string{"**"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := contract.JudgeTransition(tt.old, tt.new)
			assert.Equal(t, tt.slug, v.Slug())
			assert.Equal(t, tt.pulumi, v.PulumiUp())
			assert.Equal(t, tt.safe, v.Safe())
			text := verdictText(t, v)
			for _, s := range tt.want {
				assert.Contains(t, text, s)
			}
			for _, s := range tt.wantNot {
				assert.NotContains(t, text, s)
			}
		})
	}
}

// TestVerdictWithoutSplit: a change whose split cannot be searched says so
// instead of proposing one.
func TestVerdictWithoutSplit(t *testing.T) {
	old := infra.Prod()
	new := old.Scaled(2)
	new.HealthyThreshold++
	new.WatchdogStrikes++
	new.LBIdleTimeout, new.AppKeepAlive = 30*time.Second, 40*time.Second
	// The longest request must stay within the new idle timeout.
	new.MaxRequest = new.LBIdleTimeout
	v := contract.JudgeTransition(old, new)
	require.True(t, v.Judged(), v.NotJudged)
	require.Equal(t, infra.NoSafeOrder, v.Transition.Order, v.Reason())
	assert.Nil(t, v.Split)
	assert.Contains(t, verdictText(t, v), "**No two-step split proposed:** 20 fields changed at once")
}

// TestDiffEndsWithTheVerdict: the diff prints the rollout order under
// everything else, judged from the two sides' values.
func TestDiffEndsWithTheVerdict(t *testing.T) {
	old, new := example()
	text := diff(t, side("base", old, nil), side("head", new, nil))
	i := strings.Index(text, "#### Rollout order: **servers first**")
	require.GreaterOrEqual(t, i, 0, text)
	assert.Greater(t, i, strings.Index(text, "#### Derived values"), "the verdict comes under the diff")
	assert.Equal(t, "servers-first", contract.DiffVerdict(side("base", old, nil), side("head", new, nil)).Slug())

	// A field the old revision lacks is judged at its new value on both
	// sides, and the verdict says so.
	old.NodeSkew = 5 * time.Second // would break the example's drain margin if it were used
	text = diff(t, side("base", old, dropField("NodeSkew")), side("head", new, nil))
	assert.Contains(t, text, "#### Rollout order: **servers first**")
	assert.Contains(t, text, "\nNew in this change, so judged at the new value on both sides: `NodeSkew`.\n")
	assert.Equal(t, []string{"NodeSkew"}, contract.DiffVerdict(side("base", old, dropField("NodeSkew")), side("head", new, nil)).Added)

	// A new side without a field this build judges cannot be ordered.
	text = diff(t, side("base", new, nil), side("head", new, dropField("Drain")))
	assert.Contains(t, text, "#### Rollout order: not judged\n\n`head` has no Drain as this build knows it")
}

func TestVerdictNamesAddedFields(t *testing.T) {
	old, new := example()
	v := contract.JudgeTransition(old, new)
	v.Added = []string{"NodeSkew", "Drain"}
	assert.True(t, strings.HasSuffix(verdictText(t, v), "\nNew in this change, so judged at the new value on both sides: `NodeSkew`, `Drain`.\n"))
}
