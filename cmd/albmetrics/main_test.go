package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/aws/smithy-go/encoding/cbor"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/internal/cmdflag"
)

const (
	lbSuffix = "app/mythex-alb-1a2b3c4/50dc6c495c0c9188"
	tgSuffix = "targetgroup/mythex-tg-5d6e7f8/73e2d6bc24d8a067"
)

// minute is 12:MM on the test's day.
func minute(m int) time.Time { return time.Date(2026, 11, 30, 12, m, 0, 0, time.UTC) }

// cloudWatch is a loopback stand-in for CloudWatch's GetMetricData as
// aws-sdk-go-v2 speaks it (Smithy RPC v2 CBOR): it decodes the request the
// SDK sends, answers from what it has "published", and pages its answer
// pageSize datapoints at a time, as CloudWatch may.
type cloudWatch struct {
	t        *testing.T
	pageSize int

	mu sync.Mutex
	// published[id][minute] is a datapoint CloudWatch has published.
	published map[string]map[time.Time]float64
	// onCall, when set, runs before the n-th call (1-based) is answered.
	onCall func(n int, cw *cloudWatch)
	calls  int
	// asked is the decoded request of each call.
	asked []cbor.Map
	// deny answers every call with AccessDenied.
	deny bool
}

func newCloudWatch(t *testing.T) *cloudWatch {
	return &cloudWatch{t: t, pageSize: 4, published: map[string]map[time.Time]float64{}}
}

func (cw *cloudWatch) publish(id string, at time.Time, v float64) {
	if cw.published[id] == nil {
		cw.published[id] = map[time.Time]float64{}
	}
	cw.published[id][at] = v
}

// callCount is how many GetMetricData calls have been answered.
func (cw *cloudWatch) callCount() int {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.calls
}

func (cw *cloudWatch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil || r.Method != http.MethodPost ||
		r.URL.Path != "/service/GraniteServiceVersion20100801/operation/GetMetricData" ||
		r.Header.Get("Smithy-Protocol") != "rpc-v2-cbor" ||
		!strings.Contains(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential=AKIDJOBCREDENTIALS/") {
		cw.t.Errorf("not a signed GetMetricData call: %s %s %v", r.Method, r.URL.Path, r.Header)
		http.Error(w, "unexpected", http.StatusNotFound)
		return
	}
	v, err := cbor.Decode(body)
	if err != nil {
		cw.t.Errorf("request body is not CBOR: %v", err)
		http.Error(w, "bad", http.StatusBadRequest)
		return
	}
	req := v.(cbor.Map)
	cw.mu.Lock()
	cw.calls++
	n := cw.calls
	if _, paging := req["NextToken"]; !paging {
		cw.asked = append(cw.asked, req)
		if cw.onCall != nil {
			cw.onCall(n, cw)
		}
	}
	w.Header().Set("Smithy-Protocol", "rpc-v2-cbor")
	w.Header().Set("Content-Type", "application/cbor")
	if cw.deny {
		cw.mu.Unlock()
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write(cbor.Encode(cbor.Map{"__type": cbor.String("com.amazonaws.cloudwatch#AccessDenied"),
			"message": cbor.String("User: arn:aws:sts::123456789012:assumed-role/deploy/x is not authorized to perform: cloudwatch:GetMetricData")}))
		return
	}
	resp := cw.answer(req)
	cw.mu.Unlock()
	_, _ = w.Write(cbor.Encode(resp))
}

type point struct {
	id string
	at time.Time
	v  float64
}

// answer lists every published point of the asked queries inside
// [StartTime, EndTime), in query then time order, one page of it.
func (cw *cloudWatch) answer(req cbor.Map) cbor.Map {
	start, err := cbor.AsTime(req["StartTime"])
	require.NoError(cw.t, err)
	end, err := cbor.AsTime(req["EndTime"])
	require.NoError(cw.t, err)
	var ids []string
	var points []point
	for _, q := range req["MetricDataQueries"].(cbor.List) {
		id := string(q.(cbor.Map)["Id"].(cbor.String))
		ids = append(ids, id)
		var at []time.Time
		for m := range cw.published[id] {
			if !m.Before(start) && m.Before(end) {
				at = append(at, m)
			}
		}
		sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
		for _, m := range at {
			points = append(points, point{id, m, cw.published[id][m]})
		}
	}
	from := 0
	if tok, ok := req["NextToken"]; ok {
		_, err := fmt.Sscanf(string(tok.(cbor.String)), "from-%d", &from)
		require.NoError(cw.t, err)
	}
	to := min(from+cw.pageSize, len(points))
	results := cbor.List{}
	for _, id := range ids {
		ts, vs := cbor.List{}, cbor.List{}
		for _, p := range points[from:to] {
			if p.id == id {
				ts = append(ts, &cbor.Tag{ID: 1, Value: cbor.Float64(float64(p.at.Unix()))})
				vs = append(vs, cbor.Float64(p.v))
			}
		}
		// Every page names every query, as CloudWatch does.
		status := "Complete"
		if to < len(points) {
			status = "PartialData"
		}
		results = append(results, cbor.Map{"Id": cbor.String(id), "Label": cbor.String(id), "Timestamps": ts, "Values": vs,
			"StatusCode": cbor.String(status)})
	}
	resp := cbor.Map{"MetricDataResults": results, "Messages": cbor.List{}}
	if to < len(points) {
		resp["NextToken"] = cbor.String(fmt.Sprintf("from-%d", to))
	}
	return resp
}

