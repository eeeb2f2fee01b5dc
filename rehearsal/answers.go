package rehearsal

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Answer is one line of a node's access log: what the node answered and how
// the exchange ended, in HAProxy's two-letter termination state (who ended
// it: S server, s server timeout, C client...; when: C connecting, H before
// the response headers, D during the body, - normally).
type Answer struct {
	Method string
	Server string
	Status int
	Term   string
}

// noServer is HAProxy's name for "no server could be chosen".
const noServer = "<NOSRV>"

// ALBStatus is what an ALB node would have answered, read from the
// termination state the way production reads the ALB's access log:
//
//   - the server refused or reset the connection (SC) → 502, "the load
//     balancer received a TCP RST from the target when attempting to
//     establish a connection";
//   - the server closed or reset with the request outstanding (SH) → 502;
//   - the server did not accept the connection in time (sC) → 504;
//   - the server did not answer within the idle timeout (sH) → 504;
//   - no server could be chosen → 503;
//   - anything else: the status as answered.
func (a Answer) ALBStatus() int {
	if a.Server == noServer {
		return http.StatusServiceUnavailable
	}
	if len(a.Term) < 2 {
		return a.Status
	}
	switch a.Term[:2] {
	case "SC", "SH":
		return http.StatusBadGateway
	case "sC", "sH":
		return http.StatusGatewayTimeout
	}
	return a.Status
}

// ParseAnswer reads an access log line (HAProxyConfig's log-format); ok is
// false for any other line.
func ParseAnswer(line string) (Answer, bool) {
	f := strings.Fields(line)
	if len(f) != 5 || f[0] != accessLogTag {
		return Answer{}, false
	}
	status, err := strconv.Atoi(f[3])
	if err != nil {
		return Answer{}, false
	}
	return Answer{Method: f[1], Server: f[2], Status: status, Term: f[4]}, true
}

// AnswerLog counts a node's answers per method, classified by ALBStatus.
// It also counts the statuses as sent, which the load generator must have
// seen exactly (the cross-check).
type AnswerLog struct {
	mu       sync.Mutex
	alb      map[string]Counts
	sent     map[string]Counts
	lines    int64
	mismatch map[string]int64
	terms    map[string]int64
	// badGateway counts the ALB's 502s per server.
	badGateway map[string]int64
	changed    chan struct{}
}

// NewAnswerLog returns an empty log.
func NewAnswerLog() *AnswerLog {
	return &AnswerLog{alb: map[string]Counts{}, sent: map[string]Counts{}, mismatch: map[string]int64{}, terms: map[string]int64{},
		badGateway: map[string]int64{}, changed: make(chan struct{})}
}

func (l *AnswerLog) parse(line string) {
	a, ok := ParseAnswer(line)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.alb[a.Method] = l.alb[a.Method].count(a.ALBStatus())
	l.sent[a.Method] = l.sent[a.Method].count(a.Status)
	if a.ALBStatus() != a.Status {
		l.mismatch[fmt.Sprintf("%s answered %d, the ALB would answer %d (termination %s)", a.Method, a.Status, a.ALBStatus(), a.Term)]++
	}
	if len(a.Term) >= 2 {
		l.terms[a.Term[:2]]++
	}
	if a.ALBStatus() == http.StatusBadGateway {
		l.badGateway[a.Server]++
	}
	l.lines++
	close(l.changed)
	l.changed = make(chan struct{})
}

// ALB returns the answers per method as the ALB would have given them.
func (l *AnswerLog) ALB() map[string]Counts {
	return l.snapshot(func() map[string]Counts { return l.alb })
}

// Sent returns the answers per method as the node sent them.
func (l *AnswerLog) Sent() map[string]Counts {
	return l.snapshot(func() map[string]Counts { return l.sent })
}

// Mismatches describes every answer the node sent differently from the ALB.
func (l *AnswerLog) Mismatches() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int64, len(l.mismatch))
	for k, v := range l.mismatch {
		out[k] = v
	}
	return out
}

// BadGatewayByServer counts the answers the ALB would have given as 502,
// per server (by its address, as the node names it).
func (l *AnswerLog) BadGatewayByServer() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int64, len(l.badGateway))
	for k, v := range l.badGateway {
		out[k] = v
	}
	return out
}

// Terminations counts the answers per termination state (its first two
// letters; "--" is a normal end).
func (l *AnswerLog) Terminations() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int64, len(l.terms))
	for k, v := range l.terms {
		out[k] = v
	}
	return out
}

func (l *AnswerLog) snapshot(m func() map[string]Counts) map[string]Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]Counts{}
	for k, v := range m() {
		out[k] = v
	}
	return out
}

// Await blocks until the node has logged at least n answers, ctx ends or
// timeout passes. HAProxy logs an answer once it is sent, so the log may
// trail the client by a moment.
func (l *AnswerLog) Await(ctx context.Context, n int64, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		l.mu.Lock()
		got, changed := l.lines, l.changed
		l.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("awaiting %d logged answers, have %d: %w", n, got, ctx.Err())
		case <-timer.C:
			return fmt.Errorf("awaiting %d logged answers, have %d: %w after %v", n, got, errTimeout, timeout)
		}
	}
}

// count adds one answer with status to c.
func (c Counts) count(status int) Counts {
	c.Requests++
	switch {
	case status >= 200 && status < 300:
		c.OK++
	case status == http.StatusBadGateway:
		c.BadGateway++
	case status == http.StatusServiceUnavailable:
		c.Unavailable++
	case status == http.StatusGatewayTimeout:
		c.Timeout++
	default:
		c.OtherStatus++
	}
	return c
}

// Answered is c without what never got an HTTP answer: the part a
// balancer's log and the client must agree on.
func (c Counts) Answered() Counts {
	return Counts{
		Requests:    c.Requests - c.ClientErrors,
		OK:          c.OK,
		BadGateway:  c.BadGateway,
		Unavailable: c.Unavailable,
		Timeout:     c.Timeout,
		OtherStatus: c.OtherStatus,
	}
}

// sumByMethod adds maps of counts per method.
func sumByMethod(ms ...map[string]Counts) map[string]Counts {
	out := map[string]Counts{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = out[k].Add(v)
		}
	}
	return out
}

// methods returns the keys of m in order.
func methods(m map[string]Counts) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
