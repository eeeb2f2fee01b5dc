package rollout

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"
	"github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2/types"

	"github.com/mythex/infra/infra"
)

// TargetHealthAPI is the one ELBv2 call the rollout makes.
type TargetHealthAPI interface {
	DescribeTargetHealth(ctx context.Context, in *elasticloadbalancingv2.DescribeTargetHealthInput, opts ...func(*elasticloadbalancingv2.Options)) (*elasticloadbalancingv2.DescribeTargetHealthOutput, error)
}

// ELB awaits a server's re-entry as the balancer sees it: the target
// (the server's name is its instance id) in TargetGroupARN on Port,
// healthy. It asks once per ReentryPoll (the balancer's verdict changes no
// faster), each call under ReentryCallMax, and last at ReentryWait's
// deadline: a slow answer before it does not end the wait early.
type ELB struct {
	API            TargetHealthAPI
	TargetGroupARN string
	Port           int
	Timing         infra.Timing
	// Log takes each change of a target's state; nil discards it. The
	// waits of a batch write side by side: it must be safe for concurrent
	// use.
	Log io.Writer
}

// WaitInService implements Balancer.
func (e ELB) WaitInService(ctx context.Context, server string) error {
	t := e.Timing
	start := time.Now()
	deadline := start.Add(t.ReentryWait())
	last := "none"
	for polls := 0; ; polls++ {
		at := start.Add(time.Duration(polls) * t.ReentryPoll())
		final := !at.Before(deadline)
		if final {
			at = deadline
		}
		if err := sleepUntil(ctx, at); err != nil {
			return fmt.Errorf("%s: waiting for re-entry (last state %s): %w", server, last, err)
		}
		state := e.state(ctx, server)
		if state != last {
			last = state
			if e.Log != nil {
				fmt.Fprintf(e.Log, "[%s] %s at +%.1fs\n", server, state, time.Since(start).Seconds())
			}
		}
		if state == string(types.TargetHealthStateEnumHealthy) {
			return nil
		}
		if final {
			return fmt.Errorf("%s not back in service after %s (%d describe-target-health calls); last state: %s",
				server, t.ReentryWait(), polls+1, last)
		}
	}
}

// state is the target's state, its reason and description, or why the call
// gave none: a failed call is a state like any other, the next may answer.
func (e ELB) state(ctx context.Context, server string) string {
	cctx, cancel := context.WithTimeout(ctx, e.Timing.ReentryCallMax())
	defer cancel()
	out, err := e.API.DescribeTargetHealth(cctx, &elasticloadbalancingv2.DescribeTargetHealthInput{
		TargetGroupArn: aws.String(e.TargetGroupARN),
		Targets:        []types.TargetDescription{{Id: aws.String(server), Port: aws.Int32(int32(e.Port))}},
	})
	if err != nil {
		return fmt.Sprintf("no-answer (%v)", err)
	}
	for _, d := range out.TargetHealthDescriptions {
		if d.Target == nil || aws.ToString(d.Target.Id) != server || aws.ToInt32(d.Target.Port) != int32(e.Port) || d.TargetHealth == nil {
			continue
		}
		h := d.TargetHealth
		s := string(h.State)
		if h.Reason != "" || aws.ToString(h.Description) != "" {
			s += fmt.Sprintf(" (%s: %s)", h.Reason, aws.ToString(h.Description))
		}
		return s
	}
	return "absent (the target group does not list this target)"
}

func sleepUntil(ctx context.Context, at time.Time) error {
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
