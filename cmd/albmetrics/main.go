// Command albmetrics reads what the load balancer itself counted during a
// rollout, from CloudWatch, and judges it: the deploy job's measure of the
// requests that reached nothing in production.
//
// It builds the request and reads the answer; the AWS CLI, already on the
// runner and holding the job's OIDC credentials, sends it:
//
//	albmetrics request -load-balancer app/NAME/ID -target-group targetgroup/NAME/ID \
//	    -since 2026-11-30T12:00:07Z -until 2026-11-30T12:04:51Z >request.json
//	aws cloudwatch get-metric-data --cli-input-json file://request.json --output json >response.json
//	albmetrics report -request request.json -max-502 0 -max-504 0 <response.json >>"$GITHUB_STEP_SUMMARY"
//
// The request asks for 1-minute sums over the window widened to whole
// minutes, of HTTPCode_ELB_502_Count, HTTPCode_ELB_504_Count and
// HTTPCode_ELB_503_Count by the load balancer's arnSuffix,
// HTTPCode_Target_5XX_Count by its and the target group's, and RequestCount.
// The report is a Markdown table; it exits 1 when 502s or 504s exceed their
// thresholds, or when the answer is not a complete answer to this request.
// A draining server's 503s never show here: the drain answers 503 to health
// checks, and health checks are not requests.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	usage := func() int {
		fmt.Fprintln(stderr, "usage: albmetrics request -load-balancer SUFFIX -target-group SUFFIX -since TIME -until TIME")
		fmt.Fprintln(stderr, "       albmetrics report -request FILE [-max-502 N] [-max-504 N] <get-metric-data.json")
		return 2
	}
	if len(args) == 0 {
		return usage()
	}
	switch args[0] {
	case "request":
		return runRequest(args[1:], stdout, stderr)
	case "report":
		return runReport(args[1:], stdin, stdout, stderr)
	}
	fmt.Fprintf(stderr, "albmetrics: unknown command %q\n", args[0])
	return usage()
}

// Namespace is where the ALB publishes its metrics.
const Namespace = "AWS/ApplicationELB"

// Period is the resolution asked for: the ALB publishes every 60 s.
const Period = 60 * time.Second

// series is one metric the report reads, in the order it prints them.
type series struct {
	ID, Metric, Column string
	// ByTargetGroup adds the TargetGroup dimension: the targets' own codes
	// are counted per target group, the balancer's per load balancer.
	ByTargetGroup bool
}

var allSeries = []series{
	{"requests", "RequestCount", "requests", false},
	{"elb502", "HTTPCode_ELB_502_Count", "502", false},
	{"elb504", "HTTPCode_ELB_504_Count", "504", false},
	{"elb503", "HTTPCode_ELB_503_Count", "503", false},
	{"target5xx", "HTTPCode_Target_5XX_Count", "target 5XX", true},
}

// Request is the input of `aws cloudwatch get-metric-data --cli-input-json`,
// in the API's own field names.
type Request struct {
	MetricDataQueries []Query
	StartTime         time.Time
	EndTime           time.Time
	ScanBy            string
}

// Query is one MetricDataQuery.
type Query struct {
	ID         string `json:"Id"`
	MetricStat MetricStat
	Label      string
	ReturnData bool
}

// MetricStat names a metric and how to aggregate it.
type MetricStat struct {
	Metric Metric
	Period int
	Stat   string
}

// Metric is a CloudWatch metric with its dimensions.
type Metric struct {
	Namespace  string
	MetricName string
	Dimensions []Dimension
}

// Dimension is one name=value of a metric.
type Dimension struct {
	Name, Value string
}

