// Command albmetrics reads what the load balancer itself counted during a
// rollout, from CloudWatch, and judges it: the deploy job's measure of the
// requests that reached nothing in production.
//
//	albmetrics -load-balancer app/NAME/ID -target-group targetgroup/NAME/ID \
//	    -since 2026-11-30T12:00:07Z -until 2026-11-30T12:04:51Z \
//	    -max-502 0 -max-504 0 -wait 10m -poll 30s >>"$GITHUB_STEP_SUMMARY"
//
// It asks GetMetricData (aws-sdk-go-v2, with the credentials and region the
// job's environment holds: AWS_ACCESS_KEY_ID…, AWS_REGION, AWS_ENDPOINT_URL)
// for 1-minute sums over the window widened to whole minutes, of
// RequestCount, HTTPCode_ELB_502_Count, HTTPCode_ELB_504_Count and
// HTTPCode_ELB_503_Count by the load balancer's arnSuffix, and
// HTTPCode_Target_5XX_Count by its and the target group's.
//
// The ALB publishes a metric only for a minute that had something to count,
// so a missing 502 datapoint means "none" only once the minute is known to be
// published. RequestCount is that proof: production serves requests every
// minute (the servers' own health checks are not requests, the clients are),
// so a minute of the window without a RequestCount datapoint is a minute
// CloudWatch has not published yet. albmetrics asks again every -poll until
// every minute has one, for at most -wait; after that it fails naming the
// minutes, and never says "passed" on an answer that is missing one.
//
// The report is a Markdown table; it exits 1 when 502s or 504s exceed their
// thresholds, when the answer stays incomplete past -wait, or when CloudWatch
// cannot be asked; 2 on bad flags. A draining server's 503s never show here:
// the drain answers 503 to health checks, and health checks are not requests.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"

	"github.com/mythex/infra/internal/cmdflag"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
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

// requestsID is the series every minute of the window must have.
const requestsID = "requests"

var allSeries = []series{
	{requestsID, "RequestCount", "requests", false},
	{"elb502", "HTTPCode_ELB_502_Count", "502", false},
	{"elb504", "HTTPCode_ELB_504_Count", "504", false},
	{"elb503", "HTTPCode_ELB_503_Count", "503", false},
	{"target5xx", "HTTPCode_Target_5XX_Count", "target 5XX", true},
}

// Window is the rollout's minutes: [Start, End), both on a minute.
type Window struct {
	Start, End                time.Time
	LoadBalancer, TargetGroup string
}

// NewWindow widens [since, until] to whole minutes, so the minutes the
// rollout started and ended in count whole.
func NewWindow(lbSuffix, tgSuffix string, since, until time.Time) Window {
	return Window{
		Start:        since.UTC().Truncate(Period),
		End:          until.UTC().Add(Period - time.Nanosecond).Truncate(Period),
		LoadBalancer: lbSuffix,
		TargetGroup:  tgSuffix,
	}
}

// Minutes lists the window's minutes.
func (w Window) Minutes() []time.Time {
	var out []time.Time
	for m := w.Start; m.Before(w.End); m = m.Add(Period) {
		out = append(out, m)
	}
	return out
}

// Input is the GetMetricData request for the window.
func (w Window) Input() *cloudwatch.GetMetricDataInput {
	in := &cloudwatch.GetMetricDataInput{
		StartTime: aws.Time(w.Start),
		EndTime:   aws.Time(w.End),
		ScanBy:    types.ScanByTimestampAscending,
	}
	for _, s := range allSeries {
		dims := []types.Dimension{{Name: aws.String("LoadBalancer"), Value: aws.String(w.LoadBalancer)}}
		if s.ByTargetGroup {
			dims = append(dims, types.Dimension{Name: aws.String("TargetGroup"), Value: aws.String(w.TargetGroup)})
		}
		in.MetricDataQueries = append(in.MetricDataQueries, types.MetricDataQuery{
			Id: aws.String(s.ID),
			MetricStat: &types.MetricStat{
				Metric: &types.Metric{Namespace: aws.String(Namespace), MetricName: aws.String(s.Metric), Dimensions: dims},
				Period: aws.Int32(int32(Period / time.Second)),
				Stat:   aws.String("Sum"),
			},
			Label:      aws.String(s.Metric),
			ReturnData: aws.Bool(true),
		})
	}
	return in
}

