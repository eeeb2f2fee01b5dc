package rehearsal

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/dockerlock"
	"github.com/mythex/infra/internal/needs"
)

// TestRehearsalSlots runs the slots design's prototype (docs/capacity.md):
// two servers of two slots each behind real HAProxy nodes under load, a
// release swapped in through each idle slot, the canary then the other.
// Every node must route to both servers throughout, with no 502 or 504.
func TestRehearsalSlots(t *testing.T) {
	const servers = 2
	needs.Have(t, needs.Docker, needs.HAProxy)
	require.NoError(t, CheckDocker(context.Background()), "this test needs a running Docker engine")
	// Two slots a server: twice the compose projects.
	dockerlock.Parallel(t, 2*servers)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	var progress bytes.Buffer
	c := Config{RepoRoot: repoRoot(t), Servers: servers, Rate: 200, Scale: 0.4, Path: "/work", WorkDir: t.TempDir(), Progress: &progress}
	r, err := RunSlots(ctx, c)
	var table bytes.Buffer
	require.NoError(t, r.WriteTable(&table))
	require.NoError(t, r.Report.WriteTable(&table))
	publish(t, "slots", table.String())
	require.NoError(t, err, "progress:\n%s", progress.String())
	require.Len(t, r.Rows, len(slotsCases()))
	for _, row := range r.Rows {
		assert.Equal(t, "pass", row.Verdict, "%s: expected %s; observed %s; %s", row.Scenario, row.Expected, row.Observed, row.Error)
		require.Len(t, row.Capacity, DefaultNodes, "%s: every node's capacity measured", row.Scenario)
		for _, l := range row.Capacity {
			assert.Equal(t, servers, l.Servers, "%s: %s counts servers, not slots", row.Scenario, l.Node)
			assert.Equal(t, servers, l.Fewest, "%s: %s routed to %d of %d servers at +%.2fs: %v out", row.Scenario, l.Node, l.Fewest, l.Servers, l.AtSeconds, l.Out)
		}
	}
	good := r.Rows[0]
	require.Len(t, good.Swaps, servers, "every server swapped")
	assert.Equal(t, []int{1, 2}, []int{good.Swaps[0].Batch, good.Swaps[1].Batch}, "the canary alone, then the rest")
	for _, s := range good.Swaps {
		assert.Positive(t, s.AdmittedSeconds, "%s: every node routed to the new slot", s.Server)
		require.NotEmpty(t, s.Exits)
		for svc, code := range s.Exits {
			assert.Zero(t, code, "%s: the old slot's %s exited cleanly", s.Server, svc)
		}
	}
	assert.Empty(t, r.Report.Profiles[0].Deploys[0].LateOut, "every node took each old slot out on its drain's 503")
	for _, row := range r.Rows[1:] {
		require.Len(t, row.Swaps, 1, "%s: only the canary was touched", row.Scenario)
		assert.Empty(t, row.Swaps[0].Exits, "%s: the canary's live slot was never stopped", row.Scenario)
	}
}

