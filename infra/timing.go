// Package infra holds Mythex's deploy timing contract and the Pulumi program
// that provisions the load balancer from it.
//
// Timing is the one definition of every number a rolling deploy depends on.
// The target group, the compose definition, the hooks, the drain library and
// TIMING.md all read it; none of them types a number of their own.
//
// A drain, as the fields below make it play out (TIMING.md draws it with the
// production values):
//
//	SIGTERM            health answers 503, real requests are still served
//	+ detection        every balancer node has seen UnhealthyThreshold failed
//	                   checks (WorstCaseDetection)
//	+ Drain            the listener closes; in-flight requests go on
//	+ ShutdownTimeout  whatever is still running is cut
//	+ StopGracePeriod  Docker sends SIGKILL (never reached: KillMargin)
package infra

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/mythex/infra/drain"
)

// HealthPath is the route the balancer's health check and the containers'
// own health checks ask, and the route the drain library answers 503 on.
const HealthPath = "/healthz"

// HealthyStatus is the one status the target group accepts as healthy (its
// matcher). A draining server answers 503, which is outside it.
const HealthyStatus = http.StatusOK

// MaxHeaderBytes bounds a request's header at the app: 64 KiB, the ALB's own
// limit on a request's headers (it refuses a larger one itself), so the app
// accepts whatever the balancer forwards and holds no more than that per
// connection.
const MaxHeaderBytes = 64 << 10

// Timing is every number a deploy depends on. Durations are time.Duration,
// counts are int; the zero value is invalid. Change a value only together
// with the values it is related to: Validate names every relation it breaks.
//
// Each field's `side` tag says what applies it, because a change reaches
// production in two steps and between them old and new values are live
// together (CheckTransition): "balancer" fields are the target group's and
// the load balancer's, changed by `pulumi up`; "servers" fields are the
// release's compose definition and hooks, changed by the rollout one server
// at a time. "servers,process" marks the ones a running container took from
// its environment when it started: a server mid-deploy stops its old
// containers, with the old release's values, under the new definition.
type Timing struct {
	// HealthCheckInterval is how often each balancer node checks each target.
	HealthCheckInterval time.Duration `side:"balancer"`
	// HealthCheckTimeout is how long one check may take before it counts as failed.
	HealthCheckTimeout time.Duration `side:"balancer"`
	// UnhealthyThreshold is how many consecutive failed checks take a target out.
	UnhealthyThreshold int `side:"balancer"`
	// HealthyThreshold is how many consecutive passed checks put a target back.
	HealthyThreshold int `side:"balancer"`
	// NodeSkew is the least time the drain must outlast worst-case detection.
	// It describes the balancer's nodes, so it moves with them.
	NodeSkew time.Duration `side:"balancer"`

	// Drain is how long a server keeps serving real traffic after its health
	// endpoint starts answering 503, when it has no better evidence that the
	// balancer has stopped sending (the fixed drain).
	Drain time.Duration `side:"servers,process"`
	// DrainQuiet is how long no real request may arrive, once every balancer
	// node the server can tell apart has failed UnhealthyThreshold checks,
	// before the drain ends on that evidence; and how long a drain past
	// Drain waits for requests to stop.
	DrainQuiet time.Duration `side:"servers,process"`
	// QuietRequests is the least number of real requests a server must have
	// had in the DrainQuiet before its drain began for a silence of
	// DrainQuiet to mean anything; with fewer, the fixed drain rules.
	QuietRequests int `side:"servers,process"`
	// MaxDrain is the longest a drain goes on while requests still arrive
	// after Drain; past it the listener closes anyway, and the log says so.
	MaxDrain time.Duration `side:"servers,process"`
	// ShutdownTimeout bounds in-flight requests after the listener closes.
	ShutdownTimeout time.Duration `side:"servers,process"`
	// KillMargin is the least time left between the end of ShutdownTimeout and
	// Docker's SIGKILL: the process's own time to exit.
	KillMargin time.Duration `side:"servers,process"`
	// StopGracePeriod is compose's stop_grace_period: Docker sends SIGKILL
	// this long after SIGTERM.
	StopGracePeriod time.Duration `side:"servers"`
	// DeregistrationDelay is how long the balancer lets in-flight requests to
	// a deregistered target finish.
	DeregistrationDelay time.Duration `side:"balancer"`

	// LBIdleTimeout is the balancer's idle timeout on a connection.
	LBIdleTimeout time.Duration `side:"balancer"`
	// AppKeepAlive is the application's idle keep-alive timeout.
	AppKeepAlive time.Duration `side:"servers,process"`
	// ReadHeaderTimeout bounds how long the app reads one request's header.
	ReadHeaderTimeout time.Duration `side:"servers,process"`
	// MaxRequest is the longest a request may take at the app: handlers that
	// hold requests (long polls, the reference service's /work) stay within it.
	MaxRequest time.Duration `side:"servers,process"`

	// ContainerHealthInterval is how often Docker runs a container's own
	// health check on the server.
	ContainerHealthInterval time.Duration `side:"servers"`
	// ContainerHealthTimeout bounds one of those checks, from the moment
	// Docker starts to exec it in the container until it exits. It is a
	// limit of the server, not a step of the deploy's timeline: Scaled keeps it.
	ContainerHealthTimeout time.Duration `side:"servers"`
	// StartTimeout is how long a deploy or a watchdog restart waits for new
	// containers to report healthy before it fails.
	StartTimeout time.Duration `side:"servers"`
	// EngineWork is what compose and the Docker engine take, beyond the
	// containers' own stop and start, to recreate every service and answer
	// the queries that verify them. Like ContainerHealthTimeout it is a limit
	// of the server, not a step of the deploy's timeline: Scaled keeps it.
	EngineWork time.Duration `side:"servers"`
	// LockWait is how long deploy and bootstrap wait for the server lock.
	LockWait time.Duration `side:"servers"`
	// DeployHold is the longest one deploy holds the server lock: the deploy
	// cuts its own run there, and the watchdog takes a lock held longer for
	// a stray holder.
	DeployHold time.Duration `side:"servers"`

	// WatchdogInterval is how often the watchdog checks every service.
	WatchdogInterval time.Duration `side:"servers"`
	// WatchdogStrikes is how many consecutive failed checks make the watchdog
	// restart a service.
	WatchdogStrikes int `side:"servers"`
	// MaxPlannedDowntime is the longest a deploy keeps a service unhealthy on
	// purpose.
	MaxPlannedDowntime time.Duration `side:"servers"`

	// Slots is how many slots a server runs its release in, each a compose
	// project publishing its own port: 1, today's design, where a deploy
	// drains the server; 2, the slots design (docs/capacity.md), where a
	// deploy starts the new release in the idle slot and drains the old
	// one only once every balancer node routes to the new.
	Slots int `side:"servers"`
	// RegisteredSlots is how many of each server's slots the target group
	// holds, one port each. Both sides read a design: the balancer must
	// check a slot before a server hands over to it (slots-registered).
	RegisteredSlots int `side:"balancer"`
}

