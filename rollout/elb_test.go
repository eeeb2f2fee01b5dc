package rollout_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/hooks/targethealth"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/rollout"
)

// standIn serves describe-target-health on loopback in the query protocol
// the SDK speaks, answered by health.
func standIn(t *testing.T, health func(targethealth.Call) (targethealth.Health, error)) (*targethealth.Server, *elasticloadbalancingv2.Client) {
	t.Helper()
	s, err := targethealth.Start(health)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	client := elasticloadbalancingv2.New(elasticloadbalancingv2.Options{
		Region:       "eu-west-1",
		BaseEndpoint: aws.String(s.URL),
		Credentials:  aws.AnonymousCredentials{},
		// One attempt: the wait's own pace decides when to ask again.
		RetryMaxAttempts: 1,
	})
	return s, client
}

// A timing whose re-entry wait is short enough for a unit test: the
// balancer's numbers scaled, its invariants kept.
func fastTiming() infra.Timing {
	return infra.Prod().Scaled(0.02)
}

func TestELBWaitsUntilHealthy(t *testing.T) {
	tm := fastTiming()
	var mu sync.Mutex
	n := 0
	s, client := standIn(t, func(c targethealth.Call) (targethealth.Health, error) {
		mu.Lock()
		defer mu.Unlock()
		n++
		switch {
		case n == 1:
			return targethealth.Health{State: targethealth.Initial, Reason: "Elb.RegistrationInProgress", Description: "Target registration is in progress"}, nil
		case n == 2:
			return targethealth.Health{}, errors.New("Throttling")
		default:
			return targethealth.Health{State: targethealth.Healthy}, nil
		}
	})
	var log bytes.Buffer
	e := rollout.ELB{API: client, TargetGroupARN: "arn:aws:elasticloadbalancing:eu-west-1:1:targetgroup/tg/1", Port: 8080, Timing: tm, Log: &log}
	start := time.Now()
	require.NoError(t, e.WaitInService(context.Background(), "i-0abc"))
	calls := s.Calls()
	require.Len(t, calls, 3)
	for _, c := range calls {
		assert.Equal(t, "i-0abc", c.ID)
		assert.Equal(t, 8080, c.Port)
		assert.Equal(t, e.TargetGroupARN, c.TargetGroupARN)
	}
	// Paced by the contract: the i-th call no sooner than i polls in.
	for i, c := range calls {
		assert.GreaterOrEqual(t, c.At.Sub(start), time.Duration(i)*tm.ReentryPoll(), "call %d", i)
	}
	assert.Contains(t, log.String(), "initial (Elb.RegistrationInProgress: Target registration is in progress)")
	// A failed call is a state like any other: reported, and the next
	// poll may answer.
	assert.Regexp(t, `\[i-0abc\] no-answer \(operation error .*DescribeTargetHealth.*\) at \+`, log.String())
	assert.Contains(t, log.String(), "healthy")
}

// Finding 8's second half: the bash wait's last poll landed before its
// own deadline. Here the last call is made at the deadline.
func TestELBLastPollAtTheDeadline(t *testing.T) {
	tm := fastTiming()
	s, client := standIn(t, func(targethealth.Call) (targethealth.Health, error) {
		return targethealth.Health{State: targethealth.Unhealthy, Reason: "Target.FailedHealthChecks"}, nil
	})
	e := rollout.ELB{API: client, TargetGroupARN: "arn:tg", Port: 80, Timing: tm}
	start := time.Now()
	err := e.WaitInService(context.Background(), "i-1")
	took := time.Since(start)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "i-1 not back in service after "+tm.ReentryWait().String(), "it names its bound")
	assert.Contains(t, err.Error(), "last state: unhealthy (Target.FailedHealthChecks: )")
	calls := s.Calls()
	require.NotEmpty(t, calls)
	assert.GreaterOrEqual(t, calls[len(calls)-1].At.Sub(start), tm.ReentryWait(), "the last poll is at the deadline, not before it")
	// It gives up within its bound: the last poll's own bound after the
	// deadline, which the rollout's context for the wait holds it to.
	assert.LessOrEqual(t, took, tm.ReentryWaitMax(), "gave up within the bound")
}