// Fetch asks for the window, every page, and gathers the pages' results by
// query id.
func Fetch(ctx context.Context, api cloudwatch.GetMetricDataAPIClient, w Window) (*cloudwatch.GetMetricDataOutput, error) {
	all := &cloudwatch.GetMetricDataOutput{}
	byID := map[string]int{}
	p := cloudwatch.NewGetMetricDataPaginator(api, w.Input())
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("CloudWatch GetMetricData: %w", err)
		}
		all.Messages = append(all.Messages, page.Messages...)
		for _, r := range page.MetricDataResults {
			id := aws.ToString(r.Id)
			i, ok := byID[id]
			if !ok {
				byID[id] = len(all.MetricDataResults)
				all.MetricDataResults = append(all.MetricDataResults, r)
				continue
			}
			// A later page continues the series; its status is the latest.
			prev := &all.MetricDataResults[i]
			prev.Timestamps = append(prev.Timestamps, r.Timestamps...)
			prev.Values = append(prev.Values, r.Values...)
			prev.Messages = append(prev.Messages, r.Messages...)
			prev.StatusCode = r.StatusCode
		}
	}
	return all, nil
}

// Counts are the sums of every series over the window and per minute.
type Counts struct {
	Total    map[string]int64
	ByMinute map[time.Time]map[string]int64
}