// NewRequest asks for every series over [since, until] widened to whole
// minutes, so the minutes the rollout started and ended in count whole.
func NewRequest(lbSuffix, tgSuffix string, since, until time.Time) Request {
	r := Request{
		StartTime: since.UTC().Truncate(Period),
		EndTime:   until.UTC().Add(Period - time.Nanosecond).Truncate(Period),
		ScanBy:    "TimestampAscending",
	}
	for _, s := range allSeries {
		dims := []Dimension{{"LoadBalancer", lbSuffix}}
		if s.ByTargetGroup {
			dims = append(dims, Dimension{"TargetGroup", tgSuffix})
		}
		r.MetricDataQueries = append(r.MetricDataQueries, Query{
			ID:         s.ID,
			MetricStat: MetricStat{Metric: Metric{Namespace, s.Metric, dims}, Period: int(Period / time.Second), Stat: "Sum"},
			Label:      s.Metric,
			ReturnData: true,
		})
	}
	return r
}

func runRequest(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("albmetrics request", flag.ContinueOnError)
	fl.SetOutput(stderr)
	lb := fl.String("load-balancer", "", "the ALB's arnSuffix (pulumi stack output albArnSuffix), app/NAME/ID")
	tg := fl.String("target-group", "", "the target group's arnSuffix (pulumi stack output targetGroupArnSuffix), targetgroup/NAME/ID")
	since := fl.String("since", "", "the rollout's start, RFC 3339")
	until := fl.String("until", "", "the rollout's end, RFC 3339")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	var problems []string
	if !strings.HasPrefix(*lb, "app/") || strings.Count(*lb, "/") != 2 {
		problems = append(problems, fmt.Sprintf("-load-balancer %q must be an ALB's arnSuffix, app/NAME/ID", *lb))
	}
	if !strings.HasPrefix(*tg, "targetgroup/") || strings.Count(*tg, "/") != 2 {
		problems = append(problems, fmt.Sprintf("-target-group %q must be a target group's arnSuffix, targetgroup/NAME/ID", *tg))
	}
	from, err1 := time.Parse(time.RFC3339, *since)
	if err1 != nil {
		problems = append(problems, fmt.Sprintf("-since %q must be an RFC 3339 time like 2026-11-30T12:00:00Z", *since))
	}
	to, err2 := time.Parse(time.RFC3339, *until)
	if err2 != nil {
		problems = append(problems, fmt.Sprintf("-until %q must be an RFC 3339 time like 2026-11-30T12:20:00Z", *until))
	}
	if err1 == nil && err2 == nil && to.Before(from) {
		problems = append(problems, fmt.Sprintf("-until %s must not be before -since %s", *until, *since))
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(stderr, "albmetrics request: %s\n", p)
		}
		return 2
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(NewRequest(*lb, *tg, from, to)); err != nil {
		fmt.Fprintf(stderr, "albmetrics request: write: %v\n", err)
		return 1
	}
	return 0
}

// Response is what `aws cloudwatch get-metric-data --output json` prints.
// The CLI follows NextToken itself, so one response holds every page.
type Response struct {
	MetricDataResults []Result
	Messages          []Message
}

// Result is one query's datapoints. A minute with no datapoint had nothing
// to count: the ALB publishes a count only when it is not zero.
type Result struct {
	ID         string `json:"Id"`
	Label      string
	Timestamps []Timestamp
	Values     []float64
	StatusCode string
	Messages   []Message
}

// Timestamp is a datapoint's time as the CLI prints it: an ISO 8601 string
// (AWS CLI v2's default cli_timestamp_format) or epoch seconds (v1's "none",
// the wire's value as is).
type Timestamp struct{ time.Time }

// UnmarshalJSON takes either form.
func (t *Timestamp) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		return t.Time.UnmarshalJSON(b)
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("timestamp %s is neither ISO 8601 nor epoch seconds", b)
	}
	whole, frac := math.Modf(secs)
	t.Time = time.Unix(int64(whole), int64(frac*1e9)).UTC()
	return nil
}

// Message is a note CloudWatch attaches to a response or a result.
type Message struct {
	Code, Value string
}

// Counts are the sums of every series over the window and per minute.
type Counts struct {
	Total    map[string]int64
	ByMinute map[time.Time]map[string]int64
}

