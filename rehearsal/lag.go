package rehearsal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/mythex/infra/infra"
)

// A balancer node slower than its numbers. The contract's zero rests on
// every ALB node acting on its deciding check at once (within NodeSkew);
// nobody outside AWS knows that it does, and the reports nearest to ours
// are of balancers that kept sending after they should have stopped
// (aws-load-balancer-controller #2366, #1064). A lagging node rehearses
// that: the server sees and answers each of the node's checks when it is
// made, and the node acts on each answer a chosen lag L later.
//
// HAProxy sends such a node's checks to a LagShim (`check addr … port …`),
// which cannot simply pass each check on and hand the node the answer the
// server gave L before: the node's earlier checks are whole intervals
// apart, so "L before" would round up to the next whole interval (a 12 s
// lag at a 5 s interval would act as 15 s, past what the lagging-balancer
// rows are built on). So the shim makes the node's checks itself, on the
// node's schedule moved L earlier: the check the node will make at g is
// made to the server at g − L, with the node's method, path and headers
// (its X-Mythex-Node among them), and the node gets that answer at g. The
// server sees one checker every interval carrying the node's name, as it
// would see the node; the node sees every answer L late, never sooner, and
// an interval later when a busy machine runs the shim's check too late to
// be the one due (TestLagFidelity measures how often).

// LagShim stands between one balancer node's health checks and one server.
type LagShim struct {
	// Addr is where the node sends its checks of the server.
	Addr string

	target string
	lag    time.Duration
	client *http.Client
	srv    *http.Server
	// ctx ends at Stop; it bounds the shim's own checks.
	ctx    context.Context
	cancel context.CancelFunc
	// wake tells the scheduler the node has checked: its schedule moved.
	wake   chan struct{}
	steady chan struct{}
	wg     sync.WaitGroup

	mu                sync.Mutex
	interval, timeout time.Duration
	// The node's last check: what the shim's checks ask, and when.
	method, uri string
	header      http.Header
	anchor      time.Time
	// period is how far apart the node's checks really come: HAProxy
	// schedules each check an interval after the last one ended, so a
	// little more than an interval, and more on a busy machine. The shim
	// checks several of the node's checks ahead, where a nominal interval
	// would be off by as many times the difference.
	period time.Duration
	// lastOwn is the shim's last check of the server.
	lastOwn time.Time
	// answers are the shim's checks of the server, oldest first, from the
	// one the node got last on.
	answers  []*lagAnswer
	stats    LagStats
	isSteady bool
}

// lagAnswer is one check of the server, made by the shim for the node.
type lagAnswer struct {
	at time.Time
	// first: made at the node's first check, not on its schedule.
	first bool
	done  chan struct{}
	// status is the server's answer; 0 when it gave none, timedOut says
	// whether it was silent or the connection failed.
	status   int
	timedOut bool
}

// LagStats is what a shim has told its node so far.
type LagStats struct {
	// Answers counts the node's checks answered.
	Answers int
	// Early counts those answered, while the node started, with the
	// server's answer to its first check: nothing the lag old was known.
	Early int
	// MinLag and MaxLag bound how long before the node's check the server
	// gave each other answer (never less than the lag by more than a
	// quarter of an interval); SumLag adds them up (MeanLag).
	MinLag, MaxLag, SumLag time.Duration
}

// MeanLag is how long before the node's check the server gave the answers
// other than the early ones, on average.
func (s LagStats) MeanLag() time.Duration {
	if n := s.Answers - s.Early; n > 0 {
		return s.SumLag / time.Duration(n)
	}
	return 0
}

// StartLagShim listens on a free loopback port for one node's checks of
// target, a node that checks every t.HealthCheckInterval and gives each
// check t.HealthCheckTimeout, and answers each check with the server's
// answer from lag before.
func StartLagShim(target string, lag time.Duration, t infra.Timing) (*LagShim, error) {
	if lag <= 0 {
		return nil, fmt.Errorf("lag shim for %s: lag %v must be positive", target, lag)
	}
	if err := checkBalancerTiming(t); err != nil {
		return nil, fmt.Errorf("lag shim for %s: %w", target, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("lag shim for %s: %w", target, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &LagShim{
		Addr:   l.Addr().String(),
		target: target,
		lag:    lag,
		// A connection per check, as the node checks; no proxy.
		client:   &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		ctx:      ctx,
		cancel:   cancel,
		wake:     make(chan struct{}, 1),
		steady:   make(chan struct{}),
		interval: t.HealthCheckInterval,
		timeout:  t.HealthCheckTimeout,
		period:   t.HealthCheckInterval,
	}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serveCheck), ReadHeaderTimeout: t.HealthCheckTimeout}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(l)
	}()
	go s.schedule()
	return s, nil
}

// Steady is closed once the node has had its first answer made on its
// schedule, the lag before: from then on every answer it gets is.
func (s *LagShim) Steady() <-chan struct{} { return s.steady }

// Stats reports what the shim has told the node so far.
func (s *LagShim) Stats() LagStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Stop closes the shim and waits for its checks to end.
func (s *LagShim) Stop() {
	s.cancel()
	_ = s.srv.Close()
	s.wg.Wait()
}

