package hooks

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/needs"
)

func TestGeneratedFilesAreFresh(t *testing.T) {
	files, err := Generated(infra.Prod())
	require.NoError(t, err)
	require.Len(t, files, 5)
	for name, want := range files {
		got, err := os.ReadFile(name)
		require.NoError(t, err, "read %s (run go generate ./hooks)", name)
		assert.Equal(t, string(want), string(got), "%s is stale: run go generate ./hooks", name)
	}
}

// composeFiles finds every compose definition of the git work tree at root,
// committed or not (ignored files aside), outside testdata. git lists them,
// not a walk of the directories from this process: go test would record
// every directory read as an input of the package's cached result, and any
// file appearing anywhere in the tree (another suite's temporary file)
// would make the whole hooks suite run again.
func composeFiles(root string) ([]string, error) {
	pattern := regexp.MustCompile(`^(docker-)?compose.*\.ya?ml$`)
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		return nil, fmt.Errorf("list the files of %s: %w", root, err)
	}
	var found []string
	for _, p := range strings.Split(string(out), "\x00") {
		if p == "" || slices.Contains(strings.Split(p, "/"), "testdata") {
			continue
		}
		if pattern.MatchString(path.Base(p)) && !slices.Contains(found, p) {
			found = append(found, p)
		}
	}
	return found, nil
}

func TestOneComposeDefinition(t *testing.T) {
	found, err := composeFiles(repoRoot(t))
	require.NoError(t, err)
	assert.Equal(t, []string{"hooks/compose.yaml"}, found,
		"the repository must hold exactly one compose definition, hooks/compose.yaml (rendered from the timing contract)")
}

func TestComposeFilesFindsASecondDefinition(t *testing.T) {
	root := t.TempDir()
	out, err := exec.Command("git", "init", "-q", root).CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, p := range []string{"hooks/compose.yaml", "ops/docker-compose.prod.yml", "x/compose.override.yaml",
		"testdata/compose.yaml", "hooks/compose.tmpl", "notes/composer.json"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p), nil, 0o644))
	}
	found, err := composeFiles(root)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"hooks/compose.yaml", "ops/docker-compose.prod.yml", "x/compose.override.yaml"}, found)
}

type composeDoc struct {
	Services map[string]struct {
		Image           string   `yaml:"image"`
		Restart         string   `yaml:"restart"`
		StopSignal      string   `yaml:"stop_signal"`
		StopGracePeriod string   `yaml:"stop_grace_period"`
		Environment     []string `yaml:"environment"`
		Ports           []string `yaml:"ports"`
		Healthcheck     struct {
			Test     []string `yaml:"test"`
			Interval string   `yaml:"interval"`
			Timeout  string   `yaml:"timeout"`
			Retries  int      `yaml:"retries"`
		} `yaml:"healthcheck"`
	} `yaml:"services"`
}

// testTimings are the timings the renderers are checked against: production
// and the scaled ones the tests and the rehearsal run.
var testTimings = map[string]infra.Timing{
	"prod":       infra.Prod(),
	"scaled 0.2": infra.Prod().Scaled(0.2),
	"scaled 0.4": infra.Prod().Scaled(0.4),
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	require.NoError(t, err, "parse %q", s)
	return d
}

func TestComposeFollowsTiming(t *testing.T) {
	for name, timing := range testTimings {
		t.Run(name, func(t *testing.T) {
			out, err := RenderCompose(timing)
			require.NoError(t, err)
			var doc composeDoc
			require.NoError(t, yaml.Unmarshal(out, &doc))
			require.Len(t, doc.Services, len(Roles))
			for _, role := range Roles {
				svc, ok := doc.Services[role]
				require.True(t, ok, "service %s", role)
				assert.Equal(t, timing.StopGracePeriod, mustDuration(t, svc.StopGracePeriod), "%s stop_grace_period", role)
				assert.Equal(t, "SIGTERM", svc.StopSignal, role)
				assert.Equal(t, timing.ContainerHealthInterval, mustDuration(t, svc.Healthcheck.Interval), "%s healthcheck interval", role)
				assert.Equal(t, timing.ContainerHealthTimeout, mustDuration(t, svc.Healthcheck.Timeout), "%s healthcheck timeout", role)
				assert.Equal(t, timing.UnhealthyThreshold, svc.Healthcheck.Retries, "%s healthcheck retries", role)
				assert.Equal(t, []string{"CMD", "/service", "check"}, svc.Healthcheck.Test, role)
				assert.Equal(t, "${MYTHEX_IMAGE_PREFIX:-mythex}/"+role+":${MYTHEX_VERSION:?set MYTHEX_VERSION to the release to run}", svc.Image, role)
				for _, kv := range timing.DrainConfig().Environ() {
					assert.Contains(t, svc.Environment, kv, "%s environment", role)
				}
				assert.Contains(t, svc.Environment, "MYTHEX_ROLE="+role)
				require.Len(t, svc.Ports, 1, role)
				if role == BalancerRole {
					assert.Equal(t, "${MYTHEX_BIND:-0.0.0.0}:${MYTHEX_APP_PORT:?set MYTHEX_APP_PORT to the target group's port}:8080", svc.Ports[0])
				} else {
					assert.Equal(t, "127.0.0.1::8080", svc.Ports[0], "%s is published on loopback only", role)
				}
			}
		})
	}
}

