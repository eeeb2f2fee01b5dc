package hooks

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The watchdog unit's hardening is checked by systemd's own reading of
// it, not only its syntax: `systemd-analyze security --offline=true` loads
// the unit file as systemd would and scores what each setting leaves
// exposed (0 none, 10 all). The installed unit must score at most 4.0 and
// have each setting below in effect. What keeps it above 0: it runs as root
// with no system call filter and the network (it talks to the Docker socket
// and to the services over loopback), and ProtectHome is read-only, not
// off. The same unit without its hardening scores far above the bound,
// so the check can fail.
func TestWatchdogUnitHardeningTakesEffect(t *testing.T) {
	const maxExposure = 4.0
	analyze := systemdAnalyze(t)
	inEffect := []string{
		"NoNewPrivileges", "AmbientCapabilities", "CapabilityBoundingSet_CAP_SYS_ADMIN",
		"CapabilityBoundingSet_CAP_SYS_PTRACE", "CapabilityBoundingSet_CAP_NET_ADMIN",
		"ProtectSystem", "PrivateTmp", "PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules",
		"ProtectKernelLogs", "ProtectControlGroups", "ProtectClock", "ProtectHostname",
		"RestrictSUIDSGID", "RestrictRealtime", "LockPersonality", "SystemCallArchitectures",
		"RestrictNamespaces_user", "RestrictNamespaces_mnt", "RestrictAddressFamilies_AF_PACKET",
		"RestrictAddressFamilies_AF_NETLINK", "RestrictAddressFamilies_OTHER",
	}
	s := newServer(t, dockerTiming)
	res := run(t, s, nil, "bootstrap")
	require.Equal(t, 0, res.code, "%s", res)
	installed := filepath.Join(s.Root, "systemd", ServiceFile)
	// The same unit with every hardening line taken out.
	var bare []string
	for _, l := range strings.Split(string(mustRead(t, installed)), "\n") {
		k, _, _ := strings.Cut(l, "=")
		if !strings.HasPrefix(k, "Protect") && !strings.HasPrefix(k, "Restrict") && !strings.HasPrefix(k, "Private") &&
			!strings.HasSuffix(k, "Capabilities") && k != "CapabilityBoundingSet" &&
			k != "NoNewPrivileges" && k != "LockPersonality" && k != "SystemCallArchitectures" && k != "ReadWritePaths" {
			bare = append(bare, l)
		}
	}
	unhardened := filepath.Join(t.TempDir(), ServiceFile)
	require.NoError(t, os.WriteFile(unhardened, []byte(strings.Join(bare, "\n")), 0o644))

	for _, tc := range []struct {
		name, unit string
		hardened   bool
	}{
		{"installed", installed, true},
		{"without its hardening", unhardened, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// --threshold is the exposure times ten.
			cmd := exec.Command(analyze, "security", "--offline=true", "--no-pager",
				"--threshold="+strconv.Itoa(int(maxExposure*10)), tc.unit)
			out, err := cmd.CombinedOutput()
			m := regexp.MustCompile(`Overall exposure level for ` + regexp.QuoteMeta(ServiceFile) + `: ([0-9.]+) `).FindSubmatch(out)
			require.NotNil(t, m, "no overall exposure level:\n%s", out)
			exposure, perr := strconv.ParseFloat(string(m[1]), 64)
			require.NoError(t, perr)
			t.Logf("%s: exposure %.1f", tc.name, exposure)
			if !tc.hardened {
				assert.Error(t, err, "above the threshold, systemd-analyze fails")
				assert.Greater(t, exposure, maxExposure)
				return
			}
			assert.NoError(t, err, "%s", out)
			assert.LessOrEqual(t, exposure, maxExposure, "%s", out)

			js, err := exec.Command(analyze, "security", "--offline=true", "--json=short", tc.unit).Output()
			require.NoError(t, err)
			var checks []struct {
				Set       *bool  `json:"set"`
				JSONField string `json:"json_field"`
			}
			require.NoError(t, json.Unmarshal(js, &checks))
			set := map[string]bool{}
			for _, c := range checks {
				set[c.JSONField] = c.Set != nil && *c.Set
			}
			for _, f := range inEffect {
				assert.True(t, set[f], "%s is not in effect", f)
			}
		})
	}
}
