package rehearsal

import (
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
	ref := infra.Prod().Scaled(0.2)
	got, want := t.TempDir(), t.TempDir()
	require.NoError(t, writeRelease(got, ref, ref))
	require.NoError(t, hooks.WriteRelease(want, ref))
	assert.Equal(t, readRelease(t, want), readRelease(t, got))
}

func TestWriteReleaseBeforeDiffersOnlyInTheDrain(t *testing.T) {
	ref := infra.Prod().Scaled(0.2)
	before := Before().Scaled(0.2)
	require.Error(t, hooks.WriteRelease(t.TempDir(), before), "the hooks refuse the old setup")

	dir, refDir := t.TempDir(), t.TempDir()
	require.NoError(t, writeRelease(dir, before, ref))
	require.NoError(t, hooks.WriteRelease(refDir, ref))
	got, prod := readRelease(t, dir), readRelease(t, refDir)

	drainOf := func(tm infra.Timing) string { return `"` + drain.EnvDrain + "=" + tm.Drain.String() + `"` }
	assert.Equal(t, len(hooks.Roles), strings.Count(got[hooks.ComposeFile], drainOf(before)), "every service drains for before's %v", before.Drain)
	assert.NotContains(t, got[hooks.ComposeFile], drainOf(ref))
	assert.Equal(t, strings.ReplaceAll(prod[hooks.ComposeFile], drainOf(ref), drainOf(before)), got[hooks.ComposeFile],
		"nothing else differs from prod's servers")
	assert.Equal(t, string(hooks.Checksum([]byte(got[hooks.ComposeFile]))), got[hooks.ChecksumFile], "checksum matches what is shipped")
	assert.Equal(t, prod[hooks.TimingEnvFile], got[hooks.TimingEnvFile])
}

func TestSwapEnvRefusesWhatItCannotFind(t *testing.T) {
	compose := []byte(`- "A=1"` + "\n" + `- "A=1"` + "\n")
	out, err := swapEnv(compose, []string{"A=1", "B=2"}, []string{"A=9", "B=2"}, 2)
	require.NoError(t, err)
	assert.Equal(t, `- "A=9"`+"\n"+`- "A=9"`+"\n", string(out))

	_, err = swapEnv(compose, []string{"A=1"}, []string{"A=9"}, 3)
	assert.ErrorContains(t, err, `"A=1" occurs 2 times in the compose definition, want once per service (3)`)
	_, err = swapEnv(compose, []string{"A=1"}, nil, 2)
	assert.ErrorContains(t, err, "0 entries for 1")
}
