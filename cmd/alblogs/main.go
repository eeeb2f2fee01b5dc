// Command alblogs reads Application Load Balancer access logs for a time
// window and prints the requests that reached nothing, the 502s and 504s the
// balancer answered itself because no target answered (target_status_code
// "-"), by target, by error_reason and by minute, so an engineer can see which
// server and which phase of a deploy lost requests. The targets' own 5xx,
// which reached a server and were passed through, are reported apart.
//
// The files are the ones ALB writes to the stack's bucket (gzip, one request
// a line, AWS's documented format), fetched for example with
//
//	aws s3 sync "s3://$(pulumi stack output accessLogsBucket)/$(pulumi stack output accessLogsPrefix)/AWSLogs/ACCOUNT/elasticloadbalancing/REGION/2026/11/30/" logs/
//
// Usage:
//
//	go run ./cmd/alblogs -since 2026-11-30T12:00:00Z -until 2026-11-30T12:20:00Z logs/
//
// Each argument is a file (gzip or plain) or a directory searched for *.log.gz
// and *.log. A line that does not parse fails the run, naming file, line and
// field: a count that silently skipped lines would not be a count.
package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mythex/infra/internal/cmdflag"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fl := cmdflag.New("alblogs", "-since TIME -until TIME FILE|DIR...")
	since := fl.String("since", "", "start of the window, RFC 3339 (inclusive), e.g. the rollout's start")
	until := fl.String("until", "", "end of the window, RFC 3339 (exclusive)")
	if code, exit := cmdflag.Parse(fl, args, stdout, stderr); exit {
		return code
	}
	var problems []string
	from, err := time.Parse(time.RFC3339, *since)
	if err != nil {
		problems = append(problems, fmt.Sprintf("-since %q must be an RFC 3339 time like 2026-11-30T12:00:00Z", *since))
	}
	to, err := time.Parse(time.RFC3339, *until)
	if err != nil {
		problems = append(problems, fmt.Sprintf("-until %q must be an RFC 3339 time like 2026-11-30T12:20:00Z", *until))
	}
	if len(problems) == 0 && !to.After(from) {
		problems = append(problems, fmt.Sprintf("-until %s must be after -since %s", *until, *since))
	}
	if fl.NArg() == 0 {
		problems = append(problems, "name at least one log file or directory")
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(stderr, "alblogs: %s\n", p)
		}
		fl.SetOutput(stderr)
		fl.Usage()
		return 2
	}
	files, err := logFiles(fl.Args())
	if err != nil {
		fmt.Fprintf(stderr, "alblogs: %v\n", err)
		return 1
	}
	rep := newReport(from, to)
	for _, f := range files {
		if err := rep.readFile(f); err != nil {
			fmt.Fprintf(stderr, "alblogs: %v\n", err)
			return 1
		}
	}
	if err := rep.write(stdout); err != nil {
		fmt.Fprintf(stderr, "alblogs: %v\n", err)
		return 1
	}
	return 0
}

// logFiles expands each path: a file as is, a directory to every *.log.gz
// and *.log under it, in name order (ALB's names sort by time).
func logFiles(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("log path: %w", err)
		}
		if !st.IsDir() {
			out = append(out, p)
			continue
		}
		var found []string
		err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && (strings.HasSuffix(path, ".log.gz") || strings.HasSuffix(path, ".log")) {
				found = append(found, path)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("search %s for access logs: %w", p, err)
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("%s holds no *.log.gz or *.log file", p)
		}
		sort.Strings(found)
		out = append(out, found...)
	}
	return out, nil
}

// Entry is the part of one access-log line the report needs.
type Entry struct {
	// Time is when the balancer sent the response (the line's time field).
	Time time.Time
	// Target is the target's ip:port, "-" when the request reached none.
	Target string
	// TargetProcessing is target_processing_time in seconds; -1 when the
	// balancer got no complete answer from the target.
	TargetProcessing float64
	// ELBStatus is the status the balancer answered the client with.
	ELBStatus int
	// TargetStatus is the target's status code, "-" when it gave none.
	TargetStatus string
	// Request is the request line, "METHOD URL PROTOCOL".
	Request string
	// ErrorReason is the error_reason field, "-" when there is none.
	ErrorReason string
}

// The fields of an ALB access-log line, by position (0-based), as AWS's
// "Access logs for your Application Load Balancer" lists them: type time elb
// client:port target:port request_processing_time target_processing_time
// response_processing_time elb_status_code target_status_code received_bytes
// sent_bytes "request" "user_agent" ssl_cipher ssl_protocol target_group_arn
// "trace_id" "domain_name" "chosen_cert_arn" matched_rule_priority
// request_creation_time "actions_executed" "redirect_url" "error_reason"
// "target:port_list" "target_status_code_list" "classification"
// "classification_reason" conn_trace_id. AWS adds fields at the end over
// time; its guidance is to ignore those not expected, so only the fields up to
// error_reason are required.
const (
	fieldTime             = 1
	fieldTarget           = 4
	fieldTargetProcessing = 6
	fieldELBStatus        = 8
	fieldTargetStatus     = 9
	fieldRequest          = 12
	fieldErrorReason      = 24
	minFields             = fieldErrorReason + 1
)