// start serves cw on loopback and points the SDK at it, with credentials
// and a region as configure-aws-credentials leaves them.
func (cw *cloudWatch) start(t *testing.T) {
	srv := httptest.NewServer(cw)
	t.Cleanup(srv.Close)
	t.Setenv("AWS_ENDPOINT_URL", srv.URL)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDJOBCREDENTIALS")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_SESSION_TOKEN", "session")
	t.Setenv("AWS_REGION", "us-east-1")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

// rollout publishes a rollout's minutes 12:00–12:04: requests every minute,
// target 5XX at 12:01, and 502s as given.
func rollout(cw *cloudWatch, elb502 map[int]float64) {
	for m, n := range []float64{11980, 12011, 12003, 11876, 12040} {
		cw.publish("requests", minute(m), n)
	}
	cw.publish("target5xx", minute(1), 2)
	for m, n := range elb502 {
		cw.publish("elb502", minute(m), n)
	}
}

func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// window is a rollout from 12:00:07 to 12:04:51: minutes 12:00 to 12:05.
func window(extra ...string) []string {
	return append([]string{"-load-balancer", lbSuffix, "-target-group", tgSuffix,
		"-since", "2026-11-30T12:00:07Z", "-until", "2026-11-30T12:04:51Z", "-wait", "0s", "-poll", "10ms"}, extra...)
}

const tableTop = "| | requests | 502 | 504 | 503 | target 5XX |\n|---|---:|---:|---:|---:|---:|\n"

func TestAsksForTheRolloutsWholeMinutes(t *testing.T) {
	cw := newCloudWatch(t)
	rollout(cw, nil)
	cw.start(t)
	code, _, stderr := runCmd(t, window()...)
	require.Equal(t, 0, code, stderr)
	require.Len(t, cw.asked, 1)
	req := cw.asked[0]
	start, _ := cbor.AsTime(req["StartTime"])
	end, _ := cbor.AsTime(req["EndTime"])
	assert.Equal(t, minute(0), start.UTC(), "the start's minute counts whole")
	assert.Equal(t, minute(5), end.UTC(), "the end's minute counts whole")
	assert.Equal(t, cbor.String("TimestampAscending"), req["ScanBy"])

	type q struct {
		ID, Metric, Stat string
		Period           int64
		Dims             map[string]string
	}
	var got []q
	for _, v := range req["MetricDataQueries"].(cbor.List) {
		m := v.(cbor.Map)
		ms := m["MetricStat"].(cbor.Map)
		metric := ms["Metric"].(cbor.Map)
		assert.Equal(t, cbor.String("AWS/ApplicationELB"), metric["Namespace"])
		assert.Equal(t, cbor.Bool(true), m["ReturnData"])
		dims := map[string]string{}
		for _, d := range metric["Dimensions"].(cbor.List) {
			dims[string(d.(cbor.Map)["Name"].(cbor.String))] = string(d.(cbor.Map)["Value"].(cbor.String))
		}
		period, err := cbor.AsInt64(ms["Period"])
		require.NoError(t, err)
		got = append(got, q{string(m["Id"].(cbor.String)), string(metric["MetricName"].(cbor.String)), string(ms["Stat"].(cbor.String)), period, dims})
	}
	lb := map[string]string{"LoadBalancer": lbSuffix}
	assert.Equal(t, []q{
		{"requests", "RequestCount", "Sum", 60, lb},
		{"elb502", "HTTPCode_ELB_502_Count", "Sum", 60, lb},
		{"elb504", "HTTPCode_ELB_504_Count", "Sum", 60, lb},
		{"elb503", "HTTPCode_ELB_503_Count", "Sum", 60, lb},
		{"target5xx", "HTTPCode_Target_5XX_Count", "Sum", 60, map[string]string{"LoadBalancer": lbSuffix, "TargetGroup": tgSuffix}},
	}, got)
}