// Read checks that resp answers req completely and sums it.
func Read(req Request, resp Response) (Counts, error) {
	c := Counts{Total: map[string]int64{}, ByMinute: map[time.Time]map[string]int64{}}
	var problems []string
	for _, m := range resp.Messages {
		problems = append(problems, fmt.Sprintf("CloudWatch says %s: %s", m.Code, m.Value))
	}
	seen := map[string]bool{}
	for _, r := range resp.MetricDataResults {
		if !slices.ContainsFunc(req.MetricDataQueries, func(q Query) bool { return q.ID == r.ID }) {
			problems = append(problems, fmt.Sprintf("result %q answers no query of the request", r.ID))
			continue
		}
		if seen[r.ID] {
			problems = append(problems, fmt.Sprintf("result %q appears twice", r.ID))
			continue
		}
		seen[r.ID] = true
		if r.StatusCode != "Complete" {
			problems = append(problems, fmt.Sprintf("result %q has StatusCode %q, not Complete", r.ID, r.StatusCode))
		}
		for _, m := range r.Messages {
			problems = append(problems, fmt.Sprintf("result %q: CloudWatch says %s: %s", r.ID, m.Code, m.Value))
		}
		if len(r.Timestamps) != len(r.Values) {
			problems = append(problems, fmt.Sprintf("result %q has %d timestamps for %d values", r.ID, len(r.Timestamps), len(r.Values)))
			continue
		}
		for i, stamp := range r.Timestamps {
			ts, v := stamp.Time, r.Values[i]
			switch {
			case ts.Before(req.StartTime) || !ts.Before(req.EndTime):
				problems = append(problems, fmt.Sprintf("result %q: datapoint at %s is outside the window %s–%s", r.ID,
					ts.UTC().Format(time.RFC3339), req.StartTime.Format(time.RFC3339), req.EndTime.Format(time.RFC3339)))
				continue
			case v < 0 || v != math.Trunc(v):
				problems = append(problems, fmt.Sprintf("result %q: value %v at %s is not a count", r.ID, v, ts.UTC().Format(time.RFC3339)))
				continue
			}
			minute := ts.UTC().Truncate(Period)
			if c.ByMinute[minute] == nil {
				c.ByMinute[minute] = map[string]int64{}
			}
			c.ByMinute[minute][r.ID] += int64(v)
			c.Total[r.ID] += int64(v)
		}
	}
	for _, q := range req.MetricDataQueries {
		if !seen[q.ID] {
			problems = append(problems, fmt.Sprintf("no result for query %q (%s)", q.ID, q.MetricStat.Metric.MetricName))
		}
	}
	if len(problems) > 0 {
		return Counts{}, fmt.Errorf("the CloudWatch answer is not a complete answer to the request:\n  %s", strings.Join(problems, "\n  "))
	}
	return c, nil
}

// Thresholds are the most 502s and 504s a rollout may cause.
type Thresholds struct {
	Max502, Max504 int64
}

// Verdict lists every threshold the counts exceed.
func (t Thresholds) Verdict(c Counts) []string {
	var over []string
	if n := c.Total["elb502"]; n > t.Max502 {
		over = append(over, fmt.Sprintf("%d 502 above the threshold %d", n, t.Max502))
	}
	if n := c.Total["elb504"]; n > t.Max504 {
		over = append(over, fmt.Sprintf("%d 504 above the threshold %d", n, t.Max504))
	}
	return over
}