// serveCheck answers one of the node's checks.
func (s *LagShim) serveCheck(w http.ResponseWriter, r *http.Request) {
	a := s.answerFor(r, time.Now())
	select {
	case <-a.done:
	case <-r.Context().Done():
		return
	}
	switch {
	case a.status != 0:
		w.Header().Set("Connection", "close")
		w.WriteHeader(a.status)
	case a.timedOut:
		// Silent, as the server was: the node's own timeout fails the
		// check. Bounded for a node that never gives up.
		select {
		case <-r.Context().Done():
		case <-s.ctx.Done():
		case <-time.After(2 * s.checkTimeout()):
		}
		resetConn(w)
	default:
		// Refused or reset: the node's check connection is reset, which
		// HAProxy counts as the server gone (listenerGone), as it would
		// the refusal itself.
		resetConn(w)
	}
}

func (s *LagShim) checkTimeout() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.timeout
}

// answerFor notes the node's check at now and picks the answer it gets:
// the server's latest answer at least the lag old, give or take
// lagTolerance. The node's first check has none, and is made to the server
// at once; until answers the lag old exist, the node gets that one.
func (s *LagShim) answerFor(r *http.Request, now time.Time) *lagAnswer {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.method, s.uri = r.Method, r.URL.RequestURI()
	s.header = r.Header.Clone()
	s.header.Del("Connection")
	// The period follows the gaps between the node's checks, slowly: one
	// check delayed by a busy moment moves it an eighth of the delay, and a
	// gap that is no period at all (the node stalled, or started) not at
	// all.
	if gap := now.Sub(s.anchor); !s.anchor.IsZero() && gap > s.interval/2 && gap < 2*s.interval {
		s.period += (gap - s.period) / 8
	}
	s.anchor = now
	defer s.poke()
	s.stats.Answers++
	if len(s.answers) == 0 {
		first := s.checkLocked(now)
		first.first = true
		s.answers = append(s.answers, first)
	}
	// The answers are in the order the shim asked; the oldest is the
	// fallback while the node starts.
	pick := 0
	for i, a := range s.answers {
		if now.Sub(a.at) >= s.lag-lagTolerance(s.interval) {
			pick = i
		}
	}
	best := s.answers[pick]
	// Older ones are no later check's any more.
	s.answers = s.answers[pick:]
	lag := now.Sub(best.at)
	if best.first {
		s.stats.Early++
		return best
	}
	if !s.isSteady {
		s.isSteady = true
		s.stats.MinLag, s.stats.MaxLag = lag, lag
		close(s.steady)
	}
	s.stats.MinLag, s.stats.MaxLag = min(s.stats.MinLag, lag), max(s.stats.MaxLag, lag)
	s.stats.SumLag += lag
	return best
}

// lagTolerance is how much younger than the lag an answer may be and still
// be the node's: the shim asks the server when the node's check is due,
// and a busy machine runs its timer a little late. A quarter of an
// interval: the shim's checks are an interval apart, so the one before is
// never taken for the one due.
func lagTolerance(interval time.Duration) time.Duration {
	return interval / 4
}

func (s *LagShim) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// schedule makes the node's checks of the server, each L before the node
// will make it, until Stop.
func (s *LagShim) schedule() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		s.mu.Lock()
		next, ok := s.nextLocked()
		s.mu.Unlock()
		var fire <-chan time.Time
		if ok {
			timer.Reset(time.Until(next))
			fire = timer.C
		}
		select {
		case <-s.ctx.Done():
			timer.Stop()
			return
		case <-s.wake:
		case <-fire:
			s.mu.Lock()
			s.answers = append(s.answers, s.checkLocked(time.Now()))
			s.mu.Unlock()
		}
		timer.Stop()
	}
}

// nextLocked is when the shim checks the server next: L before one of the
// node's coming checks, which follow its last one (anchor) a period apart;
// the first such moment at least three quarters of an interval after the
// shim's last check. The server then sees its checks about an interval
// apart, never closer than half of one, which the drain would take for two
// nodes sharing a name.
func (s *LagShim) nextLocked() (time.Time, bool) {
	if s.anchor.IsZero() {
		return time.Time{}, false
	}
	from := s.lastOwn.Sub(s.anchor) + s.lag + 3*s.interval/4
	k := math.Ceil(float64(from) / float64(s.period))
	return s.anchor.Add(time.Duration(k)*s.period - s.lag), true
}

// checkLocked checks the server now, as the node does, and records the
// answer when it comes.
func (s *LagShim) checkLocked(now time.Time) *lagAnswer {
	a := &lagAnswer{at: now, done: make(chan struct{})}
	s.lastOwn = now
	method, uri, header, timeout := s.method, s.uri, s.header.Clone(), s.timeout
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(a.done)
		a.status, a.timedOut = s.ask(method, uri, header, timeout)
	}()
	return a
}

// ask makes one check of the server and returns its status, or 0 and
// whether it stayed silent past timeout.
func (s *LagShim) ask(method, uri string, header http.Header, timeout time.Duration) (status int, timedOut bool) {
	ctx, cancel := context.WithTimeout(s.ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+s.target+uri, nil)
	if err != nil {
		return 0, false
	}
	req.Header = header
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, errors.Is(err, context.DeadlineExceeded)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, false
}

// resetConn ends the node's check connection with a reset, unanswered.
func resetConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return
	}
	c, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