// The real compose accepts the rendered file and resolves it as intended.
func TestComposeConfigAcceptsDefinition(t *testing.T) {
	needs.Have(t, needs.Docker)
	compose, err := exec.LookPath("docker-compose")
	args := []string{}
	if err != nil {
		compose, args = "docker", []string{"compose"}
	}
	dir := t.TempDir()
	require.NoError(t, WriteRelease(dir, infra.Prod().Scaled(0.2)))
	cmd := exec.Command(compose, append(args, "-p", "hookstestconfig", "-f", filepath.Join(dir, ComposeFile), "config")...)
	cmd.Env = append(os.Environ(), "MYTHEX_VERSION=v7", "MYTHEX_APP_PORT=18080", "MYTHEX_IMAGE_PREFIX=registry.example/mythex")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "image: registry.example/mythex/publish-worker:v7")
	assert.Regexp(t, `18080:8080`, string(out))

	cmd = exec.Command(compose, append(args, "-p", "hookstestconfig", "-f", filepath.Join(dir, ComposeFile), "config")...)
	cmd.Env = append(os.Environ(), "MYTHEX_APP_PORT=18080")
	out, err = cmd.CombinedOutput()
	require.Error(t, err, "compose must refuse to run without a version")
	assert.Contains(t, string(out), "set MYTHEX_VERSION to the release to run")
}

func TestRenderRefusesUnusableTiming(t *testing.T) {
	fractionalGrace := infra.Prod()
	fractionalGrace.StopGracePeriod += 500 * time.Millisecond
	tooShortGrace := infra.Prod()
	tooShortGrace.StopGracePeriod = 20 * time.Second
	subMillisecond := infra.Prod().Scaled(0.2)
	subMillisecond.LockWait += time.Microsecond
	twoSlots := infra.Prod()
	twoSlots.Slots, twoSlots.RegisteredSlots = 2, 2
	renderers := map[string]func(infra.Timing) ([]byte, error){
		"compose": RenderCompose, "timing.env": RenderTimingEnv, "timer": RenderTimer,
	}
	tests := []struct {
		name    string
		timing  infra.Timing
		refused []string // renderers that must refuse
		want    []string
	}{
		{"grace not whole seconds", fractionalGrace, []string{"compose"}, []string{"StopGracePeriod 40.5s must be whole seconds"}},
		{"drain does not fit the grace period", tooShortGrace, []string{"compose", "timing.env", "timer"}, []string{"drain-fits-grace", "StopGracePeriod 20s"}},
		{"finer than a millisecond", subMillisecond, []string{"compose", "timing.env", "timer"}, []string{"LockWait 36.000001s must be whole milliseconds"}},
		{"two slots", twoSlots, []string{"compose", "timing.env", "timer"}, []string{"the hooks run one slot a server, and Slots is 2: the slots design (docs/capacity.md) is not built into them"}},
	}
	for _, tt := range tests {
		for rname, render := range renderers {
			t.Run(tt.name+"/"+rname, func(t *testing.T) {
				out, err := render(tt.timing)
				if !slices.Contains(tt.refused, rname) {
					assert.NoError(t, err)
					return
				}
				require.Error(t, err)
				assert.Nil(t, out)
				for _, w := range tt.want {
					assert.Contains(t, err.Error(), w)
				}
			})
		}
	}
}

