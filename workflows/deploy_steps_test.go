package workflows

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
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
// (bash -e), with the real AWS CLI talking to a CloudWatch on loopback.

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

// runStep runs a step's script as the runner would: bash -e, in the
// repository, with env on top of the test's environment.
func runStep(t *testing.T, s step, env map[string]string) (int, string) {
	t.Helper()
	cmd := exec.Command("bash", "-e", "-c", s.Run)
	cmd.Dir = root
	// env replaces the test's own variables; an empty value unsets one.
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
// in whichever protocol the AWS CLI at hand speaks: Smithy RPC v2 CBOR, AWS
// JSON 1.0 or the query protocol with XML, which CloudWatch has each served
// (botocore picks the first of its model's protocols that it supports).
type fakeCloudWatch struct {
	points []datapoint
	mu     sync.Mutex
	calls  []string
}

var queryIDs = []string{"requests", "elb502", "elb504", "elb503", "target5xx"}

func (f *fakeCloudWatch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.calls = append(f.calls, r.Header.Get("Content-Type")+" "+r.URL.Path+" "+firstLine(body))
	f.mu.Unlock()
	switch ct := r.Header.Get("Content-Type"); {
	case ct == "application/cbor":
		if !strings.HasSuffix(r.URL.Path, "/operation/GetMetricData") {
			http.Error(w, "unexpected operation "+r.URL.Path, http.StatusBadRequest)
			return
		}
		w.Header().Set("smithy-protocol", "rpc-v2-cbor")
		w.Header().Set("Content-Type", "application/cbor")
		_, _ = w.Write(f.cbor())
	case ct == "application/x-amz-json-1.0":
		if r.Header.Get("X-Amz-Target") != "GraniteServiceVersion20100801.GetMetricData" {
			http.Error(w, "unexpected target "+r.Header.Get("X-Amz-Target"), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_, _ = w.Write(f.json())
	case strings.HasPrefix(ct, "application/x-www-form-urlencoded"):
		if !bytes.Contains(body, []byte("Action=GetMetricData")) {
			http.Error(w, "unexpected action", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/xml")
		_, _ = io.WriteString(w, f.xml())
	default:
		http.Error(w, "unsupported protocol "+ct, http.StatusBadRequest)
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(string(b), "\n")
	if len(s) > 80 || strings.ContainsFunc(s, func(r rune) bool { return r < ' ' }) {
		return fmt.Sprintf("(%d bytes)", len(b))
	}
	return s
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

// json is the AWS JSON 1.0 answer: timestamps in epoch seconds.
func (f *fakeCloudWatch) json() []byte {
	type result struct {
		ID         string `json:"Id"`
		Label      string
		Timestamps []float64
		Values     []float64
		StatusCode string
	}
	out := struct {
		MetricDataResults []result
		Messages          []any
	}{Messages: []any{}}
	m := f.byID()
	for _, id := range queryIDs {
		r := result{ID: id, Label: id, Timestamps: []float64{}, Values: []float64{}, StatusCode: "Complete"}
		for _, p := range m[id] {
			r.Timestamps = append(r.Timestamps, float64(p.at.Unix()))
			r.Values = append(r.Values, p.value)
		}
		out.MetricDataResults = append(out.MetricDataResults, r)
	}
	b, _ := json.Marshal(out)
	return b
}

func (f *fakeCloudWatch) xml() string {
	var b strings.Builder
	b.WriteString(`<GetMetricDataResponse xmlns="http://monitoring.amazonaws.com/doc/2010-08-01/"><GetMetricDataResult><MetricDataResults>`)
	m := f.byID()
	for _, id := range queryIDs {
		fmt.Fprintf(&b, "<member><Id>%s</Id><Label>%s</Label><Timestamps>", id, id)
		for _, p := range m[id] {
			fmt.Fprintf(&b, "<member>%s</member>", p.at.UTC().Format(time.RFC3339))
		}
		b.WriteString("</Timestamps><Values>")
		for _, p := range m[id] {
			fmt.Fprintf(&b, "<member>%g</member>", p.value)
		}
		b.WriteString("</Values><StatusCode>Complete</StatusCode></member>")
	}
	b.WriteString(`</MetricDataResults><Messages/></GetMetricDataResult><ResponseMetadata><RequestId>00000000-0000-4000-8000-000000000000</RequestId></ResponseMetadata></GetMetricDataResponse>`)
	return b.String()
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

// awsCLI is a bin directory whose `aws` runs the real AWS CLI against
// endpoint, with throwaway credentials; the arguments are the step's own.
func awsCLI(t *testing.T, endpoint string) (string, map[string]string) {
	t.Helper()
	real, err := exec.LookPath("aws")
	require.NoError(t, err, "the AWS CLI is needed: apt-get install awscli")
	bin := t.TempDir()
	script := fmt.Sprintf("#!/usr/bin/env bash\nexec %q \"$@\" --endpoint-url %q\n", real, endpoint)
	require.NoError(t, os.WriteFile(filepath.Join(bin, "aws"), []byte(script), 0o755))
	return bin, map[string]string{
		"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
		"AWS_SESSION_TOKEN": "", "AWS_PROFILE": "", "AWS_DEFAULT_PROFILE": "", "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1", "AWS_CONFIG_FILE": filepath.Join(bin, "none"),
		"AWS_SHARED_CREDENTIALS_FILE": filepath.Join(bin, "none"),
	}
}

// The deploy job's count of the rollout's 502s: the real step, the real AWS
// CLI, CloudWatch on loopback. It writes the table to the job summary and
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

	start := time.Now().UTC().Add(-4 * time.Minute).Truncate(time.Second)
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
			bin, env := awsCLI(t, srv.URL)
			tmp := t.TempDir()
			summary := filepath.Join(tmp, "summary.md")
			env["PATH"] = bin + string(os.PathListSeparator) + os.Getenv("PATH")
			env["RUNNER_TEMP"] = tmp
			env["GITHUB_STEP_SUMMARY"] = summary
			env["ROLLOUT_START"] = start.Format(time.RFC3339)
			env["ALB_ARN_SUFFIX"] = "app/mythex-alb-1a2b3c4/50dc6c495c0c9188"
			env["TARGET_GROUP_ARN_SUFFIX"] = "targetgroup/mythex-tg-5d6e7f8/73e2d6bc24d8a067"
			env["MAX_502"] = tc.max502
			env["MAX_504"] = "0"
			env["METRICS_DELAY_SECONDS"] = "0" // the loopback CloudWatch has every minute at once

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
