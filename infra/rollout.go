package infra

import "time"

// The rollout's own bounds: every remote call and every batch it makes ends
// by one of these, signal or not. They derive from the fields above; none
// is a number of its own.

// SSHConnectTimeout bounds ssh's connection set-up to a server (ssh's
// ConnectTimeout): a server that cannot be reached in the time the
// balancer takes to judge a target dead (WorstCaseDetection) is as good as
// down, and waiting longer only holds the fleet's batch.
func (t Timing) SSHConnectTimeout() time.Duration {
	return t.WorstCaseDetection()
}

// SSHAliveInterval is how often ssh asks a silent server whether the
// connection still lives (ServerAliveInterval): the balancer's own pace of
// asking a target.
func (t Timing) SSHAliveInterval() time.Duration {
	return t.HealthCheckInterval
}

// SSHAliveCountMax is how many unanswered keep-alives end the connection
// (ServerAliveCountMax): as many as the failed checks that take a target
// out, so a stalled connection is given up after about
// UnhealthyThreshold × HealthCheckInterval, the balancer's own patience.
func (t Timing) SSHAliveCountMax() int {
	return t.UnhealthyThreshold
}

// StatusMax bounds one `remote-deploy --status`: the connection, the wait
// for the server's lock (it reads under the lock, LockWait), and the
// engine's answer to the checks that verify the services (EngineWork).
func (t Timing) StatusMax() time.Duration {
	return t.SSHConnectTimeout() + t.LockWait + t.EngineWork
}

// RemoteDeployMax bounds one remote deploy or rollback call: the
// connection, the wait for the server's lock, and the one hold under which
// bootstrap and deploy run (RemoteHold), each cutting its own run at its
// bound.
func (t Timing) RemoteDeployMax() time.Duration {
	return t.SSHConnectTimeout() + t.LockWait + t.RemoteHold()
}

// ReentryCallMax bounds one describe-target-health call of the wait for
// re-entry: it must answer before the next poll is due (ReentryPoll).
func (t Timing) ReentryCallMax() time.Duration {
	return t.ReentryPoll()
}

// ReentryWaitMax bounds the whole wait for re-entry as the rollout runs it:
// ReentryWait, with its last poll at that deadline, and that poll's own
// bound (ReentryCallMax).
func (t Timing) ReentryWaitMax() time.Duration {
	return t.ReentryWait() + t.ReentryCallMax()
}

// RolloutBatchMax bounds one batch of the rollout or its rollback: the
// servers' remote calls side by side (RemoteDeployMax), then their waits
// for re-entry side by side (ReentryWaitMax). A batch still running after
// that has failed; its servers' deploys run on to their end on the servers.
// It is the one bound on a batch: RolloutMax and RollbackBound count their
// batches at it.
func (t Timing) RolloutBatchMax() time.Duration {
	return t.RemoteDeployMax() + t.ReentryWaitMax()
}
