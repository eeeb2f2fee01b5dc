package rehearsal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/dockerlock"
	"github.com/mythex/infra/internal/needs"
)

// TestTransition is the transition rehearsal's CI tier, as small as still
// shows it: the example change, in both orders, in one run, each on
// two fresh servers behind twelve nodes at 200 requests per second, scaled
// by 0.2. The order CheckTransition calls unsafe answers 502s, counted alike
// by the load and the nodes' logs; the safe one answers none, loses no
// request to the nodes' reload and verifies every service after each step.
func TestTransition(t *testing.T) {
	needs.Have(t, needs.Docker, needs.HAProxy)
	// Each order runs its two servers, one order after the other.
	dockerlock.Parallel(t, TransitionServers)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	require.NoError(t, CheckDocker(ctx), "this test needs a running Docker engine")

	var progress bytes.Buffer
	c := Config{
		RepoRoot: repoRoot(t),
		Servers:  TransitionServers,
		Nodes:    TransitionNodes,
		Rate:     200,
		Scale:    0.2,
		Path:     "/work",
		WorkDir:  t.TempDir(),
		Progress: &progress,
	}
	start := time.Now()
	r, err := RunTransition(ctx, c)
	var table bytes.Buffer
	require.NoError(t, r.WriteTable(&table))
	publish(t, "transition", fmt.Sprintf("%v\n%s", time.Since(start).Round(time.Second), table.String()))
	require.NoError(t, err, "progress:\n%s", progress.String())
	for _, o := range r.Orders {
		require.Empty(t, o.Error, "%s stopped; progress:\n%s", o.Order, progress.String())
	}

	old, new := ExampleChange()
	verdict, err := infra.CheckTransition(old, new)
	require.NoError(t, err)
	require.Equal(t, string(verdict.Order), r.Verdict)
	require.Len(t, r.Orders, 2)
	require.Len(t, r.Report.Profiles, 2)
	for i, o := range r.Orders {
		p := r.Report.Profiles[i]
		require.Len(t, p.Deploys, 2, "%s: both steps ran", o.Order)
		assert.Empty(t, p.CrossCheck, "%s: the nodes' logs agree with the load", o.Order)
		total := total(p.Deploys)
		for _, d := range p.Deploys {
			if d.Step == stepPulumiUp {
				assert.Zero(t, d.TakenOut, "%s: the reload took no server out", o.Order)
				assert.Zero(t, d.BadGateway+d.Timeout+d.ClientErrors, "%s: the reload itself lost nothing", o.Order)
			}
			assert.True(t, d.Verified, "%s step %d: every service on every server: %v", o.Order, d.Deploy, d.Problems)
		}
		if len(o.Breaks) > 0 {
			assert.Equal(t, string(infra.BalancerFirst), o.Order, "the example breaks a relation balancer first")
			assert.NotEmpty(t, total.LateOut, "%s: nodes took servers out only once their listener had closed", o.Order)
			assert.Positive(t, total.BadGateway, "%s: the unsafe order answers 502s", o.Order)
		} else {
			assert.Equal(t, string(verdict.Order), o.Order, "the order that breaks nothing is the verdict")
			for _, m := range []string{http.MethodGet, http.MethodPost} {
				assert.Positive(t, total.ByMethod[m].OK, "%s: %s traffic flowed", o.Order, m)
			}
			assert.Zero(t, total.BadGateway, "%s: the safe order answers no 502", o.Order)
			assert.Zero(t, total.Timeout, "%s: no 504", o.Order)
			assert.Zero(t, total.ClientErrors, "%s: no request lost", o.Order)
			assert.Zero(t, total.WatchdogRestarts, "%s: no watchdog restart", o.Order)
			assert.Empty(t, total.LateOut, "%s: every node took every server out on its drain's 503, so the zero is no luck", o.Order)
		}
		assert.Equal(t, "pass", o.Verdict, "%s: %s", o.Order, o.Observed)
	}
	assert.False(t, r.Failed())
}