// Prod returns the production timing. Each value says why it is what it is.
func Prod() Timing {
	return Timing{
		// The ALB's minimum. Detection time grows with it, and detection is
		// what the drain has to outlast.
		HealthCheckInterval: 5 * time.Second,
		// The health endpoint answers from memory in microseconds; three
		// seconds ride out a GC pause or a busy node without a false failure
		// and still keep WorstCaseDetection inside the drain.
		HealthCheckTimeout: 3 * time.Second,
		// The ALB's minimum: out of rotation after two failed checks, so one
		// dropped check never takes a healthy target out.
		UnhealthyThreshold: 2,
		// The ALB's minimum: Reentry, which a rolling deploy pays once per
		// server, stays as short as AWS allows; still, one lucky check never
		// lets a flapping target back in.
		HealthyThreshold: 2,
		// ALB nodes check each target independently and apply a verdict a
		// moment after reaching it; the drain must outlast the slowest node's
		// worst case by this much.
		NodeSkew: 1 * time.Second,

		// Outlasts WorstCaseDetection by more than NodeSkew, so every balancer
		// node has provably stopped sending traffic before the listener
		// closes (the article's fix: it used to be five seconds). The drain
		// ends before it when the balancer's own checks and the silence of
		// real traffic show it has stopped, and after it while requests
		// still arrive (up to MaxDrain).
		Drain: 15 * time.Second,
		// Covers NodeSkew: a node acts on its last failed check up to
		// NodeSkew after it, so a request it sent just before arrives no
		// later. With at least QuietRequests (10) requests a second before
		// the drain, a whole second without one happens by chance about once
		// in e^10 ≈ 22,000 seconds of steady traffic; shorter, a pause in
		// that traffic would pass for the balancer having stopped.
		DrainQuiet: 1 * time.Second,
		// Ten requests in DrainQuiet: below that, a silence of DrainQuiet is
		// too likely to be chance (e^-10 at ten) to end a drain on.
		QuietRequests: 10,
		// Ten seconds past the fixed drain: a node still sending 12 s after
		// worst-case detection is served, not answered 502. 25 s is also
		// the pause that ended the 502s of a balancer slow to stop sending
		// in aws-load-balancer-controller#1064. Longer, StopGracePeriod
		// (and with it DeployDowntime and the watchdog's lock hold) would
		// have to grow past 40 s.
		MaxDrain: 25 * time.Second,
		// Mythex API requests finish in well under a second; ten seconds let
		// a slow one finish instead of being cut.
		ShutdownTimeout: 10 * time.Second,
		// Time to flush logs and exit after the last request, so a clean
		// shutdown is never mistaken for a kill (exit 0, not 137).
		KillMargin: 5 * time.Second,
		// MaxDrain + ShutdownTimeout + KillMargin, in the whole seconds the
		// Docker engine API takes: a drain that runs to its upper bound still
		// exits before SIGKILL.
		StopGracePeriod: 40 * time.Second,
		// Covers ShutdownTimeout, so the balancer never cuts a request the app
		// is still allowed to finish; equal to StopGracePeriod, because past
		// it Docker has killed the process anyway, while below it a target
		// deregistered at SIGTERM could have requests of a drain that runs to
		// MaxDrain cut. Far below the AWS default of five minutes, which
		// would stall every target removal.
		DeregistrationDelay: 40 * time.Second,

		// The ALB default; no Mythex request streams longer than this idle.
		LBIdleTimeout: 60 * time.Second,
		// Longer than LBIdleTimeout, as AWS recommends: the balancer always
		// closes an idle connection first, so it never reuses one the app has
		// just closed (a 502).
		AppKeepAlive: 75 * time.Second,
		// The balancer forwards a request's header in one piece once it has
		// parsed it, so a header still arriving after five seconds is a
		// client trickling it (slowloris) or a dead path. Below
		// ShutdownTimeout, so such a connection is gone before the shutdown
		// deadline instead of holding the shutdown to it.
		ReadHeaderTimeout: 5 * time.Second,
		// Mythex API requests finish in well under a second and
		// ShutdownTimeout lets a slow one have ten; thirty seconds is far past
		// any real request, so it bounds only what a client can hold open.
		// Within LBIdleTimeout, past which the balancer has answered 504.
		MaxRequest: 30 * time.Second,

		// Lets a deploy see a new container healthy within a second of it
		// being ready. Each check is an exec into the container, about 50 ms
		// of CPU (measured on a 2-core host): once a second, a server's four
		// services spend a fifth of a core on it, and a faster pace would
		// cost the services' own CPU on a busy server.
		ContainerHealthInterval: 1 * time.Second,
		// Docker runs the check by exec: it starts a process inside the
		// container, which costs tens of milliseconds of CPU when the server
		// is idle and several hundred when it is busy (measured on a loaded
		// 2-core host: 0.5 s at worst, with a median of 0.2 s), while the
		// answer itself comes from memory. Three seconds, like the balancer's
		// timeout, leave a busy server's exec far inside the bound, so only a
		// service that does not answer is ever marked unhealthy.
		ContainerHealthTimeout: 3 * time.Second,
		// The services start in about a second; a minute covers a cold disk
		// and image layer setup with room to spare.
		StartTimeout: 60 * time.Second,
		// Measured on a 2-core host, for a watchdog finishing a deploy of all
		// four services with the reference images (compose v1): about 2 s
		// of its run went to compose and the engine when the host was idle,
		// up to 15 s with its CPU four times oversubscribed. The stop and the
		// start have their own bounds; this is the rest, at its worst.
		EngineWork: 15 * time.Second,
		// Outlasts the longest a watchdog run holds the lock (WatchdogHold:
		// it restarts every due service at once and bounds each Docker call
		// by that deadline), so a deploy arriving mid-restart waits it out
		// instead of failing; a stuck holder still fails the job in minutes.
		LockWait: 2 * time.Minute,
		// Every step of a deploy at its own bound (DeploySteps: 4m50s) and
		// EngineWork for the rest (5m5s), rounded up to the minute: a
		// deploy at its worst is failing anyway, and the slack lets a
		// health check interval or a grace period move by seconds without
		// it. Not longer: it delays the watchdog's report of a stray
		// holder, and every bound of the rollout counts it (ServerDeployMax).
		DeployHold: 6 * time.Minute,

		// Once a minute: a crashed process at 3 a.m. is back within minutes.
		WatchdogInterval: 1 * time.Minute,
		// Four strikes (the article): a service must fail for three whole
		// intervals (WatchdogTolerance) before it is restarted, longer than
		// any planned downtime; one strike used to fight every deploy.
		WatchdogStrikes: 4,
		// The article's longest planned drain of a service during a deploy;
		// our own deploy needs at most DeployDowntime of it.
		MaxPlannedDowntime: 150 * time.Second,

		// Today's design: the hooks run one slot. The slots design keeps
		// every server in service through a rollout (docs/capacity.md);
		// the hooks, the rollout and the rehearsal do not run it yet, and
		// the hooks' renderer refuses a release of two.
		Slots: 1,
		// As many as the servers run (slots-agree): an idle port the
		// target group checks is a target unhealthy for good.
		RegisteredSlots: 1,
	}
}

// WorstCaseDetection is the longest a balancer node can keep routing to a
// target after its health endpoint starts failing: a check passed just before
// the drain began, then UnhealthyThreshold failed checks, the last of which
// takes the full timeout.
func (t Timing) WorstCaseDetection() time.Duration {
	return t.HealthCheckInterval*time.Duration(t.UnhealthyThreshold) + t.HealthCheckTimeout
}

// DrainMargin is how long the drain outlasts worst-case detection.
func (t Timing) DrainMargin() time.Duration {
	return t.Drain - t.WorstCaseDetection()
}

// Reentry is how long a healthy new target waits before the balancer sends it
// traffic: HealthyThreshold passed checks, one interval apart.
func (t Timing) Reentry() time.Duration {
	return t.HealthCheckInterval * time.Duration(t.HealthyThreshold)
}

// ReentryPoll is how often the rollout asks the balancer whether a deployed
// server is back in service: once per health-check interval, the pace at
// which the balancer's verdict can change at all. Asking faster learns
// nothing new; asking slower adds the difference to every server's deploy
// (the AWS CLI's target-in-service waiter asks every 15 s, three intervals).
func (t Timing) ReentryPoll() time.Duration {
	return t.HealthCheckInterval
}

