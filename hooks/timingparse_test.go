package hooks

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

// loaded is how lib.sh's load_timing ended on a timing file: the keys it
// set, or its exit status and what it said.
type loaded struct {
	values map[string]string
	code   int
	stderr string
}

// loadTiming runs lib.sh's load_timing on env, as the scripts do (bash
// only: nothing else runs), and returns every timing key it set.
func loadTiming(t *testing.T, env []byte) loaded {
	t.Helper()
	file := filepath.Join(t.TempDir(), TimingEnvFile)
	require.NoError(t, os.WriteFile(file, env, 0o644))
	lib, err := filepath.Abs("lib.sh")
	require.NoError(t, err)
	const script = `set -euo pipefail
source "$1"
load_timing
for key in "${TIMING_KEYS[@]}"; do
  printf '%s=%s\0' "$key" "${!key}"
done`
	cmd := exec.Command("bash", "-c", script, "load_timing", lib)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MYTHEX_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "MYTHEX_TIMING_ENV="+file)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		require.NoError(t, err, "run bash")
	}
	res := loaded{code: cmd.ProcessState.ExitCode(), stderr: stderr.String()}
	if res.code == 0 {
		res.values = map[string]string{}
		for _, kv := range strings.Split(strings.TrimSuffix(stdout.String(), "\x00"), "\x00") {
			k, v, ok := strings.Cut(kv, "=")
			require.True(t, ok, "%q", kv)
			res.values[k] = v
		}
	}
	return res
}

// withLine is env with key's line set to key=raw, and that line's number.
func withLine(t *testing.T, env []byte, key, raw string) ([]byte, int) {
	t.Helper()
	lines := strings.Split(string(env), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, key+"=") {
			lines[i] = key + "=" + raw
			return []byte(strings.Join(lines, "\n")), i + 1
		}
	}
	require.Failf(t, "no such key", "timing.env has no %s", key)
	return nil, 0
}

// Finding 7: load_timing stripped one leading and one trailing double
// quote, each on its own, so MYTHEX_WATCHDOG_STRIKES="4 read as 4 and
// MYTHEX_HEALTH_PATH=/healthz" as /healthz, without a word. A value is
// bare, or wholly in one pair of double quotes, as the generator writes
// it; any other quote is refused, each line named, all at once.
func TestTimingFileQuotesWrapAValueWhole(t *testing.T) {
	const (
		double = "a double quote may only wrap the whole value, in one pair"
		single = "timing.env holds no single quote (a value is bare, or in double quotes)"
	)
	generated := mustRender(t, RenderTimingEnv, infra.Prod())
	bad := []struct {
		key, raw, want string
	}{
		{"MYTHEX_WATCHDOG_STRIKES", `"4`, double},
		{"MYTHEX_HEALTH_PATH", `/healthz"`, double},
		{"MYTHEX_SETTLE_CHECKS", `""2""`, double},
		{"MYTHEX_START_TIMEOUT_MS", `6"0000`, double},
		{"MYTHEX_LOCK_WAIT_MS", `"`, double},
		{"MYTHEX_SERVICES", `"api orchestrator" "gateway publish-worker"`, double},
		{"MYTHEX_COMPOSE_VARS", `"MYTHEX_VERSION MYTHEX_IMAGE_PREFIX MYTHEX_BIND MYTHEX_APP_PORT"x`, double},
		{"MYTHEX_HEALTHY_STATUS", `'200'`, single},
		{"MYTHEX_DEPLOY_HOLD_MS", `"'360000'"`, single},
	}
	t.Run("bad quotes, each named at once", func(t *testing.T) {
		env := generated
		want := map[string]int{}
		for _, b := range bad {
			env, want[b.key] = withLine(t, env, b.key, b.raw)
		}
		env = append(env, "MYTHEX_NOT_A_KEY=\"1\"\n"...)
		res := loadTiming(t, env)
		assert.Equal(t, 1, res.code, "stderr:\n%s", res.stderr)
		assert.Contains(t, res.stderr, "invalid timing file")
		for _, b := range bad {
			assert.Contains(t, res.stderr, fmt.Sprintf("line %d sets %s to %s: %s", want[b.key], b.key, b.raw, b.want), b.key)
			assert.NotContains(t, res.stderr, b.key+" is missing", "%s: one problem, said once", b.key)
			assert.NotContains(t, res.stderr, b.key+"=", "%s: its value is not judged after its quotes are refused", b.key)
		}
		assert.Contains(t, res.stderr, "sets MYTHEX_NOT_A_KEY, which is not a timing key", "the other rules still hold beside these")
	})
	for _, tc := range []struct {
		name, key, raw, want string
	}{
		{"a number in one pair", "MYTHEX_WATCHDOG_STRIKES", `"4"`, "4"},
		{"a path in one pair", "MYTHEX_HEALTH_PATH", `"/healthz"`, "/healthz"},
		{"a list bare, of one", "MYTHEX_SERVICES", `api`, "api"},
		{"a list in one pair", "MYTHEX_SERVICES", `"api gateway"`, "api gateway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env, _ := withLine(t, generated, tc.key, tc.raw)
			res := loadTiming(t, env)
			require.Equal(t, 0, res.code, "stderr:\n%s", res.stderr)
			assert.Equal(t, tc.want, res.values[tc.key])
		})
	}
}

// What the servers read from the timing file the generator writes is what
// it meant, key for key: the committed hooks/timing.env, and the file for
// every timing the tests and the rehearsal render.
func TestServersReadTheTimingFileAsWritten(t *testing.T) {
	files := map[string]infra.Timing{"hooks/" + TimingEnvFile: infra.Prod()}
	for name, timing := range testTimings {
		files["rendered, "+name] = timing
	}
	for name, timing := range files {
		t.Run(name, func(t *testing.T) {
			env := mustRender(t, RenderTimingEnv, timing)
			if name == "hooks/"+TimingEnvFile {
				env = mustRead(t, TimingEnvFile)
			}
			meant := map[string]string{}
			for _, kv := range timingEnvValues(timing) {
				meant[kv[0]] = kv[1]
			}
			res := loadTiming(t, env)
			require.Equal(t, 0, res.code, "stderr:\n%s", res.stderr)
			assert.Equal(t, meant, res.values)
		})
	}
}
