package rehearsal

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/dockerlock"
	"github.com/mythex/infra/internal/needs"
	rolloutpkg "github.com/mythex/infra/rollout"
)

// fakeServers are servers whose hooks only record their calls (in calls),
// keep
// the release in a file (every server starts on v8) and fail the deploy for
// the project named "broken": the rollout and its seams are real, Docker is
// not needed.
func fakeServers(t *testing.T, dir string, projects ...string) []*server {
	t.Helper()
	hooksDir := filepath.Join(dir, "hooks")
	require.NoError(t, os.MkdirAll(hooksDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(hooksDir, "deploy"), []byte(`#!/usr/bin/env bash
set -euo pipefail
echo "$MYTHEX_PROJECT deploy $*" >>"$MYTHEX_ROOT/calls"
echo "deploy $* on $MYTHEX_PROJECT"
if [[ "$MYTHEX_PROJECT" == broken ]]; then
  echo "compose up failed" >&2
  exit 1
fi
echo "$1" >"$MYTHEX_ROOT/$MYTHEX_PROJECT.release"
`), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(hooksDir, "remote-deploy"), []byte(`#!/usr/bin/env bash
set -euo pipefail
echo "$MYTHEX_PROJECT remote-deploy $*" >>"$MYTHEX_ROOT/calls"
state="$MYTHEX_ROOT/$MYTHEX_PROJECT.release"
case "$1" in
  --status) echo "release=$(cat "$state") previous= verified=yes" ;;
  --rollback)
    echo "rollback to $2 on $MYTHEX_PROJECT"
    echo "$2" >"$state"
    ;;
  *) exit 2 ;;
esac
`), 0o755))
	for _, p := range projects {
		require.NoError(t, os.WriteFile(filepath.Join(dir, p+".release"), []byte("v8\n"), 0o644))
	}
	var servers []*server
	for i, p := range projects {
		log, err := os.Create(filepath.Join(dir, p+".log"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = log.Close() })
		servers = append(servers, &server{
			name:   []string{"s1", "s2", "s3"}[i],
			Server: hooks.Server{HooksDir: hooksDir, Root: dir, Project: p, ReleaseDir: dir},
			addr:   "127.0.0.1:" + []string{"1", "2", "3"}[i],
			log:    log,
		})
	}
	return servers
}

func trackerOnly(servers []*server) []*Balancer {
	var ups []string
	for _, s := range servers {
		ups = append(ups, s.addr)
	}
	return []*Balancer{
		{Name: "lb1", Health: NewHealthTracker(ups)},
		{Name: "lb2", Health: NewHealthTracker(ups)},
	}
}

