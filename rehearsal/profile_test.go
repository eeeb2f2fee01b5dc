package rehearsal

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

func TestBeforeIsTheArticlesOldSetup(t *testing.T) {
	b, p := Before(), infra.Prod()
	// The article: a 5 s drain against checks every 30 s, two to fail,
	// "up to about 60 seconds end to end".
	assert.InDelta(t, 60, b.WorstCaseDetection().Seconds(), 5, "up to about 60 s to notice")
	assert.InDelta(t, 55, (b.WorstCaseDetection() - b.Drain).Seconds(), 5,
		"for roughly 55 s the balancer kept sending to a server that had stopped listening")
	// Nothing else changed: the server side is prod's but for the drain.
	b.Drain, b.HealthCheckInterval = p.Drain, p.HealthCheckInterval
	assert.Equal(t, p, b)

	err := Before().Validate()
	require.Error(t, err, "the old setup breaks the drain handshake")
	assert.True(t, infra.HasRule(err, infra.RuleDrainOutlasts), "%v", err)
}

func TestCheckScale(t *testing.T) {
	tests := []struct {
		name    string
		scale   float64
		wantErr string
	}{
		{"a fifth: 8 s stop grace", 0.2, ""},
		{"a tenth: 4 s stop grace", 0.1, ""},
		{"unscaled", 1, ""},
		{"a third: 13.2 s stop grace", 0.33, "StopGracePeriod 40s × 0.33 = 13.2s"},
		{"suggests the nearest whole-second scale", 0.33, "e.g. 0.325"},
		{"too small for a whole second", 0.01, "StopGracePeriod 40s × 0.01 = 400ms"},
		{"zero", 0, "scale 0 must be within (0, 1]"},
		{"negative", -0.2, "scale -0.2 must be within (0, 1]"},
		{"slower than production", 2, "scale 2 must be within (0, 1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckScale(infra.Prod(), tt.scale)
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestProfiles(t *testing.T) {
	ps, err := Profiles(0.2, ProfileProd, ProfileBefore)
	require.NoError(t, err)
	require.Len(t, ps, 2)
	prod, before := ps[0], ps[1]

	assert.Equal(t, ProfileProd, prod.Name)
	assert.Equal(t, infra.Prod().Scaled(0.2), prod.Timing)
	assert.Equal(t, 8*time.Second, prod.Timing.StopGracePeriod)
	assert.Empty(t, prod.Violations, "prod is valid unscaled")
	assert.NoError(t, prod.Timing.ValidateInvariants(), "prod keeps its invariants scaled")

	assert.Equal(t, ProfileBefore, before.Name)
	assert.Equal(t, Before().Scaled(0.2), before.Timing)
	assert.Equal(t, time.Second, before.Timing.Drain)
	assert.NotEmpty(t, before.Violations, "before's broken rules are carried to the report")
}

func TestProfilesReportsEveryProblem(t *testing.T) {
	_, err := Profiles(0.33, ProfileProd, "staging", ProfileBefore)
	require.Error(t, err)
	for _, want := range []string{"profile prod: scale 0.33", `profile "staging": unknown`, "profile before: scale 0.33"} {
		assert.ErrorContains(t, err, want)
	}
	_, err = Profiles(0.2)
	assert.ErrorContains(t, err, "no profile given")
}
