package rehearsal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/dockerlock"
	"github.com/mythex/infra/internal/needs"
)

// TestRehearsalFleet is the fleet rollout's CI tier: three servers, two at
// once after the canary, behind real HAProxy nodes under load; then a
// release whose api never becomes healthy and one whose api crashes once,
// each caught by the canary and rolled back. Scale 0.4: the smallest at
// which a crash fits between Docker's first health check and a node's
// admission (crashAfter).
func TestRehearsalFleet(t *testing.T) {
	const servers = 3
	needs.Have(t, needs.Docker, needs.HAProxy)
	require.NoError(t, CheckDocker(context.Background()), "this test needs a running Docker engine")
	dockerlock.Parallel(t, servers)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	var progress bytes.Buffer
	c := Config{
		RepoRoot:       repoRoot(t),
		Servers:        servers,
		MaxUnavailable: "2",
		Rate:           200,
		Scale:          0.4,
		Path:           "/work",
		WorkDir:        t.TempDir(),
		Progress:       &progress,
	}
	r, err := RunFleet(ctx, c)
	var table bytes.Buffer
	require.NoError(t, r.WriteTable(&table))
	require.NoError(t, r.Report.WriteTable(&table))
	publish(t, "fleet", table.String())
	require.NoError(t, err, "progress:\n%s", progress.String())
	require.Len(t, r.Rows, len(fleetCases()))
	for _, row := range r.Rows {
		assert.Equal(t, "pass", row.Verdict, "%s: expected %s; observed %s; %s", row.Scenario, row.Expected, row.Observed, row.Error)
	}
	batched := r.Report.Profiles[0]
	require.Equal(t, FleetBatched, batched.Profile)
	require.Len(t, batched.Deploys, 1)
	d := batched.Deploys[0]
	assert.Empty(t, d.NotTakenOut, "every node took every server out on its drain")
	assert.Empty(t, d.LateOut, "no node was late")
	assert.Contains(t, r.Rows[0].Table, "deploy: verified and back in service")
	// Capacity, node by node from its own log: with K = 3 and N = 2 every
	// node must keep routing to at least K − N = 1 server.
	require.NotEmpty(t, r.Rows[0].Capacity, "every node's capacity measured")
	n, err := c.fleetN()
	require.NoError(t, err)
	for _, l := range r.Rows[0].Capacity {
		t.Logf("%s: fewest servers in service %d of %d, at +%.2fs into the rollout, out: %v", l.Node, l.Fewest, l.Servers, l.AtSeconds, l.Out)
		assert.Equal(t, c.Servers, l.Servers, "%s counts every server", l.Node)
		assert.GreaterOrEqual(t, l.Fewest, capacityFloor(c.Servers, n), "%s routed to %d of %d servers at +%.2fs: %v out", l.Node, l.Fewest, l.Servers, l.AtSeconds, l.Out)
	}
	logs, err := filepath.Glob(filepath.Join(c.RepoRoot, "hooks", "remote-deploy.*.log"))
	require.NoError(t, err)
	assert.Empty(t, logs, "a rollback's log stays with its server, out of the repository")
	for _, row := range r.Rows[1:] {
		assert.Regexp(t, `(?m)^s1 .* deploy FAILED: .*; rollback: verified and back in service$`, row.Table, "the canary, %s", row.Scenario)
	}
}

func TestFleetConfigRefuses(t *testing.T) {
	good := Config{RepoRoot: "/repo", Servers: 3, MaxUnavailable: "2", Rate: 200, Scale: 0.4, Path: "/work"}
	require.NoError(t, good.ValidateFleet())
	for _, tt := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"every server at once", func(c *Config) { c.MaxUnavailable = "3" }, "maxUnavailable 3 must be below servers 3"},
		{"a percentage", func(c *Config) { c.MaxUnavailable = "50%" }, `MaxUnavailable "50%" must be a count`},
		{"over ssh", func(c *Config) { c.SSH = true }, "does not run over ssh"},
		{"no room for the crash", func(c *Config) { c.Scale = 0.2 }, "no crash fits between; rehearse it at a scale of 0.4 or more"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.change(&c)
			assert.ErrorContains(t, c.ValidateFleet(), tt.want)
			_, err := RunFleet(context.Background(), c)
			assert.ErrorContains(t, err, tt.want, "RunFleet refuses it before touching Docker")
		})
	}
}

