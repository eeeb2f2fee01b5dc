package drain_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain/internal/gendoc"
	"github.com/mythex/infra/infra"
)

// The package doc draws the drain with the production numbers; it must move
// when they do.
func TestDocIsGeneratedFromProductionTiming(t *testing.T) {
	want, err := gendoc.Render(infra.Prod())
	require.NoError(t, err)
	got, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	assert.Equal(t, string(want), string(got), "drain/doc.go is stale: run go generate ./drain")
}

func TestDocFollowsTheTiming(t *testing.T) {
	prod, err := gendoc.Render(infra.Prod())
	require.NoError(t, err)
	longer := infra.Prod()
	longer.Drain += longer.HealthCheckInterval
	longer.StopGracePeriod += longer.HealthCheckInterval
	other, err := gendoc.Render(longer)
	require.NoError(t, err)
	assert.NotEqual(t, string(prod), string(other), "a different drain must draw a different timeline")
	assert.Contains(t, string(other), "t="+longer.Drain.String())
}

func TestDocRefusesAnInvalidTiming(t *testing.T) {
	broken := infra.Prod()
	broken.Drain = broken.WorstCaseDetection()
	_, err := gendoc.Render(broken)
	require.Error(t, err)
	assert.True(t, infra.HasRule(err, infra.RuleDrainOutlasts), "got %v", err)
}