// ReentryWait bounds the rollout's wait for a deployed server to be back in
// service. The deploy returns once every container is healthy, so a sound
// server passes the balancer's next check: the first passed check may start
// one interval later and take its whole timeout, the rest follow one
// interval apart (Reentry + HealthCheckTimeout). One failed check on the way
// back is tolerated, as UnhealthyThreshold tolerates one on the way out: it
// restarts the count (another Reentry). The slowest node applies its verdict
// NodeSkew later, and the rollout sees it at its next poll (ReentryPoll). A
// server not back by then is not coming back by itself.
func (t Timing) ReentryWait() time.Duration {
	return 2*t.Reentry() + t.HealthCheckTimeout + t.NodeSkew + t.ReentryPoll()
}

// ReentryBound is the longest Reentry may be: the drain. A server must not
// take longer to come back than it took to leave, so a rolling deploy never
// has more than one server out of rotation for longer than one drain, and a
// restarted server is not left idle while its neighbours carry its load.
func (t Timing) ReentryBound() time.Duration {
	return t.Drain
}

// EarliestRemoval is the soonest a balancer node takes a target out once
// its health endpoint answers 503: no node acts before its
// UnhealthyThreshold-th failed check, which comes (UnhealthyThreshold − 1)
// intervals after the first at the soonest (the first may come at once).
func (t Timing) EarliestRemoval() time.Duration {
	return t.HealthCheckInterval * time.Duration(t.UnhealthyThreshold-1)
}

// EarliestDrainEnd is the soonest a drain may end on evidence: no balancer
// node can have acted before EarliestRemoval, and the drain then waits
// DrainQuiet for the requests that node sent just before acting.
// The drain library applies it as drain.Config.EarliestEnd.
func (t Timing) EarliestDrainEnd() time.Duration {
	return t.EarliestRemoval() + t.DrainQuiet
}

// MaxShutdownDeadline is when, after SIGTERM, the last in-flight request is
// cut at the latest: a drain that ran to MaxDrain, then ShutdownTimeout.
func (t Timing) MaxShutdownDeadline() time.Duration {
	return t.MaxDrain + t.ShutdownTimeout
}

// absentMeans gives, for a field Timing gained after releases went out
// without it, the value those releases behaved as if they had.
var absentMeans = map[string]func(*Timing){
	// Before MaxDrain a drain never went past Drain.
	"MaxDrain": func(t *Timing) { t.MaxDrain = t.Drain },
	// Before the slots design every server ran one slot, registered once.
	"Slots":           func(t *Timing) { t.Slots = 1 },
	"RegisteredSlots": func(t *Timing) { t.RegisteredSlots = 1 },
}

// AsReleasedWithout returns t with each of fields that a release lacked
// set to what that release behaved as (MaxDrain: its Drain); a field with
// no such meaning keeps t's value. A change is judged against an older
// release this way, not with the new release's numbers on both sides.
func (t Timing) AsReleasedWithout(fields []string) Timing {
	for _, f := range fields {
		if set, ok := absentMeans[f]; ok {
			set(&t)
		}
	}
	return t
}

// ListenerCloses is when, after SIGTERM, the server stops accepting connections.
func (t Timing) ListenerCloses() time.Duration {
	return t.Drain
}

// ShutdownDeadline is when, after SIGTERM, the last in-flight request is cut.
func (t Timing) ShutdownDeadline() time.Duration {
	return t.Drain + t.ShutdownTimeout
}

// KillSlack is the time between ShutdownDeadline and Docker's SIGKILL.
func (t Timing) KillSlack() time.Duration {
	return t.StopGracePeriod - t.ShutdownDeadline()
}

// KeepAliveMargin is how much longer the app keeps an idle connection open
// than the balancer does.
func (t Timing) KeepAliveMargin() time.Duration {
	return t.AppKeepAlive - t.LBIdleTimeout
}

// RequestDeadline is the app's read and write deadline on one request:
// AppKeepAlive, which outlasts the balancer's idle timeout (rule
// keepalive-outlasts-idle) and so every request the balancer still waits
// for, MaxRequest included (rule idle-covers-max-request), and every request
// the drain lets finish (rule deadline-covers-shutdown). Shorter, it would
// cut requests the app allows (net/http also ends a request's context at its
// read deadline). Past it a client that stops reading or sending holds a
// connection no longer.
func (t Timing) RequestDeadline() time.Duration {
	return t.AppKeepAlive
}

// WatchdogTolerance is the longest outage the watchdog never acts on: an
// outage shorter than (strikes − 1) intervals spans at most strikes − 1 checks.
func (t Timing) WatchdogTolerance() time.Duration {
	return t.WatchdogInterval * time.Duration(t.WatchdogStrikes-1)
}

// FirstContainerCheck is the latest a new container's first health check
// can report: Docker runs it one interval after the start, and it may take
// its whole timeout.
func (t Timing) FirstContainerCheck() time.Duration {
	return t.ContainerHealthInterval + t.ContainerHealthTimeout
}

// DeployDowntime is the longest one service is unhealthy on purpose during a
// deploy: the old container may use its whole stop grace period, the new one
// its whole start timeout.
func (t Timing) DeployDowntime() time.Duration {
	return t.StopGracePeriod + t.StartTimeout
}

// WatchdogHold is the longest one watchdog run holds the server lock: one
// restart of every due service at once (DeployDowntime), then verifying
// them, with what compose and the engine take around both (EngineWork). The
// watchdog cuts its own run there.
func (t Timing) WatchdogHold() time.Duration {
	return t.DeployDowntime() + t.EngineWork
}

// EarliestReentry is the soonest a balancer node sends a new target traffic
// once it is ready: its first passed check may come at once, the others
// follow one interval apart.
func (t Timing) EarliestReentry() time.Duration {
	return t.HealthCheckInterval * time.Duration(t.HealthyThreshold-1)
}

// SettleChecks is how many of its own health checks a deploy watches each
// new container pass after it first turned healthy (besides watching it for
// Reentry): Docker marks a container unhealthy after this many consecutive
// failed checks (compose's retries), so a container that fails right after
// its first passed check has shown it by then, however slowly a busy server
// runs the checks.
func (t Timing) SettleChecks() int {
	return t.UnhealthyThreshold
}

// ServerDeployMin is the theoretical minimum time to deploy one server: the
// old containers drain, then the balancer re-admits the new ones. Starting
// containers and finishing in-flight requests are taken as instant.
func (t Timing) ServerDeployMin() time.Duration {
	return t.Drain + t.Reentry()
}

// AdmissionMax is the latest every balancer node routes to a target once
// it answers healthy: a node's next check may start one interval later and
// the others follow one interval apart (Reentry), the last of them taking
// its whole timeout. The mirror of WorstCaseDetection.
func (t Timing) AdmissionMax() time.Duration {
	return t.Reentry() + t.HealthCheckTimeout
}

// HandoverRemoval is the soonest a balancer node takes a server's old slot
// out after its new slot answers healthy, in the slots design: the deploy
// hands over once the new slot has passed its settle watch (Reentry), and
// a node acts no sooner than EarliestRemoval after the old slot's 503s.
func (t Timing) HandoverRemoval() time.Duration {
	return t.Reentry() + t.EarliestRemoval()
}

// SlotDeployMin is the theoretical minimum time of one server's deploy in
// the slots design (Slots 2): the new slot is admitted (Reentry, the settle
// watch the deploy runs anyway), then the old slot drains. ServerDeployMin's
// two halves swapped, and the server never out of service. Starting
// containers and finishing in-flight requests are taken as instant.
func (t Timing) SlotDeployMin() time.Duration {
	return t.Reentry() + t.Drain
}