// TestExampleChange: the rehearsed change is docs/timing.md's example, valid as
// production would run it, and moves no field but those it must.
func TestExampleChange(t *testing.T) {
	old, new := ExampleChange()
	assert.Equal(t, infra.Prod(), old)
	require.NoError(t, new.Validate())
	var moved []string
	o, n := reflect.ValueOf(old), reflect.ValueOf(new)
	for i := 0; i < o.NumField(); i++ {
		if o.Field(i).Interface() != n.Field(i).Interface() {
			moved = append(moved, o.Type().Field(i).Name)
		}
	}
	assert.Equal(t, []string{"HealthCheckInterval", "Drain", "MaxDrain", "StopGracePeriod"}, moved)
	assert.Equal(t, 2*old.HealthCheckInterval, new.HealthCheckInterval, "the balancer checks half as often")
	// The grace period is the least that keeps drain-fits-grace: a second
	// less breaks it.
	tight := new
	tight.StopGracePeriod -= time.Second
	assert.True(t, infra.HasRule(tight.Validate(), infra.RuleFitsGrace))
	assert.Equal(t, []string{"HealthCheckInterval 5s → 10s (balancer)", "Drain 15s → 30s (servers)", "MaxDrain 25s → 30s (servers)", "StopGracePeriod 40s → 45s (servers)"},
		changedFields(old, new))
}

// TestTransitionCase: the verdict is CheckTransition's, at production's
// numbers and scaled alike; each order is a profile whose servers start at
// the old timing; the new release renders through the ordinary renderer.
func TestTransitionCase(t *testing.T) {
	old, new := ExampleChange()
	tc, err := newTransitionCase(old, new, 0.2)
	require.NoError(t, err)
	want, err := infra.CheckTransition(old, new)
	require.NoError(t, err)
	assert.Equal(t, want.Order, tc.tr.Order)
	assert.Equal(t, infra.ServersFirst, tc.tr.Order, "the example is servers first")
	require.Len(t, tc.profiles, 2)
	assert.Equal(t, []infra.Order{infra.BalancerFirst, infra.ServersFirst}, tc.orders)
	for i, p := range tc.profiles {
		assert.Equal(t, orderProfiles[tc.orders[i]], p.Name)
		assert.Equal(t, old.Scaled(0.2), p.Timing)
		assert.NotNil(t, p.steps)
		assert.Empty(t, p.Breaks, "nothing broken is rendered")
	}
	assert.Equal(t, 9*time.Second, tc.scaledNew.StopGracePeriod, "whole seconds scaled")
	require.NoError(t, hooks.WriteRelease(t.TempDir(), tc.scaledNew), "the ordinary renderer takes the new release")

}

func TestTransitionCaseRefuses(t *testing.T) {
	old, new := ExampleChange()
	shortDrain := new
	shortDrain.Drain = 9 * time.Second
	keepAlive := old
	keepAlive.LBIdleTimeout, keepAlive.AppKeepAlive = 100*time.Second, 120*time.Second
	tests := []struct {
		name     string
		old, new infra.Timing
		scale    float64
		want     []string
	}{
		{"a scale Docker cannot take", old, new, 0.33, []string{"old timing: scale 0.33 makes StopGracePeriod 40s × 0.33 = 13.2s"}},
		{"an invalid new timing", old, shortDrain, 0.2, []string{"new timing: invalid timing", "drain-outlasts-detection"}},
		{"a break whose symptom is not judged", old, keepAlive, 0.2, []string{"balancer first breaks keepalive-outlasts-idle"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newTransitionCase(tt.old, tt.new, tt.scale)
			require.Error(t, err)
			for _, w := range tt.want {
				assert.ErrorContains(t, err, w)
			}
		})
	}

	c := Config{RepoRoot: "/repo", Servers: 2, Rate: 200, Scale: 0.2, Path: "/work", SSH: true, Nodes: 1}
	err := c.ValidateTransition()
	for _, w := range []string{"does not run over ssh", "Nodes 1 must be at least 2"} {
		assert.ErrorContains(t, err, w)
	}
	c.SSH, c.Nodes = false, 0
	assert.NoError(t, c.ValidateTransition(), "Deploys and Profiles are the transition's own")
}

