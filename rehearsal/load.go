package rehearsal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Counts classifies responses the way users feel them. Only 502 and 504 are
// requests that reached nothing; a 503 from the balancer means it had no
// healthy upstream; a server's own health-check 503 never reaches the load
// generator, which asks only real routes.
type Counts struct {
	Requests     int64 `json:"requests"`
	OK           int64 `json:"2xx"`
	BadGateway   int64 `json:"502"`
	Unavailable  int64 `json:"503"`
	Timeout      int64 `json:"504"`
	OtherStatus  int64 `json:"other"`
	ClientErrors int64 `json:"client_errors"`
	// Skipped counts requests the generator could not start because every
	// connection was busy: the offered rate fell short by this much.
	Skipped int64 `json:"skipped"`
}

// ReachedNothing is the number the rehearsal is about: 502s and 504s.
func (c Counts) ReachedNothing() int64 { return c.BadGateway + c.Timeout }

// Sub returns c − o, the counts between two snapshots.
func (c Counts) Sub(o Counts) Counts {
	return Counts{
		Requests:     c.Requests - o.Requests,
		OK:           c.OK - o.OK,
		BadGateway:   c.BadGateway - o.BadGateway,
		Unavailable:  c.Unavailable - o.Unavailable,
		Timeout:      c.Timeout - o.Timeout,
		OtherStatus:  c.OtherStatus - o.OtherStatus,
		ClientErrors: c.ClientErrors - o.ClientErrors,
		Skipped:      c.Skipped - o.Skipped,
	}
}

// Add returns c + o.
func (c Counts) Add(o Counts) Counts {
	return Counts{
		Requests:     c.Requests + o.Requests,
		OK:           c.OK + o.OK,
		BadGateway:   c.BadGateway + o.BadGateway,
		Unavailable:  c.Unavailable + o.Unavailable,
		Timeout:      c.Timeout + o.Timeout,
		OtherStatus:  c.OtherStatus + o.OtherStatus,
		ClientErrors: c.ClientErrors + o.ClientErrors,
		Skipped:      c.Skipped + o.Skipped,
	}
}

// Kind is one sort of request in a load's mix.
type Kind struct {
	// Method is GET or POST: a POST is what a balancer must never send
	// twice, and a GET is what a forgiving proxy silently re-sends.
	Method string
	// Path is the route with its query (e.g. /work?ms=10).
	Path string
	// Body is the size of a POST's body in bytes.
	Body int
	// Weight is the kind's share of the mix, relative to the others.
	Weight int
}

// LoadConfig is what a Load sends.
type LoadConfig struct {
	// Targets are base URLs on 127.0.0.1 (the balancer nodes); requests are
	// spread over them in turn.
	Targets []string
	// Mix is what is asked, each kind in proportion to its weight.
	Mix []Kind
	// Rate is requests per second, over all targets together.
	Rate int
	// Quiet spells: every QuietEvery, the last Quiet of it runs at QuietRate
	// instead of Rate. The balancer's pooled upstream connections sit idle
	// through a spell and are reused when the rate comes back: with Quiet
	// just under the balancer's idle timeout, the oldest reuse it allows.
	// Zero Quiet means none.
	Quiet, QuietEvery time.Duration
	QuietRate         int
	// Probe, when set, sends bursts after idle gaps at a keep-alive's edge
	// during the quiet spells.
	Probe *Probe
	// RequestTimeout bounds one request; a request that outlives it is a
	// client error.
	RequestTimeout time.Duration
	// MaxRequests and MaxDuration bound the run: it stops at whichever comes
	// first, even if nobody calls Stop.
	MaxRequests int64
	MaxDuration time.Duration
}

