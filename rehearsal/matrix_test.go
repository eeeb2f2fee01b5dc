package rehearsal

import (
	"bytes"
	"encoding/json"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/infra"
)

// TestMatrixCoversEveryRelation: each relation of the contract is broken by
// a row or says why a rehearsal cannot show it; a new relation fails here
// until it gets one or the other.
func TestMatrixCoversEveryRelation(t *testing.T) {
	broken := map[infra.Rule]bool{}
	for _, c := range MatrixCases() {
		for _, r := range c.Breaks {
			broken[r] = true
		}
	}
	for _, rel := range infra.Relations() {
		_, why := Unrehearsable[rel.Rule]
		assert.True(t, broken[rel.Rule] || why, "relation %s: no matrix row breaks it and no reason says why not", rel.Rule)
	}
	for r := range Unrehearsable {
		assert.True(t, slices.ContainsFunc(infra.Relations(), func(rel infra.Relation) bool { return rel.Rule == r }), "%s is not a relation", r)
	}
}

// TestMatrixProfilesBreakWhatTheyName renders every row's release at the
// default scale: a row that broke anything but its named relations, or kept
// one, would be refused by the renderer.
func TestMatrixProfilesBreakWhatTheyName(t *testing.T) {
	ps, err := matrixProfiles(0.2, MatrixCases())
	require.NoError(t, err)
	require.Equal(t, ProfileProd, ps[0].Name, "prod first")
	for _, p := range ps {
		t.Run(p.Name, func(t *testing.T) {
			require.NoError(t, writeRelease(t.TempDir(), p))
			if len(p.Breaks) > 0 {
				assert.Error(t, hooks.WriteRelease(t.TempDir(), p.Timing), "the ordinary renderer refuses %s", p.Name)
			}
		})
	}
}

// TestMatrixProfilesServe: every row's services accept their drain
// configuration and serve the load's every request, so a row shows the
// symptom of the relation it breaks, not a service that refuses to start
// (exit 2) or a request it refuses.
func TestMatrixProfilesServe(t *testing.T) {
	ps, err := matrixProfiles(0.2, MatrixCases())
	require.NoError(t, err)
	for _, p := range ps {
		t.Run(p.Name, func(t *testing.T) {
			cfg := p.Timing.DrainConfig()
			require.NoError(t, cfg.Validate(), "the services refuse the row's configuration")
			for _, k := range APIMix(p.Timing, "/work") {
				u, err := url.Parse(k.Path)
				require.NoError(t, err)
				ms, err := strconv.Atoi(u.Query().Get("ms"))
				require.NoError(t, err, k.Path)
				assert.LessOrEqual(t, time.Duration(ms)*time.Millisecond, cfg.MaxRequest, "%s %s: longer than the app allows", k.Method, k.Path)
			}
		})
	}
}

func TestMatrixVerdicts(t *testing.T) {
	cases := MatrixCases()
	quiet := ProfileReport{Total: DeployReport{Counts: Counts{Requests: 100, OK: 100}, Verified: true}}
	loud := ProfileReport{
		Total:        DeployReport{Counts: Counts{Requests: 100, OK: 90, BadGateway: 10}, WatchdogRestarts: 1, Verified: true},
		Deploys:      []DeployReport{{Problems: []string{"api: old container abc exited 137: killed after stop_grace_period 2s"}}},
		Terminations: map[string]int64{"SH": 3},
	}
	for _, c := range cases {
		_, quietShown := c.observe(quiet)
		_, loudShown := c.observe(loud)
		if c.Profile == ProfileProd {
			assert.False(t, quietShown, "prod: a clean run shows no symptom")
			assert.True(t, loudShown, "prod: 502s and restarts are a symptom")
			continue
		}
		assert.False(t, quietShown, "%s: a clean run does not show the symptom", c.Profile)
		assert.True(t, loudShown, "%s: its symptom is seen", c.Profile)
	}
}

func TestMatrixTableAndJSON(t *testing.T) {
	m := Matrix{Date: "2026-11-30", Rows: []MatrixRow{
		{Profile: "prod", Expected: "none", Observed: "0 502", Verdict: "pass"},
		{Profile: "short-grace", Breaks: []string{"drain-fits-grace"}, Expected: "137", Observed: "2 exited 137", Verdict: "pass", Error: "profile short-grace: deploy failed\nmore"},
	}, Unrehearsable: map[string]string{"deregistration-covers-shutdown": "no deregistration"}}
	assert.False(t, m.Failed())
	var b bytes.Buffer
	require.NoError(t, m.WriteTable(&b))
	for _, want := range []string{"Invariant matrix, 2026-11-30", "short-grace  drain-fits-grace", "prod         none", "short-grace stopped: profile short-grace: deploy failed\n", "deregistration-covers-shutdown: no deregistration"} {
		assert.Contains(t, b.String(), want)
	}
	b.Reset()
	require.NoError(t, m.WriteJSON(&b))
	var back Matrix
	require.NoError(t, json.Unmarshal(b.Bytes(), &back))
	assert.Equal(t, m.Rows, back.Rows)
	m.Rows[1].Verdict = "FAIL"
	assert.True(t, m.Failed())
	assert.True(t, Matrix{}.Failed(), "an empty matrix proves nothing")
}