// TestTransitionJudge: a safe order passes only clean, an unsafe one only
// with 502s the nodes' logs confirm; an order that did not run both steps
// proves nothing.
func TestTransitionJudge(t *testing.T) {
	old, new := ExampleChange()
	tc, err := newTransitionCase(old, new, 0.2)
	require.NoError(t, err)
	step := func(n int, c Counts) DeployReport {
		return DeployReport{Deploy: n, Counts: c, Verified: true, ByMethod: map[string]Counts{"GET": c}}
	}
	clean := Counts{Requests: 100, OK: 100}
	loud := Counts{Requests: 100, OK: 90, BadGateway: 10}
	profile := func(ds ...DeployReport) *ProfileReport { return &ProfileReport{Deploys: ds} }
	withCross := profile(step(1, clean), step(2, loud))
	withCross.CrossCheck = []string{"GET: the load saw 10 502; the nodes logged 9"}
	unverified := step(2, clean)
	unverified.Verified = false
	late := step(1, clean)
	late.LateOut = []string{"lb3/s1"}
	tests := []struct {
		name   string
		order  infra.Order
		pr     *ProfileReport
		runErr error
		pass   bool
	}{
		{"safe, clean", infra.ServersFirst, profile(step(1, clean), step(2, clean)), nil, true},
		{"safe, 502s", infra.ServersFirst, profile(step(1, loud), step(2, clean)), nil, false},
		{"safe, a request lost to the reload", infra.ServersFirst, profile(step(1, clean), step(2, Counts{Requests: 100, OK: 99, ClientErrors: 1})), nil, false},
		{"safe, not verified", infra.ServersFirst, profile(step(1, clean), unverified), nil, false},
		{"safe, no 502 but a node was late: luck", infra.ServersFirst, profile(late, step(2, clean)), nil, false},
		{"unsafe, 502s", infra.BalancerFirst, profile(step(1, clean), step(2, loud)), nil, true},
		{"unsafe, clean", infra.BalancerFirst, profile(step(1, clean), step(2, clean)), nil, false},
		{"unsafe, the logs disagree", infra.BalancerFirst, withCross, nil, false},
		{"one step ran", infra.BalancerFirst, profile(step(1, loud)), errors.New("profile balancer-first: rollout failed"), false},
		{"not run", infra.ServersFirst, nil, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := tc.judge(tt.order, tt.pr, tt.runErr)
			assert.Equal(t, tt.pass, res.Verdict == "pass", "%+v", res)
			assert.Equal(t, string(tt.order), res.Order)
			if tt.order == infra.BalancerFirst {
				assert.Equal(t, []string{string(infra.RuleDrainOutlasts), string(infra.RuleReentryShort)}, res.Breaks)
			} else {
				assert.Empty(t, res.Breaks)
			}
		})
	}
}

func TestTransitionReportTableAndJSON(t *testing.T) {
	r := TransitionReport{
		Date: "2026-12-01", Change: []string{"Drain 15s → 25s (servers)"}, Verdict: "servers first",
		Reason: "servers first: roll the servers out, then run `pulumi up`", Nodes: 10,
		Orders: []OrderResult{
			{Order: "balancer first", Breaks: []string{"drain-outlasts-detection"}, Expected: "502s", Observed: "12 502", Verdict: "pass"},
			{Order: "servers first", Expected: "no 502", Observed: "0 502", Verdict: "pass", Error: "profile servers-first: stopped\nmore"},
		},
		Report: Report{Servers: 2, Rate: 200, Scale: 0.2, Path: "/work", Balancer: "HAProxy 2.6", Profiles: []ProfileReport{
			{Profile: "balancer-first", Deploys: []DeployReport{{Deploy: 1, Step: stepPulumiUp, Verified: true}, {Deploy: 2, Step: stepRollout, ServerSeconds: []float64{7, 9}, Problems: []string{"s1: api: container health \"starting\""}}}},
		}},
	}
	assert.False(t, r.Failed())
	var b bytes.Buffer
	require.NoError(t, r.WriteTable(&b))
	for _, want := range []string{
		"Transition rehearsal, 2026-12-01: Drain 15s → 25s (servers).",
		"2 servers, 10 balancer nodes",
		"CheckTransition: servers first: roll the servers out",
		"balancer-first  1. " + stepPulumiUp,
		"balancer-first  2. " + stepRollout,
		"8.00",
		"balancer-first step 2: s1: api",
		"balancer first (breaks drain-outlasts-detection): pass",
		"servers first (breaks nothing): pass",
		"stopped: profile servers-first: stopped\n",
	} {
		assert.Contains(t, b.String(), want)
	}
	b.Reset()
	require.NoError(t, r.WriteJSON(&b))
	var back TransitionReport
	require.NoError(t, json.Unmarshal(b.Bytes(), &back))
	assert.Equal(t, r.Orders, back.Orders)
	r.Orders[0].Verdict = "FAIL"
	assert.True(t, r.Failed())
	assert.True(t, TransitionReport{}.Failed(), "no order proves nothing")
}