// Probe is load aimed at the keep-alive race. The balancer pools its
// upstream connections; a connection the app closes at the moment the
// balancer sends a request on it is a 502 (the ALB's "target closed the
// connection ... while the load balancer had an outstanding request"). Steady
// or random arrivals rarely land there (measured: none in a minute at 200
// requests/s; the node seems to reuse its newest connection first), and the
// race window on loopback is about a
// millisecond (measured: a request sent 1 ms before to 0.5 ms after the
// app's idle close races it). So during each quiet spell every target gets
// bursts of Width requests, one per server behind it, each burst sent Gap
// (give or take the window) after the previous burst was answered: the
// node's pooled connections idle for just about Gap, then are reused. With
// Gap at the app's keep-alive, an app that closes before the balancer does
// is caught in the act; an app that outlasts the balancer never is.
type Probe struct {
	// Gap is the idle time aimed at, between a burst's last answer and the
	// next burst.
	Gap time.Duration
	// Width is requests per burst: the servers behind each target, so that
	// each of them gets one.
	Width int
	// Kinds are what the bursts ask, in turn: short ones, so that a burst's
	// connections go idle together.
	Kinds []Kind
}

// The probe's gaps spread over the loopback race window and a little
// either side of it: Gap − probeEarly to Gap + probeLate.
const (
	probeEarly = 2 * time.Millisecond
	probeLate  = time.Millisecond
)

// Validate reports every problem with c at once.
func (c LoadConfig) Validate() error {
	var errs []error
	if len(c.Targets) == 0 {
		errs = append(errs, fieldErr("Targets", "is empty"))
	}
	for _, t := range c.Targets {
		if err := checkLoopback(t); err != nil {
			errs = append(errs, err)
		}
	}
	if len(c.Mix) == 0 {
		errs = append(errs, fieldErr("Mix", "is empty"))
	}
	for i, k := range c.Mix {
		if k.Method != http.MethodGet && k.Method != http.MethodPost {
			errs = append(errs, fieldErr(fmt.Sprintf("Mix[%d].Method", i), "%q must be GET or POST", k.Method))
		}
		if k.Path == "" || k.Path[0] != '/' {
			errs = append(errs, fieldErr(fmt.Sprintf("Mix[%d].Path", i), "%q must start with /", k.Path))
		}
		if k.Body < 0 || (k.Method == http.MethodGet && k.Body != 0) {
			errs = append(errs, fieldErr(fmt.Sprintf("Mix[%d].Body", i), "%d must be 0 for a GET and not negative", k.Body))
		}
		if k.Weight < 1 {
			errs = append(errs, fieldErr(fmt.Sprintf("Mix[%d].Weight", i), "%d must be at least 1", k.Weight))
		}
	}
	if c.Rate <= 0 {
		errs = append(errs, fieldErr("Rate", "%d must be positive", c.Rate))
	}
	if c.Quiet < 0 {
		errs = append(errs, fieldErr("Quiet", "%v must not be negative", c.Quiet))
	}
	if c.Quiet > 0 && c.QuietEvery <= c.Quiet {
		errs = append(errs, fieldErr("QuietEvery", "%v must exceed Quiet %v", c.QuietEvery, c.Quiet))
	}
	if c.QuietRate < 0 || c.QuietRate > c.Rate {
		errs = append(errs, fieldErr("QuietRate", "%d must be within [0, Rate %d]", c.QuietRate, c.Rate))
	}
	if p := c.Probe; p != nil {
		if p.Gap <= probeEarly {
			errs = append(errs, fieldErr("Probe.Gap", "%v must exceed %v", p.Gap, probeEarly))
		}
		if p.Width < 1 {
			errs = append(errs, fieldErr("Probe.Width", "%d must be at least 1", p.Width))
		}
		if len(p.Kinds) == 0 {
			errs = append(errs, fieldErr("Probe.Kinds", "is empty"))
		}
		if c.Quiet == 0 {
			errs = append(errs, fieldErr("Probe", "needs quiet spells (Quiet is 0)"))
		}
	}
	if c.RequestTimeout <= 0 {
		errs = append(errs, fieldErr("RequestTimeout", "%v must be positive", c.RequestTimeout))
	}
	if c.MaxRequests <= 0 {
		errs = append(errs, fieldErr("MaxRequests", "%d must be positive", c.MaxRequests))
	}
	if c.MaxDuration <= 0 {
		errs = append(errs, fieldErr("MaxDuration", "%v must be positive", c.MaxDuration))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("load config: %w", err)
	}
	return nil
}