// ParseLine parses one access-log line.
func ParseLine(line string) (Entry, error) {
	f, err := splitFields(line)
	if err != nil {
		return Entry{}, err
	}
	if len(f) < minFields {
		return Entry{}, fmt.Errorf("%d fields, an ALB access-log line has at least %d (up to error_reason)", len(f), minFields)
	}
	var e Entry
	var problems []string
	if e.Time, err = time.Parse(time.RFC3339Nano, f[fieldTime]); err != nil {
		problems = append(problems, fmt.Sprintf("time %q is not an ISO 8601 time", f[fieldTime]))
	}
	e.Target = f[fieldTarget]
	if e.TargetProcessing, err = strconv.ParseFloat(f[fieldTargetProcessing], 64); err != nil {
		problems = append(problems, fmt.Sprintf("target_processing_time %q is not a number", f[fieldTargetProcessing]))
	}
	if e.ELBStatus, err = strconv.Atoi(f[fieldELBStatus]); err != nil {
		problems = append(problems, fmt.Sprintf("elb_status_code %q is not a number", f[fieldELBStatus]))
	}
	e.TargetStatus = f[fieldTargetStatus]
	e.Request = f[fieldRequest]
	e.ErrorReason = f[fieldErrorReason]
	if len(problems) > 0 {
		return Entry{}, errors.New(strings.Join(problems, "; "))
	}
	return e, nil
}

// splitFields splits a line on single spaces; a field in double quotes may
// hold spaces, and a backslash escapes the next character inside it.
func splitFields(line string) ([]string, error) {
	var out []string
	for i := 0; i < len(line); {
		if line[i] == ' ' {
			i++
			continue
		}
		if line[i] != '"' {
			j := strings.IndexByte(line[i:], ' ')
			if j < 0 {
				j = len(line) - i
			}
			out = append(out, line[i:i+j])
			i += j
			continue
		}
		var b strings.Builder
		j := i + 1
		for ; j < len(line) && line[j] != '"'; j++ {
			if line[j] == '\\' && j+1 < len(line) {
				j++
			}
			b.WriteByte(line[j])
		}
		if j >= len(line) {
			return nil, fmt.Errorf("field %d: quote opened at column %d is never closed", len(out), i+1)
		}
		out = append(out, b.String())
		i = j + 1
	}
	return out, nil
}

// balancersOwn reports whether the balancer answered the request itself
// because no target answered it: a 502 (no or no complete answer) or a 504
// (no answer in time) with target_status_code "-". That is what CloudWatch
// counts as HTTPCode_ELB_502_Count and HTTPCode_ELB_504_Count. A 502 or 504
// with a target status code was the target's own answer, passed through: it
// reached a server, and CloudWatch counts it as HTTPCode_Target_5XX_Count.
func balancersOwn(e Entry) bool {
	return (e.ELBStatus == 502 || e.ELBStatus == 504) && e.TargetStatus == "-"
}

// targetStatus is the target's status code as a number, 0 when it gave none.
func targetStatus(e Entry) int {
	n, err := strconv.Atoi(e.TargetStatus)
	if err != nil {
		return 0
	}
	return n
}

type counts struct {
	requests int
	// elb502 and elb504: the balancer's own answers, requests that reached
	// nothing; noAnswer: those of them with target_processing_time -1.
	elb502, elb504, noAnswer int
	// target502, target504, target5xx: the targets' own answers.
	target502, target504, target5xx int
}

func (c *counts) add(e Entry) {
	c.requests++
	if balancersOwn(e) {
		if e.ELBStatus == 502 {
			c.elb502++
		} else {
			c.elb504++
		}
		if e.TargetProcessing == -1 {
			c.noAnswer++
		}
		return
	}
	switch ts := targetStatus(e); {
	case ts == 502:
		c.target502++
	case ts == 504:
		c.target504++
	}
	if ts := targetStatus(e); ts >= 500 && ts <= 599 {
		c.target5xx++
	}
}

func (c *counts) lost() int { return c.elb502 + c.elb504 }

type report struct {
	from, to  time.Time
	files     int
	total     counts
	byTarget  map[string]*counts
	byReason  map[string]*counts
	byMinute  map[time.Time]*counts
	examples  []string
	malformed []string
}

func newReport(from, to time.Time) *report {
	return &report{from: from, to: to, byTarget: map[string]*counts{}, byReason: map[string]*counts{}, byMinute: map[time.Time]*counts{}}
}

// maxMalformed bounds how many bad lines an error lists.
const maxMalformed = 10

