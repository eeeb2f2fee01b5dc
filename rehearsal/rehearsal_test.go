package rehearsal

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/internal/dockerlock"
	"github.com/mythex/infra/internal/needs"
)

// ReportsEnv names a directory where the rehearsal tests also write their
// tables, one file each: go test shows a passing test's log only with -v,
// and CI prints these (.ci/run) so every run's numbers can be read.
const ReportsEnv = "MYTHEX_REHEARSAL_REPORTS"

// publish logs a test's table and, when ReportsEnv is set, writes it there.
func publish(t *testing.T, name, text string) {
	t.Helper()
	t.Logf("\n%s", text)
	dir := os.Getenv(ReportsEnv)
	if dir == "" {
		return
	}
	err := os.WriteFile(filepath.Join(dir, name+".txt"), []byte(text), 0o644)
	assert.NoError(t, err, "write the %s table into %s=%s", name, ReportsEnv, dir)
}

// repoRoot is the repository, two levels up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "hooks", "deploy"))
	require.NoError(t, err, "the rehearsal runs the repository's hooks")
	return root
}

// TestMatrix is the rehearsal's CI tier: the invariant matrix as small as
// still shows every row's symptom (two servers, one deploy per profile),
// real containers behind real HAProxy nodes under 200 requests per second.
// prod must lose nothing, and each profile that breaks a relation must show
// what users would see, or the rehearsal could not tell a fix from luck.
func TestMatrix(t *testing.T) {
	const servers = 2
	needs.Have(t, needs.Docker, needs.HAProxy)
	require.NoError(t, CheckDocker(context.Background()), "this test needs a running Docker engine")
	// Alone: its rows' symptoms are timings a machine kept busy by another
	// rehearsal beside it blurs. With the fleet and the runner's cancel
	// beside it, the evidence drain's lagging row answered 193 502s: the
	// nodes' checks and the load ran late enough to look like a balancer
	// that had stopped. The suite's sequential tests run before its
	// parallel ones, so it runs first, by itself.
	dockerlock.Hold(t)
	// Bounded from here: the wait for the other Docker suites is go test's
	// to bound (-timeout), not this test's.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	var progress bytes.Buffer
	c := Config{
		RepoRoot: repoRoot(t),
		Servers:  servers,
		Deploys:  1,
		Rate:     200,
		Scale:    0.2,
		Path:     "/work",
		WorkDir:  t.TempDir(),
		Progress: &progress,
	}
	m, err := RunMatrix(ctx, c)
	var table bytes.Buffer
	require.NoError(t, m.WriteTable(&table))
	require.NoError(t, m.Report.WriteTable(&table))
	publish(t, "matrix", table.String())
	require.NoError(t, err, "progress:\n%s", progress.String())
	require.Len(t, m.Rows, len(MatrixCases())+len(LaggingCases()))
	for _, row := range m.Rows {
		assert.Equal(t, "pass", row.Verdict, "%s: expected %s; observed %s; %s", row.Profile, row.Expected, row.Observed, row.Error)
	}
	require.NotEmpty(t, m.Report.Profiles)

	prod := m.Report.Profiles[0]
	require.Equal(t, ProfileProd, prod.Profile)
	require.Len(t, prod.Deploys, c.Deploys)
	for _, d := range prod.Deploys {
		assert.Zero(t, d.BadGateway, "prod deploy %d: 502s", d.Deploy)
		assert.Zero(t, d.Timeout, "prod deploy %d: 504s", d.Deploy)
		assert.True(t, d.Verified, "prod deploy %d: every service on every server: %v", d.Deploy, d.Problems)
		assert.Zero(t, d.WatchdogRestarts, "prod deploy %d: watchdog restarts", d.Deploy)
		assert.Len(t, d.ServerSeconds, c.Servers, "prod deploy %d: every server deployed", d.Deploy)
		// The handshake really happened: each node took each server out
		// before its listener closed (else no 502 could be luck). A node may
		// take a server out once more when a check of a loaded host times
		// out: that loses no request.
		assert.Empty(t, d.NotTakenOut, "prod deploy %d: node/server pairs where the node never took the server out", d.Deploy)
		assert.Empty(t, d.LateOut, "prod deploy %d: node/server pairs where the node took the server out only once its listener was closed", d.Deploy)
		assert.GreaterOrEqual(t, d.TakenOut, 2*c.Servers, "prod deploy %d: servers taken out by the balancer nodes", d.Deploy)
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			assert.Positive(t, d.ByMethod[method].OK, "prod deploy %d: %s traffic flowed", d.Deploy, method)
			assert.Zero(t, d.ByMethod[method].ReachedNothing(), "prod deploy %d: %s 502s and 504s", d.Deploy, method)
		}
	}
	assert.Positive(t, prod.Total.WatchdogRuns, "the watchdog ran during the deploys")
	for _, p := range m.Report.Profiles {
		assert.Empty(t, p.CrossCheck, "%s: the balancer nodes' logs agree with the load", p.Profile)
		for _, d := range p.Deploys {
			assert.Equal(t, d.Requests, d.ByMethod[http.MethodGet].Requests+d.ByMethod[http.MethodPost].Requests,
				"%s deploy %d: every request counted per method", p.Profile, d.Deploy)
		}
		assert.GreaterOrEqual(t, p.Balancers[http.MethodGet].Requests+p.Balancers[http.MethodPost].Requests,
			p.Total.Requests-p.Total.ClientErrors, "%s: the nodes logged every answer", p.Profile)
		assert.Equal(t, p.ByMethod[http.MethodPost].BadGateway, p.Balancers[http.MethodPost].BadGateway, "%s: POST 502s, load and logs", p.Profile)
	}
}

func TestConfigValidate(t *testing.T) {
	good := Config{RepoRoot: "/repo", Servers: 3, Deploys: 2, Rate: 200, Scale: 0.2,
		Profiles: []string{ProfileProd, ProfileBefore}, Path: "/work"}
	require.NoError(t, good.Validate())

	bad := Config{Scale: 0.33, Profiles: []string{"prod", "nope"}, Path: "/healthz", Nodes: 1}
	err := bad.Validate()
	require.Error(t, err)
	for _, want := range []string{
		"RepoRoot is empty", "Servers 0", "Deploys 0", "Rate 0",
		`Path "/healthz" is the health endpoint`, "profile prod: scale 0.33", `profile "nope": unknown`,
		"Nodes 1 must be at least 2",
	} {
		assert.ErrorContains(t, err, want)
	}
	_, err = Run(context.Background(), bad)
	assert.ErrorContains(t, err, "RepoRoot is empty", "Run refuses what Validate refuses, before touching Docker")

	for arg, want := range map[string]string{
		"3":   "maxUnavailable 3 must be below servers 3",
		"two": `-max-unavailable "two" must be a count (1 or more) or a percentage`,
		"0%":  `-max-unavailable "0%" must be a count`,
	} {
		c := good
		c.MaxUnavailable = arg
		assert.ErrorContains(t, c.Validate(), want, "the rollout's -max-unavailable, checked before anything runs")
	}
	good.MaxUnavailable = "67%"
	assert.NoError(t, good.Validate(), "two of three")
}