// quietLeft is how much of a quiet spell is left elapsed into the run; zero
// outside the spells.
func (c LoadConfig) quietLeft(elapsed time.Duration) time.Duration {
	if c.Quiet == 0 {
		return 0
	}
	into := elapsed % c.QuietEvery
	if into < c.QuietEvery-c.Quiet {
		return 0
	}
	return c.QuietEvery - into
}

// rateAt is the rate due elapsed into the run.
func (c LoadConfig) rateAt(elapsed time.Duration) float64 {
	if c.quietLeft(elapsed) > 0 {
		return float64(c.QuietRate)
	}
	return float64(c.Rate)
}

// fieldErr is a problem with one named field of a config; the message
// starts with the field's name, as the caller spells it.
func fieldErr(field, format string, args ...any) error {
	return fmt.Errorf("%s "+format, append([]any{field}, args...)...)
}

// checkLoopback refuses any target but 127.0.0.1: the rehearsal never sends
// traffic off the machine.
func checkLoopback(target string) error {
	u, err := url.Parse(target)
	if err != nil {
		return fmt.Errorf("target %q: %w", target, err)
	}
	if u.Scheme != "http" || u.Hostname() != "127.0.0.1" || u.Port() == "" {
		return fmt.Errorf("target %q must be http://127.0.0.1:<port>", target)
	}
	return nil
}

// Load is a running load generator.
type Load struct {
	cfg    LoadConfig
	client *http.Client
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup
	// start is the one clock of the spells: the mix and the probes read
	// it, so the probes never run while the mix is still sending (each
	// goroutine's own start differs by its scheduling delay).
	start time.Time

	kinds []Kind // the mix, each kind repeated by its weight
	tally tally

	errMu     sync.Mutex
	errSample map[string]int64
}

// StartLoad starts sending cfg.Rate requests per second, each on one of a
// pool of keep-alive connections, until Stop, ctx's end, or cfg's bounds.
func StartLoad(ctx context.Context, cfg LoadConfig) (*Load, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// One second of requests in flight at most: enough connections that a
	// server finishing in-flight work never starves the rate, few enough
	// that a stuck balancer shows up as Skipped, not as unbounded goroutines.
	conns := cfg.Rate
	transport := &http.Transport{
		DialContext: (&net.Dialer{Timeout: cfg.RequestTimeout}).DialContext,
		// A connection per request. HAProxy answers a request that was not
		// the first on its client connection by closing that connection
		// silently when the server resets a reused upstream connection (it
		// expects the client to retry, and Go's client does re-send a GET),
		// where the ALB answers 502. The first request on a connection gets
		// the 502; the upstream side, where the keep-alive race lives, is
		// pooled by the node either way.
		DisableKeepAlives:  true,
		DisableCompression: true,
	}
	// Stop and MaxDuration end the pacing; requests already sent run to
	// their own timeout and are counted. Only ctx's end cuts them.
	pace, cancel := context.WithTimeout(ctx, cfg.MaxDuration)
	l := &Load{
		cfg: cfg,
		tally: tally{
			byMethod: map[string]*counter{},
			byTarget: map[string]*counter{},
		},
		client:    &http.Client{Transport: transport, Timeout: cfg.RequestTimeout},
		cancel:    cancel,
		done:      make(chan struct{}),
		start:     time.Now(),
		errSample: map[string]int64{},
	}
	for _, t := range cfg.Targets {
		l.tally.byTarget[t] = &counter{}
	}
	for _, k := range cfg.Mix {
		for range k.Weight {
			l.kinds = append(l.kinds, k)
		}
		if l.tally.byMethod[k.Method] == nil {
			l.tally.byMethod[k.Method] = &counter{}
		}
	}
	l.wg.Add(1)
	go l.run(pace, ctx, conns)
	if cfg.Probe != nil {
		for _, t := range cfg.Targets {
			l.wg.Add(1)
			go l.probe(pace, ctx, t)
		}
	}
	go func() {
		l.wg.Wait()
		l.client.CloseIdleConnections()
		close(l.done)
	}()
	return l, nil
}

