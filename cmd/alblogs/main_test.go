package main

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/internal/cmdflag"
)

// httpsEntry is the HTTPS entry of AWS's "Access logs for your Application
// Load Balancer" examples, field for field.
const httpsEntry = `https 2018-07-02T22:23:00.186641Z app/my-loadbalancer/50dc6c495c0c9188 192.168.131.39:2817 10.0.0.1:80 0.086 0.048 0.037 200 200 0 57 "GET https://www.example.com:443/ HTTP/1.1" "curl/7.46.0" ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/my-targets/73e2d6bc24d8a067 "Root=1-58337281-1d84f3d73c47ec4e58577259" "www.example.com" "arn:aws:acm:us-east-2:123456789012:certificate/12345678-1234-1234-1234-123456789012" 1 2018-07-02T22:22:48.364000Z "authenticate,forward" "-" "-" "10.0.0.1:80" "200" "-" "-" TID_1234abcd5678ef90`

// entry is an access-log line in the documented format: time, target,
// processing times, status codes and error_reason as given, every other field
// as in AWS's example. A request that reached nothing has target_processing_time
// and response_processing_time -1 and target_status_code "-".
func entry(at, target, targetTime string, elb int, targetStatus, reason string) string {
	respTime := "0.000"
	if targetTime == "-1" {
		respTime = "-1"
	}
	return strings.Join([]string{
		"https", at, "app/mythex-alb/50dc6c495c0c9188", "203.0.113.7:51234", target,
		"0.000", targetTime, respTime, strconv.Itoa(elb), targetStatus, "212", "0",
		`"GET https://api.mythex.example:443/v1/feed?page=2 HTTP/1.1"`, `"Mozilla/5.0 (X11; Linux x86_64) \"quoted\""`,
		"ECDHE-RSA-AES128-GCM-SHA256", "TLSv1.2",
		"arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/mythex-tg/73e2d6bc24d8a067",
		`"Root=1-58337281-1d84f3d73c47ec4e58577259"`, `"api.mythex.example"`,
		`"arn:aws:acm:us-east-1:123456789012:certificate/12345678-1234-1234-1234-123456789012"`, "0",
		"2026-11-30T12:00:00.000000Z", `"forward"`, `"-"`, `"` + reason + `"`, `"` + target + `"`, `"` + targetStatus + `"`,
		`"-"`, `"-"`, "TID_1234abcd5678ef90",
	}, " ")
}

func TestParseLine(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return v
	}
	tests := []struct {
		name string
		line string
		want Entry
		err  string
	}{
		{
			name: "AWS's HTTPS example",
			line: httpsEntry,
			want: Entry{Time: at("2018-07-02T22:23:00.186641Z"), Target: "10.0.0.1:80", TargetProcessing: 0.048, ELBStatus: 200,
				TargetStatus: "200", Request: "GET https://www.example.com:443/ HTTP/1.1", ErrorReason: "-"},
		},
		{
			name: "a request that reached nothing: -1 processing times, no target status",
			line: entry("2026-11-30T12:03:05.123456Z", "10.0.1.12:8080", "-1", 502, "-", "-"),
			want: Entry{Time: at("2026-11-30T12:03:05.123456Z"), Target: "10.0.1.12:8080", TargetProcessing: -1, ELBStatus: 502,
				TargetStatus: "-", Request: "GET https://api.mythex.example:443/v1/feed?page=2 HTTP/1.1", ErrorReason: "-"},
		},
		{
			name: "fields AWS added after ours are ignored",
			line: httpsEntry + ` "-" "-" "-"`,
			want: Entry{Time: at("2018-07-02T22:23:00.186641Z"), Target: "10.0.0.1:80", TargetProcessing: 0.048, ELBStatus: 200,
				TargetStatus: "200", Request: "GET https://www.example.com:443/ HTTP/1.1", ErrorReason: "-"},
		},
		{name: "cut short", line: strings.Join(strings.Fields(httpsEntry)[:12], " "), err: "12 fields, an ALB access-log line has at least 25"},
		{name: "unclosed quote", line: httpsEntry + ` "cut off`, err: "field 30: quote opened at column"},
		{
			name: "every bad field named",
			line: strings.Replace(strings.Replace(httpsEntry, "2018-07-02T22:23:00.186641Z", "yesterday", 1), " 0.048 0.037 200 ", " fast 0.037 OK ", 1),
			err:  `time "yesterday" is not an ISO 8601 time; target_processing_time "fast" is not a number; elb_status_code "OK" is not a number`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseLine(tc.line)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func writeGzip(t *testing.T, path string, lines ...string) {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := zw.Write([]byte(strings.Join(lines, "\n") + "\n"))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o600))
}

func runCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// A deploy's window, as `aws s3 sync` leaves the logs: two gzip files in the
// dated directories ALB writes.
func TestReportGroupsWhatReachedNothing(t *testing.T) {
	dir := t.TempDir()
	day := filepath.Join(dir, "AWSLogs", "123456789012", "elasticloadbalancing", "us-east-1", "2026", "11", "30")
	a, b := "10.0.1.12:8080", "10.0.2.34:8080"
	writeGzip(t, filepath.Join(day, "123456789012_elasticloadbalancing_us-east-1_app.mythex-alb.50dc6c495c0c9188_20261130T1205Z_198.51.100.1_2abc.log.gz"),
		entry("2026-11-30T11:59:59.999999Z", a, "-1", 502, "-", "-"), // before the window
		entry("2026-11-30T12:00:10.000000Z", a, "0.004", 200, "200", "-"),
		entry("2026-11-30T12:03:05.000000Z", a, "-1", 502, "-", "-"),
		entry("2026-11-30T12:03:06.000000Z", a, "-1", 502, "-", "-"),
		entry("2026-11-30T12:03:07.000000Z", b, "0.002", 200, "200", "-"),
		entry("2026-11-30T12:03:30.000000Z", a, "0.010", 502, "502", "-"), // the app's own 502, passed through
	)
	writeGzip(t, filepath.Join(day, "123456789012_elasticloadbalancing_us-east-1_app.mythex-alb.50dc6c495c0c9188_20261130T1210Z_198.51.100.2_3def.log.gz"),
		entry("2026-11-30T12:07:01.000000Z", b, "-1", 504, "-", "ExampleReason"),
		entry("2026-11-30T12:07:02.000000Z", b, "0.003", 503, "503", "-"), // a draining server's health answer never shows here; a 503 from the app does, and is not lost
		entry("2026-11-30T12:10:00.000000Z", b, "-1", 502, "-", "-"),      // at the window's end: out
	)

	code, out, stderr := runCmd(t, "-since", "2026-11-30T12:00:00Z", "-until", "2026-11-30T12:10:00Z", dir)
	require.Equal(t, 0, code, "stderr: %s", stderr)
	assert.Contains(t, out, "ALB access logs 2026-11-30T12:00:00Z to 2026-11-30T12:10:00Z: 7 requests in 2 file(s); 2 ELB 502, 1 ELB 504 (requests that reached nothing: the balancer answered, target_status_code -), 3 of them with no answer from a target (target_processing_time -1).")
	assert.Contains(t, out, "The targets' own answers, passed through (they reached a server): 1 502, 0 504, 2 5xx in all.")
	row := func(cells ...string) *regexp.Regexp {
		for i, c := range cells {
			cells[i] = regexp.QuoteMeta(c)
		}
		return regexp.MustCompile(`(?m)^` + strings.Join(cells, ` +`) + `$`)
	}
	byTarget := section(t, out, "By target")
	assert.Regexp(t, row(a, "2", "0", "2", "1", "0", "1"), byTarget)
	assert.Regexp(t, row(b, "0", "1", "1", "0", "0", "1"), byTarget)
	byReason := section(t, out, "By error_reason")
	assert.Regexp(t, row("-", "2", "0", "2"), byReason)
	assert.Regexp(t, row("ExampleReason", "0", "1", "1"), byReason)
	byMinute := section(t, out, "By minute")
	assert.Regexp(t, row("2026-11-30T12:03Z", "4", "2", "0"), byMinute)
	assert.Regexp(t, row("2026-11-30T12:07Z", "2", "0", "1"), byMinute)
	assert.NotContains(t, byMinute, "12:00Z", "a minute without a 502 or 504 is left out")
	assert.NotContains(t, out, "11:59", "before the window")
	assert.Contains(t, out, "2026-11-30T12:03:05Z 502 target 10.0.1.12:8080 target_status - target_processing_time -1 error_reason - \"GET https://api.mythex.example:443/v1/feed?page=2 HTTP/1.1\"")
}

// section is the part of the report from the line starting with title to the
// next blank line.
func section(t *testing.T, out, title string) string {
	t.Helper()
	i := strings.Index(out, "\n"+title)
	require.GreaterOrEqual(t, i, 0, "section %q in:\n%s", title, out)
	s := out[i+1:]
	if j := strings.Index(s, "\n\n"); j >= 0 {
		s = s[:j]
	}
	return s
}