func (r *report) readFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open access log: %w", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var in io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		defer gz.Close()
		in = gz
	}
	r.files++
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		e, err := ParseLine(line)
		if err != nil {
			r.malformed = append(r.malformed, fmt.Sprintf("%s:%d: %v", path, n, err))
			continue
		}
		r.add(e)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if len(r.malformed) > 0 {
		shown := r.malformed[:min(len(r.malformed), maxMalformed)]
		return fmt.Errorf("%d line(s) are not ALB access-log lines:\n  %s", len(r.malformed), strings.Join(shown, "\n  "))
	}
	return nil
}

func (r *report) add(e Entry) {
	if e.Time.Before(r.from) || !e.Time.Before(r.to) {
		return
	}
	bump := func(m map[string]*counts, k string) {
		if m[k] == nil {
			m[k] = &counts{}
		}
		m[k].add(e)
	}
	r.total.add(e)
	minute := e.Time.UTC().Truncate(time.Minute)
	if r.byMinute[minute] == nil {
		r.byMinute[minute] = &counts{}
	}
	r.byMinute[minute].add(e)
	if balancersOwn(e) || targetStatus(e) >= 500 {
		bump(r.byTarget, e.Target)
	}
	if balancersOwn(e) {
		bump(r.byReason, e.ErrorReason)
		if len(r.examples) < 5 {
			r.examples = append(r.examples, fmt.Sprintf("%s %d target %s target_status %s target_processing_time %g error_reason %s %q",
				e.Time.UTC().Format(time.RFC3339Nano), e.ELBStatus, e.Target, e.TargetStatus, e.TargetProcessing, e.ErrorReason, e.Request))
		}
	}
}

func (r *report) write(w io.Writer) error {
	var b bytes.Buffer
	t := r.total
	fmt.Fprintf(&b, "ALB access logs %s to %s: %d requests in %d file(s); %d ELB 502, %d ELB 504 (requests that reached nothing: the balancer answered, target_status_code -), %d of them with no answer from a target (target_processing_time -1).\n",
		r.from.UTC().Format(time.RFC3339), r.to.UTC().Format(time.RFC3339), t.requests, r.files, t.elb502, t.elb504, t.noAnswer)
	fmt.Fprintf(&b, "The targets' own answers, passed through (they reached a server): %d 502, %d 504, %d 5xx in all.\n", t.target502, t.target504, t.target5xx)
	if t.lost()+t.target5xx == 0 {
		fmt.Fprintln(&b, "No request reached nothing in this window.")
		_, err := w.Write(b.Bytes())
		return err
	}
	// Most lost first, then by name.
	sorted := func(m map[string]*counts) []string {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			a, c := m[keys[i]], m[keys[j]]
			if a.lost() != c.lost() {
				return a.lost() > c.lost()
			}
			return keys[i] < keys[j]
		})
		return keys
	}
	fmt.Fprintf(&b, "\nBy target (\"-\": the balancer had no target to send to)\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "target\tELB 502\tELB 504\tno answer (-1)\ttarget's 502\ttarget's 504\ttarget's 5xx\n")
	for _, k := range sorted(r.byTarget) {
		c := r.byTarget[k]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\n", k, c.elb502, c.elb504, c.noAnswer, c.target502, c.target504, c.target5xx)
	}
	_ = tw.Flush() // b cannot fail
	if t.lost() == 0 {
		fmt.Fprintln(&b, "\nNo request reached nothing in this window.")
		_, err := w.Write(trimLines(b.Bytes()))
		return err
	}

	fmt.Fprintf(&b, "\nBy error_reason of the ELB 502s and 504s (\"-\": none given)\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "error_reason\tELB 502\tELB 504\tno answer (-1)\n")
	for _, k := range sorted(r.byReason) {
		c := r.byReason[k]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", k, c.elb502, c.elb504, c.noAnswer)
	}
	_ = tw.Flush()

	fmt.Fprintf(&b, "\nBy minute (minutes with an ELB 502 or 504)\n")
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "minute (UTC)\trequests\tELB 502\tELB 504\n")
	minutes := make([]time.Time, 0, len(r.byMinute))
	for m, c := range r.byMinute {
		if c.lost() > 0 {
			minutes = append(minutes, m)
		}
	}
	sort.Slice(minutes, func(i, j int) bool { return minutes[i].Before(minutes[j]) })
	for _, m := range minutes {
		c := r.byMinute[m]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", m.Format("2006-01-02T15:04Z"), c.requests, c.elb502, c.elb504)
	}
	_ = tw.Flush()

	fmt.Fprintf(&b, "\nFirst of them\n")
	for _, e := range r.examples {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	if _, err := w.Write(trimLines(b.Bytes())); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// trimLines drops the padding tabwriter leaves after a line's last value.
func trimLines(b []byte) []byte {
	lines := bytes.Split(b, []byte("\n"))
	for i, l := range lines {
		lines[i] = bytes.TrimRight(l, " ")
	}
	return bytes.Join(lines, []byte("\n"))
}
