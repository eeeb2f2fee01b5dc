package rehearsal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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
	ps, err := matrixProfiles(0.2, append(MatrixCases(), LaggingCases()...))
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
	ps, err := matrixProfiles(0.2, append(MatrixCases(), LaggingCases()...))
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
	cases := append(MatrixCases(), LaggingCases()...)
	quiet := ProfileReport{Total: DeployReport{Counts: Counts{Requests: 100, OK: 100}, Verified: true}, LaggingNodes: []string{"lb2"}}
	loud := ProfileReport{
		Total: DeployReport{Counts: Counts{Requests: 100, OK: 90, BadGateway: 10}, WatchdogRestarts: 1, Verified: true,
			BadGatewayBy: map[string]int64{"lb2/s1": 10}},
		Deploys:      []DeployReport{{Problems: []string{"api: old container abc exited 137: killed after stop_grace_period 2s"}}},
		Terminations: map[string]int64{"SH": 3},
		LaggingNodes: []string{"lb2"},
	}
	for _, c := range cases {
		_, quietShown := c.observe(quiet)
		_, loudShown := c.observe(loud)
		assert.False(t, quietShown, "%s: a clean run shows no symptom", c.Profile)
		assert.True(t, loudShown, "%s: its symptom is seen", c.Profile)
		// The rows that must lose nothing pass clean and fail loud; the
		// others the other way round.
		assert.Equal(t, c.Clean, c.judge(&quiet, nil).Verdict == "pass", "%s on a clean run", c.Profile)
		assert.Equal(t, !c.Clean, c.judge(&loud, nil).Verdict == "pass", "%s on a loud run", c.Profile)
	}
	assert.True(t, cases[0].Clean, "prod must lose nothing")
}

func TestMatrixJudge(t *testing.T) {
	prod, lagging := MatrixCases()[0], LaggingCases()[1]
	clean := ProfileReport{Total: DeployReport{Counts: Counts{Requests: 100, OK: 100}, Verified: true}}
	disagreeing := clean
	disagreeing.CrossCheck = []string{"GET: the load saw 1 502; the nodes logged 0"}
	tests := []struct {
		name    string
		cs      Case
		pr      *ProfileReport
		err     error
		verdict string
		obs     string
	}{
		{"clean run", prod, &clean, nil, "pass", "0 502, 0 504, verified yes"},
		{"clean but stopped", prod, &clean, errors.New("profile prod: deploy 1 failed"), "FAIL", "0 502"},
		{"clean but the logs disagree", lagging, &disagreeing, nil, "FAIL", "0 502"},
		{"not run", lagging, nil, nil, "FAIL", "not run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			row := tt.cs.judge(tt.pr, tt.err)
			assert.Equal(t, tt.verdict, row.Verdict)
			assert.Contains(t, row.Observed, tt.obs)
			assert.Equal(t, tt.cs.Expected, row.Expected)
			if tt.err != nil {
				assert.Equal(t, tt.err.Error(), row.Error)
			}
		})
	}
}

// lagProblems says how a node acting lag late after tm's checks fails the
// lagging-balancer rows, straight from the contract: a node not lagging
// takes a responsive server out no sooner than the contract's own earliest
// (EarliestDrainEnd, less its quiet window) and within its worst case; the
// lagging one must act past the fixed drain, so it still sends when the
// listener closes, and before MaxDrain less DrainQuiet, so the evidence
// drain sees its requests stop in time.
func lagProblems(tm infra.Timing, lag time.Duration) []string {
	var problems []string
	direct0, direct1 := nodeActs(tm, 0)
	if direct0 != tm.EarliestDrainEnd()-tm.DrainQuiet || direct1 > tm.WorstCaseDetection() {
		problems = append(problems, fmt.Sprintf("a node not lagging acts %v to %v, not within the contract's %v to %v",
			direct0, direct1, tm.EarliestDrainEnd()-tm.DrainQuiet, tm.WorstCaseDetection()))
	}
	earliest, latest := nodeActs(tm, lag)
	if earliest-direct0 != lag || latest-direct1 != lag {
		problems = append(problems, fmt.Sprintf("a node %v late acts %v to %v: not a lag after %v to %v", lag, earliest, latest, direct0, direct1))
	}
	if earliest <= tm.Drain {
		problems = append(problems, fmt.Sprintf("acts from %v, within the fixed drain %v: the fixed drain would show no 502", earliest, tm.Drain))
	}
	if latest >= tm.MaxDrain-tm.DrainQuiet {
		problems = append(problems, fmt.Sprintf("acts until %v, past MaxDrain %v less DrainQuiet %v: the evidence drain would close on its requests",
			latest, tm.MaxDrain, tm.DrainQuiet))
	}
	return problems
}

