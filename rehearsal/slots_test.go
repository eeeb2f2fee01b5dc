package rehearsal

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	var progress bytes.Buffer
	c := Config{RepoRoot: repoRoot(t), Servers: servers, Rate: 200, Scale: 0.4, Path: "/work", WorkDir: t.TempDir(), Progress: &progress}
	r, err := RunSlots(ctx, c)
	var table bytes.Buffer
	require.NoError(t, r.WriteTable(&table))
	require.NoError(t, r.Report.WriteTable(&table))
	publish(t, "slots", table.String())
	require.NoError(t, err, "progress:\n%s", progress.String())
	assert.Equal(t, "pass", r.Verdict, "observed %s; %s", r.Observed, r.Error)
	require.Len(t, r.Swaps, servers, "every server swapped")
	assert.Equal(t, []int{1, 2}, []int{r.Swaps[0].Batch, r.Swaps[1].Batch}, "the canary alone, then the rest")
	require.Len(t, r.Capacity, DefaultNodes, "every node's capacity measured")
	for _, l := range r.Capacity {
		assert.Equal(t, servers, l.Servers, "%s counts servers, not slots", l.Node)
		assert.Equal(t, servers, l.Fewest, "%s routed to %d of %d servers at +%.2fs: %v out", l.Node, l.Fewest, l.Servers, l.AtSeconds, l.Out)
	}
	for _, s := range r.Swaps {
		assert.Positive(t, s.AdmittedSeconds, "%s: every node routed to the new slot", s.Server)
		for svc, code := range s.Exits {
			assert.Zero(t, code, "%s: the old slot's %s exited cleanly", s.Server, svc)
		}
	}
	dr := r.Report.Profiles[0].Deploys[0]
	assert.Empty(t, dr.LateOut, "every node took each old slot out on its drain's 503")
}

func TestSlotsConfigRefuses(t *testing.T) {
	good := Config{RepoRoot: "/repo", Servers: 2, Rate: 200, Scale: 0.4, Path: "/work"}
	require.NoError(t, good.ValidateSlots())
	for _, tt := range []struct {
		name   string
		change func(*Config)
		want   []string
	}{
		{"one server", func(c *Config) { c.Servers = 1 }, []string{"Servers 1: the slots prototype needs a canary and at least one server after it"}},
		{"over ssh, and no load", func(c *Config) { c.SSH, c.Rate = true, 0 }, []string{"does not run over ssh", "Rate 0"}},
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