func TestWindowOnAMinuteStaysPut(t *testing.T) {
	w := NewWindow(lbSuffix, tgSuffix, minute(0), minute(5))
	assert.Equal(t, minute(0), w.Start)
	assert.Equal(t, minute(5), w.End)
	assert.Len(t, w.Minutes(), 5)
}

func TestReport(t *testing.T) {
	tests := []struct {
		name      string
		elb502    map[int]float64
		args      []string
		code      int
		rows      []string
		verdict   string
		stderrHas string
	}{
		{
			name: "no 502", code: 0,
			rows:    []string{"| rollout | 59910 | 0 | 0 | 0 | 2 |", "| 12:01Z | 12011 | 0 | 0 | 0 | 2 |"},
			verdict: "**Passed:** 0 502 (threshold 0), 0 504 (threshold 0).",
		},
		{
			name: "the article's 10 502s", elb502: map[int]float64{2: 6, 3: 4}, code: 1,
			rows: []string{"| rollout | 59910 | 10 | 0 | 0 | 2 |", "| 12:01Z | 12011 | 0 | 0 | 0 | 2 |",
				"| 12:02Z | 12003 | 6 | 0 | 0 | 0 |", "| 12:03Z | 11876 | 4 | 0 | 0 | 0 |"},
			verdict:   "**Failed:** 10 502 above the threshold 0. Which server and which phase: `go run ./cmd/alblogs -since 2026-11-30T12:00:00Z -until 2026-11-30T12:05:00Z LOGS`",
			stderrHas: "the rollout made requests reach nothing: 10 502 above the threshold 0",
		},
		{
			name: "within a configured threshold", elb502: map[int]float64{2: 6, 3: 4}, args: []string{"-max-502", "10"}, code: 0,
			rows: []string{"| rollout | 59910 | 10 | 0 | 0 | 2 |", "| 12:01Z | 12011 | 0 | 0 | 0 | 2 |",
				"| 12:02Z | 12003 | 6 | 0 | 0 | 0 |", "| 12:03Z | 11876 | 4 | 0 | 0 | 0 |"},
			verdict: "**Passed:** 10 502 (threshold 10), 0 504 (threshold 0).",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cw := newCloudWatch(t)
			rollout(cw, tc.elb502)
			cw.start(t)
			code, out, stderr := runCmd(t, window(tc.args...)...)
			assert.Equal(t, tc.code, code, stderr)
			assert.Contains(t, out, "CloudWatch `AWS/ApplicationELB`, 1-minute sums, 2026-11-30T12:00:00Z to 2026-11-30T12:05:00Z (the rollout's minutes, each with its RequestCount published), load balancer `"+lbSuffix+"`, target group `"+tgSuffix+"`.")
			assert.Contains(t, out, tableTop+strings.Join(tc.rows, "\n")+"\n\n", "the table, every minute with a 5XX and no other")
			assert.Contains(t, out, tc.verdict)
			assert.Contains(t, out, "never show here")
			if tc.stderrHas != "" {
				assert.Contains(t, stderr, tc.stderrHas)
			}
			assert.Greater(t, cw.callCount(), 1, "the answer came in pages, every page read")
		})
	}
}

// The defect: RequestCount stops two minutes before the window ends (not
// published yet), and no 502 datapoint is in the answer. That is no "0 502":
// albmetrics waits its bound and fails, naming the minutes, and never passes.
func TestAMissingMinuteNeverPasses(t *testing.T) {
	cw := newCloudWatch(t)
	for m, n := range []float64{11980, 12011, 12003} {
		cw.publish("requests", minute(m), n)
	}
	cw.start(t)
	started := time.Now()
	code, out, stderr := runCmd(t, window("-wait", "300ms", "-poll", "50ms")...)
	assert.Equal(t, 1, code)
	assert.Empty(t, out, "no summary, no \"Passed\", from an incomplete answer")
	assert.NotContains(t, stderr, "Passed")
	assert.Contains(t, stderr, "albmetrics: not judged: after waiting 300ms, CloudWatch has not published the whole window 2026-11-30T12:00:00Z–2026-11-30T12:05:00Z: no RequestCount datapoint for minute(s) 12:03Z, 12:04Z")
	assert.Contains(t, stderr, "asking again in 50ms", "it waited for the late minutes before giving up")
	assert.GreaterOrEqual(t, time.Since(started), 250*time.Millisecond, "it waited out its bound")
	assert.Greater(t, cw.callCount(), 1)
}