// TestLaggingBalancerLagFallsBetweenTheDrains: the lagging node acts after
// the fixed drain and before the evidence drain's bound, at production
// timing and as every lagging row runs it scaled; all from the contract,
// so moving its numbers until the lag no longer fits fails here.
func TestLaggingBalancerLagFallsBetweenTheDrains(t *testing.T) {
	prod := infra.Prod()
	lag := LaggingLag(prod)
	earliest, latest := nodeActs(prod, lag)
	t.Logf("production: lag %v, the lagging node acts %v to %v after the turn; fixed drain %v, MaxDrain %v less DrainQuiet %v",
		lag, earliest, latest, prod.Drain, prod.MaxDrain, prod.DrainQuiet)
	assert.Empty(t, lagProblems(prod, lag))
	assert.Positive(t, lag)
	for _, cs := range LaggingCases() {
		assert.Equal(t, lag, cs.Nodes.Lag, "%s: the lag at production timing", cs.Profile)
	}
	for _, f := range []float64{0.1, 0.2, 0.5, 1} {
		ps, err := matrixProfiles(f, LaggingCases())
		require.NoError(t, err)
		for _, p := range ps {
			assert.Empty(t, lagProblems(p.Timing, p.nodes.Lag), "%s at scale %v", p.Name, f)
			assert.InDelta(t, LaggingLag(p.Timing).Seconds(), p.nodes.Lag.Seconds(), 1e-3, "%s at scale %v: the scaled lag is the scaled timing's", p.Name, f)
		}
	}

	// A contract whose gap between the drains is no wider than a check
	// interval leaves no lag that fits, and the test says so.
	narrow := prod
	narrow.MaxDrain = prod.Drain + prod.DrainQuiet + prod.HealthCheckInterval
	assert.NotEmpty(t, lagProblems(narrow, LaggingLag(narrow)))
	// Nor does the lag fit after the numbers move under it.
	slower := prod
	slower.HealthCheckInterval += 2 * prod.HealthCheckInterval / 5
	assert.NotEmpty(t, lagProblems(slower, lag), "production's lag with checks every %v", slower.HealthCheckInterval)
}