// WriteMarkdown writes the job summary: the totals, every minute that had a
// 5XX, and the verdict.
func WriteMarkdown(w io.Writer, req Request, c Counts, t Thresholds) error {
	var b strings.Builder
	dim := map[string]string{}
	for _, q := range req.MetricDataQueries {
		for _, d := range q.MetricStat.Metric.Dimensions {
			dim[d.Name] = d.Value
		}
	}
	fmt.Fprintf(&b, "### Production: requests that reached nothing during the rollout\n\n")
	fmt.Fprintf(&b, "CloudWatch `%s`, 1-minute sums, %s to %s (the rollout's minutes), load balancer `%s`, target group `%s`.\n\n",
		Namespace, req.StartTime.Format(time.RFC3339), req.EndTime.Format(time.RFC3339), dim["LoadBalancer"], dim["TargetGroup"])
	header := "| | requests | 502 | 504 | 503 | target 5XX |\n|---|---:|---:|---:|---:|---:|\n"
	row := func(name string, m map[string]int64) {
		fmt.Fprintf(&b, "| %s |", name)
		for _, s := range allSeries {
			fmt.Fprintf(&b, " %d |", m[s.ID])
		}
		b.WriteString("\n")
	}
	b.WriteString(header)
	row("rollout", c.Total)
	var minutes []time.Time
	for m, v := range c.ByMinute {
		if v["elb502"]+v["elb504"]+v["elb503"]+v["target5xx"] > 0 {
			minutes = append(minutes, m)
		}
	}
	slices.SortFunc(minutes, func(a, b time.Time) int { return a.Compare(b) })
	for _, m := range minutes {
		row(m.Format("15:04Z"), c.ByMinute[m])
	}
	b.WriteString("\n502 and 504 are requests that reached nothing; 503 means no healthy target " +
		"(a draining server's 503s answer health checks, which are not requests, and never show here); " +
		"target 5XX are the servers' own errors.\n\n")
	if over := t.Verdict(c); len(over) > 0 {
		fmt.Fprintf(&b, "**Failed:** %s. Which server and which phase: `go run ./cmd/alblogs -since %s -until %s LOGS` on the access logs (README, production runbook).\n",
			strings.Join(over, "; "), req.StartTime.Format(time.RFC3339), req.EndTime.Format(time.RFC3339))
	} else {
		fmt.Fprintf(&b, "**Passed:** %d 502 (threshold %d), %d 504 (threshold %d).\n", c.Total["elb502"], t.Max502, c.Total["elb504"], t.Max504)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	return nil
}

func runReport(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("albmetrics report", flag.ContinueOnError)
	fl.SetOutput(stderr)
	reqPath := fl.String("request", "", "the request file `albmetrics request` wrote")
	var t Thresholds
	fl.Int64Var(&t.Max502, "max-502", 0, "most HTTPCode_ELB_502_Count the rollout may cause")
	fl.Int64Var(&t.Max504, "max-504", 0, "most HTTPCode_ELB_504_Count the rollout may cause")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	var problems []string
	if *reqPath == "" {
		problems = append(problems, "-request is required")
	}
	if t.Max502 < 0 {
		problems = append(problems, fmt.Sprintf("-max-502 %d must not be negative", t.Max502))
	}
	if t.Max504 < 0 {
		problems = append(problems, fmt.Sprintf("-max-504 %d must not be negative", t.Max504))
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(stderr, "albmetrics report: %s\n", p)
		}
		return 2
	}
	req, resp, err := readInputs(*reqPath, stdin)
	if err == nil {
		var c Counts
		if c, err = Read(req, resp); err == nil {
			if err = WriteMarkdown(stdout, req, c, t); err == nil {
				if over := t.Verdict(c); len(over) > 0 {
					fmt.Fprintf(stderr, "albmetrics report: the rollout made requests reach nothing: %s\n", strings.Join(over, "; "))
					return 1
				}
				return 0
			}
		}
	}
	fmt.Fprintf(stderr, "albmetrics report: %v\n", err)
	return 1
}

func readInputs(reqPath string, stdin io.Reader) (Request, Response, error) {
	var req Request
	b, err := os.ReadFile(reqPath)
	if err != nil {
		return Request{}, Response{}, fmt.Errorf("read the request: %w", err)
	}
	if err := json.Unmarshal(b, &req); err != nil {
		return Request{}, Response{}, fmt.Errorf("request %s: %w", reqPath, err)
	}
	if len(req.MetricDataQueries) != len(allSeries) {
		return Request{}, Response{}, fmt.Errorf("request %s has %d queries, not the %d `albmetrics request` writes", reqPath, len(req.MetricDataQueries), len(allSeries))
	}
	var resp Response
	// Fields the CLI may add later are ignored; the ones read are checked.
	if err := json.NewDecoder(stdin).Decode(&resp); err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("stdin is empty")
		}
		return Request{}, Response{}, fmt.Errorf("read the get-metric-data answer on stdin: %w", err)
	}
	return req, resp, nil
}