func TestNothingLost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.log.gz")
	writeGzip(t, path, entry("2026-11-30T12:00:10.000000Z", "10.0.1.12:8080", "0.004", 200, "200", "-"))
	code, out, _ := runCmd(t, "-since", "2026-11-30T12:00:00Z", "-until", "2026-11-30T12:10:00Z", path)
	require.Equal(t, 0, code)
	assert.Contains(t, out, "1 requests in 1 file(s); 0 ELB 502, 0 ELB 504")
	assert.Contains(t, out, "No request reached nothing in this window.")
	assert.NotContains(t, out, "By target")
}

// The three lines of the defect: a 502 the balancer answered because no target
// did (target_status_code "-"), and a 502 and a 504 the target answered
// itself. CloudWatch counts one HTTPCode_ELB_502_Count, no
// HTTPCode_ELB_504_Count, and two HTTPCode_Target_5XX_Count; so must we.
func TestOnlyWhatReachedNothingIsTheBalancers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.log.gz")
	writeGzip(t, path,
		entry("2026-11-30T12:03:05.000000Z", "10.0.1.12:8080", "-1", 502, "-", "-"),
		entry("2026-11-30T12:03:06.000000Z", "10.0.1.12:8080", "0.010", 502, "502", "-"),
		entry("2026-11-30T12:03:07.000000Z", "10.0.1.12:8080", "30.001", 504, "504", "-"),
	)
	code, out, stderr := runCmd(t, "-since", "2026-11-30T12:00:00Z", "-until", "2026-11-30T12:10:00Z", path)
	require.Equal(t, 0, code, "stderr: %s", stderr)
	assert.Contains(t, out, "3 requests in 1 file(s); 1 ELB 502, 0 ELB 504 (requests that reached nothing")
	assert.Contains(t, out, "The targets' own answers, passed through (they reached a server): 1 502, 1 504, 2 5xx in all.")
	assert.Regexp(t, `(?m)^2026-11-30T12:03Z +3 +1 +0$`, section(t, out, "By minute"))
}