func TestLaggingCases(t *testing.T) {
	cases := LaggingCases()
	require.Len(t, cases, 2)
	fixed, evidence := cases[0], cases[1]
	assert.Equal(t, LaggingFixedDrain, fixed.Profile)
	assert.Equal(t, NodeBehaviour{Lag: LaggingLag(infra.Prod())}, fixed.Nodes, "nodes the servers cannot tell apart")
	assert.False(t, fixed.Clean, "its 502s are its symptom")
	assert.Equal(t, LaggingEvidence, evidence.Profile)
	assert.Equal(t, NodeBehaviour{Lag: LaggingLag(infra.Prod()), Named: true}, evidence.Nodes, "nodes that name themselves")
	assert.True(t, evidence.Clean, "it must lose nothing")
	for _, cs := range cases {
		assert.Empty(t, cs.Breaks, "%s: the contract holds; the balancer is what is slow", cs.Profile)
		assert.Equal(t, infra.Prod(), cs.timing(), cs.Profile)
	}
	prod := infra.Prod()
	earliest, latest := nodeActs(prod, LaggingLag(prod))
	assert.Contains(t, fixed.Expected, fmt.Sprintf("%v to %v after its health turned, past the %v fixed drain", earliest, latest, prod.Drain))
	assert.Contains(t, evidence.Expected, fmt.Sprintf("(%v to %v), within MaxDrain %v", earliest, latest, prod.MaxDrain))

	ps, err := matrixProfiles(0.2, cases)
	require.NoError(t, err)
	for _, p := range ps {
		assert.True(t, p.steady, "%s: the load runs steady, so the evidence drain has its QuietRequests", p.Name)
		assert.True(t, p.Timing.DrainConfig().Evidence, "%s: the servers run the evidence drain; whether it can end a drain is the nodes' doing", p.Name)
		assert.Equal(t, time.Duration(float64(LaggingLag(prod))*0.2), p.nodes.Lag, "%s: scaled with the timing", p.Name)
	}
	plain, err := matrixProfiles(0.2, MatrixCases())
	require.NoError(t, err)
	for _, p := range plain {
		assert.Equal(t, NodeBehaviour{}, p.nodes, "%s: plain nodes", p.Name)
		assert.False(t, p.steady, "%s: the load keeps its quiet spells", p.Name)
	}
}

func TestProfileNodeOptions(t *testing.T) {
	assert.Equal(t, []NodeOptions{{Name: "lb1"}, {Name: "lb2"}}, Profile{}.nodeOptions(2), "plain nodes, as before the lagging rows")
	assert.Equal(t, []NodeOptions{{Name: "lb1"}, {Name: "lb2"}, {Name: "lb3", Lag: time.Second}},
		Profile{nodes: NodeBehaviour{Lag: time.Second}}.nodeOptions(3), "the last node lags")
	assert.Equal(t, []NodeOptions{{Name: "lb1", Named: true}, {Name: "lb2", Named: true, Lag: time.Second}},
		Profile{nodes: NodeBehaviour{Lag: time.Second, Named: true}}.nodeOptions(2), "every node named")
}

func TestMatrixRowsAndTheirValidation(t *testing.T) {
	c := Config{RepoRoot: "/repo", Servers: 3, Deploys: 1, Rate: 200, Scale: 0.2, Path: "/work"}
	names := []string{}
	for _, cs := range c.matrixCases() {
		names = append(names, cs.Profile)
	}
	assert.Equal(t, []string{ProfileProd, "short-drain", "short-keepalive", "short-grace", LaggingFixedDrain, LaggingEvidence}, names)
	quiet := infra.Prod().Scaled(c.Scale).DrainQuiet
	perServer := func(c Config) float64 { return float64(c.Rate) / float64(c.Servers) * quiet.Seconds() }
	require.NoError(t, c.ValidateMatrix(), "the default load brings each server %.1f requests in the DrainQuiet", perServer(c))

	c.Servers, c.Path = 2*c.Servers, "/healthz"
	need := int(math.Ceil(float64(infra.Prod().QuietRequests) * float64(c.Servers) / quiet.Seconds()))
	require.Greater(t, need, c.Rate, "twice the servers thin the traffic below what the evidence drain needs")
	err := c.ValidateMatrix()
	require.Error(t, err)
	for _, want := range []string{`Path "/healthz"`,
		fmt.Sprintf("the lagging-balancer row's evidence drain needs %d requests per server in the %v before a drain", infra.Prod().QuietRequests, quiet),
		fmt.Sprintf("%d requests/s over %d servers bring %.1f: raise Rate to %d or run fewer servers", c.Rate, c.Servers, perServer(c), need)} {
		assert.ErrorContains(t, err, want)
	}
	_, err = RunMatrix(context.Background(), c)
	assert.ErrorContains(t, err, "raise Rate to", "RunMatrix refuses what ValidateMatrix refuses, before touching Docker")
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
