package drain

//go:generate go run gen_doc.go

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Phase is where a Server is in its life. Phases only move forward, one
// step at a time: Serving, Draining, ShuttingDown, Stopped.
type Phase int32

// The phases, in the order a Server goes through them.
const (
	// Serving: health answers HealthyStatus (when ready), every route serves.
	Serving Phase = iota
	// Draining: health answers 503, every other route still serves, and
	// every response closes its connection. Lasts Config.Drain, or less or
	// more on evidence (see Server).
	Draining
	// ShuttingDown: the listener is closed; in-flight requests have
	// Config.ShutdownTimeout to finish.
	ShuttingDown
	// Stopped: every connection is closed and Serve has returned.
	Stopped
)

var phaseNames = [...]string{"serving", "draining", "shutting-down", "stopped"}

func (p Phase) String() string {
	if p < 0 || int(p) >= len(phaseNames) {
		return fmt.Sprintf("phase(%d)", int32(p))
	}
	return phaseNames[p]
}

// PhaseChange is one step from a phase to the next.
type PhaseChange struct {
	From, To Phase
	// At is when To began.
	At time.Time
	// Lasted is how long From lasted.
	Lasted time.Duration
	// Reason is what ended From, e.g. "SIGTERM" or "drain elapsed".
	Reason string
}

// Option adjusts a Server built by New.
type Option func(*Server)

// WithLogger sends the Server's logs (phase changes, readiness changes, cut
// requests) to l instead of slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(s *Server) { s.log = l }
}

// WithReady plugs in the service's own readiness, e.g. a dependency being
// reachable. While check returns an error, the health route answers 503 just
// as it does while draining, but the log says "not ready" with the error
// rather than "draining". check runs on every health request, with that
// request's context: keep it fast.
func WithReady(check func(context.Context) error) Option {
	return func(s *Server) { s.ready = check }
}

// OnPhase calls f on every phase change, in order, on the goroutine that runs
// the lifecycle: f must not block. Several OnPhase options all apply.
func OnPhase(f func(PhaseChange)) Option {
	return func(s *Server) { s.hooks = append(s.hooks, f) }
}

// Reasons a phase ends; they appear in logs and in PhaseChange.Reason.
const (
	ReasonCalled        = "StartDrain called"
	ReasonSkipCalled    = "SkipDrain called"
	ReasonDrainElapsed  = "drain elapsed"
	ReasonAllFinished   = "in-flight requests finished"
	ReasonDeadline      = "shutdown timeout elapsed"
	ReasonContextDone   = "context done"
	reasonListenerError = "listener failed"
)

// Server serves HTTP and, when asked to stop, drains: it fails its health
// check while still serving real traffic until the balancer has stopped
// sending any, then closes its listener and lets in-flight requests finish.
// A Server serves once.
//
// The evidence drain (Config.Evidence) ends the drain on what the server
// sees rather than on a clock: the balancer's health checks it answered 503,
// counted per node, and the arrivals of real requests. Its rules:
//
//   - It ends early once every balancer node it can tell apart has had
//     UnhealthyThreshold checks answered 503 and no request has arrived for
//     DrainQuiet since the last of them, but never before EarliestDrainEnd,
//     (UnhealthyThreshold − 1) × HealthCheckInterval + DrainQuiet after the
//     drain began: no node can have acted sooner (ReasonEvidence).
//   - Where the evidence is weak, Drain rules as a fixed drain, exactly as
//     with the evidence drain off (ReasonDrainElapsed): no node seen
//     checking, nodes it cannot tell apart (one name or address checking
//     faster than one node does), or traffic too thin (fewer than
//     QuietRequests requests in the DrainQuiet before the drain) for
//     silence to mean anything.
//   - Otherwise, when requests still arrive at the end of Drain, it goes on
//     until none has arrived for DrainQuiet (ReasonRequestsStopped), up to
//     MaxDrain (ReasonMaxDrain, logged as an error: the balancer still
//     sends, and what it sends next is answered 502).
//
// What the server can and cannot know: a balancer node checks and forwards
// from its own address. An ALB has one node (or more) per subnet, each with
// its own address there, and a port Docker publishes by NAT keeps that
// address: the server tells nodes apart by it. Through Docker's userland
// proxy (loopback, hairpin) every node arrives from one address, and
// counting checks per address would count several nodes as one: a check
// that names its node (HeaderNode) counts for that name instead, and an
// address checking faster than one node marks the evidence weak. A node
// that stopped checking in the detection time before the drain no longer
// routes here and does not count; one the server never saw is unknown to
// it, which is why the silence of real traffic must confirm the checks. The
// service's own health check (HeaderSelfCheck) is never a node's.