// SlotOverlapMax is the longest a server runs two releases at once in the
// slots design, which its memory must hold: the new slot's start and wait
// for health (StartTimeout), its settle watch (Reentry, and up to
// StartTimeout more on a busy server), then the old slot's stop
// (StopGracePeriod).
func (t Timing) SlotOverlapMax() time.Duration {
	return 2*t.StartTimeout + t.Reentry() + t.StopGracePeriod
}

// DeploySteps is the sum of the bounds of what a deploy does under the
// lock, each step at its own bound: fetching the release's missing images,
// side by side (StartTimeout); replacing the containers (DeployDowntime:
// compose's whole stop grace and start); waiting for them to turn healthy
// (StartTimeout); watching them settle for as long as the balancer takes to
// re-admit the server (Reentry) and, on a busy server, until each has run
// its settle checks (StartTimeout more).
func (t Timing) DeploySteps() time.Duration {
	return 3*t.StartTimeout + t.DeployDowntime() + t.Reentry()
}

// RemoteHold is the longest anything holds the server lock: a remote deploy
// or rollback takes it once and, under that one hold, runs bootstrap (its
// systemd calls bounded by StartTimeout) and then deploy (DeployHold). The
// watchdog (WatchdogHold) and bootstrap alone hold it for less; the watchdog
// takes a lock held by one holder for longer for a stray.
func (t Timing) RemoteHold() time.Duration {
	return t.StartTimeout + t.DeployHold
}

// ServerDeployMax is the longest a deploy of one server may take: waiting
// for the lock, then holding it (DeployHold, where the deploy cuts its own
// run).
func (t Timing) ServerDeployMax() time.Duration {
	return t.LockWait + t.DeployHold
}

// DefaultMaxUnavailable is the rollout's --max-unavailable when none is
// given: one server out of service at a time.
const DefaultMaxUnavailable = 1

// InvalidRolloutError names every problem with a rollout's shape: how many
// servers it deploys and how many of them may be out of service at once.
type InvalidRolloutError struct {
	Servers, MaxUnavailable int
	Problems                []string
}

func (e *InvalidRolloutError) Error() string {
	return fmt.Sprintf("invalid rollout of servers %d with maxUnavailable %d: %s",
		e.Servers, e.MaxUnavailable, strings.Join(e.Problems, "; "))
}

// CheckRollout returns an *InvalidRolloutError naming every problem with a
// rollout of servers servers that takes up to maxUnavailable of them out of
// service at once (the rollout's --max-unavailable, a percentage already
// resolved to a count), or nil. There must be a server, and at least one
// must be allowed out. With more than one server, fewer than all may be: an
// ALB whose targets are all unhealthy fails open and sends requests to every
// target, draining ones included, and a rollback goes back maxUnavailable at
// a time with no canary to keep one server up. A lone server is the whole
// fleet, whatever maxUnavailable says.
//
// RolloutBatches, RolloutBatchesMax, RollbackBatchesMax and the Timing
// methods that count batches panic on a rollout CheckRollout refuses:
// callers check their input first, as the rollout checks its flags before
// it touches a server.
func CheckRollout(servers, maxUnavailable int) error {
	var problems []string
	if servers < 1 {
		problems = append(problems, fmt.Sprintf("servers %d must be at least 1", servers))
	}
	if maxUnavailable < 1 {
		problems = append(problems, fmt.Sprintf("maxUnavailable %d must be at least 1", maxUnavailable))
	}
	if servers > 1 && maxUnavailable >= servers {
		problems = append(problems, fmt.Sprintf(
			"maxUnavailable %d must be below servers %d: an ALB whose targets are all unhealthy fails open and sends requests to draining targets too",
			maxUnavailable, servers))
	}
	if len(problems) > 0 {
		return &InvalidRolloutError{Servers: servers, MaxUnavailable: maxUnavailable, Problems: problems}
	}
	return nil
}

// RolloutBatches is how many batches a rollout takes servers through, at
// most maxUnavailable of them out of service at once: 1 + ⌈(servers − 1) /
// maxUnavailable⌉. The first batch is a canary of one server, so a broken
// release takes one server out, not maxUnavailable; the others go
// maxUnavailable at a time, the last batch taking what is left. That is the
// plan for a fleet that is all in service on another release; what the
// servers run at the start can add batches (RolloutBatchesMax).
func RolloutBatches(servers, maxUnavailable int) int {
	if err := CheckRollout(servers, maxUnavailable); err != nil {
		panic(err)
	}
	return batchesAfterOnes(servers, 1, maxUnavailable)
}

// RolloutBatchesMax is the most batches a rollout runs, whatever its
// servers run at its start: 3 + ⌈(servers − 3) / maxUnavailable⌉, three
// batches of one server and then maxUnavailable at a time (as many as there
// are servers, when there are fewer than three). Servers already on the
// release and verified are checked in a batch of their own first (one
// server, at worst, so every other one is deployed); then the canary; then
// the servers already out of service go in batches of their own, so at
// worst the last of them is alone in its batch and the healthy servers
// start a batch of their own after it. RolloutBatches is this count for a
// fleet all in service on another release; with maxUnavailable 1 every
// batch holds one server and the two are equal.
func RolloutBatchesMax(servers, maxUnavailable int) int {
	if err := CheckRollout(servers, maxUnavailable); err != nil {
		panic(err)
	}
	return batchesAfterOnes(servers, 3, maxUnavailable)
}

// RollbackBatchesMax is the most batches a rollback runs: 2 + ⌈(servers −
// 2) / maxUnavailable⌉ (as many as there are servers, when there are fewer
// than two). A rollback goes back through the batches the rollout deployed,
// in reverse; it may skip one, never add one. At worst the rollout deployed
// every server, the canary alone and the last of the servers already out
// alone: RolloutBatchesMax without the check, which deploys nothing.
func RollbackBatchesMax(servers, maxUnavailable int) int {
	if err := CheckRollout(servers, maxUnavailable); err != nil {
		panic(err)
	}
	return batchesAfterOnes(servers, 2, maxUnavailable)
}

// batchesAfterOnes is how many batches take servers through when the first
// ones batches hold one server each and the rest hold up to per.
func batchesAfterOnes(servers, ones, per int) int {
	ones = min(ones, servers)
	return ones + (servers-ones+per-1)/per
}

// RolloutMin is the theoretical minimum time a rollout takes:
// RolloutBatches × ServerDeployMin. A batch's servers drain and come back
// side by side, so a batch takes as long as one server, and the batches go
// one after another. A sound rollout takes about this long.
func (t Timing) RolloutMin(servers, maxUnavailable int) time.Duration {
	return time.Duration(RolloutBatches(servers, maxUnavailable)) * t.ServerDeployMin()
}

// RolloutMax bounds a rollout that rolls nothing back, as the rollout
// bounds its own steps: it asks every server what it runs (StatusMax, side
// by side), runs at most RolloutBatchesMax batches one after another, each
// cut at RolloutBatchMax, the last one included even when it fails, and
// asks every server again at the end (StatusMax): 2 × StatusMax +
// RolloutBatchesMax × RolloutBatchMax.
func (t Timing) RolloutMax(servers, maxUnavailable int) time.Duration {
	return 2*t.StatusMax() + time.Duration(RolloutBatchesMax(servers, maxUnavailable))*t.RolloutBatchMax()
}

// RollbackBound is the most an automatic rollback adds to a failed
// rollout's RolloutMax: RollbackBatchesMax × RolloutBatchMax. At worst the
// last batch failed and every server was touched. They go back to their
// previous release through the rollout's own batches in reverse, at most
// maxUnavailable at a time, through the same drain and re-entry, each batch
// cut at RolloutBatchMax like a rollout's. The status rounds are
// RolloutMax's: the rollout asks once more only after its rollback.
func (t Timing) RollbackBound(servers, maxUnavailable int) time.Duration {
	return time.Duration(RollbackBatchesMax(servers, maxUnavailable)) * t.RolloutBatchMax()
}