// Read sums an answer for the window. It returns an error when the answer
// is wrong (a result for no query, a datapoint outside the window, a value
// that is no count, a note from CloudWatch), and the window's minutes it
// does not cover yet: a query not Complete, or a minute without a
// RequestCount datapoint. Only an answer with neither is a count.
func Read(w Window, resp *cloudwatch.GetMetricDataOutput) (Counts, []string, error) {
	c := Counts{Total: map[string]int64{}, ByMinute: map[time.Time]map[string]int64{}}
	var problems, pending []string
	for _, m := range resp.Messages {
		problems = append(problems, fmt.Sprintf("CloudWatch says %s: %s", aws.ToString(m.Code), aws.ToString(m.Value)))
	}
	seen := map[string]bool{}
	for _, r := range resp.MetricDataResults {
		id := aws.ToString(r.Id)
		if !slices.ContainsFunc(allSeries, func(s series) bool { return s.ID == id }) {
			problems = append(problems, fmt.Sprintf("result %q answers no query of the request", id))
			continue
		}
		if seen[id] {
			problems = append(problems, fmt.Sprintf("result %q appears twice", id))
			continue
		}
		seen[id] = true
		if r.StatusCode != types.StatusCodeComplete {
			pending = append(pending, fmt.Sprintf("result %q has StatusCode %q, not Complete", id, r.StatusCode))
		}
		for _, m := range r.Messages {
			problems = append(problems, fmt.Sprintf("result %q: CloudWatch says %s: %s", id, aws.ToString(m.Code), aws.ToString(m.Value)))
		}
		if len(r.Timestamps) != len(r.Values) {
			problems = append(problems, fmt.Sprintf("result %q has %d timestamps for %d values", id, len(r.Timestamps), len(r.Values)))
			continue
		}
		for i, ts := range r.Timestamps {
			v := r.Values[i]
			switch {
			case ts.Before(w.Start) || !ts.Before(w.End):
				problems = append(problems, fmt.Sprintf("result %q: datapoint at %s is outside the window %s–%s", id,
					ts.UTC().Format(time.RFC3339), w.Start.Format(time.RFC3339), w.End.Format(time.RFC3339)))
				continue
			case v < 0 || v != math.Trunc(v):
				problems = append(problems, fmt.Sprintf("result %q: value %v at %s is not a count", id, v, ts.UTC().Format(time.RFC3339)))
				continue
			}
			minute := ts.UTC().Truncate(Period)
			if c.ByMinute[minute] == nil {
				c.ByMinute[minute] = map[string]int64{}
			}
			c.ByMinute[minute][id] += int64(v)
			c.Total[id] += int64(v)
		}
	}
	for _, s := range allSeries {
		if !seen[s.ID] {
			problems = append(problems, fmt.Sprintf("no result for query %q (%s)", s.ID, s.Metric))
		}
	}
	if len(problems) > 0 {
		return Counts{}, nil, fmt.Errorf("the CloudWatch answer is not an answer to the request:\n  %s", strings.Join(problems, "\n  "))
	}
	var missing []string
	for _, m := range w.Minutes() {
		if _, ok := c.ByMinute[m][requestsID]; !ok {
			missing = append(missing, m.Format("15:04Z"))
		}
	}
	if len(missing) > 0 {
		pending = append(pending, "no RequestCount datapoint for minute(s) "+strings.Join(missing, ", "))
	}
	return c, pending, nil
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

// WriteMarkdown writes the job summary of a complete answer: the totals,
// every minute that had a 5XX, and the verdict.
func WriteMarkdown(w io.Writer, win Window, c Counts, t Thresholds) error {
	var b strings.Builder
	fmt.Fprintf(&b, "### Production: requests that reached nothing during the rollout\n\n")
	fmt.Fprintf(&b, "CloudWatch `%s`, 1-minute sums, %s to %s (the rollout's minutes, each with its RequestCount published), load balancer `%s`, target group `%s`.\n\n",
		Namespace, win.Start.Format(time.RFC3339), win.End.Format(time.RFC3339), win.LoadBalancer, win.TargetGroup)
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
		fmt.Fprintf(&b, "**Failed:** %s. Which server and which phase: `go run ./cmd/alblogs -since %s -until %s LOGS` on the access logs (docs/runbook.md).\n",
			strings.Join(over, "; "), win.Start.Format(time.RFC3339), win.End.Format(time.RFC3339))
	} else {
		fmt.Fprintf(&b, "**Passed:** %d 502 (threshold %d), %d 504 (threshold %d).\n", c.Total["elb502"], t.Max502, c.Total["elb504"], t.Max504)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	return nil
}

// options are the command's flags.
type options struct {
	lb, tg, since, until string
	thresholds           Thresholds
	wait, poll, call     time.Duration
}

// exitNow is the status of a command line cmdflag has already answered:
// 0 after -h, 2 after a bad flag.
type exitNow int

func (e exitNow) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func parse(args []string, stdout, stderr io.Writer) (options, Window, error) {
	var o options
	fl := cmdflag.New("albmetrics", "-load-balancer SUFFIX -target-group SUFFIX -since TIME -until TIME [flags]")
	fl.StringVar(&o.lb, "load-balancer", "", "the ALB's arnSuffix (pulumi stack output albArnSuffix), app/NAME/ID")
	fl.StringVar(&o.tg, "target-group", "", "the target group's arnSuffix (pulumi stack output targetGroupArnSuffix), targetgroup/NAME/ID")
	fl.StringVar(&o.since, "since", "", "the rollout's start, RFC 3339")
	fl.StringVar(&o.until, "until", "", "the rollout's end, RFC 3339")
	fl.Int64Var(&o.thresholds.Max502, "max-502", 0, "most HTTPCode_ELB_502_Count the rollout may cause")
	fl.Int64Var(&o.thresholds.Max504, "max-504", 0, "most HTTPCode_ELB_504_Count the rollout may cause")
	fl.DurationVar(&o.wait, "wait", 10*time.Minute, "how long to wait for CloudWatch to publish every minute of the window")
	fl.DurationVar(&o.poll, "poll", 30*time.Second, "how often to ask again while a minute is missing")
	fl.DurationVar(&o.call, "call-timeout", time.Minute, "bound on one GetMetricData exchange, its retries included")
	if code, exit := cmdflag.Parse(fl, args, stdout, stderr); exit {
		return o, Window{}, exitNow(code)
	}
	var problems []string
	if fl.NArg() > 0 {
		problems = append(problems, fmt.Sprintf("unexpected argument(s) %q", fl.Args()))
	}
	if !strings.HasPrefix(o.lb, "app/") || strings.Count(o.lb, "/") != 2 {
		problems = append(problems, fmt.Sprintf("-load-balancer %q must be an ALB's arnSuffix, app/NAME/ID", o.lb))
	}
	if !strings.HasPrefix(o.tg, "targetgroup/") || strings.Count(o.tg, "/") != 2 {
		problems = append(problems, fmt.Sprintf("-target-group %q must be a target group's arnSuffix, targetgroup/NAME/ID", o.tg))
	}
	from, err1 := time.Parse(time.RFC3339, o.since)
	if err1 != nil {
		problems = append(problems, fmt.Sprintf("-since %q must be an RFC 3339 time like 2026-11-30T12:00:00Z", o.since))
	}
	to, err2 := time.Parse(time.RFC3339, o.until)
	if err2 != nil {
		problems = append(problems, fmt.Sprintf("-until %q must be an RFC 3339 time like 2026-11-30T12:20:00Z", o.until))
	}
	if err1 == nil && err2 == nil && to.Before(from) {
		problems = append(problems, fmt.Sprintf("-until %s must not be before -since %s", o.until, o.since))
	}
	if o.thresholds.Max502 < 0 {
		problems = append(problems, fmt.Sprintf("-max-502 %d must not be negative", o.thresholds.Max502))
	}
	if o.thresholds.Max504 < 0 {
		problems = append(problems, fmt.Sprintf("-max-504 %d must not be negative", o.thresholds.Max504))
	}
	if o.wait < 0 {
		problems = append(problems, fmt.Sprintf("-wait %s must not be negative", o.wait))
	}
	if o.poll <= 0 {
		problems = append(problems, fmt.Sprintf("-poll %s must be positive", o.poll))
	}
	if o.call <= 0 {
		problems = append(problems, fmt.Sprintf("-call-timeout %s must be positive", o.call))
	}
	if len(problems) > 0 {
		return o, Window{}, errors.New(strings.Join(problems, "\n"))
	}
	return o, NewWindow(o.lb, o.tg, from, to), nil
}

// Await asks for the window until the answer covers every minute, for at
// most wait: the counts of a complete answer, or an error naming what is
// still missing. progress gets a line for each answer found short.
func Await(ctx context.Context, api cloudwatch.GetMetricDataAPIClient, w Window, wait, poll, call time.Duration, progress io.Writer) (Counts, error) {
	deadline := time.Now().Add(wait)
	for {
		callCtx, cancel := context.WithTimeout(ctx, call)
		resp, err := Fetch(callCtx, api, w)
		cancel()
		if err != nil {
			return Counts{}, err
		}
		c, pending, err := Read(w, resp)
		if err != nil {
			return Counts{}, err
		}
		if len(pending) == 0 {
			return c, nil
		}
		left := time.Until(deadline)
		if left < poll {
			return Counts{}, fmt.Errorf("not judged: after waiting %s, CloudWatch has not published the whole window %s–%s: %s "+
				"(production serves requests every minute, so a minute without RequestCount is unpublished, not quiet; "+
				"read the access logs with alblogs, or run the job again)",
				wait, w.Start.Format(time.RFC3339), w.End.Format(time.RFC3339), strings.Join(pending, "; "))
		}
		fmt.Fprintf(progress, "albmetrics: %s; asking again in %s (%s left of -wait %s)\n", strings.Join(pending, "; "), poll, left.Round(time.Second), wait)
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return Counts{}, fmt.Errorf("waiting for CloudWatch: %w", ctx.Err())
		case <-t.C:
		}
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, w, err := parse(args, stdout, stderr)
	var done exitNow
	if errors.As(err, &done) {
		return int(done)
	}
	if err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "albmetrics: %s\n", line)
		}
		return 2
	}
	cfgCtx, cancel := context.WithTimeout(ctx, o.call)
	cfg, err := config.LoadDefaultConfig(cfgCtx)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "albmetrics: AWS configuration: %v\n", err)
		return 1
	}
	if cfg.Region == "" {
		fmt.Fprintln(stderr, "albmetrics: no AWS region: set AWS_REGION (configure-aws-credentials sets it)")
		return 1
	}
	c, err := Await(ctx, cloudwatch.NewFromConfig(cfg), w, o.wait, o.poll, o.call, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "albmetrics: %v\n", err)
		return 1
	}
	if err := WriteMarkdown(stdout, w, c, o.thresholds); err != nil {
		fmt.Fprintf(stderr, "albmetrics: %v\n", err)
		return 1
	}
	if over := o.thresholds.Verdict(c); len(over) > 0 {
		fmt.Fprintf(stderr, "albmetrics: the rollout made requests reach nothing: %s\n", strings.Join(over, "; "))
		return 1
	}
	return 0
}
