package rehearsal

import (
	"context"
	"errors"
	"fmt"
	"io"
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

// LoadConfig is what a Load sends.
type LoadConfig struct {
	// Targets are base URLs on 127.0.0.1 (the balancer nodes); requests are
	// spread over them in turn.
	Targets []string
	// Path is the route asked, with its query (e.g. /work?ms=5).
	Path string
	// Rate is requests per second, over all targets together.
	Rate int
	// RequestTimeout bounds one request; a request that outlives it is a
	// client error.
	RequestTimeout time.Duration
	// IdleTimeout closes a connection idle this long. Keep it below the
	// balancer's idle timeout, so the client, not the balancer, closes an
	// idle connection, and no request races a balancer closing it.
	IdleTimeout time.Duration
	// MaxRequests and MaxDuration bound the run: it stops at whichever comes
	// first, even if nobody calls Stop.
	MaxRequests int64
	MaxDuration time.Duration
}

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
	if c.Path == "" || c.Path[0] != '/' {
		errs = append(errs, fieldErr("Path", "%q must start with /", c.Path))
	}
	if c.Rate <= 0 {
		errs = append(errs, fieldErr("Rate", "%d must be positive", c.Rate))
	}
	if c.RequestTimeout <= 0 {
		errs = append(errs, fieldErr("RequestTimeout", "%v must be positive", c.RequestTimeout))
	}
	if c.IdleTimeout <= 0 {
		errs = append(errs, fieldErr("IdleTimeout", "%v must be positive", c.IdleTimeout))
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

	requests, ok, s502, s503, s504, other, clientErr, skipped atomic.Int64

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
		DialContext:         (&net.Dialer{Timeout: cfg.RequestTimeout}).DialContext,
		MaxIdleConnsPerHost: conns,
		MaxIdleConns:        conns * len(cfg.Targets),
		IdleConnTimeout:     cfg.IdleTimeout,
		DisableCompression:  true,
	}
	// Stop and MaxDuration end the pacing; requests already sent run to
	// their own timeout and are counted. Only ctx's end cuts them.
	pace, cancel := context.WithTimeout(ctx, cfg.MaxDuration)
	l := &Load{
		cfg:       cfg,
		client:    &http.Client{Transport: transport, Timeout: cfg.RequestTimeout},
		cancel:    cancel,
		done:      make(chan struct{}),
		errSample: map[string]int64{},
	}
	go l.run(pace, ctx, conns)
	return l, nil
}

// run paces requests by a ticker: at each tick it starts as many as the rate
// says should have started by now, so a late tick never lowers the rate.
func (l *Load) run(pace, reqCtx context.Context, conns int) {
	defer close(l.done)
	defer l.client.CloseIdleConnections()
	defer l.wg.Wait()
	slots := make(chan struct{}, conns)
	interval := time.Second / time.Duration(l.cfg.Rate)
	interval = max(interval, time.Millisecond)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	start := time.Now()
	var sent int64
	for next := 0; ; {
		select {
		case <-pace.Done():
			return
		case now := <-ticker.C:
			due := min(int64(now.Sub(start).Seconds()*float64(l.cfg.Rate)), l.cfg.MaxRequests)
			for ; sent < due; sent++ {
				target := l.cfg.Targets[next%len(l.cfg.Targets)]
				next++
				select {
				case slots <- struct{}{}:
					l.wg.Add(1)
					go func() {
						defer l.wg.Done()
						defer func() { <-slots }()
						l.one(reqCtx, target)
					}()
				default:
					l.skipped.Add(1)
				}
			}
			if sent >= l.cfg.MaxRequests {
				return
			}
		}
	}
}

func (l *Load) one(ctx context.Context, target string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target+l.cfg.Path, nil)
	if err != nil {
		l.clientError(err)
		return
	}
	resp, err := l.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			// The whole rehearsal was cancelled: not a failed request.
			return
		}
		l.clientError(err)
		return
	}
	// Read the whole body so the connection goes back to the pool.
	_, copyErr := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	l.requests.Add(1)
	switch {
	case copyErr != nil:
		l.clientErr.Add(1)
		l.noteError(fmt.Errorf("read body: %w", copyErr))
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		l.ok.Add(1)
	case resp.StatusCode == http.StatusBadGateway:
		l.s502.Add(1)
	case resp.StatusCode == http.StatusServiceUnavailable:
		l.s503.Add(1)
	case resp.StatusCode == http.StatusGatewayTimeout:
		l.s504.Add(1)
	default:
		l.other.Add(1)
		l.noteError(fmt.Errorf("status %d", resp.StatusCode))
	}
}

func (l *Load) clientError(err error) {
	l.requests.Add(1)
	l.clientErr.Add(1)
	l.noteError(err)
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
func (l *Load) Counts() Counts {
	return Counts{
		Requests:     l.requests.Load(),
		OK:           l.ok.Load(),
		BadGateway:   l.s502.Load(),
		Unavailable:  l.s503.Load(),
		Timeout:      l.s504.Load(),
		OtherStatus:  l.other.Load(),
		ClientErrors: l.clientErr.Load(),
		Skipped:      l.skipped.Load(),
	}
}

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