// The rehearsal runs the rollout package CI runs, its seams ending at the
// simulated servers' hooks and at the balancer nodes' verdicts, asked as
// production asks the target group: a deploy that fails and a server the
// nodes never take back are each caught and rolled back, and a failed
// rollback stops the rollback, as rollout.Run's rules say; every report
// field (the servers' times, the rollbacks, the output and its table)
// says what happened.
func TestRolloutDrivesTheRealRolloutPackage(t *testing.T) {
	// Short bounds: the wait for a server never back lasts ReentryWait.
	tm := infra.Prod().Scaled(0.05)
	tests := []struct {
		name      string
		projects  []string
		out       string // a server the balancer never takes back
		wantTimes int
		rollbacks int
		wantErr   []string
	}{
		{"every server", []string{"a", "b", "c"}, "", 3, 0, nil},
		{"a deploy fails: the rollout rolls back", []string{"a", "broken", "c"}, "", 1, 2, []string{
			"rollout v9: failed", "[s2] compose up failed", "deploy FAILED: deploy v9 on s2: exit status 1",
			"rolling back [s2] to the release before", "rolling back [s1] to the release before",
			"s1      v8              v8           yes       deploy: verified and back in service; rollback: verified and back in service",
			"s3      v8              v8           yes       not started",
		}},
		{"a server never back: rolled back, and the rollback stops when it fails", []string{"a", "b", "c"}, "127.0.0.1:2", 1, 1, []string{
			"rollout v9: failed", "s2 not back in service after", "out of rotation on lb1",
			"rollback of [s2] failed; stopping",
			"s1      v8              v9           yes       deploy: verified and back in service; not rolled back: a rollback failed",
			"s3      v8              v8           yes       not started",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			servers := fakeServers(t, dir, tt.projects...)
			lbs := trackerOnly(servers)
			if tt.out != "" {
				lbs[0].Health.observe(tt.out, false)
			}
			ro, err := newRollout(dir, servers, lbs, tm, nil)
			require.NoError(t, err)
			defer ro.close()

			hook, total, err := ro.run(context.Background(), "v9", infra.DefaultMaxUnavailable)
			assert.Len(t, total, tt.wantTimes)
			assert.Len(t, hook, tt.wantTimes)
			for i := range total {
				assert.GreaterOrEqual(t, total[i], hook[i], "a server is back in service only after its hook")
			}
			assert.Equal(t, tt.rollbacks, ro.rolledBack())
			assert.Contains(t, ro.lastOutput(), "server  release before  release now  verified  what happened", "the table ends the output")
			if tt.wantErr == nil {
				require.NoError(t, err)
				for _, s := range servers {
					b, err := os.ReadFile(s.log.Name())
					require.NoError(t, err)
					assert.Contains(t, string(b), "deploy v9 on "+s.Project, "the hook ran with the server's own environment")
				}
				assert.Len(t, ro.lastTimeline().BatchesSeconds, 3, "one server at a time")
				return
			}
			require.Error(t, err)
			for _, w := range tt.wantErr {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}

// The rollout's inputs are checked as cmd/rollout checks them, before any
// server is touched; a timing that breaks the contract's relations, as the
// matrix's profiles do on purpose, is rehearsed.
func TestRolloutChecksItsInputs(t *testing.T) {
	dir := t.TempDir()
	servers := fakeServers(t, dir, "a", "b")
	broken := infra.Prod().Scaled(0.05)
	broken.StopGracePeriod = broken.Drain / 2
	require.Error(t, broken.ValidateInvariants())
	ro, err := newRollout(dir, servers, trackerOnly(servers), broken, nil)
	require.NoError(t, err)
	defer ro.close()
	_, _, err = ro.run(context.Background(), "v9", 2)
	require.ErrorContains(t, err, "maxUnavailable 2 must be below servers 2")
	assert.NoFileExists(t, filepath.Join(dir, "calls"), "no server touched")
	_, _, err = ro.run(context.Background(), "v9", 1)
	require.NoError(t, err)
	assert.FileExists(t, filepath.Join(dir, "calls"))
}

// `rehearse -ssh` is production's path: rollout.SSH ships the release to
// each server through a real sshd and runs remote-deploy there (bootstrap,
// then deploy), and rollout.ELB awaits each server's re-entry through the
// AWS SDK, asking the stand-in that answers from the balancer nodes. Two
// servers, one deploy, under load: no 502, no 504, every server timed.
func TestRolloutOverSSHIsProductionsPath(t *testing.T) {
	const servers = 2
	needs.Have(t, needs.Docker, needs.HAProxy, needs.SSHD)
	require.NoError(t, CheckDocker(context.Background()), "this test needs a running Docker engine")
	dockerlock.Parallel(t, servers)
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
		Profiles: []string{ProfileProd},
		SSH:      true,
		WorkDir:  t.TempDir(),
		Progress: &progress,
	}
	rep, err := Run(ctx, c)
	var table bytes.Buffer
	require.NoError(t, rep.WriteTable(&table))
	publish(t, "ssh", table.String())
	require.NoError(t, err, "progress:\n%s", progress.String())
	require.Len(t, rep.Profiles, 1)
	require.Len(t, rep.Profiles[0].Deploys, 1)
	d := rep.Profiles[0].Deploys[0]
	assert.Zero(t, d.ReachedNothing(), "502s and 504s")
	assert.True(t, d.Verified, "every service on every server: %v", d.Problems)
	require.Len(t, d.ServerSeconds, c.Servers, "every server timed")
	for i := range d.ServerSeconds {
		assert.Greater(t, d.ServerSeconds[i], d.HookSeconds[i], "s%d back in service after its deploy", i+1)
	}

	log, err := os.ReadFile(filepath.Join(c.WorkDir, ProfileProd, "rollout.log"))
	require.NoError(t, err)
	for _, s := range []string{"s1", "s2"} {
		assert.Regexp(t, `(?m)^\[`+s+`\] \S+ deploy: `, string(log), "%s's deploy relayed over ssh", s)
		assert.Regexp(t, `(?m)^\[`+s+`\] healthy at \+[0-9.]+s$`, string(log), "%s's re-entry seen through describe-target-health", s)
	}
	assert.Contains(t, string(log), "installed hooks into", "bootstrap ran on the servers")
	assert.Contains(t, string(log), "deployed "+d.Version+" to all 2 server(s)")
	shipped, err := os.ReadDir(filepath.Join(c.WorkDir, ProfileProd, "releases", d.Version))
	require.NoError(t, err, "the release was unpacked where the rollout put it")
	var names []string
	for _, e := range shipped {
		if !strings.HasPrefix(e.Name(), "remote-deploy.") || !strings.HasSuffix(e.Name(), ".log") {
			names = append(names, e.Name())
		}
	}
	assert.ElementsMatch(t, rolloutpkg.ReleaseFiles, names, "the release is what the rollout ships")
}