// The crash comes after Docker's first check and before any node can have
// admitted the api.
func TestCrashAfter(t *testing.T) {
	tm := infra.Prod().Scaled(0.4)
	d, err := crashAfter(tm)
	require.NoError(t, err)
	assert.Greater(t, d, tm.ContainerHealthInterval)
	assert.Less(t, d, time.Duration(tm.HealthyThreshold-1)*tm.HealthCheckInterval)
	_, err = crashAfter(infra.Prod().Scaled(0.2))
	assert.Error(t, err)
}

func TestFleetJudge(t *testing.T) {
	tm := infra.Prod().Scaled(0.4)
	good := DeployReport{Version: "v", Verified: true, ServerSeconds: []float64{1, 2, 3}, Counts: Counts{Requests: 100, OK: 100}}
	table := "server  release before  release now  verified  what happened\ns1 a a yes FAILED (deploy exit 1); rolled back\ns2 a a yes not started\ns3 a a yes not started"
	batched, broken := fleetCases()[0], fleetCases()[1]
	began := time.Date(2026, 12, 7, 7, 12, 0, 0, time.UTC)
	low := func(node string, fewest int, s float64, out ...string) NodeLow {
		return NodeLow{Node: node, Fewest: fewest, Servers: 3, At: began.Add(time.Duration(s * float64(time.Second))), AtSeconds: s, Out: out}
	}
	// fine is a batch of two out on lb1 at once: K − N = 1, allowed.
	fine := []NodeLow{low("lb1", 1, 14.2, "s2", "s3"), low("lb2", 2, 3.5, "s1")}
	short := []NodeLow{low("lb1", 0, 14.2, "s1", "s2", "s3"), low("lb2", 2, 3.5, "s1")}
	for _, tt := range []struct {
		name string
		fc   fleetCase
		dr   DeployReport
		st   fleetStep
		pass bool
	}{
		{"batched, clean", batched, good, fleetStep{seconds: 30, capacity: fine}, true},
		{"batched, a 502", batched, func() DeployReport { d := good; d.BadGateway = 1; return d }(), fleetStep{seconds: 30, capacity: fine}, false},
		{"batched, a rollback", batched, good, fleetStep{seconds: 30, rolledBack: 1, capacity: fine}, false},
		{"batched, a server missing", batched, func() DeployReport { d := good; d.ServerSeconds = d.ServerSeconds[:2]; return d }(), fleetStep{capacity: fine}, false},
		{"batched, a node below K − N", batched, good, fleetStep{seconds: 30, capacity: short}, false},
		{"batched, capacity not measured", batched, good, fleetStep{seconds: 30}, false},
		{"broken, a node below K − N: reported, not judged", broken, good, fleetStep{rolloutErr: errors.New("exit 1"), rolledBack: 1, output: table, capacity: short}, true},
		{"broken, caught on the canary", broken, good, fleetStep{rolloutErr: errors.New("exit 1"), rolledBack: 1, output: table}, true},
		{"broken, not caught", broken, good, fleetStep{output: table}, false},
		{"broken, caught late", broken, good, fleetStep{rolloutErr: errors.New("exit 1"), rolledBack: 2, output: strings.Replace(table, "not started", "deployed; rolled back", 1)}, false},
		{"broken, not verified", broken, func() DeployReport { d := good; d.Verified = false; return d }(), fleetStep{rolloutErr: errors.New("exit 1"), rolledBack: 1, output: table}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			row := tt.fc.judge(&ProfileReport{Deploys: []DeployReport{tt.dr}}, nil, &tt.st, tm, 3, 2, capacityFloor(3, 2))
			assert.Equal(t, tt.pass, row.Verdict == "pass", "%+v", row)
		})
	}
	row := batched.judge(&ProfileReport{Deploys: []DeployReport{good}}, nil, &fleetStep{seconds: 30, capacity: fine}, tm, 3, 2, 1)
	assert.Equal(t, 2, row.Batches)
	assert.InDelta(t, 2*tm.ServerDeployMin().Seconds(), row.RolloutMinSeconds, 1e-9)
	assert.InDelta(t, 2*tm.ServerDeployMin().Seconds(), row.CeilSeconds, 1e-9)
	assert.Contains(t, row.Observed, "1.50× RolloutMin (2 batches")
	assert.NotContains(t, row.Observed, "asking", "no timeline, none reported")
	tl := Timeline{BeforeSeconds: 2, BatchesSeconds: []float64{12, 13}, AfterSeconds: 3}
	row = batched.judge(&ProfileReport{Deploys: []DeployReport{good}}, nil, &fleetStep{seconds: 30, timeline: tl, capacity: fine}, tm, 3, 2, 1)
	assert.Equal(t, tl, row.Timeline)
	assert.Contains(t, row.Observed, "; asking 2.0s before, batches 12.0 + 13.0s, 3.0s after")
}

