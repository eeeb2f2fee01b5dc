package rehearsal

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/drain"
	"github.com/mythex/infra/hooks"
	"github.com/mythex/infra/infra"
)

func readRelease(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range []string{hooks.ComposeFile, hooks.ChecksumFile, hooks.TimingEnvFile} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		out[f] = string(b)
	}
	return out
}

func TestWriteReleaseProdIsTheHooksOwn(t *testing.T) {
	ps, err := Profiles(0.2, ProfileProd)
	require.NoError(t, err)
	ref := ps[0].Timing
	got, want := t.TempDir(), t.TempDir()
	require.NoError(t, writeRelease(got, ps[0]))
	require.NoError(t, hooks.WriteRelease(want, ref))
	assert.Equal(t, readRelease(t, want), readRelease(t, got))
}

func TestWriteReleaseBeforeDiffersOnlyInTheDrain(t *testing.T) {
	ref := infra.Prod().Scaled(0.2)
	ps, err := Profiles(0.2, ProfileBefore)
	require.NoError(t, err)
	before := ps[0].Timing
	require.Error(t, hooks.WriteRelease(t.TempDir(), before), "the hooks refuse the old setup")

	dir, refDir := t.TempDir(), t.TempDir()
	require.NoError(t, writeRelease(dir, ps[0]))
	require.NoError(t, hooks.WriteRelease(refDir, ref))
	got, prod := readRelease(t, dir), readRelease(t, refDir)

	drainOf := func(tm infra.Timing) string { return `"` + drain.EnvDrain + "=" + tm.Drain.String() + `"` }
	assert.Equal(t, len(hooks.Roles), strings.Count(got[hooks.ComposeFile], drainOf(before)), "every service drains for before's %v", before.Drain)
	assert.NotContains(t, got[hooks.ComposeFile], drainOf(ref))
	// The evidence drain's copy of the balancer's interval is before's own.
	intervalOf := func(tm infra.Timing) string {
		return `"` + drain.EnvCheckInterval + "=" + tm.HealthCheckInterval.String() + `"`
	}
	want := strings.NewReplacer(drainOf(ref), drainOf(before), intervalOf(ref), intervalOf(before)).Replace(prod[hooks.ComposeFile])
	assert.Equal(t, uncommented(want), uncommented(got[hooks.ComposeFile]),
		"nothing else differs from prod's servers (the header comment tells before's drain)")
	assert.Equal(t, string(hooks.Checksum([]byte(got[hooks.ComposeFile]))), got[hooks.ChecksumFile], "checksum matches what is shipped")
	// The one number that follows the balancer's checks is before's own,
	// from its slower checks: the deploy's settle window (re-entry).
	reentry := func(tm infra.Timing) *strings.Replacer {
		return strings.NewReplacer(fmt.Sprintf("MYTHEX_SETTLE_MS=%d\n", tm.Reentry().Milliseconds()), "SETTLE\n")
	}
	assert.Equal(t, reentry(ref).Replace(prod[hooks.TimingEnvFile]), reentry(before).Replace(got[hooks.TimingEnvFile]),
		"the scripts' numbers are prod's but for those that follow the balancer's checks")
}

func TestWriteReleaseRefusesAnUnnamedBreak(t *testing.T) {
	ps, err := Profiles(0.2, ProfileBefore)
	require.NoError(t, err)
	p := ps[0]
	p.Breaks = p.Breaks[:1]
	err = writeRelease(t.TempDir(), p)
	require.Error(t, err)
	assert.ErrorContains(t, err, "profile before")
}

// uncommented drops a YAML file's comment lines.
func uncommented(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, "#") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}