// FailedRolloutMax bounds a rollout whatever happens: RolloutMax +
// RollbackBound. A rollout that fails in its b-th deploy batch has run b of
// them and rolls back at most b, so failing in the last is the worst case.
// A CI job that runs the rollout needs at least this timeout, or it can be
// cut mid-rollback.
func (t Timing) FailedRolloutMax(servers, maxUnavailable int) time.Duration {
	return t.RolloutMax(servers, maxUnavailable) + t.RollbackBound(servers, maxUnavailable)
}

// Scaled returns t with every duration of the deploy's timeline multiplied
// by f and the counts kept, so a rehearsal can run the real timeline in a
// fraction of the time. The result keeps the invariants (ValidateInvariants)
// but not AWS's limits.
//
// What the balancer and the drain see scales: the balancer's checks, the
// drain, shutdown and grace, idle and keep-alive, the deploy's and the
// watchdog's bounds. The container health check does not: it is the
// server's own cost, not a step of the timeline. Docker runs each check by
// exec, about 50 ms of CPU however short the timeline, so its pace
// (ContainerHealthInterval) is what the host can afford and its bound
// (ContainerHealthTimeout) how long a busy host may take to run one. Scaled
// with the rest (to 200 ms and 600 ms at 0.2), a dozen containers asked for
// more exec than two cores run, checks queued past their timeout, and Docker
// marked serving containers unhealthy. Nor does EngineWork, compose's and
// the engine's own time: at 0.2 the watchdog's hold left it a fifth of what
// a busy host takes, and a watchdog finishing a sound deploy ran out of its
// hold before it had verified the services.
func (t Timing) Scaled(f float64) Timing {
	orig := t
	s := func(d time.Duration) time.Duration {
		return time.Duration(math.Round(float64(d) * f))
	}
	t.HealthCheckInterval = s(t.HealthCheckInterval)
	t.HealthCheckTimeout = s(t.HealthCheckTimeout)
	t.NodeSkew = s(t.NodeSkew)
	t.Drain = s(t.Drain)
	t.DrainQuiet = s(t.DrainQuiet)
	t.MaxDrain = s(t.MaxDrain)
	t.ShutdownTimeout = s(t.ShutdownTimeout)
	t.KillMargin = s(t.KillMargin)
	t.StopGracePeriod = s(t.StopGracePeriod)
	t.DeregistrationDelay = s(t.DeregistrationDelay)
	t.LBIdleTimeout = s(t.LBIdleTimeout)
	t.AppKeepAlive = s(t.AppKeepAlive)
	t.ReadHeaderTimeout = s(t.ReadHeaderTimeout)
	t.MaxRequest = s(t.MaxRequest)
	// ContainerHealthInterval and ContainerHealthTimeout are the host's:
	// kept (see above).
	t.StartTimeout = s(t.StartTimeout)
	// EngineWork is the host's: kept. LockWait covers the watchdog's hold,
	// EngineWork included, and a margin past it that is the timeline's:
	// only the margin scales.
	t.LockWait = t.WatchdogHold() + s(orig.LockWait-orig.WatchdogHold())
	// DeployHold covers the steps (scaled) and EngineWork (kept); its margin
	// past them is the timeline's.
	t.DeployHold = t.DeploySteps() + t.EngineWork + s(orig.DeployHold-orig.DeploySteps()-orig.EngineWork)
	t.WatchdogInterval = s(t.WatchdogInterval)
	t.MaxPlannedDowntime = s(t.MaxPlannedDowntime)
	return t
}

// Rule names one relation or limit that Validate checks.
type Rule string

// The rules. Limits come from the ALB target group API; invariants are ours.
const (
	RulePositive          Rule = "positive"
	RuleWholeSeconds      Rule = "whole-seconds"
	RuleAWSRange          Rule = "aws-range"
	RuleTimeoutBelowInt   Rule = "timeout-below-interval"
	RuleDrainOutlasts     Rule = "drain-outlasts-detection"
	RuleFitsGrace         Rule = "drain-fits-grace"
	RuleReentryShort      Rule = "reentry-short"
	RuleKeepAlive         Rule = "keepalive-outlasts-idle"
	RuleWatchdogTolerates Rule = "watchdog-tolerates-deploy"
	RuleDowntimePlanned   Rule = "deploy-within-planned-downtime"
	RuleDeregCovers       Rule = "deregistration-covers-shutdown"
	RuleLockOutlasts      Rule = "lock-wait-outlasts-restart"
	RuleHoldCoversSteps   Rule = "deploy-hold-covers-steps"
	RuleContainerFaster   Rule = "container-check-faster"
	RuleStartCovers       Rule = "start-covers-first-check"
	RuleHeaderBeforeCut   Rule = "header-timeout-below-shutdown"
	RuleIdleCoversRequest Rule = "idle-covers-max-request"
	RuleDeadlineCoversCut Rule = "deadline-covers-shutdown"
	RuleMaxDrainFits      Rule = "max-drain-fits-grace"
	RuleMaxDrainCovers    Rule = "max-drain-covers-drain"
	RuleQuietCoversSkew   Rule = "quiet-covers-skew"
	RuleHandoverCapacity  Rule = "handover-keeps-capacity"
	// The design: how many slots each side runs. A limit for one release
	// (slots, slots-agree); slots-registered holds between the sides while
	// a change of design rolls out.
	RuleSlots           Rule = "slots"
	RuleSlotsAgree      Rule = "slots-agree"
	RuleSlotsRegistered Rule = "slots-registered"
)

// Violation is one broken rule: which fields take part and what is wrong.
type Violation struct {
	Rule   Rule
	Fields []string
	Msg    string
}

func (v Violation) Error() string {
	return fmt.Sprintf("%s: %s", v.Rule, v.Msg)
}

// Violations returns every rule t breaks, limits first, then invariants;
// nil when t is valid.
func (t Timing) Violations() []Violation {
	return append(t.limitViolations(), t.invariantViolations()...)
}

// Validate reports every rule t breaks at once, or nil.
func (t Timing) Validate() error {
	return joinViolations(t.Violations())
}

// ValidateInvariants reports every broken relation between the numbers and
// every non-positive value, without AWS's ranges and whole-second limits: the
// check for a Scaled timing.
func (t Timing) ValidateInvariants() error {
	var vs []Violation
	for _, v := range t.limitViolations() {
		if v.Rule == RulePositive {
			vs = append(vs, v)
		}
	}
	return joinViolations(append(vs, t.invariantViolations()...))
}

// InvalidTimingError carries every violation of one timing.
type InvalidTimingError struct {
	Violations []Violation
}

func (e *InvalidTimingError) Error() string {
	lines := []string{fmt.Sprintf("invalid timing: %d rule(s) broken", len(e.Violations))}
	for _, v := range e.Violations {
		lines = append(lines, "  - "+v.Error())
	}
	return strings.Join(lines, "\n")
}

func joinViolations(vs []Violation) error {
	if len(vs) == 0 {
		return nil
	}
	return &InvalidTimingError{Violations: vs}
}

type durationField struct {
	name  string
	value time.Duration
}

