package workflows

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
)

// The deploy job's own steps, run with bash the way the runner runs a `run:`
// (bash --noprofile --norc -eo pipefail, under deploy.yml's `shell: bash`),
// with the deploy job's albmetrics talking to a CloudWatch on
// loopback.

func exportedOutputs(t *testing.T) []string {
	t.Helper()
	stack, err := infra.LoadStackFile(filepath.Join(root, "Pulumi.prod.yaml"))
	require.NoError(t, err)
	var keys []string
	err = pulumi.RunErr(func(ctx *pulumi.Context) error {
		lb, err := infra.Build(ctx, infra.Prod())
		if err != nil {
			return err
		}
		for k := range lb.Outputs() {
			keys = append(keys, k)
		}
		return nil
	}, pulumi.WithMocks(infra.Project, stack.Stack, &infra.Recorder{}), infra.WithConfig(stack.Config))
	require.NoError(t, err)
	return keys
}

// runnerShell is how the runner runs a `run:` under `shell: bash`, which
// deploy.yml sets for every step (TestDeployRunsEveryStepUnderPipefail):
// the script is a file, {0}.
var runnerShell = []string{"bash", "--noprofile", "--norc", "-eo", "pipefail"}

// runStep runs a step's script as the runner would, in the repository, with
// env on top of the test's environment.
func runStep(t *testing.T, s step, env map[string]string) (int, string) {
	t.Helper()
	return runStepIn(t, s, root, env)
}

// runStepIn runs a step's script in dir; env replaces the test's own
// variables, and an empty value unsets one.
func runStepIn(t *testing.T, s step, dir string, env map[string]string) (int, string) {
	t.Helper()
	script := filepath.Join(t.TempDir(), "step.sh")
	require.NoError(t, os.WriteFile(script, []byte(s.Run), 0o644))
	cmd := exec.Command(runnerShell[0], append(runnerShell[1:], script)...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); env[k] == "" {
			if _, set := env[k]; !set {
				cmd.Env = append(cmd.Env, kv)
			}
		}
	}
	for k, v := range env {
		if v != "" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String()
	}
	require.NoError(t, err, "run step %q", s.Name)
	return 0, out.String()
}

// datapoint is one minute's sum of one query.
type datapoint struct {
	id    string
	at    time.Time
	value float64
}

// fakeCloudWatch answers GetMetricData on loopback with the datapoints given,
// in Smithy RPC v2 CBOR, the protocol aws-sdk-go-v2's CloudWatch client
// speaks.
type fakeCloudWatch struct {
	points []datapoint
	mu     sync.Mutex
	calls  []string
}

var queryIDs = []string{"requests", "elb502", "elb504", "elb503", "target5xx"}

func (f *fakeCloudWatch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	f.mu.Lock()
	f.calls = append(f.calls, r.Header.Get("Content-Type")+" "+r.URL.Path)
	f.mu.Unlock()
	if r.Header.Get("Content-Type") != "application/cbor" || !strings.HasSuffix(r.URL.Path, "/operation/GetMetricData") {
		http.Error(w, "unexpected call "+r.URL.Path, http.StatusBadRequest)
		return
	}
	w.Header().Set("smithy-protocol", "rpc-v2-cbor")
	w.Header().Set("Content-Type", "application/cbor")
	_, _ = w.Write(f.cbor())
}

func (f *fakeCloudWatch) byID() map[string][]datapoint {
	m := map[string][]datapoint{}
	for _, p := range f.points {
		m[p.id] = append(m[p.id], p)
	}
	for _, ps := range m {
		sort.Slice(ps, func(i, j int) bool { return ps[i].at.Before(ps[j].at) })
	}
	return m
}

// cbor encodes the answer in CBOR (RFC 8949): maps with text keys, arrays,
// text, float64 values and epoch-seconds timestamps (tag 1), as Smithy's
// RPC v2 CBOR protocol carries GetMetricData's output.
func (f *fakeCloudWatch) cbor() []byte {
	var b bytes.Buffer
	head := func(major byte, n int) {
		switch {
		case n < 24:
			b.WriteByte(major<<5 | byte(n))
		case n < 256:
			b.WriteByte(major<<5 | 24)
			b.WriteByte(byte(n))
		default:
			b.WriteByte(major<<5 | 25)
			_ = binary.Write(&b, binary.BigEndian, uint16(n))
		}
	}
	text := func(s string) { head(3, len(s)); b.WriteString(s) }
	float := func(v float64) { b.WriteByte(0xfb); _ = binary.Write(&b, binary.BigEndian, math.Float64bits(v)) }
	m := f.byID()
	head(5, 2)
	text("MetricDataResults")
	head(4, len(queryIDs))
	for _, id := range queryIDs {
		head(5, 5)
		text("Id")
		text(id)
		text("Label")
		text(id)
		text("Timestamps")
		head(4, len(m[id]))
		for _, p := range m[id] {
			head(6, 1)
			float(float64(p.at.Unix()))
		}
		text("Values")
		head(4, len(m[id]))
		for _, p := range m[id] {
			float(p.value)
		}
		text("StatusCode")
		text("Complete")
	}
	text("Messages")
	head(4, 0)
	return b.Bytes()
}