// The batched verdict holds every node to the required capacity, names the
// node, the instant and the servers out when one falls short, and reports
// each node's minimum in the table and the JSON.
func TestFleetJudgeCapacity(t *testing.T) {
	tm := infra.Prod().Scaled(0.4)
	good := DeployReport{Version: "v", Verified: true, ServerSeconds: []float64{1, 2, 3}, Counts: Counts{Requests: 100, OK: 100}}
	batched := fleetCases()[0]
	began := time.Date(2026, 12, 7, 7, 12, 0, 0, time.UTC)
	low := func(node string, fewest int, s float64, out ...string) NodeLow {
		return NodeLow{Node: node, Fewest: fewest, Servers: 3, At: began.Add(time.Duration(s * float64(time.Second))), AtSeconds: s, Out: out}
	}
	judge := func(lows []NodeLow, required int) FleetRow {
		return batched.judge(&ProfileReport{Deploys: []DeployReport{good}}, nil, &fleetStep{seconds: 30, capacity: lows}, tm, 3, 2, required)
	}
	fine := []NodeLow{low("lb1", 1, 14.2, "s2", "s3"), low("lb2", 3, 0)}
	for _, tt := range []struct {
		name     string
		lows     []NodeLow
		required int
		pass     bool
		has      []string
		hasNot   []string
	}{
		{"every node at K − N or more", fine, capacityFloor(3, 2), true,
			[]string{"; capacity: every node routed to at least 1 of 3 servers (lb1 1 at +14.20s: s2, s3 out; lb2 3 throughout), at least 1 required"},
			[]string{"CAPACITY"}},
		{"a node below K − N, named with its instant and the servers out",
			[]NodeLow{low("lb1", 2, 3.5, "s1"), low("lb2", 0, 14.25, "s1", "s2", "s3")}, capacityFloor(3, 2), false,
			[]string{"; CAPACITY BELOW 1: lb2 routed to 0 of 3 servers at 07:12:14.250 (+14.25s), s1, s2, s3 out"},
			[]string{"lb1 routed to"}},
		{"the slots design's rule, every server: a batch out fails", fine, 3, false,
			[]string{"at least 3 required", "CAPACITY BELOW 3: lb1 routed to 1 of 3 servers at 07:12:14.200 (+14.20s), s2, s3 out"},
			[]string{"lb2 routed to"}},
		{"no measurement fails", nil, capacityFloor(3, 2), false,
			[]string{"CAPACITY NOT MEASURED"}, []string{"; capacity:"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			row := judge(tt.lows, tt.required)
			assert.Equal(t, tt.pass, row.Verdict == "pass", row.Observed)
			assert.Equal(t, tt.lows, row.Capacity)
			assert.Equal(t, tt.required, row.CapacityRequired)
			for _, s := range tt.has {
				assert.Contains(t, row.Observed, s)
			}
			for _, s := range tt.hasNot {
				assert.NotContains(t, row.Observed, s)
			}
		})
	}

	rep := FleetReport{Servers: 3, MaxUnavailable: 2, Rows: []FleetRow{judge(fine, 1)}}
	var table, js bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	assert.Contains(t, table.String(), "capacity: every node routed to at least 1 of 3 servers (lb1 1 at +14.20s: s2, s3 out; lb2 3 throughout)")
	require.NoError(t, rep.WriteJSON(&js))
	var back FleetReport
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	assert.Equal(t, fine, back.Rows[0].Capacity)
	assert.Equal(t, 1, back.Rows[0].CapacityRequired)
	assert.Contains(t, js.String(), `"fewest": 1`)
}