// run paces requests by a ticker: at each tick it starts as many as the
// rate (integrated over time, quiet spells included) says should have
// started by now, so a late tick never lowers the rate.
func (l *Load) run(pace, reqCtx context.Context, conns int) {
	defer l.wg.Done()
	slots := make(chan struct{}, conns)
	interval := time.Second / time.Duration(l.cfg.Rate)
	interval = max(interval, time.Millisecond)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	start := l.start
	last := start
	var sent int64
	var due float64
	for {
		select {
		case <-pace.Done():
			return
		case now := <-ticker.C:
			due += l.cfg.rateAt(now.Sub(start)) * now.Sub(last).Seconds()
			last = now
			for ; sent < min(int64(due), l.cfg.MaxRequests); sent++ {
				// Every kind goes to every target in turn.
				kind := l.kinds[sent%int64(len(l.kinds))]
				target := l.cfg.Targets[(sent/int64(len(l.kinds)))%int64(len(l.cfg.Targets))]
				select {
				case slots <- struct{}{}:
					l.wg.Add(1)
					go func() {
						defer l.wg.Done()
						defer func() { <-slots }()
						l.one(reqCtx, target, kind)
					}()
				default:
					l.tally.skip()
				}
			}
			if sent >= l.cfg.MaxRequests {
				// The run's bound: the probes stop too.
				l.cancel()
				return
			}
		}
	}
}

// nextGap is the wait before the next burst: Gap, spread over the race
// window, from Gap − probeEarly up to Gap + probeLate.
func (p *Probe) nextGap() time.Duration {
	return p.Gap - probeEarly + rand.N(probeEarly+probeLate)
}

// probe sends target its bursts in every quiet spell (Probe): one as the
// spell starts, then one after each gap, as long as a whole gap still fits.
func (l *Load) probe(pace, reqCtx context.Context, target string) {
	defer l.wg.Done()
	p := l.cfg.Probe
	start := l.start
	sleep := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-pace.Done():
			return false
		case <-t.C:
			// Both may be ready at once, and select picks either: the
			// run's end wins, so no burst follows it.
			return pace.Err() == nil
		}
	}
	var n int
	burst := func() {
		var wg sync.WaitGroup
		for range p.Width {
			k := p.Kinds[n%len(p.Kinds)]
			n++
			wg.Add(1)
			go func() {
				defer wg.Done()
				l.one(reqCtx, target, k)
			}()
		}
		wg.Wait()
	}
	for {
		elapsed := time.Since(start)
		if l.cfg.quietLeft(elapsed) == 0 {
			if !sleep(l.cfg.QuietEvery - l.cfg.Quiet - elapsed%l.cfg.QuietEvery) {
				return
			}
			continue
		}
		burst()
		for {
			gap := p.nextGap()
			if l.cfg.quietLeft(time.Since(start)) <= gap {
				break
			}
			if !sleep(gap) {
				return
			}
			burst()
		}
		// Out of this spell before looking for the next one.
		if !sleep(l.cfg.quietLeft(time.Since(start)) + time.Millisecond) {
			return
		}
	}
}

func (l *Load) one(ctx context.Context, target string, k Kind) {
	var body io.Reader
	if k.Method == http.MethodPost {
		body = bytes.NewReader(bytes.Repeat([]byte("x"), k.Body))
	}
	req, err := http.NewRequestWithContext(ctx, k.Method, target+k.Path, body)
	if err != nil {
		l.clientError(k.Method, target, err)
		return
	}
	resp, err := l.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			// The whole rehearsal was cancelled: not a failed request.
			return
		}
		l.clientError(k.Method, target, err)
		return
	}
	// Read the whole body so the connection goes back to the pool.
	_, copyErr := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if copyErr != nil {
		l.clientError(k.Method, target, fmt.Errorf("%s: read body: %w", k.Method, copyErr))
		return
	}
	l.tally.answer(k.Method, target, resp.StatusCode)
	if s := resp.StatusCode; s < 200 || (s >= 300 && s != http.StatusBadGateway && s != http.StatusServiceUnavailable && s != http.StatusGatewayTimeout) {
		l.noteError(fmt.Errorf("%s: status %d", k.Method, s))
	}
}

