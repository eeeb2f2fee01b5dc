package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	lbSuffix = "app/mythex-alb-1a2b3c4/50dc6c495c0c9188"
	tgSuffix = "targetgroup/mythex-tg-5d6e7f8/73e2d6bc24d8a067"
)

func runCmd(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, strings.NewReader(stdin), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestRequestAsksForTheRolloutsWholeMinutes(t *testing.T) {
	code, out, stderr := runCmd(t, "", "request", "-load-balancer", lbSuffix, "-target-group", tgSuffix,
		"-since", "2026-11-30T12:00:07Z", "-until", "2026-11-30T13:04:51+01:00")
	require.Equal(t, 0, code, stderr)

	// The API's own field names, as --cli-input-json takes them.
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	assert.Equal(t, "2026-11-30T12:00:00Z", raw["StartTime"], "the start's minute counts whole")
	assert.Equal(t, "2026-11-30T12:05:00Z", raw["EndTime"], "the end's minute counts whole, in UTC")
	assert.Equal(t, "TimestampAscending", raw["ScanBy"])

	type q struct {
		ID, Metric, Stat string
		Period           float64
		Dims             map[string]string
	}
	var got []q
	for _, v := range raw["MetricDataQueries"].([]any) {
		m := v.(map[string]any)
		ms := m["MetricStat"].(map[string]any)
		metric := ms["Metric"].(map[string]any)
		assert.Equal(t, "AWS/ApplicationELB", metric["Namespace"])
		assert.Equal(t, true, m["ReturnData"])
		dims := map[string]string{}
		for _, d := range metric["Dimensions"].([]any) {
			dims[d.(map[string]any)["Name"].(string)] = d.(map[string]any)["Value"].(string)
		}
		got = append(got, q{m["Id"].(string), metric["MetricName"].(string), ms["Stat"].(string), ms["Period"].(float64), dims})
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

func TestRequestWindowOnAMinuteStaysPut(t *testing.T) {
	req := NewRequest(lbSuffix, tgSuffix, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), time.Date(2026, 11, 30, 12, 5, 0, 0, time.UTC))
	assert.Equal(t, time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), req.StartTime)
	assert.Equal(t, time.Date(2026, 11, 30, 12, 5, 0, 0, time.UTC), req.EndTime)
}

func TestRequestRefusesBadFlags(t *testing.T) {
	code, out, stderr := runCmd(t, "", "request", "-load-balancer", "arn:aws:elasticloadbalancing:x", "-target-group", "tg",
		"-since", "2026-11-30T12:10:00Z", "-until", "2026-11-30T12:00:00Z")
	assert.Equal(t, 2, code)
	assert.Empty(t, out)
	for _, w := range []string{
		`-load-balancer "arn:aws:elasticloadbalancing:x" must be an ALB's arnSuffix, app/NAME/ID`,
		`-target-group "tg" must be a target group's arnSuffix`,
		"-until 2026-11-30T12:00:00Z must not be before -since 2026-11-30T12:10:00Z",
	} {
		assert.Contains(t, stderr, w)
	}
}

// writeRequest writes the request of a rollout from 12:00:07 to 12:04:51.
func writeRequest(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "request.json")
	code, out, stderr := runCmd(t, "", "request", "-load-balancer", lbSuffix, "-target-group", tgSuffix,
		"-since", "2026-11-30T12:00:07Z", "-until", "2026-11-30T12:04:51Z")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, os.WriteFile(path, []byte(out), 0o600))
	return path
}

// cliAnswer is a get-metric-data answer as the AWS CLI prints it
// (--output json): timestamps in ISO 8601 with an offset, one result per
// query; a series with no datapoint had nothing to count.
func cliAnswer(elb502 string) string {
	return `{
    "MetricDataResults": [
        {"Id": "requests", "Label": "RequestCount", "Timestamps": ["2026-11-30T12:00:00+00:00", "2026-11-30T12:01:00+00:00", "2026-11-30T12:02:00+00:00", "2026-11-30T12:03:00+00:00", "2026-11-30T12:04:00+00:00"], "Values": [11980.0, 12011.0, 12003.0, 11876.0, 12040.0], "StatusCode": "Complete"},
        {"Id": "elb502", "Label": "HTTPCode_ELB_502_Count", ` + elb502 + `, "StatusCode": "Complete"},
        {"Id": "elb504", "Label": "HTTPCode_ELB_504_Count", "Timestamps": [], "Values": [], "StatusCode": "Complete"},
        {"Id": "elb503", "Label": "HTTPCode_ELB_503_Count", "Timestamps": [], "Values": [], "StatusCode": "Complete"},
        {"Id": "target5xx", "Label": "HTTPCode_Target_5XX_Count", "Timestamps": ["2026-11-30T12:01:00+00:00"], "Values": [2.0], "StatusCode": "Complete"}
    ],
    "Messages": []
}`
}

const (
	no502s   = `"Timestamps": [], "Values": []`
	ten502s  = `"Timestamps": ["2026-11-30T12:02:00+00:00", "2026-11-30T12:03:00+00:00"], "Values": [6.0, 4.0]`
	tableTop = "| | requests | 502 | 504 | 503 | target 5XX |\n|---|---:|---:|---:|---:|---:|\n"
)

