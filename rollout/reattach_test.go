package rollout_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/rollout"
)

// Finding 9: an ssh drop during a deploy was taken for a failed deploy and
// rolled back, over a deploy that runs on, detached, on the server and may
// be about to succeed, the rollback racing it for the server's lock. Here
// the rollout re-attaches: it waits for that deploy to end and judges it
// by what the server says.
func TestSSHDropReattachesToTheRunningDeploy(t *testing.T) {
	for _, tc := range []struct {
		name        string
		switchFails bool
		outcome     string
		rollbacks   []string
		what        []string
	}{
		{"the deploy ends verified", false, rollout.Deployed, nil, []string{
			"ssh dropped; re-attached: on v2, verified (its record: 2026-12-07T04:00:00Z v2: deployed and verified)",
			"deploy: verified and back in service"}},
		{"the deploy fails", true, rollout.Failed, []string{"s1"}, []string{
			`deploy FAILED: ssh dropped; re-attached: runs "v2", verified no (its record: 2026-12-07T04:00:00Z v2: FAILED after changing this server)`,
			"rollback: verified and back in service"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(map[string]server{"s1": healthy(), "s2": healthy(), "s3": healthy()})
			release := make(chan struct{})
			f.drop["s1"] = release
			f.switchFails["s1"] = tc.switchFails
			done := make(chan rollout.Report)
			go func() { done <- rollout.Run(context.Background(), cfg(f, 1, "s1", "s2", "s3")) }()
			// The connection drops while the deploy runs on; it ends
			// after the call has failed.
			require.Equal(t, "s1", <-f.dropped)
			close(release)
			rep := <-done
			assert.Equal(t, tc.outcome, rep.Outcome)
			assert.Equal(t, tc.rollbacks, f.callsOf("rollback"))
			assert.Equal(t, []string{"s1"}, f.callsOf("attach"))
			assert.Equal(t, tc.what, byServer(rep)["s1"].What)
			assert.LessOrEqual(t, f.maxOut, 1)
			if tc.outcome == rollout.Deployed {
				assert.Equal(t, []string{"s1", "s2", "s3"}, f.callsOf("deploy"))
				for _, s := range rep.Servers {
					assert.Equal(t, "v2", s.Now, s.Server)
					assert.Equal(t, "yes", s.Verified, s.Server)
				}
			} else {
				assert.Equal(t, []string{"s1"}, f.callsOf("deploy"), "nothing more deployed after a failure")
				assert.Equal(t, "v1", byServer(rep)["s1"].Now, "rolled back")
			}
		})
	}
}

// A server that cannot be reached again within the call's bound is a
// failed deploy, as before re-attaching existed: it is tried again at
// ssh's keep-alive pace until then, and rolled back after.
func TestSSHDropWithNoReattachFails(t *testing.T) {
	if testing.Short() {
		t.Skip("waits a scaled deploy bound; run without -short")
	}
	tm := infra.Prod().Scaled(0.01)
	f := newFleet(map[string]server{"s1": healthy(), "s2": healthy()})
	release := make(chan struct{})
	f.drop["s1"] = release
	f.unreachable["s1"] = true
	c := cfg(f, 1, "s1", "s2")
	c.Timing = tm
	done := make(chan rollout.Report)
	start := time.Now()
	go func() { done <- rollout.Run(context.Background(), c) }()
	require.Equal(t, "s1", <-f.dropped)
	close(release)
	rep := <-done
	assert.Equal(t, rollout.Failed, rep.Outcome)
	assert.GreaterOrEqual(t, time.Since(start), tm.RemoteDeployMax(), "tried until the call's bound")
	assert.Greater(t, len(f.callsOf("attach")), 1, "tried again")
	assert.Equal(t, []string{"s1"}, f.callsOf("rollback"))
	what := byServer(rep)["s1"].What
	require.NotEmpty(t, what)
	assert.Regexp(t, `^deploy FAILED: ssh dropped \(s1 v2: ssh failed or the connection dropped \(exit 255\)\); re-attach failed: context deadline exceeded \(last try: s1 --attach v2: ssh failed`, what[0])
}