// A handler may hijack its connection (a WebSocket upgrade), through
// http.Hijacker or http.ResponseController. The connection is then the
// handler's to close, but the shutdown still waits for it within
// ShutdownTimeout and closes and logs it if it is still open then. Such a
// handler should watch Entered(Draining) or Entered(ShuttingDown) and close
// its connection in its own protocol's way, so its client reconnects to
// another server.
type Server struct {
	cfg   Config
	next  http.Handler
	log   *slog.Logger
	ready func(context.Context) error
	hooks []func(PhaseChange)

	hs         *http.Server
	baseCtx    context.Context
	cancelBase context.CancelFunc

	phase   atomic.Int32
	entered [Stopped + 1]chan struct{}
	served  atomic.Bool

	drainOnce, skipOnce     sync.Once
	drainCh, skipCh         chan struct{}
	drainReason, skipReason string

	notReady atomic.Bool

	ev       *evidence
	extended chan struct{}

	mu       sync.Mutex
	inFlight map[*request]struct{}
	hijacked map[*hijackedConn]struct{}
	// closedOne is closed, and replaced, each time a hijacked connection
	// closes: the shutdown waits on it.
	closedOne chan struct{}
}

// request is one request being handled, kept so that a cut can be logged.
type request struct {
	method, path, remote string
	start                time.Time
	// hijacked: the handler took the connection over; a cut of it is
	// logged as the connection's, not as the request's.
	hijacked bool
}