func TestFinalTable(t *testing.T) {
	out := "[s1] deployed\n2026-12-02T07:00:00Z rollout: s1 runs v, verified\nserver  release before  release now  verified  what happened\ns1      a               b            yes       deployed\n2026-12-02T07:00:01Z rollout: deployed b to all 1 server(s): s1\n"
	assert.Equal(t, "server  release before  release now  verified  what happened\ns1      a               b            yes       deployed", finalTable(out))
	assert.Empty(t, finalTable("no table"))
}

func TestTimelineOf(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 6, 12, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	for _, tt := range []struct {
		name  string
		start map[string]float64 // a server's deploy start, seconds after the run began
		total map[string]float64 // seconds until it was back in service
		ended float64
		want  Timeline
	}{
		{"a canary, then batches of two, the last of one",
			map[string]float64{"s1": 8, "s2": 42, "s3": 42.01, "s4": 79.5, "s5": 79.52, "s6": 114.6},
			map[string]float64{"s1": 34, "s2": 36.5, "s3": 37, "s4": 35, "s5": 34.9, "s6": 35.5},
			158.5,
			Timeline{BeforeSeconds: 8, BatchesSeconds: []float64{34, 37.01, 35, 35.5}, AfterSeconds: 8.4}},
		{"one at a time", map[string]float64{"s1": 1, "s2": 11}, map[string]float64{"s1": 10, "s2": 10}, 22,
			Timeline{BeforeSeconds: 1, BatchesSeconds: []float64{10, 10}, AfterSeconds: 1}},
		{"the canary failed: no batch ended", map[string]float64{"s1": 2}, map[string]float64{}, 40, Timeline{}},
		{"the second batch failed: only the first counts",
			map[string]float64{"s1": 2, "s2": 12, "s3": 12}, map[string]float64{"s1": 10}, 60,
			Timeline{BeforeSeconds: 2, BatchesSeconds: []float64{10}, AfterSeconds: 48}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := map[string]time.Time{}
			for s, secs := range tt.start {
				start[s] = at(secs)
			}
			got := timelineOf(t0, at(tt.ended), start, tt.total)
			assert.InDelta(t, tt.want.BeforeSeconds, got.BeforeSeconds, 1e-6)
			assert.InDelta(t, tt.want.AfterSeconds, got.AfterSeconds, 1e-6)
			require.Len(t, got.BatchesSeconds, len(tt.want.BatchesSeconds))
			for i := range tt.want.BatchesSeconds {
				assert.InDelta(t, tt.want.BatchesSeconds[i], got.BatchesSeconds[i], 1e-6, "batch %d", i+1)
			}
		})
	}
	assert.Equal(t, "asking 8.0s before, batches 34.0 + 37.0s, 9.0s after",
		Timeline{BeforeSeconds: 8, BatchesSeconds: []float64{34, 37}, AfterSeconds: 9}.String())
}
