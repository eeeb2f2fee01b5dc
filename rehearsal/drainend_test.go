package rehearsal

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/mythex/infra/drain"
)

func TestParseDrainEnd(t *testing.T) {
	tests := []struct {
		name string
		out  string
		want DrainEnd
		ok   bool
	}{
		{"the fixed drain",
			"2026-12-07T12:00:00Z deploy: api: old container 0123456789ab drained and exited 0; its drain lasted 15.004s (" + drain.ReasonDrainElapsed + ")\n",
			DrainEnd{Seconds: 15.004, Reason: drain.ReasonDrainElapsed}, true},
		{"the evidence, among other services' lines",
			"gateway: old container aaaaaaaaaaaa drained and exited 0; its drain lasted 15s (drain elapsed)\n" +
				"api: old container 0123456789ab drained and exited 0; its drain lasted 6.5s (" + drain.ReasonEvidence + ")\n",
			DrainEnd{Seconds: 6.5, Reason: drain.ReasonEvidence}, true},
		{"a deploy whose hooks do not say", "api: old container 0123456789ab drained and exited 0\n", DrainEnd{}, false},
		{"a length that is no duration", "api: old container 0123456789ab drained and exited 0; its drain lasted soon (x)\n", DrainEnd{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseDrainEnd(tt.out)
			assert.Equal(t, tt.ok, ok)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestDrainSummary(t *testing.T) {
	assert.Empty(t, drainSummary(nil))
	assert.Equal(t, `the old api drained 10.00s on average (3 drains): ended 1 by "balancer stopped: every node failed its checks and requests stopped", 2 by "drain elapsed"`,
		drainSummary([]DrainEnd{
			{Server: "s1", Seconds: 15, Reason: drain.ReasonDrainElapsed},
			{Server: "s2", Seconds: 5, Reason: drain.ReasonEvidence},
			{Server: "s3", Seconds: 10, Reason: drain.ReasonDrainElapsed},
		}))
}