// jobAWS is the environment configure-aws-credentials leaves, with
// throwaway credentials, and the SDK pointed at endpoint.
func jobAWS(endpoint, dir string) map[string]string {
	return map[string]string{
		"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
		"AWS_SESSION_TOKEN": "", "AWS_PROFILE": "", "AWS_DEFAULT_PROFILE": "", "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": filepath.Join(dir, "none"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "none"), "AWS_ENDPOINT_URL": endpoint,
	}
}

// The deploy job's count of the rollout's 502s: the real step, CloudWatch on
// loopback, the rollout's end from a stand-in `date`. It writes the table to the job summary and
// fails the job on any 502 or 504 above the threshold (0 unless configured).
func TestRolloutCountsTheLoadBalancersOwnErrors(t *testing.T) {
	w := load(t, "deploy.yml")
	rollout := w.Jobs["rollout"]
	s := findStep(t, rollout, "Count the rollout's 502s and 504s at the load balancer")
	assert.Equal(t, "${{ !cancelled() && steps.start.outputs.time != '' }}", s.If, "it counts after a failed rollout too")
	names := make([]string, len(rollout.Steps))
	for i, st := range rollout.Steps {
		names[i] = st.Name
	}
	assert.Equal(t, []string{"Note the rollout's start", "Roll out, a canary then batches, rolled back on a failure", s.Name}, names[len(names)-3:],
		"the window is the rollout's")
	assert.Equal(t, "${{ vars.DEPLOY_MAX_502 || '0' }}", s.Env["MAX_502"], "502 threshold: config, 0 by default")
	assert.Equal(t, "${{ vars.DEPLOY_MAX_504 || '0' }}", s.Env["MAX_504"], "504 threshold: config, 0 by default")

	start := time.Date(2026, 11, 30, 12, 0, 7, 0, time.UTC)
	end := time.Date(2026, 11, 30, 12, 3, 51, 0, time.UTC)
	minute := func(i int) time.Time { return start.Truncate(time.Minute).Add(time.Duration(i) * time.Minute) }
	requests := []datapoint{{"requests", minute(0), 11980}, {"requests", minute(1), 12011}, {"requests", minute(2), 12003}, {"requests", minute(3), 11876}}
	tests := []struct {
		name    string
		points  []datapoint
		max502  string
		code    int
		summary []string
	}{
		{
			name: "no request reached nothing", points: requests, max502: "0", code: 0,
			summary: []string{"| rollout | 47870 | 0 | 0 | 0 | 0 |", "**Passed:** 0 502 (threshold 0), 0 504 (threshold 0)."},
		},
		{
			name: "the article's first deploy", points: append([]datapoint{{"elb502", minute(1), 6}, {"elb502", minute(2), 4}, {"elb504", minute(2), 1}}, requests...),
			max502: "0", code: 1,
			summary: []string{"| rollout | 47870 | 10 | 1 | 0 | 0 |", "| " + minute(1).Format("15:04Z") + " | 12011 | 6 | 0 | 0 | 0 |",
				"**Failed:** 10 502 above the threshold 0; 1 504 above the threshold 0."},
		},
		{
			name: "within the configured threshold", points: append([]datapoint{{"elb502", minute(1), 6}, {"target5xx", minute(3), 2}}, requests...),
			max502: "6", code: 0,
			summary: []string{"| rollout | 47870 | 6 | 0 | 0 | 2 |", "**Passed:** 6 502 (threshold 6), 0 504 (threshold 0)."},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cw := &fakeCloudWatch{points: tc.points}
			srv := httptest.NewServer(cw)
			defer srv.Close()
			tmp, bin := t.TempDir(), t.TempDir()
			env := jobAWS(srv.URL, tmp)
			require.NoError(t, os.WriteFile(filepath.Join(bin, "date"), []byte("#!/bin/sh\necho "+end.Format(time.RFC3339)+"\n"), 0o755))
			summary := filepath.Join(tmp, "summary.md")
			env["PATH"] = bin + string(os.PathListSeparator) + os.Getenv("PATH")
			env["RUNNER_TEMP"] = tmp
			env["GITHUB_STEP_SUMMARY"] = summary
			env["ROLLOUT_START"] = start.Format(time.RFC3339)
			env["ALB_ARN_SUFFIX"] = "app/mythex-alb-1a2b3c4/50dc6c495c0c9188"
			env["TARGET_GROUP_ARN_SUFFIX"] = "targetgroup/mythex-tg-5d6e7f8/73e2d6bc24d8a067"
			env["MAX_502"] = tc.max502
			env["MAX_504"] = "0"
			env["METRICS_WAIT"] = s.Env["METRICS_WAIT"]
			env["METRICS_POLL"] = s.Env["METRICS_POLL"]

			code, out := runStep(t, s, env)
			assert.Equal(t, tc.code, code, "step output:\n%s", out)
			got, err := os.ReadFile(summary)
			require.NoError(t, err, "the step wrote the job summary; output:\n%s", out)
			for _, want := range tc.summary {
				assert.Contains(t, string(got), want)
			}
			assert.Contains(t, string(got), "load balancer `app/mythex-alb-1a2b3c4/50dc6c495c0c9188`, target group `targetgroup/mythex-tg-5d6e7f8/73e2d6bc24d8a067`")
			cw.mu.Lock()
			defer cw.mu.Unlock()
			assert.Len(t, cw.calls, 1, "one GetMetricData call: %q", cw.calls)
		})
	}
}

