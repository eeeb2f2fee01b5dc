package drain

import (
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// HeaderNode names the balancer node a health check comes from, where the
// node's address cannot: a check that carries it counts for the node it
// names, whatever address it arrives from.
const HeaderNode = "X-Mythex-Node"

// HeaderSelfCheck marks a health check made by the service's own host
// (Docker's health check): it is no balancer node's, so it never counts as
// evidence.
const HeaderSelfCheck = "X-Mythex-Self-Check"

// Reasons the drain ends, besides SkipDrain, a second signal and a failed
// listener; they appear in logs and in PhaseChange.Reason.
const (
	// ReasonEvidence: every balancer node the server could tell apart had
	// failed UnhealthyThreshold checks, no request had arrived for
	// DrainQuiet, and EarliestDrainEnd had passed.
	ReasonEvidence = "balancer stopped: every node failed its checks and requests stopped"
	// ReasonRequestsStopped: requests were still arriving at the end of
	// Drain; they stopped for DrainQuiet before MaxDrain.
	ReasonRequestsStopped = "requests stopped after the drain was extended"
	// ReasonMaxDrain: requests were still arriving at MaxDrain; the
	// listener closes anyway, and the balancer answers what it still sends
	// with 502.
	ReasonMaxDrain = "max drain elapsed with requests still arriving"
	// ReasonUnwatched: nothing checks or sends here. No balancer node had
	// checked the server since it started, long enough before the drain
	// for one that checks it to have been seen, and no request had arrived
	// for as long, or during the drain; EarliestDrainEnd had passed. A
	// drain is for health-checkers to notice; with none, it only delays
	// the deploy (a service no balancer fronts).
	ReasonUnwatched = "nothing checks or sends here: no balancer node has checked this server, no request arrived"
)

// NodeEvidence is what the server saw of one balancer node's health checks.
type NodeEvidence struct {
	// Name is the node as the server tells it apart: "node NAME" for a
	// check that names itself (HeaderNode), "addr IP" for one that does not.
	Name string
	// Failed is how many of its checks were answered 503 during the drain.
	Failed int
	// Merged: its checks came faster than one node checks (less than half
	// an interval apart), so several checkers share the name or address.
	Merged bool
}

// Evidence is what the server knows about the balancer during a drain.
type Evidence struct {
	// Nodes are the balancer nodes seen checking within the detection time
	// before the drain, or during it, by name.
	Nodes []NodeEvidence
	// Requests is how many real requests arrived in the DrainQuiet before
	// the drain, up to QuietRequests.
	Requests int
	// Weak says why the checks and the traffic prove nothing, so the fixed
	// drain rules; empty when the evidence can end the drain.
	Weak string
}

// peer is one balancer node as the server tells it apart.
type peer struct {
	last   time.Time
	failed int
	// out is when its UnhealthyThreshold-th check was answered 503: the
	// node acts on it, at most NodeSkew later.
	out    time.Time
	merged bool
}

// evidence gathers, for the drain, the health checks answered and the
// arrivals of real requests. Safe for concurrent use.
type evidence struct {
	cfg Config
	// wake is signalled when anything the drain decides on changes.
	wake chan struct{}

	mu    sync.Mutex
	peers map[string]*peer
	// arrivals holds the last QuietRequests arrival times before the drain,
	// as a ring; lastArrival is the latest, before or during the drain.
	arrivals    []time.Time
	next        int
	lastArrival time.Time
	start       time.Time
	// born is when the server started; checked, whether any balancer node
	// has ever checked it (a node gone quiet is forgotten, this is not).
	born    time.Time
	checked bool
	// requests counts the arrivals in the DrainQuiet before start.
	requests int
	extended bool
}

func newEvidence(cfg Config) *evidence {
	n := cfg.QuietRequests
	if n < 1 {
		n = 1
	}
	return &evidence{cfg: cfg, wake: make(chan struct{}, 1), peers: make(map[string]*peer), arrivals: make([]time.Time, 0, n),
		born: time.Now()}
}

func (e *evidence) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// window is how long before the drain a node must have checked to count:
// a node that has not checked for the worst-case detection time already
// holds the server unhealthy (its missing checks failed) or is gone.
func (e *evidence) window() time.Duration {
	return e.cfg.HealthCheckInterval*time.Duration(e.cfg.UnhealthyThreshold) + e.cfg.HealthCheckTimeout
}

// peerName tells a check's node: by the name it gives itself, else by its
// address. "" for the service's own check.
func peerName(r *http.Request) string {
	if r.Header.Get(HeaderSelfCheck) != "" {
		return ""
	}
	if n := strings.TrimSpace(r.Header.Get(HeaderNode)); n != "" {
		return "node " + n
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "addr " + host
}

// check records one health check; failed says it was answered 503 during
// the drain.
func (e *evidence) check(r *http.Request, failed bool, now time.Time) {
	name := peerName(r)
	if name == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.checked = true
	if e.start.IsZero() {
		// Forget nodes gone quiet, so clients asking the health route
		// from many addresses hold no memory.
		for k, p := range e.peers {
			if now.Sub(p.last) > e.window() {
				delete(e.peers, k)
			}
		}
	}
	p := e.peers[name]
	if p == nil {
		p = &peer{}
		e.peers[name] = p
	} else if now.Sub(p.last) < e.cfg.HealthCheckInterval/2 {
		// One node checks once an interval. Two checkers behind one
		// address (Docker's userland proxy, a NAT) come closer than half
		// an interval apart unless their phases differ by exactly half.
		p.merged = true
	}
	p.last = now
	if failed {
		p.failed++
		if p.failed == e.cfg.UnhealthyThreshold {
			p.out = now
		}
	}
	e.signal()
}

// arrive records a real request's arrival.
func (e *evidence) arrive(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lastArrival = now
	if e.start.IsZero() {
		if len(e.arrivals) < cap(e.arrivals) {
			e.arrivals = append(e.arrivals, now)
		} else {
			e.arrivals[e.next] = now
			e.next = (e.next + 1) % len(e.arrivals)
		}
		return
	}
	e.signal()
}

// begin marks the drain's start: the nodes that count and the traffic
// before it are fixed from here.
func (e *evidence) begin(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.start = now
	for k, p := range e.peers {
		if now.Sub(p.last) > e.window() {
			delete(e.peers, k)
		}
	}
	for _, a := range e.arrivals {
		if now.Sub(a) <= e.cfg.DrainQuiet {
			e.requests++
		}
	}
}

// report is Evidence as of now; e.mu must be held.
func (e *evidence) report() Evidence {
	ev := Evidence{Requests: e.requests}
	for name, p := range e.peers {
		ev.Nodes = append(ev.Nodes, NodeEvidence{Name: name, Failed: p.failed, Merged: p.merged})
	}
	sort.Slice(ev.Nodes, func(i, j int) bool { return ev.Nodes[i].Name < ev.Nodes[j].Name })
	var merged []string
	for _, n := range ev.Nodes {
		if n.Merged {
			merged = append(merged, n.Name)
		}
	}
	switch {
	case !e.cfg.Evidence:
		ev.Weak = "evidence drain off"
	case len(ev.Nodes) == 0:
		ev.Weak = "no balancer node seen checking"
	case len(merged) > 0:
		ev.Weak = "nodes cannot be told apart: checks too frequent from " + strings.Join(merged, ", ")
	case e.requests < e.cfg.QuietRequests:
		ev.Weak = fmt.Sprintf("traffic too thin: %d requests in the %v before the drain, fewer than %d",
			e.requests, e.cfg.DrainQuiet, e.cfg.QuietRequests)
	}
	return ev
}

// unwatched reports that nothing checks or sends here (ReasonUnwatched):
// no node has ever checked, the server was up for the detection time
// before the drain (a node checking it would have been seen), and no
// request arrived in that time or since. e.mu must be held.
func (e *evidence) unwatched() bool {
	w := e.window()
	return e.cfg.Evidence && !e.checked && e.start.Sub(e.born) >= w &&
		(e.lastArrival.IsZero() || e.start.Sub(e.lastArrival) > w)
}

// decision is what the drain does at one moment.
type decision struct {
	end    bool
	reason string
	// extend: requests still arrive past Drain (logged once).
	extend bool
	// wait is how long until the decision can change by time alone.
	wait time.Duration
	ev   Evidence
}

// decide applies the drain's rules at now (see Server).
func (e *evidence) decide(now time.Time) decision {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.cfg
	d := decision{ev: e.report()}
	elapsed := now.Sub(e.start)
	wait := c.Drain - elapsed

	if e.unwatched() {
		endAt := e.start.Add(c.EarliestEnd())
		if !now.Before(endAt) {
			d.end, d.reason = true, ReasonUnwatched
			return d
		}
		wait = min(wait, endAt.Sub(now))
	}
	if d.ev.Weak == "" {
		allFailed := true
		var lastFail time.Time
		for _, p := range e.peers {
			if p.failed < c.UnhealthyThreshold {
				allFailed = false
			}
			if p.out.After(lastFail) {
				lastFail = p.out
			}
		}
		if allFailed {
			// Quiet since the last node's deciding check and the last
			// request, and never before the earliest a node can act.
			quietFrom := lastFail
			if e.lastArrival.After(quietFrom) {
				quietFrom = e.lastArrival
			}
			endAt := quietFrom.Add(c.DrainQuiet)
			if lower := e.start.Add(c.EarliestEnd()); lower.After(endAt) {
				endAt = lower
			}
			if !now.Before(endAt) {
				d.end, d.reason = true, ReasonEvidence
				return d
			}
			wait = min(wait, endAt.Sub(now))
		}
	}
	if elapsed < c.Drain {
		d.wait = wait
		return d
	}
	// Weak evidence keeps the fixed drain whole: requests arriving then say
	// nothing about which nodes still send.
	arriving := d.ev.Weak == "" && now.Sub(e.lastArrival) < c.DrainQuiet
	switch {
	case arriving && elapsed >= c.MaxDrain:
		d.end, d.reason = true, ReasonMaxDrain
	case arriving:
		d.extend = !e.extended
		e.extended = true
		d.wait = min(e.lastArrival.Add(c.DrainQuiet).Sub(now), c.MaxDrain-elapsed)
	case e.extended:
		d.end, d.reason = true, ReasonRequestsStopped
	default:
		d.end, d.reason = true, ReasonDrainElapsed
	}
	return d
}