func TestSlotsConfigRefuses(t *testing.T) {
	good := Config{RepoRoot: "/repo", Servers: 2, Rate: 200, Scale: 0.4, Path: "/work"}
	require.NoError(t, good.ValidateSlots())
	for _, p := range []string{ProfileProd, ProfileEvidence} {
		c := good
		c.Profiles = []string{p}
		require.NoError(t, c.ValidateSlots(), p)
	}
	for _, tt := range []struct {
		name   string
		change func(*Config)
		want   []string
	}{
		{"one server", func(c *Config) { c.Servers = 1 }, []string{"Servers 1: the slots prototype needs a canary and at least one server after it"}},
		{"over ssh, and no load", func(c *Config) { c.SSH, c.Rate = true, 0 }, []string{"does not run over ssh", "Rate 0"}},
		{"two profiles", func(c *Config) { c.Profiles = []string{ProfileProd, ProfileEvidence} }, []string{`Profiles ["prod" "evidence"]: the slots prototype runs one profile, prod or evidence`}},
		{"the article's profile", func(c *Config) { c.Profiles = []string{ProfileBefore} }, []string{"runs one profile, prod or evidence"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.change(&c)
			err := c.ValidateSlots()
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestMebibytes(t *testing.T) {
	for in, want := range map[string]float64{"12.5MiB": 12.5, "1.5GiB": 1536, "512KiB": 0.5, "0B": 0, "junk": 0, "xMiB": 0} {
		assert.InDelta(t, want, mebibytes(in), 1e-9, in)
	}
}

// TestSlotsJudge: each scenario's verdict from what its steps measured.
func TestSlotsJudge(t *testing.T) {
	tm := infra.Prod().Scaled(0.4)
	good := DeployReport{Version: "v", Verified: true, Counts: Counts{Requests: 100, OK: 100}}
	full := []NodeLow{{Node: "lb1", Fewest: 2, Servers: 2}, {Node: "lb2", Fewest: 2, Servers: 2}}
	clean := map[string]int{"api": 0, "gateway": 0}
	swapped := []SlotSwap{{Server: "s1", Batch: 1, AdmittedSeconds: 3, Exits: clean}, {Server: "s2", Batch: 2, AdmittedSeconds: 3, Exits: clean}}
	failed := []SlotSwap{{Server: "s1", Batch: 1, AdmittedSeconds: -1}}
	swap, broken := slotsCases()[0], slotsCases()[1]
	for _, tt := range []struct {
		name string
		sc   slotsCase
		dr   DeployReport
		st   slotsStep
		pass bool
		has  string
	}{
		{"every server swapped", swap, good, slotsStep{seconds: 30, batches: []float64{15, 15}, swaps: swapped, capacity: full}, true,
			"rollout 30.0s (goal 25.0s, 3.00× SlotDeployMin 10s); batches 15.0 + 15.0s; capacity: every node routed to at least 2 of 2 servers"},
		{"a node down to one server", swap, good, slotsStep{swaps: swapped, capacity: []NodeLow{full[0], {Node: "lb2", Fewest: 1, Servers: 2, Out: []string{"s1"}}}}, false,
			"CAPACITY BELOW 2: lb2 routed to 1 of 2 servers"},
		{"an old slot killed", swap, good, slotsStep{swaps: []SlotSwap{swapped[0], {Server: "s2", Batch: 2, AdmittedSeconds: 3, Exits: map[string]int{"api": 137}}}, capacity: full}, false,
			"s2: the old slot's api exited 137"},
		{"a new slot no node routed to", swap, good, slotsStep{swaps: []SlotSwap{swapped[0], {Server: "s2", Batch: 2, AdmittedSeconds: -1, Exits: clean}}, capacity: full}, false,
			"s2: a node never routed to the new slot"},
		{"a 502", swap, DeployReport{Version: "v", Verified: true, Counts: Counts{Requests: 100, OK: 99, BadGateway: 1}}, slotsStep{swaps: swapped, capacity: full}, false,
			"1 502, 0 504 in 100 requests"},
		{"a broken release caught on the canary", broken, good, slotsStep{seconds: 20, swaps: failed, capacity: full, swapErr: errors.New("deploy failed")}, true,
			"the canary's idle slot failed: yes; 1 of 2 servers touched; 20.0s"},
		{"a broken release that swapped", broken, good, slotsStep{swaps: swapped, capacity: full}, false,
			"the canary's idle slot failed: NO; 2 of 2 servers touched"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			row := tt.sc.judge(&ProfileReport{Deploys: []DeployReport{tt.dr}}, nil, &tt.st, tm, 2)
			assert.Equal(t, tt.pass, row.Verdict == "pass", row.Observed)
			assert.Contains(t, row.Observed, tt.has)
		})
	}
	row := swap.judge(nil, errors.New("profile slots-swap: boom"), &slotsStep{}, tm, 2)
	assert.Equal(t, "FAIL", row.Verdict)
	assert.Equal(t, "did not run", row.Observed)
}