// A late minute that CloudWatch publishes while albmetrics waits is counted:
// the 12:04 datapoints (requests and 3 502s) appear before the third call.
func TestALateMinuteIsWaitedFor(t *testing.T) {
	cw := newCloudWatch(t)
	for m, n := range []float64{11980, 12011, 12003, 11876} {
		cw.publish("requests", minute(m), n)
	}
	cw.onCall = func(n int, cw *cloudWatch) {
		if n == 3 {
			cw.publish("requests", minute(4), 12040)
			cw.publish("elb502", minute(4), 3)
		}
	}
	cw.start(t)
	code, out, stderr := runCmd(t, window("-wait", "1h", "-poll", "10ms")...)
	assert.Equal(t, 1, code, stderr)
	assert.Contains(t, stderr, "no RequestCount datapoint for minute(s) 12:04Z; asking again in 10ms")
	assert.Contains(t, out, "| rollout | 59910 | 3 | 0 | 0 | 0 |")
	assert.Contains(t, out, "**Failed:** 3 502 above the threshold 0.")
}

func TestCloudWatchRefusing(t *testing.T) {
	cw := newCloudWatch(t)
	cw.deny = true
	cw.start(t)
	code, out, stderr := runCmd(t, window()...)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, stderr, "albmetrics: CloudWatch GetMetricData: ")
	assert.Contains(t, stderr, "AccessDenied")
	assert.Equal(t, 1, strings.Count(strings.TrimSpace(stderr), "\n")+1, "one line: %s", stderr)
}

func TestAWrongAnswerIsRefused(t *testing.T) {
	w := NewWindow(lbSuffix, tgSuffix, minute(0), minute(5))
	cw := newCloudWatch(t)
	rollout(cw, map[int]float64{5: 6})
	cw.publish("target5xx", minute(1), 2.5)
	out := sdkAnswer(cw)
	out.MetricDataResults = out.MetricDataResults[:len(out.MetricDataResults)-1] // target5xx's result lost
	_, _, err := Read(w, out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `no result for query "target5xx" (HTTPCode_Target_5XX_Count)`)

	out = sdkAnswer(cw)
	out.MetricDataResults[1].Timestamps = append(out.MetricDataResults[1].Timestamps, minute(5))
	out.MetricDataResults[1].Values = append(out.MetricDataResults[1].Values, 6)
	out.MetricDataResults[4].Values[0] = 2.5
	_, _, err = Read(w, out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `result "elb502": datapoint at 2026-11-30T12:05:00Z is outside the window 2026-11-30T12:00:00Z–2026-11-30T12:05:00Z`)
	assert.Contains(t, err.Error(), `result "target5xx": value 2.5 at 2026-11-30T12:01:00Z is not a count`)
}

// sdkAnswer is what the SDK returns for the stand-in's published points, as
// one page.
func sdkAnswer(cw *cloudWatch) *cloudwatch.GetMetricDataOutput {
	out := &cloudwatch.GetMetricDataOutput{}
	for _, s := range allSeries {
		r := types.MetricDataResult{Id: aws.String(s.ID), StatusCode: types.StatusCodeComplete}
		var at []time.Time
		for m := range cw.published[s.ID] {
			at = append(at, m)
		}
		sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
		for _, m := range at {
			r.Timestamps = append(r.Timestamps, m)
			r.Values = append(r.Values, cw.published[s.ID][m])
		}
		out.MetricDataResults = append(out.MetricDataResults, r)
	}
	return out
}

func TestBadFlags(t *testing.T) {
	code, out, stderr := runCmd(t, "-load-balancer", "arn:aws:elasticloadbalancing:x", "-target-group", "tg",
		"-since", "2026-11-30T12:10:00Z", "-until", "2026-11-30T12:00:00Z", "-max-504", "-3", "-poll", "0s")
	assert.Equal(t, 2, code)
	assert.Empty(t, out)
	for _, w := range []string{
		`albmetrics: -load-balancer "arn:aws:elasticloadbalancing:x" must be an ALB's arnSuffix, app/NAME/ID`,
		`albmetrics: -target-group "tg" must be a target group's arnSuffix`,
		"albmetrics: -until 2026-11-30T12:00:00Z must not be before -since 2026-11-30T12:10:00Z",
		"albmetrics: -max-504 -3 must not be negative",
		"albmetrics: -poll 0s must be positive",
	} {
		assert.Contains(t, stderr, w)
	}
}

// -h lists the command's own flags and no other package's, on stdout.
func TestUsageIsOwnFlags(t *testing.T) {
	code, out, stderr := runCmd(t, "-h")
	assert.Equal(t, 0, code)
	assert.Empty(t, stderr)
	assert.Contains(t, out, "usage: albmetrics -load-balancer SUFFIX")
	assert.Equal(t, []string{"call-timeout", "load-balancer", "max-502", "max-504", "poll", "since", "target-group", "until", "wait"}, cmdflag.Listed(out))

	code, out, stderr = runCmd(t, "-no-such-flag")
	assert.Equal(t, 2, code)
	assert.Empty(t, out)
	assert.Contains(t, stderr, "flag provided but not defined: -no-such-flag")
}