func TestReport(t *testing.T) {
	req := writeRequest(t)
	tests := []struct {
		name      string
		answer    string
		args      []string
		code      int
		rows      []string
		verdict   string
		stderrHas string
	}{
		{
			name: "no 502", answer: cliAnswer(no502s), code: 0,
			rows:    []string{"| rollout | 59910 | 0 | 0 | 0 | 2 |", "| 12:01Z | 12011 | 0 | 0 | 0 | 2 |"},
			verdict: "**Passed:** 0 502 (threshold 0), 0 504 (threshold 0).",
		},
		{
			name: "the article's 10 502s", answer: cliAnswer(ten502s), code: 1,
			rows: []string{"| rollout | 59910 | 10 | 0 | 0 | 2 |", "| 12:01Z | 12011 | 0 | 0 | 0 | 2 |",
				"| 12:02Z | 12003 | 6 | 0 | 0 | 0 |", "| 12:03Z | 11876 | 4 | 0 | 0 | 0 |"},
			verdict:   "**Failed:** 10 502 above the threshold 0. Which server and which phase: `go run ./cmd/alblogs -since 2026-11-30T12:00:00Z -until 2026-11-30T12:05:00Z LOGS`",
			stderrHas: "the rollout made requests reach nothing: 10 502 above the threshold 0",
		},
		{
			name: "epoch-second timestamps, as AWS CLI v1 prints them", code: 1,
			answer: strings.Replace(cliAnswer(ten502s), `"2026-11-30T12:02:00+00:00", "2026-11-30T12:03:00+00:00"]`, `1796040120, 1796040180.0]`, 1),
			rows: []string{"| rollout | 59910 | 10 | 0 | 0 | 2 |", "| 12:01Z | 12011 | 0 | 0 | 0 | 2 |",
				"| 12:02Z | 12003 | 6 | 0 | 0 | 0 |", "| 12:03Z | 11876 | 4 | 0 | 0 | 0 |"},
			verdict:   "**Failed:** 10 502 above the threshold 0.",
			stderrHas: "10 502 above the threshold 0",
		},
		{
			name: "within a configured threshold", answer: cliAnswer(ten502s), args: []string{"-max-502", "10"}, code: 0,
			rows: []string{"| rollout | 59910 | 10 | 0 | 0 | 2 |", "| 12:01Z | 12011 | 0 | 0 | 0 | 2 |",
				"| 12:02Z | 12003 | 6 | 0 | 0 | 0 |", "| 12:03Z | 11876 | 4 | 0 | 0 | 0 |"},
			verdict: "**Passed:** 10 502 (threshold 10), 0 504 (threshold 0).",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, stderr := runCmd(t, tc.answer, append([]string{"report", "-request", req}, tc.args...)...)
			assert.Equal(t, tc.code, code, stderr)
			assert.Contains(t, out, "CloudWatch `AWS/ApplicationELB`, 1-minute sums, 2026-11-30T12:00:00Z to 2026-11-30T12:05:00Z (the rollout's minutes), load balancer `"+lbSuffix+"`, target group `"+tgSuffix+"`.")
			assert.Contains(t, out, tableTop+strings.Join(tc.rows, "\n")+"\n\n", "the table, every minute with a 5XX and no other")
			assert.Contains(t, out, tc.verdict)
			assert.Contains(t, out, "never show here")
			if tc.stderrHas != "" {
				assert.Contains(t, stderr, tc.stderrHas)
			}
		})
	}
}

func TestReportRefusesAnIncompleteAnswer(t *testing.T) {
	req := writeRequest(t)
	broken := strings.NewReplacer(
		`{"Id": "elb504", "Label": "HTTPCode_ELB_504_Count", "Timestamps": [], "Values": [], "StatusCode": "Complete"},`, "",
		`"Values": [2.0], "StatusCode": "Complete"`, `"Values": [2.5], "StatusCode": "PartialData"`,
		`"2026-11-30T12:02:00+00:00", "2026-11-30T12:03:00+00:00"], "Values": [6.0, 4.0]`, `"2026-11-30T12:05:00+00:00"], "Values": [6.0]`,
		`"Messages": []`, `"Messages": [{"Code": "MaxQueryTimeRangeExceed", "Value": "The query time range exceeds the maximum"}]`,
	).Replace(cliAnswer(ten502s))
	code, out, stderr := runCmd(t, broken, "report", "-request", req)
	assert.Equal(t, 1, code)
	assert.Empty(t, out, "no summary from an answer that cannot be trusted")
	for _, w := range []string{
		"the CloudWatch answer is not a complete answer to the request:",
		"CloudWatch says MaxQueryTimeRangeExceed: The query time range exceeds the maximum",
		`result "elb502": datapoint at 2026-11-30T12:05:00Z is outside the window 2026-11-30T12:00:00Z–2026-11-30T12:05:00Z`,
		`result "target5xx" has StatusCode "PartialData", not Complete`,
		`result "target5xx": value 2.5 at 2026-11-30T12:01:00Z is not a count`,
		`no result for query "elb504" (HTTPCode_ELB_504_Count)`,
	} {
		assert.Contains(t, stderr, w)
	}

	for name, tc := range map[string]struct {
		stdin string
		args  []string
		code  int
		want  string
	}{
		"empty answer":       {"", []string{"-request", req}, 1, "read the get-metric-data answer on stdin: stdin is empty"},
		"not JSON":           {"An error occurred (AccessDenied)", []string{"-request", req}, 1, "read the get-metric-data answer on stdin"},
		"no request":         {cliAnswer(no502s), []string{"-max-502", "-1"}, 2, "-request is required"},
		"negative threshold": {cliAnswer(no502s), []string{"-request", req, "-max-504", "-3"}, 2, "-max-504 -3 must not be negative"},
		"missing request":    {cliAnswer(no502s), []string{"-request", filepath.Join(t.TempDir(), "nope.json")}, 1, "read the request: open "},
	} {
		t.Run(name, func(t *testing.T) {
			code, out, stderr := runCmd(t, tc.stdin, append([]string{"report"}, tc.args...)...)
			assert.Equal(t, tc.code, code)
			assert.Empty(t, out)
			assert.Contains(t, stderr, tc.want)
		})
	}
}