// The plugin is installed only if its bytes are the pinned ones.
func TestSessionManagerPluginIsPinnedAndVerified(t *testing.T) {
	s := findStep(t, load(t, "deploy.yml").Jobs["rollout"], "Install the Session Manager plugin")
	assert.Regexp(t, `^\d+\.\d+\.\d+\.\d+$`, s.Env["SESSION_MANAGER_PLUGIN_VERSION"])
	assert.Regexp(t, `^[0-9a-f]{64}$`, s.Env["SESSION_MANAGER_PLUGIN_SHA256"])
	assert.NotContains(t, s.Run, "/latest/", "a fixed version, never latest")

	payload := []byte("a stand-in package\n")
	sum := sha256.Sum256(payload)
	for name, tc := range map[string]struct {
		sha       string
		code      int
		installed bool
	}{
		"pinned bytes": {hex.EncodeToString(sum[:]), 0, true},
		"other bytes":  {s.Env["SESSION_MANAGER_PLUGIN_SHA256"], 1, false},
	} {
		t.Run(name, func(t *testing.T) {
			bin, tmp := t.TempDir(), t.TempDir()
			log := filepath.Join(tmp, "log")
			fake := map[string]string{
				// curl -fsSLo FILE URL: writes the payload, logs the URL.
				"curl":                   `out=""; while (($#)); do case "$1" in -fsSLo) out="$2"; shift 2;; *) echo "curl $1" >>"$LOG"; shift;; esac; done; printf 'a stand-in package\n' >"$out"`,
				"sudo":                   `"$@"`,
				"dpkg":                   `echo "dpkg $*" >>"$LOG"`,
				"session-manager-plugin": `echo "plugin $*" >>"$LOG"`,
			}
			for n, body := range fake {
				require.NoError(t, os.WriteFile(filepath.Join(bin, n), []byte("#!/usr/bin/env bash\nset -eu\n"+body+"\n"), 0o755))
			}
			code, out := runStep(t, s, map[string]string{
				"PATH": bin + string(os.PathListSeparator) + os.Getenv("PATH"), "RUNNER_TEMP": tmp, "LOG": log,
				"SESSION_MANAGER_PLUGIN_VERSION": s.Env["SESSION_MANAGER_PLUGIN_VERSION"], "SESSION_MANAGER_PLUGIN_SHA256": tc.sha,
			})
			assert.Equal(t, tc.code, code, out)
			logged, _ := os.ReadFile(log)
			assert.Contains(t, string(logged), "curl https://s3.amazonaws.com/session-manager-downloads/plugin/"+s.Env["SESSION_MANAGER_PLUGIN_VERSION"]+"/ubuntu_64bit/session-manager-plugin.deb")
			assert.Equal(t, tc.installed, strings.Contains(string(logged), "dpkg -i "), "installed: %s", logged)
		})
	}
}