func (t Timing) durations() []durationField {
	return []durationField{
		{"HealthCheckInterval", t.HealthCheckInterval},
		{"HealthCheckTimeout", t.HealthCheckTimeout},
		{"NodeSkew", t.NodeSkew},
		{"Drain", t.Drain},
		{"DrainQuiet", t.DrainQuiet},
		{"MaxDrain", t.MaxDrain},
		{"ShutdownTimeout", t.ShutdownTimeout},
		{"KillMargin", t.KillMargin},
		{"StopGracePeriod", t.StopGracePeriod},
		{"DeregistrationDelay", t.DeregistrationDelay},
		{"LBIdleTimeout", t.LBIdleTimeout},
		{"AppKeepAlive", t.AppKeepAlive},
		{"ReadHeaderTimeout", t.ReadHeaderTimeout},
		{"MaxRequest", t.MaxRequest},
		{"ContainerHealthInterval", t.ContainerHealthInterval},
		{"ContainerHealthTimeout", t.ContainerHealthTimeout},
		{"StartTimeout", t.StartTimeout},
		{"EngineWork", t.EngineWork},
		{"LockWait", t.LockWait},
		{"DeployHold", t.DeployHold},
		{"WatchdogInterval", t.WatchdogInterval},
		{"MaxPlannedDowntime", t.MaxPlannedDowntime},
	}
}

type secondsField struct {
	name     string
	value    time.Duration
	min, max time.Duration
}

// awsSeconds are the durations the ALB API takes in whole seconds, with the
// range it accepts.
func (t Timing) awsSeconds() []secondsField {
	return []secondsField{
		{"HealthCheckInterval", t.HealthCheckInterval, 5 * time.Second, 300 * time.Second},
		{"HealthCheckTimeout", t.HealthCheckTimeout, 2 * time.Second, 120 * time.Second},
		{"DeregistrationDelay", t.DeregistrationDelay, 0, 3600 * time.Second},
		{"LBIdleTimeout", t.LBIdleTimeout, 1 * time.Second, 4000 * time.Second},
	}
}

func (t Timing) limitViolations() []Violation {
	var vs []Violation
	for _, f := range t.durations() {
		if f.value <= 0 {
			vs = append(vs, Violation{RulePositive, []string{f.name},
				fmt.Sprintf("%s %v must be positive", f.name, f.value)})
		}
	}
	counts := []struct {
		name  string
		value int
	}{
		{"UnhealthyThreshold", t.UnhealthyThreshold},
		{"HealthyThreshold", t.HealthyThreshold},
		{"WatchdogStrikes", t.WatchdogStrikes},
		{"QuietRequests", t.QuietRequests},
		{"Slots", t.Slots},
		{"RegisteredSlots", t.RegisteredSlots},
	}
	for _, c := range counts {
		if c.value <= 0 {
			vs = append(vs, Violation{RulePositive, []string{c.name},
				fmt.Sprintf("%s %d must be positive", c.name, c.value)})
		}
	}
	// The Docker engine API takes the stop timeout in whole seconds too.
	whole := append(t.awsSeconds(), secondsField{name: "StopGracePeriod", value: t.StopGracePeriod})
	for _, f := range whole {
		if f.value%time.Second != 0 {
			vs = append(vs, Violation{RuleWholeSeconds, []string{f.name},
				fmt.Sprintf("%s %v must be whole seconds", f.name, f.value)})
		}
	}
	for _, f := range t.awsSeconds() {
		if f.value < f.min || f.value > f.max {
			vs = append(vs, Violation{RuleAWSRange, []string{f.name},
				fmt.Sprintf("%s %v must be within %v–%v", f.name, f.value, f.min, f.max)})
		}
	}
	for _, c := range counts[:2] {
		if c.value < 2 || c.value > 10 {
			vs = append(vs, Violation{RuleAWSRange, []string{c.name},
				fmt.Sprintf("%s %d must be within 2–10", c.name, c.value)})
		}
	}
	for _, c := range []struct {
		name  string
		value int
	}{{"Slots", t.Slots}, {"RegisteredSlots", t.RegisteredSlots}} {
		if c.value > MaxSlots {
			vs = append(vs, Violation{RuleSlots, []string{c.name},
				fmt.Sprintf("%s %d must be 1 (a deploy drains the server) or %d (a deploy swaps slots): no design has more", c.name, c.value, MaxSlots)})
		}
	}
	if t.Slots != t.RegisteredSlots {
		vs = append(vs, Violation{RuleSlotsAgree, []string{"Slots", "RegisteredSlots"},
			fmt.Sprintf("RegisteredSlots %d must equal Slots %d in a release: fewer, and a server hands over to a slot no balancer node checks; more, and the target group holds a port no server runs, unhealthy for good (the two differ only while a change of design rolls out, balancer first)",
				t.RegisteredSlots, t.Slots)})
	}
	return vs
}

// MaxSlots is the most slots a server runs: the old release's and the new
// one's, side by side for the handover.
const MaxSlots = 2

func (t Timing) invariantViolations() []Violation {
	var vs []Violation
	for _, r := range Relations() {
		if !r.Holds(t) {
			vs = append(vs, Violation{r.Rule, r.Fields, r.explain(t)})
		}
	}
	// Between counts, so not a Relation (whose margin is a duration): a
	// server whose slots the target group does not all hold hands over to
	// a port no balancer node checks, and drains itself out of service.
	if t.RegisteredSlots < t.Slots {
		vs = append(vs, Violation{RuleSlotsRegistered, []string{"RegisteredSlots", "Slots"},
			fmt.Sprintf("RegisteredSlots %d must not be below Slots %d: a server hands over to a slot no balancer node checks, and drains itself out of service (a change to more slots goes balancer first, to fewer servers first)",
				t.RegisteredSlots, t.Slots)})
	}
	return vs
}

// Term is one side of a relation: a field or a derived value of Timing.
type Term struct {
	Name  string
	Value func(Timing) time.Duration
}

// Relation is one invariant, written as a margin: Left must exceed Right by
// at least Need (by more than Need when Strict). Validate checks these, and
// TIMING.md and `timing diff` show their margins, so a relation is declared
// once.
type Relation struct {
	Rule Rule
	// Fields are the Timing fields the relation reads.
	Fields      []string
	Left, Right Term
	// Need is the least margin; nil means zero.
	Need   *Term
	Strict bool
	// Applies says whether the relation binds t (nil: always); one that
	// does not holds whatever its margin. A relation of one design binds
	// only a timing of that design.
	Applies func(Timing) bool
	// AppliesWhen says, for a relation with Applies, when it binds.
	AppliesWhen string
	// explain says, with the values, what is wrong when it does not hold.
	explain func(Timing) string
}

// Margin is how far Left exceeds Right.
func (r Relation) Margin(t Timing) time.Duration {
	return r.Left.Value(t) - r.Right.Value(t)
}

// NeedValue is the least margin the relation accepts (exclusive when Strict).
func (r Relation) NeedValue(t Timing) time.Duration {
	if r.Need == nil {
		return 0
	}
	return r.Need.Value(t)
}

// Binds reports whether the relation applies to t at all.
func (r Relation) Binds(t Timing) bool {
	return r.Applies == nil || r.Applies(t)
}

// Holds reports whether t keeps the relation.
func (r Relation) Holds(t Timing) bool {
	if !r.Binds(t) {
		return true
	}
	if r.Strict {
		return r.Margin(t) > r.NeedValue(t)
	}
	return r.Margin(t) >= r.NeedValue(t)
}

func field(name string, get func(Timing) time.Duration) Term {
	return Term{Name: name, Value: get}
}

