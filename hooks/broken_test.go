package hooks

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

func TestBrokenReleaseFor(t *testing.T) {
	short := infra.Prod()
	short.Drain = 10 * time.Second // detection takes up to 13 s
	twice := short
	twice.Drain = 5 * time.Second // re-entry (10 s) is now slower too
	tests := []struct {
		name    string
		timing  infra.Timing
		breaks  []infra.Rule
		wantErr []string
	}{
		{"breaks exactly what it names", short, []infra.Rule{infra.RuleDrainOutlasts}, nil},
		{"two relations, both named", twice, []infra.Rule{infra.RuleDrainOutlasts, infra.RuleReentryShort}, nil},
		{"a relation it does not name", twice, []infra.Rule{infra.RuleDrainOutlasts}, []string{string(infra.RuleReentryShort)}},
		{"a relation it keeps", short, []infra.Rule{infra.RuleDrainOutlasts, infra.RuleKeepAlive},
			[]string{"meant to break keepalive-outlasts-idle but keeps it"}},
		{"nothing named", short, nil, []string{"name the relations it breaks"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			err := BrokenReleaseFor(dir, tt.timing, tt.breaks...)
			if tt.wantErr != nil {
				require.Error(t, err)
				for _, w := range tt.wantErr {
					assert.ErrorContains(t, err, w)
				}
				entries, rerr := os.ReadDir(dir)
				require.NoError(t, rerr)
				assert.Empty(t, entries, "nothing written")
				return
			}
			require.NoError(t, err)
			compose, err := os.ReadFile(filepath.Join(dir, ComposeFile))
			require.NoError(t, err)
			assert.Contains(t, string(compose), `"MYTHEX_DRAIN=`+tt.timing.Drain.String()+`"`, "the broken drain is what the services read")
			sum, err := os.ReadFile(filepath.Join(dir, ChecksumFile))
			require.NoError(t, err)
			assert.Equal(t, string(Checksum(compose)), string(sum))
		})
	}
	// The ordinary renderers still refuse it.
	assert.Error(t, WriteRelease(t.TempDir(), short))
	_, err := Generated(short)
	assert.ErrorContains(t, err, string(infra.RuleDrainOutlasts))
}

// TestBrokenReleaseOnlyForTheRehearsal keeps the one way to render a broken
// timing out of everything but the rehearsal. git searches the tree's Go
// files, committed or not, rather than a walk from this process: go test
// records every directory a test reads as an input of its cached result, so
// any change anywhere in the tree (git's own index included) would make the
// whole hooks suite run again.
func TestBrokenReleaseOnlyForTheRehearsal(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	out, err := exec.Command("git", "-C", root, "grep", "--untracked", "-l", "-F", "BrokenReleaseFor(", "--", "*.go").Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 1 && len(exit.Stderr) == 0 {
		err = nil // nothing found
	}
	require.NoError(t, err, "git grep in %s", root)
	var users []string
	for _, rel := range strings.Fields(string(out)) {
		if !strings.HasPrefix(rel, "hooks/broken") && !strings.HasPrefix(rel, "rehearsal/") {
			users = append(users, rel)
		}
	}
	require.NotEmpty(t, strings.Fields(string(out)), "git grep finds the definition itself: the search works")
	assert.Empty(t, users, "only the rehearsal may render a broken timing")
}
