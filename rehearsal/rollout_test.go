package rehearsal

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/needs"
)

// fakeServers are servers whose hooks only record their arguments, keep
// the release in a file (every server starts on v8) and fail the deploy for
// the project named "broken": the rollout script and the control endpoint
// are real, Docker is not needed.
func fakeServers(t *testing.T, dir string, projects ...string) []*server {
	t.Helper()
	hooksDir := filepath.Join(dir, "hooks")
	require.NoError(t, os.MkdirAll(hooksDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(hooksDir, "deploy"), []byte(`#!/usr/bin/env bash
set -euo pipefail
echo "deploy $* on $MYTHEX_PROJECT"
if [[ "$MYTHEX_PROJECT" == broken ]]; then
  echo "compose up failed" >&2
  exit 1
fi
echo "$1" >"$MYTHEX_ROOT/$MYTHEX_PROJECT.release"
`), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(hooksDir, "remote-deploy"), []byte(`#!/usr/bin/env bash
set -euo pipefail
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

func TestRolloutDrivesTheRealScript(t *testing.T) {
	needs.Have(t, needs.Shellcheck, needs.Tool("jq", "apt-get install jq"), needs.Tool("flock", "apt-get install util-linux"))
	repo := repoRoot(t)
	tm := infra.Prod().Scaled(0.2)
	tests := []struct {
		name      string
		projects  []string
		out       string // a server the balancer never takes back
		wantTimes int
		wantErr   []string
	}{
		{"every server", []string{"a", "b", "c"}, "", 3, nil},
		{"a deploy fails: the rollout rolls back", []string{"a", "broken", "c"}, "", 1, []string{
			"deploy of v9 to s2 FAILED (exit ", "compose up failed", "rolling back s2 to the release before",
			"s1 runs v8 again", "s3      v8              v8           yes       not started",
		}},
		{"a server never back: the rollout rolls back", []string{"a", "b", "c"}, "127.0.0.1:2", 1, []string{
			"s2 did not come back into service (exit ", "balancer lb1", "s1 runs v8 again",
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
			short := tm
			short.StartTimeout = 100 * time.Millisecond
			ro, err := newRollout(repo, dir, servers, lbs, short, nil)
			require.NoError(t, err)
			defer ro.close()
			for _, cmd := range []string{ro.deployCmd, ro.waitCmd} {
				out, err := exec.Command("shellcheck", cmd).CombinedOutput()
				assert.NoError(t, err, "shellcheck %s: %s", cmd, out)
			}

			hook, total, err := ro.run(context.Background(), "v9")
			assert.Len(t, total, tt.wantTimes)
			assert.Len(t, hook, tt.wantTimes)
			for i := range total {
				assert.GreaterOrEqual(t, total[i], hook[i], "a server is back in service only after its hook")
			}
			if tt.wantErr == nil {
				require.NoError(t, err)
				for _, s := range servers {
					b, err := os.ReadFile(s.log.Name())
					require.NoError(t, err)
					assert.Contains(t, string(b), "deploy v9 on "+s.Project, "the hook ran with the server's own environment")
				}
				return
			}
			require.Error(t, err)
			for _, w := range tt.wantErr {
				assert.ErrorContains(t, err, w)
			}
		})
	}
}

func TestControlScriptUsage(t *testing.T) {
	dir := t.TempDir()
	ro, err := newRollout(repoRoot(t), dir, nil, nil, infra.Prod().Scaled(0.2), nil)
	require.NoError(t, err)
	defer ro.close()
	out, err := exec.Command(ro.deployCmd, "only-one").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "usage: deploy-server SERVER ARGS...")
	out, err = exec.Command(ro.waitCmd, "s9").CombinedOutput()
	require.Error(t, err, "an unknown server fails the command")
	assert.Contains(t, string(out), `no server "s9"`)
}