// Relations are the invariants between the numbers, in the order Validate
// reports them.
func Relations() []Relation {
	interval := field("HealthCheckInterval", func(t Timing) time.Duration { return t.HealthCheckInterval })
	timeout := field("HealthCheckTimeout", func(t Timing) time.Duration { return t.HealthCheckTimeout })
	containerInterval := field("ContainerHealthInterval", func(t Timing) time.Duration { return t.ContainerHealthInterval })
	plannedDowntime := field("MaxPlannedDowntime", func(t Timing) time.Duration { return t.MaxPlannedDowntime })
	shutdown := field("ShutdownTimeout", func(t Timing) time.Duration { return t.ShutdownTimeout })
	deployDowntime := Term{"DeployDowntime", Timing.DeployDowntime}
	watchdogHold := Term{"WatchdogHold", Timing.WatchdogHold}
	maxRequest := field("MaxRequest", func(t Timing) time.Duration { return t.MaxRequest })
	drainTerm := field("Drain", func(t Timing) time.Duration { return t.Drain })
	maxDrain := field("MaxDrain", func(t Timing) time.Duration { return t.MaxDrain })
	return []Relation{
		{
			Rule:   RuleTimeoutBelowInt,
			Fields: []string{"HealthCheckTimeout", "HealthCheckInterval"},
			Left:   interval, Right: timeout, Strict: true,
			explain: func(t Timing) string {
				return fmt.Sprintf("HealthCheckTimeout %v must be below HealthCheckInterval %v (the ALB refuses otherwise)",
					t.HealthCheckTimeout, t.HealthCheckInterval)
			},
		},
		{
			Rule:   RuleDrainOutlasts,
			Fields: []string{"Drain", "HealthCheckInterval", "UnhealthyThreshold", "HealthCheckTimeout", "NodeSkew"},
			Left:   field("Drain", func(t Timing) time.Duration { return t.Drain }),
			Right:  Term{"WorstCaseDetection", Timing.WorstCaseDetection},
			Need:   &Term{"NodeSkew", func(t Timing) time.Duration { return t.NodeSkew }},
			explain: func(t Timing) string {
				return fmt.Sprintf("Drain %v must exceed worst-case detection %v (HealthCheckInterval %v × UnhealthyThreshold %d + HealthCheckTimeout %v) by at least NodeSkew %v; margin is %v",
					t.Drain, t.WorstCaseDetection(), t.HealthCheckInterval, t.UnhealthyThreshold, t.HealthCheckTimeout, t.NodeSkew, t.DrainMargin())
			},
		},
		{
			Rule:   RuleFitsGrace,
			Fields: []string{"Drain", "ShutdownTimeout", "KillMargin", "StopGracePeriod"},
			Left:   field("StopGracePeriod", func(t Timing) time.Duration { return t.StopGracePeriod }),
			Right:  Term{"ShutdownDeadline", Timing.ShutdownDeadline},
			Need:   &Term{"KillMargin", func(t Timing) time.Duration { return t.KillMargin }},
			explain: func(t Timing) string {
				return fmt.Sprintf("Drain %v + ShutdownTimeout %v + KillMargin %v = %v must fit inside StopGracePeriod %v, or Docker kills the process mid-shutdown",
					t.Drain, t.ShutdownTimeout, t.KillMargin, t.ShutdownDeadline()+t.KillMargin, t.StopGracePeriod)
			},
		},
		{
			Rule:   RuleReentryShort,
			Fields: []string{"HealthyThreshold", "HealthCheckInterval", "Drain"},
			Left:   Term{"ReentryBound", Timing.ReentryBound},
			Right:  Term{"Reentry", Timing.Reentry},
			explain: func(t Timing) string {
				return fmt.Sprintf("re-entry %v (HealthyThreshold %d × HealthCheckInterval %v) must not exceed Drain %v: a server must come back no slower than it leaves",
					t.Reentry(), t.HealthyThreshold, t.HealthCheckInterval, t.ReentryBound())
			},
		},
		{
			Rule:   RuleKeepAlive,
			Fields: []string{"AppKeepAlive", "LBIdleTimeout"},
			Left:   field("AppKeepAlive", func(t Timing) time.Duration { return t.AppKeepAlive }),
			Right:  field("LBIdleTimeout", func(t Timing) time.Duration { return t.LBIdleTimeout }),
			Strict: true,
			explain: func(t Timing) string {
				return fmt.Sprintf("AppKeepAlive %v must exceed LBIdleTimeout %v, or the balancer reuses a connection the app has just closed (a 502)",
					t.AppKeepAlive, t.LBIdleTimeout)
			},
		},
		{
			Rule:   RuleWatchdogTolerates,
			Fields: []string{"WatchdogStrikes", "WatchdogInterval", "MaxPlannedDowntime"},
			Left:   Term{"WatchdogTolerance", Timing.WatchdogTolerance},
			Right:  plannedDowntime, Strict: true,
			explain: func(t Timing) string {
				return fmt.Sprintf("watchdog tolerance %v ((WatchdogStrikes %d − 1) × WatchdogInterval %v) must exceed MaxPlannedDowntime %v, or a planned outage looks like a crash",
					t.WatchdogTolerance(), t.WatchdogStrikes, t.WatchdogInterval, t.MaxPlannedDowntime)
			},
		},
		{
			Rule:   RuleDowntimePlanned,
			Fields: []string{"StopGracePeriod", "StartTimeout", "MaxPlannedDowntime"},
			Left:   plannedDowntime, Right: deployDowntime,
			explain: func(t Timing) string {
				return fmt.Sprintf("StopGracePeriod %v + StartTimeout %v = %v must not exceed MaxPlannedDowntime %v",
					t.StopGracePeriod, t.StartTimeout, t.DeployDowntime(), t.MaxPlannedDowntime)
			},
		},
		{
			Rule:   RuleDeregCovers,
			Fields: []string{"DeregistrationDelay", "ShutdownTimeout"},
			Left:   field("DeregistrationDelay", func(t Timing) time.Duration { return t.DeregistrationDelay }),
			Right:  shutdown,
			explain: func(t Timing) string {
				return fmt.Sprintf("DeregistrationDelay %v must cover ShutdownTimeout %v, or the balancer cuts requests the app would finish",
					t.DeregistrationDelay, t.ShutdownTimeout)
			},
		},
		{
			Rule:   RuleLockOutlasts,
			Fields: []string{"LockWait", "StopGracePeriod", "StartTimeout", "EngineWork"},
			Left:   field("LockWait", func(t Timing) time.Duration { return t.LockWait }),
			Right:  watchdogHold,
			explain: func(t Timing) string {
				return fmt.Sprintf("LockWait %v must cover the longest a watchdog run holds the lock, one restart of every due service at once and its verification: StopGracePeriod %v + StartTimeout %v + EngineWork %v = %v",
					t.LockWait, t.StopGracePeriod, t.StartTimeout, t.EngineWork, t.WatchdogHold())
			},
		},
		{
			// The deploy cuts its run at DeployHold: a hold shorter than its
			// steps' own bounds would cut a deploy every step of which was
			// within its bound.
			Rule:   RuleHoldCoversSteps,
			Fields: []string{"DeployHold", "StartTimeout", "StopGracePeriod", "HealthyThreshold", "HealthCheckInterval", "EngineWork"},
			Left:   field("DeployHold", func(t Timing) time.Duration { return t.DeployHold }),
			Right:  Term{"DeploySteps", Timing.DeploySteps},
			Need:   &Term{"EngineWork", func(t Timing) time.Duration { return t.EngineWork }},
			explain: func(t Timing) string {
				return fmt.Sprintf("DeployHold %v must cover every step a deploy takes under the lock, each at its own bound, and EngineWork %v for the rest: images 3 × StartTimeout %v + DeployDowntime %v + Reentry %v = %v, + EngineWork = %v",
					t.DeployHold, t.EngineWork, t.StartTimeout, t.DeployDowntime(), t.Reentry(), t.DeploySteps(), t.DeploySteps()+t.EngineWork)
			},
		},
		{
			// Docker's first passed check comes within one container interval
			// of a new container being ready; the balancer re-admits it no
			// sooner than EarliestReentry.
			Rule:   RuleContainerFaster,
			Fields: []string{"ContainerHealthInterval", "HealthCheckInterval", "HealthyThreshold"},
			Left:   Term{"EarliestReentry", Timing.EarliestReentry}, Right: containerInterval,
			explain: func(t Timing) string {
				return fmt.Sprintf("ContainerHealthInterval %v must not exceed the earliest re-entry %v ((HealthyThreshold %d - 1) × HealthCheckInterval %v), so a deploy sees a new container healthy no later than the balancer sends it traffic",
					t.ContainerHealthInterval, t.EarliestReentry(), t.HealthyThreshold, t.HealthCheckInterval)
			},
		},
		{
			Rule:   RuleStartCovers,
			Fields: []string{"StartTimeout", "ContainerHealthInterval", "ContainerHealthTimeout"},
			Left:   field("StartTimeout", func(t Timing) time.Duration { return t.StartTimeout }),
			Right:  Term{"FirstContainerCheck", Timing.FirstContainerCheck}, Strict: true,
			explain: func(t Timing) string {
				return fmt.Sprintf("StartTimeout %v must exceed the first container check %v (ContainerHealthInterval %v + ContainerHealthTimeout %v): Docker runs the first health check only after one interval and may take its whole timeout, so no container could ever be seen healthy",
					t.StartTimeout, t.FirstContainerCheck(), t.ContainerHealthInterval, t.ContainerHealthTimeout)
			},
		},
		{
			Rule:   RuleHeaderBeforeCut,
			Fields: []string{"ShutdownTimeout", "ReadHeaderTimeout"},
			Left:   shutdown,
			Right:  field("ReadHeaderTimeout", func(t Timing) time.Duration { return t.ReadHeaderTimeout }),
			Strict: true,
			explain: func(t Timing) string {
				return fmt.Sprintf("ReadHeaderTimeout %v must be below ShutdownTimeout %v, or a client trickling its header holds every shutdown to its deadline",
					t.ReadHeaderTimeout, t.ShutdownTimeout)
			},
		},
		{
			Rule:   RuleIdleCoversRequest,
			Fields: []string{"LBIdleTimeout", "MaxRequest"},
			Left:   field("LBIdleTimeout", func(t Timing) time.Duration { return t.LBIdleTimeout }),
			Right:  maxRequest,
			explain: func(t Timing) string {
				return fmt.Sprintf("LBIdleTimeout %v must cover MaxRequest %v, or the balancer answers 504 to a request the app allows",
					t.LBIdleTimeout, t.MaxRequest)
			},
		},
		{
			Rule:   RuleDeadlineCoversCut,
			Fields: []string{"AppKeepAlive", "ShutdownTimeout"},
			Left:   Term{"RequestDeadline", Timing.RequestDeadline},
			Right:  shutdown, Strict: true,
			explain: func(t Timing) string {
				return fmt.Sprintf("the request deadline %v (AppKeepAlive) must exceed ShutdownTimeout %v, or the app cuts a request the drain lets finish",
					t.RequestDeadline(), t.ShutdownTimeout)
			},
		},
		{
			Rule:   RuleMaxDrainFits,
			Fields: []string{"MaxDrain", "ShutdownTimeout", "KillMargin", "StopGracePeriod"},
			Left:   field("StopGracePeriod", func(t Timing) time.Duration { return t.StopGracePeriod }),
			Right:  Term{"MaxShutdownDeadline", Timing.MaxShutdownDeadline},
			Need:   &Term{"KillMargin", func(t Timing) time.Duration { return t.KillMargin }},
			explain: func(t Timing) string {
				return fmt.Sprintf("MaxDrain %v + ShutdownTimeout %v + KillMargin %v = %v must fit inside StopGracePeriod %v, or a drain that runs to its upper bound is killed mid-shutdown",
					t.MaxDrain, t.ShutdownTimeout, t.KillMargin, t.MaxShutdownDeadline()+t.KillMargin, t.StopGracePeriod)
			},
		},
		{
			Rule:   RuleMaxDrainCovers,
			Fields: []string{"MaxDrain", "Drain"},
			Left:   maxDrain, Right: drainTerm,
			explain: func(t Timing) string {
				return fmt.Sprintf("MaxDrain %v must not be below Drain %v: the upper bound of a drain that requests keep going cannot end it before the fixed drain",
					t.MaxDrain, t.Drain)
			},
		},
		{
			Rule:   RuleQuietCoversSkew,
			Fields: []string{"DrainQuiet", "NodeSkew"},
			Left:   field("DrainQuiet", func(t Timing) time.Duration { return t.DrainQuiet }),
			Right:  field("NodeSkew", func(t Timing) time.Duration { return t.NodeSkew }),
			explain: func(t Timing) string {
				return fmt.Sprintf("DrainQuiet %v must cover NodeSkew %v, or a drain ends on evidence while the slowest node's last requests are still on their way",
					t.DrainQuiet, t.NodeSkew)
			},
		},
		{
			// The slots design's handover: the deploy hands over Reentry
			// after the new slot answers healthy (its settle watch), and a
			// node takes the old slot out no sooner than EarliestRemoval
			// after that; every node routes to the new slot by
			// AdmissionMax, and applies its verdict up to NodeSkew late.
			// Broken, a node routes to neither slot for a moment: the
			// server is out of its service, the capacity the design exists
			// to keep.
			Rule:        RuleHandoverCapacity,
			Fields:      []string{"HealthCheckInterval", "UnhealthyThreshold", "HealthyThreshold", "HealthCheckTimeout", "NodeSkew", "Slots"},
			Left:        Term{"HandoverRemoval", Timing.HandoverRemoval},
			Right:       Term{"AdmissionMax", Timing.AdmissionMax},
			Need:        &Term{"NodeSkew", func(t Timing) time.Duration { return t.NodeSkew }},
			Applies:     func(t Timing) bool { return t.Slots > 1 },
			AppliesWhen: "Slots 2",
			explain: func(t Timing) string {
				return fmt.Sprintf("the old slot leaves a node no sooner than %v after the new slot answers (Reentry %v + EarliestRemoval %v), which must exceed the latest every node routes to the new slot, %v (AdmissionMax: Reentry + HealthCheckTimeout %v), by at least NodeSkew %v, or a node routes to neither slot; margin is %v",
					t.HandoverRemoval(), t.Reentry(), t.EarliestRemoval(), t.AdmissionMax(), t.HealthCheckTimeout, t.NodeSkew, t.HandoverRemoval()-t.AdmissionMax())
			},
		},
	}
}