func (l *Load) clientError(method, target string, err error) {
	l.tally.failed(method, target)
	l.noteError(err)
}

// tally is every count of the load. A request is counted in three
// counters (the total, its method's, its target's), each under the read
// side of mu; a Snapshot holds the write side, so it sees every request
// in all three or in none: a deploy's total always equals the sum of its
// per-method counts, however many requests finish while it is read.
type tally struct {
	mu       sync.RWMutex
	total    counter
	byMethod map[string]*counter // keys fixed at start
	byTarget map[string]*counter // keys fixed at start
	skipped  atomic.Int64
}

func (t *tally) answer(method, target string, status int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	t.total.add(status)
	t.byMethod[method].add(status)
	t.byTarget[target].add(status)
}

func (t *tally) failed(method, target string) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, c := range []*counter{&t.total, t.byMethod[method], t.byTarget[target]} {
		c.requests.Add(1)
		c.clientErr.Add(1)
	}
}

func (t *tally) skip() {
	t.mu.RLock()
	defer t.mu.RUnlock()
	t.skipped.Add(1)
}

// Snapshot is the load's counts at one instant: the total, and the same
// requests split per method and per target (Skipped is not split).
type Snapshot struct {
	Total    Counts
	ByMethod map[string]Counts
	ByTarget map[string]Counts
}

// Snapshot returns every count of the load at one instant.
func (l *Load) Snapshot() Snapshot {
	t := &l.tally
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Snapshot{
		Total:    t.total.load(),
		ByMethod: make(map[string]Counts, len(t.byMethod)),
		ByTarget: make(map[string]Counts, len(t.byTarget)),
	}
	s.Total.Skipped = t.skipped.Load()
	for m, c := range t.byMethod {
		s.ByMethod[m] = c.load()
	}
	for k, c := range t.byTarget {
		s.ByTarget[k] = c.load()
	}
	return s
}

// counter counts answers as they come, safe for concurrent use.
type counter struct {
	requests, ok, s502, s503, s504, other, clientErr atomic.Int64
}

func (c *counter) add(status int) {
	c.requests.Add(1)
	switch {
	case status >= 200 && status < 300:
		c.ok.Add(1)
	case status == http.StatusBadGateway:
		c.s502.Add(1)
	case status == http.StatusServiceUnavailable:
		c.s503.Add(1)
	case status == http.StatusGatewayTimeout:
		c.s504.Add(1)
	default:
		c.other.Add(1)
	}
}

func (c *counter) load() Counts {
	return Counts{
		Requests:     c.requests.Load(),
		OK:           c.ok.Load(),
		BadGateway:   c.s502.Load(),
		Unavailable:  c.s503.Load(),
		Timeout:      c.s504.Load(),
		OtherStatus:  c.other.Load(),
		ClientErrors: c.clientErr.Load(),
	}
}

// noteError keeps a count per distinct message (bounded), so a report can
// say what the client errors were.
func (l *Load) noteError(err error) {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	msg := err.Error()
	if _, ok := l.errSample[msg]; ok || len(l.errSample) < 20 {
		l.errSample[msg]++
	}
}

// Counts returns the counts so far.
func (l *Load) Counts() Counts { return l.Snapshot().Total }

// ByMethod returns the counts so far per method (Skipped is not split).
func (l *Load) ByMethod() map[string]Counts { return l.Snapshot().ByMethod }

// ByTarget returns the counts so far per target.
func (l *Load) ByTarget() map[string]Counts { return l.Snapshot().ByTarget }

// Errors returns the distinct client errors and unexpected statuses seen,
// with how often each occurred.
func (l *Load) Errors() map[string]int64 {
	l.errMu.Lock()
	defer l.errMu.Unlock()
	out := make(map[string]int64, len(l.errSample))
	for k, v := range l.errSample {
		out[k] = v
	}
	return out
}

// Done is closed once the load has stopped and every request has finished.
func (l *Load) Done() <-chan struct{} { return l.done }

// Stop stops sending, waits for in-flight requests to finish, and returns the
// totals.
func (l *Load) Stop() Counts {
	l.cancel()
	<-l.done
	return l.Counts()
}