func TestTimingEnvFollowsTiming(t *testing.T) {
	for name, timing := range testTimings {
		t.Run(name, func(t *testing.T) {
			out, err := RenderTimingEnv(timing)
			require.NoError(t, err)
			// Read as the servers read it: lib.sh's load_timing.
			res := loadTiming(t, out)
			require.Equal(t, 0, res.code, "stderr:\n%s", res.stderr)
			env := res.values
			ms := func(key string) time.Duration {
				n, err := strconv.ParseInt(env[key], 10, 64)
				require.NoError(t, err, key)
				return time.Duration(n) * time.Millisecond
			}
			assert.Equal(t, timing.LockWait, ms("MYTHEX_LOCK_WAIT_MS"))
			assert.Equal(t, timing.StartTimeout, ms("MYTHEX_START_TIMEOUT_MS"))
			assert.Equal(t, timing.StopGracePeriod, ms("MYTHEX_STOP_GRACE_PERIOD_MS"))
			assert.Equal(t, timing.ContainerHealthInterval, ms("MYTHEX_CONTAINER_HEALTH_INTERVAL_MS"))
			assert.Equal(t, timing.ContainerHealthTimeout, ms("MYTHEX_CONTAINER_HEALTH_TIMEOUT_MS"))
			assert.Equal(t, timing.Reentry(), ms("MYTHEX_SETTLE_MS"))
			assert.Equal(t, timing.WatchdogInterval, ms("MYTHEX_WATCHDOG_INTERVAL_MS"))
			assert.Equal(t, timing.DeployHold, ms("MYTHEX_DEPLOY_HOLD_MS"))
			assert.Equal(t, timing.RemoteHold(), ms("MYTHEX_REMOTE_HOLD_MS"))
			assert.Equal(t, strconv.Itoa(timing.WatchdogStrikes), env["MYTHEX_WATCHDOG_STRIKES"])
			assert.Equal(t, infra.HealthPath, env["MYTHEX_HEALTH_PATH"])
			assert.Equal(t, strconv.Itoa(infra.HealthyStatus), env["MYTHEX_HEALTHY_STATUS"])
			assert.Equal(t, strings.Join(Roles, " "), env["MYTHEX_SERVICES"])
			assert.ElementsMatch(t, []string{EnvVersion, EnvAppPort, EnvBind, EnvImagePrefix}, strings.Fields(env["MYTHEX_COMPOSE_VARS"]))
		})
	}
}

func TestTimerRunsEveryWatchdogInterval(t *testing.T) {
	for name, timing := range testTimings {
		t.Run(name, func(t *testing.T) {
			out, err := RenderTimer(timing)
			require.NoError(t, err)
			keys := map[string]string{}
			for _, l := range strings.Split(string(out), "\n") {
				if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
					keys[k] = v
				}
			}
			assert.Equal(t, timing.WatchdogInterval, mustDuration(t, keys["OnUnitActiveSec"]))
			assert.Equal(t, timing.WatchdogInterval, mustDuration(t, keys["OnActiveSec"]))
			assert.Less(t, mustDuration(t, keys["AccuracySec"]), timing.WatchdogInterval)
			assert.Equal(t, "mythex-watchdog.service", keys["Unit"])
		})
	}
}

// No script types a number of the contract: each one it needs comes from
// timing.env. Every production duration, in seconds and in milliseconds, is
// looked for in every script line that is not a comment. Numbers below 10 are
// too common to tell apart (exit codes, regex bounds), and 1000 is the
// scripts' milliseconds-per-second.
func TestScriptsTypeNoContractNumber(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range []time.Duration{infra.Prod().HealthCheckInterval, infra.Prod().HealthCheckTimeout,
		infra.Prod().NodeSkew, infra.Prod().Drain, infra.Prod().ShutdownTimeout, infra.Prod().KillMargin,
		infra.Prod().StopGracePeriod, infra.Prod().DeregistrationDelay, infra.Prod().LBIdleTimeout,
		infra.Prod().AppKeepAlive, infra.Prod().ContainerHealthInterval, infra.Prod().StartTimeout,
		infra.Prod().LockWait, infra.Prod().WatchdogInterval, infra.Prod().MaxPlannedDowntime} {
		for _, n := range []int64{int64(f / time.Second), int64(f / time.Millisecond)} {
			if n >= 10 && n != 1000 {
				seen[strconv.FormatInt(n, 10)] = true
			}
		}
	}
	require.Contains(t, seen, "120", "the lock wait is among the numbers looked for")
	// Lines whose number is not a duration, though it equals one.
	notDurations := map[string]bool{
		"readonly EXIT_LOCKED=75": true, // sysexits' EX_TEMPFAIL
	}
	for _, script := range scripts(t) {
		for i, line := range strings.Split(string(mustRead(t, script)), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") || notDurations[strings.TrimSpace(line)] {
				continue
			}
			for n := range seen {
				// 10#… is bash's base-10 prefix, not a number.
				re := regexp.MustCompile(`(^|[^0-9A-Za-z_.])` + n + `([^0-9A-Za-z_#]|$)`)
				assert.False(t, re.MatchString(line), "%s:%d types %s, a number of the timing contract: %q", script, i+1, n, line)
			}
		}
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	require.NoError(t, err)
	return b
}

// scripts lists hooks/'s shell scripts: every file starting with a shebang.
func scripts(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		if bytes.HasPrefix(mustRead(t, e.Name()), []byte("#!")) {
			out = append(out, e.Name())
		}
	}
	require.Subset(t, out, []string{"deploy", "watchdog", "bootstrap", "remote-deploy", "lib.sh"})
	return out
}

func TestShellcheck(t *testing.T) {
	needs.Have(t, needs.Shellcheck)
	path, err := exec.LookPath("shellcheck")
	require.NoError(t, err, "shellcheck is needed (apt-get install shellcheck)")
	out, err := exec.Command(path, scripts(t)...).CombinedOutput()
	assert.NoError(t, err, "shellcheck:\n%s", out)
}
