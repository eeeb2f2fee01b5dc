// Command alblogs reads Application Load Balancer access logs for a time
// window and prints the requests that reached nothing, the 502s and 504s the
// balancer answered itself, by target, by error_reason and by minute, so an
// engineer can see which server and which phase of a deploy lost requests.
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
	"flag"
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
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("alblogs", flag.ContinueOnError)
	fl.SetOutput(stderr)
	since := fl.String("since", "", "start of the window, RFC 3339 (inclusive), e.g. the rollout's start")
	until := fl.String("until", "", "end of the window, RFC 3339 (exclusive)")
	if err := fl.Parse(args); err != nil {
		return 2
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

// lost reports whether the balancer answered the request itself because it
// reached nothing: 502 (no or no complete answer from the target) or 504 (no
// answer in time).
func lost(status int) bool { return status == 502 || status == 504 }

type counts struct{ requests, s502, s504, noAnswer int }

func (c *counts) add(e Entry) {
	c.requests++
	switch e.ELBStatus {
	case 502:
		c.s502++
	case 504:
		c.s504++
	}
	if lost(e.ELBStatus) && e.TargetProcessing == -1 {
		c.noAnswer++
	}
}

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
	if lost(e.ELBStatus) {
		bump(r.byTarget, e.Target)
		bump(r.byReason, e.ErrorReason)
		if len(r.examples) < 5 {
			r.examples = append(r.examples, fmt.Sprintf("%s %d target %s target_status %s target_processing_time %g error_reason %s %q",
				e.Time.UTC().Format(time.RFC3339Nano), e.ELBStatus, e.Target, e.TargetStatus, e.TargetProcessing, e.ErrorReason, e.Request))
		}
	}
}

func (r *report) write(w io.Writer) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "ALB access logs %s to %s: %d requests in %d file(s); %d 502, %d 504 (requests that reached nothing), %d of them with no answer from a target (target_processing_time -1).\n",
		r.from.UTC().Format(time.RFC3339), r.to.UTC().Format(time.RFC3339), r.total.requests, r.files, r.total.s502, r.total.s504, r.total.noAnswer)
	if r.total.s502+r.total.s504 == 0 {
		fmt.Fprintln(&b, "No request reached nothing in this window.")
		_, err := w.Write(b.Bytes())
		return err
	}
	table := func(title, key string, m map[string]*counts) {
		fmt.Fprintf(&b, "\n%s\n", title)
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "%s\t502\t504\tno answer (-1)\n", key)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		// Most lost first, then by name.
		sort.Slice(keys, func(i, j int) bool {
			a, c := m[keys[i]], m[keys[j]]
			if a.s502+a.s504 != c.s502+c.s504 {
				return a.s502+a.s504 > c.s502+c.s504
			}
			return keys[i] < keys[j]
		})
		for _, k := range keys {
			c := m[k]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", k, c.s502, c.s504, c.noAnswer)
		}
		_ = tw.Flush() // b cannot fail
	}
	table("By target (\"-\": the balancer had no target to send to)", "target", r.byTarget)
	table("By error_reason (\"-\": none given)", "error_reason", r.byReason)

	fmt.Fprintf(&b, "\nBy minute (minutes with a 502 or 504)\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "minute (UTC)\trequests\t502\t504\n")
	minutes := make([]time.Time, 0, len(r.byMinute))
	for m, c := range r.byMinute {
		if c.s502+c.s504 > 0 {
			minutes = append(minutes, m)
		}
	}
	sort.Slice(minutes, func(i, j int) bool { return minutes[i].Before(minutes[j]) })
	for _, m := range minutes {
		c := r.byMinute[m]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", m.Format("2006-01-02T15:04Z"), c.requests, c.s502, c.s504)
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