// HasRule reports whether err is an *InvalidTimingError that contains rule r.
func HasRule(err error, r Rule) bool {
	var ite *InvalidTimingError
	if !errors.As(err, &ite) {
		return false
	}
	for _, v := range ite.Violations {
		if v.Rule == r {
			return true
		}
	}
	return false
}

// DrainConfig is the server's side of the handshake, as the drain library
// takes it.
func (t Timing) DrainConfig() drain.Config {
	return drain.Config{
		HealthPath:      HealthPath,
		HealthyStatus:   HealthyStatus,
		Drain:           t.Drain,
		ShutdownTimeout: t.ShutdownTimeout,
		// The evidence drain: the balancer's check pace and threshold say
		// what its nodes' checks prove; the rest bounds the drain.
		Evidence:            true,
		HealthCheckInterval: t.HealthCheckInterval,
		HealthCheckTimeout:  t.HealthCheckTimeout,
		UnhealthyThreshold:  t.UnhealthyThreshold,
		DrainQuiet:          t.DrainQuiet,
		QuietRequests:       t.QuietRequests,
		MaxDrain:            t.MaxDrain,
		KeepAlive:           t.AppKeepAlive,
		// Timing's reasons hold for these; drain.Config says what each does.
		ReadHeaderTimeout: t.ReadHeaderTimeout,
		ReadTimeout:       t.RequestDeadline(),
		WriteTimeout:      t.RequestDeadline(),
		MaxHeaderBytes:    MaxHeaderBytes,
		MaxRequest:        t.MaxRequest,
	}
}