// New returns a Server that answers cfg.HealthPath itself and passes every
// other request to next. cfg is validated first; every problem is reported.
func New(cfg Config, next http.Handler, opts ...Option) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("drain: invalid config: %w", err)
	}
	if next == nil {
		return nil, errors.New("drain: nil handler")
	}
	s := &Server{
		cfg:       cfg,
		next:      next,
		log:       slog.Default(),
		drainCh:   make(chan struct{}),
		skipCh:    make(chan struct{}),
		inFlight:  make(map[*request]struct{}),
		hijacked:  make(map[*hijackedConn]struct{}),
		closedOne: make(chan struct{}),
		ev:        newEvidence(cfg),
		extended:  make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	for i := range s.entered {
		s.entered[i] = make(chan struct{})
	}
	close(s.entered[Serving])
	s.baseCtx, s.cancelBase = context.WithCancel(context.Background())
	s.hs = &http.Server{
		Handler: s,
		// Longer than the balancer's idle timeout, so the balancer always
		// closes an idle connection first and never reuses one just closed.
		IdleTimeout: cfg.KeepAlive,
		// A slow client holds a connection only this long; the numbers and
		// their reasons are the timing contract's (see Config).
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return s.baseCtx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// Config returns the configuration the Server runs with.
func (s *Server) Config() Config { return s.cfg }

// IdleTimeout is the idle keep-alive timeout in force outside the drain.
func (s *Server) IdleTimeout() time.Duration { return s.hs.IdleTimeout }

// Phase returns the current phase.
func (s *Server) Phase() Phase { return Phase(s.phase.Load()) }

// Entered returns a channel that is closed once the Server has entered p. It
// stays closed, so a late reader never misses it. When Entered(ShuttingDown)
// is closed, the listener is already closed.
func (s *Server) Entered(p Phase) <-chan struct{} {
	if p < Serving || p > Stopped {
		panic(fmt.Sprintf("drain: no such phase %d", int32(p)))
	}
	return s.entered[p]
}

// Extended returns a channel that is closed once the drain has gone on past
// Config.Drain because requests were still arriving.
func (s *Server) Extended() <-chan struct{} { return s.extended }

// Evidence returns what the server has seen of the balancer so far: its
// nodes' checks, the traffic before the drain, and whether that is enough
// to end the drain on.
func (s *Server) Evidence() Evidence {
	s.ev.mu.Lock()
	defer s.ev.mu.Unlock()
	return s.ev.report()
}

// StartDrain starts the drain: health answers 503 from now on while every
// other route keeps serving. Calling it again has no further effect. It may
// be called before Serve; the drain then starts as soon as Serve does.
func (s *Server) StartDrain() { s.startDrain(ReasonCalled) }

// SkipDrain ends the drain now and moves on to shutting down; in-flight
// requests still get the whole shutdown timeout. Before the drain has
// started, it starts it and ends it at once.
func (s *Server) SkipDrain() { s.skipDrain(ReasonSkipCalled) }

func (s *Server) startDrain(reason string) {
	s.drainOnce.Do(func() {
		s.drainReason = reason
		close(s.drainCh)
	})
}

func (s *Server) skipDrain(reason string) {
	s.startDrain(reason)
	s.skipOnce.Do(func() {
		s.skipReason = reason
		close(s.skipCh)
	})
}

// Run serves on ln and stops on request. The first SIGTERM or SIGINT, or ctx
// ending, starts the drain. A second signal while draining ends the drain at
// once, as an operator's "I mean it": the listener closes, but in-flight
// requests still get the shutdown timeout, because cutting them would turn
// them into 502s. Later signals are logged and ignored: the hard stop is the
// container's SIGKILL, not this library's business. Run returns once the
// Server has stopped; a nil error means a clean stop, even if requests were
// cut (they are logged).
//
// ctx ending starts the drain but never cuts it short: a context from
// signal.NotifyContext ends on the very signal Run also receives, and one
// signal is one stop request.
func (s *Server) Run(ctx context.Context, ln net.Listener) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()

	signals := 0
	onSignal := func(sig os.Signal) {
		signals++
		reason := signalName(sig)
		switch {
		case signals == 1:
			s.startDrain(reason)
		case s.Phase() <= Draining:
			s.skipDrain("second stop request: " + reason)
		default:
			s.log.Warn("stop request ignored: already shutting down; in-flight requests keep their shutdown timeout",
				"reason", reason, "shutdown_timeout", s.cfg.ShutdownTimeout.String())
		}
	}
	ctxDone := ctx.Done()
	for {
		select {
		case err := <-done:
			return err
		case sig := <-sigs:
			onSignal(sig)
		case <-ctxDone:
			ctxDone = nil
			// The signal that ended a NotifyContext may already be here: it
			// is then the stop request, named after itself.
			select {
			case sig := <-sigs:
				onSignal(sig)
			default:
			}
			s.startDrain(contextReason(ctx))
		}
	}
}

// contextReason names a drain that ctx's end started. os/signal hands a
// signal to each channel registered for it in turn, so a context from
// signal.NotifyContext may end before the same signal reaches Run's own
// channel (it then counts there as the first stop request, which changes
// nothing). Such a context's cause is "<signal> signal received": the drain
// is named after that signal, whichever channel saw it first, rather than
// after whichever goroutine ran first.
func contextReason(ctx context.Context) string {
	cause := context.Cause(ctx)
	for _, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGINT} {
		if cause != nil && cause.Error() == sig.String()+" signal received" {
			return signalName(sig)
		}
	}
	return ReasonContextDone + ": " + cause.Error()
}

func signalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	}
	return sig.String()
}

