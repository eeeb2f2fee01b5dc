package rollout_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/rollout"
)

// Finding 1: the bash rollout's ssh had no connect or keep-alive bound.
func TestSSHOptionsBoundConnectAndSilence(t *testing.T) {
	tm := infra.Prod()
	opts := rollout.SSH{Timing: tm, Config: "/etc/ssh/mythex"}.Options()
	assert.Equal(t, []string{
		"-F", "/etc/ssh/mythex",
		"-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "ConnectTimeout=13",
		"-o", "ServerAliveInterval=5",
		"-o", "ServerAliveCountMax=2",
	}, opts)
	// Derived, not typed: the contract's numbers.
	assert.Equal(t, tm.WorstCaseDetection(), tm.SSHConnectTimeout())
	assert.Equal(t, tm.HealthCheckInterval, tm.SSHAliveInterval())
	assert.Equal(t, tm.UnhealthyThreshold, tm.SSHAliveCountMax())
}

func TestParseStatus(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      rollout.Status
		bad       bool
	}{
		{"verified", "release=v2 previous=v1 verified=yes\n", rollout.Status{Release: "v2", Previous: "v1", Verified: true}, false},
		{"never deployed", "release= previous= verified=no\n", rollout.Status{}, false},
		{"unreadable", "hello\n", rollout.Status{}, true},
		{"verified missing", "release=v2 previous=v1\n", rollout.Status{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := rollout.ParseStatus(tc.out)
			if tc.bad {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, st)
		})
	}
}

// A release's files are all in hooks/, where the rollout ships them from.
func TestReleaseFilesAreInHooks(t *testing.T) {
	for _, f := range rollout.ReleaseFiles {
		_, err := os.Stat(filepath.Join("..", "hooks", f))
		assert.NoError(t, err, "the release's file %s is in hooks/", f)
	}
}