// AWS's documented example entries ("Access logs for your Application Load
// Balancer", Examples), each as one line: every kind parses, and only the
// failed Lambda call, a 502 with target_status_code "-", is the balancer's own.
func TestAWSExampleEntries(t *testing.T) {
	tests := []struct {
		name         string
		line         string
		target       string
		elb          int
		targetStatus string
		reason       string
		own          bool
	}{
		{name: "HTTP", target: "10.0.0.1:80", elb: 200, targetStatus: "200", reason: "-",
			line: `http 2018-07-02T22:23:00.186641Z app/my-loadbalancer/50dc6c495c0c9188 192.168.131.39:2817 10.0.0.1:80 0.000 0.001 0.000 200 200 34 366 "GET http://www.example.com:80/ HTTP/1.1" "curl/7.46.0" - - arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/my-targets/73e2d6bc24d8a067 "Root=1-58337262-36d228ad5d99923122bbe354" "-" "-" 0 2018-07-02T22:22:48.364000Z "forward" "-" "-"`},
		{name: "HTTPS", target: "10.0.0.1:80", elb: 200, targetStatus: "200", reason: "-", line: httpsEntry},
		{name: "HTTP/2", target: "10.0.0.66:9000", elb: 200, targetStatus: "200", reason: "-",
			line: `h2 2018-07-02T22:23:00.186641Z app/my-loadbalancer/50dc6c495c0c9188 10.0.1.252:48160 10.0.0.66:9000 0.000 0.002 0.000 200 200 5 257 "GET https://10.0.2.105:773/ HTTP/2.0" "curl/7.46.0" ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/my-targets/73e2d6bc24d8a067 "Root=1-58337327-72bd00b0343d75b906739c42" "-" "-" 1 2018-07-02T22:22:48.364000Z "redirect" "https://example.com:80/" "-"`},
		{name: "WebSockets", target: "10.0.1.192:8010", elb: 101, targetStatus: "101", reason: "-",
			line: `ws 2018-07-02T22:23:00.186641Z app/my-loadbalancer/50dc6c495c0c9188 10.0.0.140:40914 10.0.1.192:8010 0.001 0.003 0.000 101 101 218 587 "GET http://10.0.0.30:80/ HTTP/1.1" "-" - - arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/my-targets/73e2d6bc24d8a067 "Root=1-58337364-23a8c76965a2ef7629b185e3" "-" "-" 1 2018-07-02T22:22:48.364000Z "forward" "-" "-"`},
		{name: "secured WebSockets", target: "10.0.0.171:8010", elb: 101, targetStatus: "101", reason: "-",
			line: `wss 2018-07-02T22:23:00.186641Z app/my-loadbalancer/50dc6c495c0c9188 10.0.0.140:44244 10.0.0.171:8010 0.000 0.001 0.000 101 101 218 786 "GET https://10.0.0.30:443/ HTTP/1.1" "-" ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 arn:aws:elasticloadbalancing:us-west-2:123456789012:targetgroup/my-targets/73e2d6bc24d8a067 "Root=1-58337364-23a8c76965a2ef7629b185e3" "-" "-" 1 2018-07-02T22:22:48.364000Z "forward" "-" "-"`},
		{name: "Lambda, succeeded", target: "-", elb: 200, targetStatus: "200", reason: "-",
			line: `http 2018-11-30T22:23:00.186641Z app/my-loadbalancer/50dc6c495c0c9188 192.168.131.39:2817 - 0.000 0.001 0.000 200 200 34 366 "GET http://www.example.com:80/ HTTP/1.1" "curl/7.46.0" - - arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/my-targets/73e2d6bc24d8a067 "Root=1-58337364-23a8c76965a2ef7629b185e3" "-" "-" 0 2018-11-30T22:22:48.364000Z "forward" "-" "-"`},
		{name: "Lambda, failed", target: "-", elb: 502, targetStatus: "-", reason: "LambdaInvalidResponse", own: true,
			line: `http 2018-11-30T22:23:00.186641Z app/my-loadbalancer/50dc6c495c0c9188 192.168.131.39:2817 - 0.000 0.001 0.000 502 - 34 366 "GET http://www.example.com:80/ HTTP/1.1" "curl/7.46.0" - - arn:aws:elasticloadbalancing:us-east-2:123456789012:targetgroup/my-targets/73e2d6bc24d8a067 "Root=1-58337364-23a8c76965a2ef7629b185e3" "-" "-" 0 2018-11-30T22:22:48.364000Z "forward" "-" "LambdaInvalidResponse"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := ParseLine(tc.line)
			require.NoError(t, err)
			assert.Equal(t, tc.target, e.Target)
			assert.Equal(t, tc.elb, e.ELBStatus)
			assert.Equal(t, tc.targetStatus, e.TargetStatus)
			assert.Equal(t, tc.reason, e.ErrorReason)
			assert.Equal(t, tc.own, balancersOwn(e), "the balancer's own answer")
		})
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	good := entry("2026-11-30T12:00:10.000000Z", "10.0.1.12:8080", "0.004", 200, "200", "-")
	bad := filepath.Join(dir, "bad.log")
	require.NoError(t, os.WriteFile(bad, []byte(good+"\nnot a log line\n"+good+"\n"), 0o600))
	empty := t.TempDir()

	tests := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{name: "flags", args: []string{"-since", "noon", "-until", "later"}, code: 2,
			want: []string{`-since "noon" must be an RFC 3339 time`, `-until "later" must be an RFC 3339 time`, "name at least one log file or directory"}},
		{name: "window backwards", args: []string{"-since", "2026-11-30T12:10:00Z", "-until", "2026-11-30T12:00:00Z", bad}, code: 2,
			want: []string{"-until 2026-11-30T12:00:00Z must be after -since 2026-11-30T12:10:00Z"}},
		{name: "malformed line", args: []string{"-since", "2026-11-30T12:00:00Z", "-until", "2026-11-30T12:10:00Z", bad}, code: 1,
			want: []string{"1 line(s) are not ALB access-log lines", bad + ":2: 4 fields, an ALB access-log line has at least 25"}},
		{name: "no logs in directory", args: []string{"-since", "2026-11-30T12:00:00Z", "-until", "2026-11-30T12:10:00Z", empty}, code: 1,
			want: []string{empty + " holds no *.log.gz or *.log file"}},
		{name: "missing path", args: []string{"-since", "2026-11-30T12:00:00Z", "-until", "2026-11-30T12:10:00Z", filepath.Join(dir, "nope")}, code: 1,
			want: []string{"log path: stat "}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, stderr := runCmd(t, tc.args...)
			assert.Equal(t, tc.code, code)
			assert.Empty(t, out, "no report from bad input")
			for _, w := range tc.want {
				assert.Contains(t, stderr, w)
			}
		})
	}
}

// -h lists the command's own flags and no other package's, on stdout.
func TestUsageIsOwnFlags(t *testing.T) {
	code, out, stderr := runCmd(t, "-h")
	assert.Equal(t, 0, code)
	assert.Empty(t, stderr)
	assert.Contains(t, out, "usage: alblogs -since TIME -until TIME FILE|DIR...")
	assert.Equal(t, []string{"since", "until"}, cmdflag.Listed(out))
}
