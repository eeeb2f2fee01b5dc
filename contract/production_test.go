package contract

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

// A stack deployed before every field was exported: its timing output has
// the key numbers only (and derived values, which are not fields).
const keyNumbersOnly = `{
  "albArnSuffix": "app/mythex-alb/50dc6c495c0c9188",
  "timing": {
    "healthCheckInterval": "5s", "healthCheckTimeout": "3s", "unhealthyThreshold": 2, "healthyThreshold": 2,
    "worstCaseDetection": "13s", "drain": "15s", "drainMargin": "2s", "reentry": "10s", "shutdownTimeout": "10s",
    "stopGracePeriod": "30s", "killSlack": "5s", "deregistrationDelay": "30s", "lbIdleTimeout": "1m0s",
    "appKeepAlive": "1m15s", "keepAliveMargin": "15s"
  }
}`

func writeOutputs(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outputs.json")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	return path
}

func TestAtProduction(t *testing.T) {
	side, err := AtProduction(writeOutputs(t, keyNumbersOnly))
	require.NoError(t, err)
	assert.Equal(t, "production", side.Label)
	j := judge(side)
	assert.True(t, j.present["LBIdleTimeout"], "lbIdleTimeout is LBIdleTimeout")
	assert.Equal(t, time.Minute, j.t.LBIdleTimeout)
	assert.Equal(t, 2, j.t.UnhealthyThreshold)
	assert.False(t, j.present["NodeSkew"], "a field the output lacks is left out")

	// Against this build's own timing: the fields the output lacked are
	// judged as added, and the verdict says which.
	v := DiffVerdict(side, Current())
	assert.True(t, v.Safe(), v.Reason())
	assert.Contains(t, v.Added, "NodeSkew")
	// Production's release had no MaxDrain: it drained for Drain at most,
	// which its 30 s grace fits; the added field is judged as that.
	assert.Contains(t, v.Added, "MaxDrain")
	assert.NotContains(t, v.Added, "Drain")

	// A slower interval than production's, judged against it.
	slow := infra.Prod()
	slow.HealthCheckInterval, slow.Drain, slow.StopGracePeriod = 10*time.Second, 25*time.Second, 40*time.Second
	assert.Equal(t, "after", DiffVerdict(side, Side{Label: "new", Snap: TakeSnapshot(slow)}).PulumiUp())
}

func TestAtProductionRefusesWhatIsNoBaseline(t *testing.T) {
	for name, tc := range map[string]struct {
		text string
		want []string
	}{
		"empty":                {"", []string{"is empty (did `pulumi stack output --json` fail?)"}},
		"not JSON":             {"error: no stack named prod", []string{"is not the JSON object `pulumi stack output --json` writes"}},
		"never deployed":       {"{}", []string{"has no `timing` output: the stack has never been deployed"}},
		"timing not an object": {`{"timing": "15s"}`, []string{"the `timing` output in"}},
		"timing null":          {`{"timing": null}`, []string{"the `timing` output in"}},
		"no field":             {`{"timing": {"worstCaseDetection": "13s"}}`, []string{"has none of the timing's fields"}},
		"every bad value named": {`{"timing": {"drain": null, "healthCheckInterval": 5, "unhealthyThreshold": "2", "lbIdleTimeout": "a minute"}}`,
			[]string{"timing.drain is null", `timing.healthCheckInterval 5 is not a duration like "15s"`,
				`timing.lbIdleTimeout "a minute" is not a duration`, `timing.unhealthyThreshold "2" is not a whole number`}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := AtProduction(writeOutputs(t, tc.text))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	_, err := AtProduction(filepath.Join(t.TempDir(), "none.json"))
	assert.ErrorContains(t, err, "production's timing: open ")
}
