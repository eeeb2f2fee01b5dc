package rehearsal

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func goodReport() Report {
	prod := []DeployReport{
		{Deploy: 1, Counts: Counts{Requests: 1000, OK: 990, Unavailable: 10}, ServerSeconds: []float64{6, 7}, ServerDeployMin: 5, TakenOut: 4, WatchdogRuns: 3, Verified: true},
		{Deploy: 2, Counts: Counts{Requests: 1000, OK: 1000}, ServerSeconds: []float64{5.5, 6.5}, ServerDeployMin: 5, TakenOut: 4, WatchdogRuns: 2, Verified: true},
	}
	before := []DeployReport{
		{Deploy: 1, Counts: Counts{Requests: 1000, OK: 900, BadGateway: 100}, ServerSeconds: []float64{3, 3}, ServerDeployMin: 3.4, Verified: true},
		{Deploy: 2, Counts: Counts{Requests: 1000, OK: 950, BadGateway: 40, ClientErrors: 10}, ServerSeconds: []float64{3, 3}, ServerDeployMin: 3.4, Verified: true},
	}
	return Report{
		Servers: 2, Deploys: 2, Rate: 200, Scale: 0.2, Path: "/work", Note: CountingNote,
		Profiles: []ProfileReport{
			{Profile: ProfileProd, Deploys: prod, Total: total(prod)},
			{Profile: ProfileBefore, Deploys: before, Total: total(before), Violations: []string{"drain-outlasts-detection: ..."},
				Errors: map[string]int64{"dial tcp 127.0.0.1:1: connect: connection refused": 10}},
		},
	}
}

func TestTotal(t *testing.T) {
	r := goodReport()
	tot := r.Profiles[0].Total
	assert.Equal(t, Counts{Requests: 2000, OK: 1990, Unavailable: 10}, tot.Counts)
	assert.Equal(t, []float64{6, 7, 5.5, 6.5}, tot.ServerSeconds)
	assert.InDelta(t, 6.25, tot.MeanServerSeconds(), 1e-9)
	assert.InDelta(t, 1.25, tot.Ratio(), 1e-9)
	assert.Equal(t, 8, tot.TakenOut)
	assert.Equal(t, 5, tot.WatchdogRuns)
	assert.True(t, tot.Verified)

	r.Profiles[0].Deploys[1].Verified = false
	assert.False(t, total(r.Profiles[0].Deploys).Verified, "one unverified deploy makes the total unverified")
	assert.False(t, total(nil).Verified, "nothing deployed is nothing verified")
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*Report)
		wantErr []string
	}{
		{"prod clean, before broken", func(*Report) {}, nil},
		{"a 502 in prod", func(r *Report) { r.Profiles[0].Deploys[1].BadGateway = 1 }, []string{"prod deploy 2: 1 502 and 0 504"}},
		{"a 504 in prod", func(r *Report) { r.Profiles[0].Deploys[0].Timeout = 2 }, []string{"prod deploy 1: 0 502 and 2 504"}},
		{"unverified prod deploy", func(r *Report) {
			r.Profiles[0].Deploys[0].Verified = false
			r.Profiles[0].Deploys[0].Problems = []string{"s1: gateway: 0 running containers, want 1"}
		}, []string{"prod deploy 1: not every service verified", "gateway: 0 running containers"}},
		{"watchdog restart in prod", func(r *Report) { r.Profiles[0].Deploys[1].WatchdogRestarts = 1 }, []string{"prod deploy 2: the watchdog restarted 1"}},
		{"before not reproduced", func(r *Report) {
			for i := range r.Profiles[1].Deploys {
				r.Profiles[1].Deploys[i].BadGateway = 0
			}
			r.Profiles[1].Total = total(r.Profiles[1].Deploys)
		}, []string{"before: no 502 in 2 deploys"}},
		{"a deploy missing", func(r *Report) { r.Profiles[0].Deploys = r.Profiles[0].Deploys[:1] }, []string{"prod: 1 of 2 deploys ran"}},
		{"every problem at once", func(r *Report) {
			r.Profiles[0].Deploys[0].BadGateway = 3
			r.Profiles[0].Deploys[1].WatchdogRestarts = 2
			r.Profiles[1].Total.BadGateway = 0
		}, []string{"prod deploy 1: 3 502", "prod deploy 2: the watchdog restarted 2", "before: no 502"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := goodReport()
			tt.edit(&r)
			err := r.Check()
			if tt.wantErr == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tt.wantErr {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, goodReport().WriteTable(&b))
	out := b.String()
	assert.Contains(t, out, "never the health endpoint", "the table says the health endpoint's 503s are not counted")
	assert.Contains(t, out, "profile prod:")
	assert.Contains(t, out, "breaks drain-outlasts-detection")
	lines := strings.Split(out, "\n")
	var header, prodTotal string
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == "deploy" && header == "" {
			header = l
		}
		if len(f) > 0 && f[0] == "total" && prodTotal == "" {
			prodTotal = l
		}
	}
	for _, col := range []string{"requests", "2xx", "502", "503", "504", "other", "client errors", "s/server", "× min", "watchdog restarts"} {
		assert.Contains(t, header, col)
	}
	assert.Equal(t, strings.Fields("total 2000 1990 0 10 0 0 0 6.25 1.25 8 5 0 yes"), strings.Fields(prodTotal))
	assert.Contains(t, out, "10× dial tcp 127.0.0.1:1: connect: connection refused", "client errors are named")
	assert.NotContains(t, out, "acts", "plain nodes are not remarked on")
	assert.NotContains(t, out, "names itself")

	r := goodReport()
	r.Profiles[0].LaggingNodes, r.Profiles[0].Lag, r.Profiles[0].NamedNodes = []string{"lb2"}, 2.4, true
	b.Reset()
	require.NoError(t, r.WriteTable(&b))
	assert.Contains(t, b.String(), "\n  lb2 acts 2.4s after the servers answer its checks\n  every node names itself in its checks\n")
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, goodReport().WriteJSON(&b))
	var got struct {
		Note     string
		Profiles []struct {
			Profile string
			Deploys []map[string]any
			Total   map[string]any
		}
	}
	require.NoError(t, json.Unmarshal(b.Bytes(), &got), b.String())
	require.Len(t, got.Profiles, 2)
	assert.Equal(t, CountingNote, got.Note)
	d := got.Profiles[1].Deploys[0]
	assert.EqualValues(t, 100, d["502"])
	assert.EqualValues(t, 900, d["2xx"])
	assert.EqualValues(t, 0.882, d["ratio_to_min"])
	assert.EqualValues(t, 3, d["server_seconds_mean"])
	assert.EqualValues(t, 140, got.Profiles[1].Total["502"])
	assert.EqualValues(t, 10, got.Profiles[1].Total["client_errors"])
}