// A healthy answer at the last poll is in time.
func TestELBHealthyAtTheLastPollIsInTime(t *testing.T) {
	tm := fastTiming()
	start := time.Now()
	_, client := standIn(t, func(targethealth.Call) (targethealth.Health, error) {
		if time.Since(start) >= tm.ReentryWait() {
			return targethealth.Health{State: targethealth.Healthy}, nil
		}
		return targethealth.Health{State: targethealth.Initial}, nil
	})
	e := rollout.ELB{API: client, TargetGroupARN: "arn:tg", Port: 80, Timing: tm}
	require.NoError(t, e.WaitInService(context.Background(), "i-1"))
}

func TestELBEndsWithItsContext(t *testing.T) {
	tm := infra.Prod()
	_, client := standIn(t, func(targethealth.Call) (targethealth.Health, error) {
		return targethealth.Health{State: targethealth.Initial}, nil
	})
	e := rollout.ELB{API: client, TargetGroupARN: "arn:tg", Port: 80, Timing: tm}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := e.WaitInService(ctx, "i-1")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// The wait reports each change of the target's state once, in order, and
// sees re-entry within one poll of the target turning healthy, never
// asking faster than the contract's pace. Each state holds for a whole
// poll or more, centred between two polls, so a poll up to half an
// interval late still sees every one.
func TestELBReportsEachChangeAndSeesReentryWithinAPoll(t *testing.T) {
	tm := infra.Prod().Scaled(0.1)
	poll := tm.ReentryPoll()
	turnsHealthy := 3.5
	steps := []struct {
		at float64 // polls after the first call
		h  targethealth.Health
	}{
		{0, targethealth.Health{State: targethealth.Draining, Reason: "Target.DeregistrationInProgress", Description: "Target deregistration is in progress"}},
		{0.5, targethealth.Health{State: targethealth.Initial, Reason: "Elb.RegistrationInProgress", Description: "Target registration is in progress"}},
		{1.5, targethealth.Health{State: targethealth.Unhealthy, Reason: "Target.ResponseCodeMismatch", Description: "Health checks failed with these codes: [503]"}},
		{turnsHealthy, targethealth.Health{State: targethealth.Healthy}},
	}
	var mu sync.Mutex
	var first time.Time
	s, client := standIn(t, func(c targethealth.Call) (targethealth.Health, error) {
		mu.Lock()
		defer mu.Unlock()
		if first.IsZero() {
			first = c.At
		}
		h := steps[0].h
		for _, st := range steps {
			if c.At.Sub(first) >= time.Duration(st.at*float64(poll)) {
				h = st.h
			}
		}
		return h, nil
	})
	var log bytes.Buffer
	e := rollout.ELB{API: client, TargetGroupARN: "arn:tg", Port: 8080, Timing: tm, Log: &log}
	require.NoError(t, e.WaitInService(context.Background(), "i-0abc"))

	var changes []string
	for _, l := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		state, _, _ := strings.Cut(strings.TrimPrefix(l, "[i-0abc] "), " at +")
		changes = append(changes, state)
	}
	assert.Equal(t, []string{
		"draining (Target.DeregistrationInProgress: Target deregistration is in progress)",
		"initial (Elb.RegistrationInProgress: Target registration is in progress)",
		"unhealthy (Target.ResponseCodeMismatch: Health checks failed with these codes: [503])",
		"healthy",
	}, changes, "each change once, in order:\n%s", log.String())

	calls := s.Calls()
	require.NotEmpty(t, calls)
	healthyAt := calls[0].At.Add(time.Duration(turnsHealthy * float64(poll)))
	last := calls[len(calls)-1].At
	assert.False(t, last.Before(healthyAt), "the last call is the one that saw it healthy")
	assert.LessOrEqual(t, last.Sub(healthyAt), poll, "re-entry seen within one poll (%v) of turning healthy", poll)
	for i := 1; i < len(calls); i++ {
		assert.GreaterOrEqual(t, calls[i].At.Sub(calls[i-1].At), poll/2, "calls %d and %d: the pace is the contract's, %v", i-1, i, poll)
	}
	assert.LessOrEqual(t, len(calls), int(turnsHealthy)+2, "one call a poll")
}