// Serve serves on ln until the drain has run its course and every request
// has finished or been cut; it does not watch signals (Run does). It returns
// nil after a clean stop, or the listener's error if the listener failed, in
// which case the Server still skips the drain and shuts down in order.
func (s *Server) Serve(ln net.Listener) error {
	if !s.served.CompareAndSwap(false, true) {
		return errors.New("drain: Serve called twice")
	}
	since := time.Now()
	s.log.Info("serving", "addr", ln.Addr().String(), "health_path", s.cfg.HealthPath,
		"drain", s.cfg.Drain.String(), "shutdown_timeout", s.cfg.ShutdownTimeout.String(),
		"keepalive", s.cfg.KeepAlive.String(), "read_header_timeout", s.cfg.ReadHeaderTimeout.String(),
		"read_timeout", s.cfg.ReadTimeout.String(), "write_timeout", s.cfg.WriteTimeout.String(),
		"max_header_bytes", s.cfg.MaxHeaderBytes)

	listenerClosed := make(chan struct{})
	s.hs.RegisterOnShutdown(func() { close(listenerClosed) })
	serveDone := make(chan error, 1)
	go func() { serveDone <- s.hs.Serve(ln) }()

	var serveErr error
	select {
	case <-s.drainCh:
	case err := <-serveDone:
		serveErr = s.listenerFailed(ln, err)
	}
	since = s.enter(Draining, since, s.drainReason,
		"drain", s.cfg.Drain.String(), "health", http.StatusServiceUnavailable)
	// The drain's rules count from the moment health turned 503 and the
	// drain says it began (enter's time), not from a moment before it: a
	// drain measured from an earlier instant ended as much before its
	// configured length as the goroutine was preempted in between.
	s.ev.begin(since)
	drainStart := since

	reason, ev := s.drainWait(drainStart, serveDone, ln, &serveErr)

	// The shutdown phase, and its timeout, start here: Stopped's Lasted
	// counts from the deadline's start, not from the listener's close a
	// moment later, so a cut at the deadline never reports less than it.
	shutdownStart := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	shutdown := make(chan error, 1)
	go func() { shutdown <- s.hs.Shutdown(ctx) }()
	<-listenerClosed
	// hs.Serve may not have taken ln over yet if the drain was skipped at
	// once; closing it here makes "listener closed" true either way.
	_ = ln.Close()
	s.enter(ShuttingDown, since, reason,
		"in_flight", s.inFlightCount(), "hijacked", s.hijackedCount(),
		"shutdown_timeout", s.cfg.ShutdownTimeout.String(),
		"nodes", nodeNames(ev.Nodes), "requests_before", ev.Requests, "weak", ev.Weak)

	cut := 0
	reason = ReasonAllFinished
	if err := <-shutdown; errors.Is(err, context.DeadlineExceeded) {
		cut = s.cut()
		reason = ReasonDeadline
	}
	// http.Server forgets a connection once it is hijacked; the same
	// deadline applies to it.
	if n := s.waitHijacked(ctx); n > 0 {
		cut += n
		reason = ReasonDeadline
	}
	s.cancelBase()
	s.enter(Stopped, shutdownStart, reason, "cut", cut,
		"since_drain_start", time.Since(drainStart).Round(time.Millisecond).String())
	return serveErr
}

// drainWait serves the drain until one of its rules ends it (see Server),
// or it is skipped; it returns the reason and the evidence at the end.
func (s *Server) drainWait(start time.Time, serveDone <-chan error, ln net.Listener, serveErr *error) (string, Evidence) {
	// Reset and Stop need no draining of C since Go 1.23.
	timer := time.NewTimer(s.cfg.Drain)
	defer timer.Stop()
	for {
		d := s.ev.decide(time.Now())
		if d.end {
			if d.reason == ReasonMaxDrain {
				s.log.Error("drain cut at max drain: requests still arriving; the balancer is still sending here and will get 502s",
					"max_drain", s.cfg.MaxDrain.String(), "drain", s.cfg.Drain.String(),
					"lasted", time.Since(start).Round(time.Millisecond).String())
			}
			return d.reason, d.ev
		}
		if d.extend {
			s.log.Warn("drain extended: requests still arriving after the drain; serving until they stop",
				"drain", s.cfg.Drain.String(), "drain_quiet", s.cfg.DrainQuiet.String(),
				"max_drain", s.cfg.MaxDrain.String())
			close(s.extended)
		}
		timer.Reset(d.wait)
		select {
		case <-timer.C:
		case <-s.ev.wake:
		case <-s.skipCh:
			return s.skipReason, s.Evidence()
		case err := <-serveDone:
			if *serveErr = s.listenerFailed(ln, err); *serveErr != nil {
				return s.skipReason, s.Evidence()
			}
			serveDone = nil
		}
	}
}

func nodeNames(nodes []NodeEvidence) string {
	var b strings.Builder
	for i, n := range nodes {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %d failed", n.Name, n.Failed)
		if n.Merged {
			b.WriteString(" (merged)")
		}
	}
	return b.String()
}

// listenerFailed records a failure of the listener while serving and skips
// the drain: nothing new can arrive, so only in-flight requests matter.
func (s *Server) listenerFailed(ln net.Listener, err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	reason := fmt.Sprintf("%s: %v", reasonListenerError, err)
	s.log.Error("listener failed; shutting down", "addr", ln.Addr().String(), "err", err)
	s.skipDrain(reason)
	return fmt.Errorf("drain: serving on %s: %w", ln.Addr(), err)
}

// cut closes every connection still open at the shutdown deadline and logs
// each request that was still running: the balancer answers those with 502.
func (s *Server) cut() int {
	s.mu.Lock()
	reqs := make([]*request, 0, len(s.inFlight))
	for r := range s.inFlight {
		if !r.hijacked {
			reqs = append(reqs, r)
		}
	}
	s.mu.Unlock()
	now := time.Now()
	for _, r := range reqs {
		s.log.Warn("request cut at shutdown timeout", "method", r.method, "path", r.path,
			"remote", r.remote, "running", now.Sub(r.start).Round(time.Millisecond).String(),
			"shutdown_timeout", s.cfg.ShutdownTimeout.String())
	}
	// Connections first: a handler woken by its context must find nothing
	// left to answer on, or a cut request would look like a success.
	if err := s.hs.Close(); err != nil {
		s.log.Warn("closing connections after shutdown timeout", "err", err)
	}
	s.cancelBase()
	return len(reqs)
}

// enter moves to phase to, logs the change with how long the previous phase
// lasted, tells the hooks and closes Entered(to). It returns when to began.
func (s *Server) enter(to Phase, since time.Time, reason string, attrs ...any) time.Time {
	from := s.Phase()
	s.phase.Store(int32(to))
	now := time.Now()
	pc := PhaseChange{From: from, To: to, At: now, Lasted: now.Sub(since), Reason: reason}
	args := append([]any{"phase", to.String(), "from", from.String(),
		"lasted", pc.Lasted.Round(time.Millisecond).String(), "reason", reason}, attrs...)
	s.log.Info("phase "+to.String(), args...)
	for _, h := range s.hooks {
		h(pc)
	}
	close(s.entered[to])
	return now
}

// InFlight is how many requests, the health route's aside, are being
// handled right now.
func (s *Server) InFlight() int { return s.inFlightCount() }

func (s *Server) inFlightCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inFlight)
}

// ServeHTTP answers the health route itself and passes everything else on.
// Once the drain has started every response carries Connection: close, so a
// balancer's pooled connections move away before the listener closes rather
// than being closed under a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	phase := s.Phase()
	if r.URL.Path == s.cfg.HealthPath {
		if phase != Serving {
			w.Header().Set("Connection", "close")
		}
		s.health(w, r, phase)
		return
	}
	req := &request{method: r.Method, path: r.URL.Path, remote: r.RemoteAddr, start: time.Now()}
	s.ev.arrive(req.start)
	cw := &closingWriter{ResponseWriter: w, s: s, req: req}
	s.mu.Lock()
	s.inFlight[req] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.inFlight, req)
		s.mu.Unlock()
	}()
	s.next.ServeHTTP(cw, r)
	// A handler that wrote nothing gets net/http's implicit 200; written
	// here, it carries Connection: close like any other during the drain.
	if !cw.wroteHeader && !cw.hijacked {
		cw.WriteHeader(http.StatusOK)
	}
}

func (s *Server) health(w http.ResponseWriter, r *http.Request, phase Phase) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	s.ev.check(r, phase == Draining, time.Now())
	if phase != Serving {
		s.log.Debug("health answered 503", "reason", "draining", "phase", phase.String())
		healthAnswer(w, r, http.StatusServiceUnavailable, phase.String())
		return
	}
	if s.ready != nil {
		if err := s.ready(r.Context()); err != nil {
			// Logged on change only: the balancer asks every few seconds.
			if s.notReady.CompareAndSwap(false, true) {
				s.log.Warn("not ready: health answers 503", "reason", "not ready", "err", err)
			}
			s.log.Debug("health answered 503", "reason", "not ready", "err", err)
			healthAnswer(w, r, http.StatusServiceUnavailable, "not ready")
			return
		}
		if s.notReady.CompareAndSwap(true, false) {
			s.log.Info("ready again: health answers " + http.StatusText(s.cfg.HealthyStatus))
		}
	}
	healthAnswer(w, r, s.cfg.HealthyStatus, "ok")
}

func healthAnswer(w http.ResponseWriter, r *http.Request, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = fmt.Fprintln(w, body)
	}
}

// closingWriter adds Connection: close to a response whose header is written
// after the drain started, even if its request arrived before. It passes on
// flushing and hijacking, which the ResponseWriter it wraps can do.
type closingWriter struct {
	http.ResponseWriter
	s           *Server
	req         *request
	wroteHeader bool
	hijacked    bool
}

func (w *closingWriter) WriteHeader(code int) {
	// 1xx responses (e.g. 103 Early Hints) precede the real header.
	if !w.wroteHeader && code >= http.StatusOK {
		w.wroteHeader = true
		if w.s.Phase() != Serving {
			w.Header().Set("Connection", "close")
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *closingWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Flush keeps streaming handlers working through the wrapper (http.Flusher).
func (w *closingWriter) Flush() { _ = w.FlushError() }

// FlushError is what http.ResponseController.Flush calls: a flush that
// reports its error.
func (w *closingWriter) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands the connection to the handler (http.Hijacker, and
// http.ResponseController.Hijack), tracked until the handler closes it.
func (w *closingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	w.hijacked = true
	return w.s.trackHijacked(conn, w.req), brw, nil
}

// Unwrap lets http.ResponseController reach the connection's own writer
// for what closingWriter does not do itself (deadlines, full duplex).
func (w *closingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// hijackedConn is a connection a handler took over, known to the Server
// until it is closed.
type hijackedConn struct {
	net.Conn
	s     *Server
	req   *request
	since time.Time
	once  sync.Once
}

// Close closes the connection and forgets it.
func (c *hijackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		defer c.s.mu.Unlock()
		delete(c.s.hijacked, c)
		close(c.s.closedOne)
		c.s.closedOne = make(chan struct{})
	})
	return c.Conn.Close()
}

func (s *Server) trackHijacked(conn net.Conn, req *request) net.Conn {
	c := &hijackedConn{Conn: conn, s: s, req: req, since: time.Now()}
	s.mu.Lock()
	defer s.mu.Unlock()
	req.hijacked = true
	s.hijacked[c] = struct{}{}
	return c
}

func (s *Server) hijackedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.hijacked)
}

// waitHijacked waits until every hijacked connection is closed or ctx ends;
// then it closes and logs those still open and returns how many.
func (s *Server) waitHijacked(ctx context.Context) int {
	for {
		s.mu.Lock()
		open := make([]*hijackedConn, 0, len(s.hijacked))
		for c := range s.hijacked {
			open = append(open, c)
		}
		closedOne := s.closedOne
		s.mu.Unlock()
		if len(open) == 0 {
			return 0
		}
		select {
		case <-closedOne:
			continue
		case <-ctx.Done():
		}
		now := time.Now()
		for _, c := range open {
			s.log.Warn("hijacked connection cut at shutdown timeout", "method", c.req.method, "path", c.req.path,
				"remote", c.req.remote, "open", now.Sub(c.since).Round(time.Millisecond).String(),
				"shutdown_timeout", s.cfg.ShutdownTimeout.String())
			_ = c.Close()
		}
		return len(open)
	}
}
