package rehearsal

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/hooks/targethealth"
)

// The stand-in answers for a server as the target group would: healthy
// only once every balancer node routes to it, and naming the nodes that do
// not.
func TestTargetHealthFollowsEveryNode(t *testing.T) {
	servers := fakeServers(t, t.TempDir(), "a", "b")
	servers[0].AppPort, servers[1].AppPort = 18080, 18081
	sshAddresses(servers)
	assert.Equal(t, "127.0.0.1", servers[0].Bind)
	assert.Equal(t, "127.0.0.2", servers[1].Bind)
	assert.Equal(t, []int{18080, 18080}, []int{servers[0].AppPort, servers[1].AppPort}, "one app port for every server, as the rollout passes one")
	assert.Equal(t, "127.0.0.2:18080", servers[1].addr)
	port := servers[0].AppPort
	lbs := trackerOnly(servers)
	call := func(id string) targethealth.Call {
		return targethealth.Call{TargetGroupARN: rehearsalTargetGroup, ID: id, Port: port}
	}
	h, err := targetHealth(call("s1"), servers, lbs, port)
	require.NoError(t, err)
	assert.Equal(t, targethealth.Health{State: targethealth.Healthy}, h)

	lbs[1].Health.observe(servers[0].addr, false)
	h, err = targetHealth(call("s1"), servers, lbs, port)
	require.NoError(t, err)
	assert.Equal(t, targethealth.Health{State: targethealth.Unhealthy, Reason: "Target.FailedHealthChecks", Description: "out of rotation on lb2"}, h)
	h, err = targetHealth(call("s2"), servers, lbs, port)
	require.NoError(t, err)
	assert.Equal(t, targethealth.Healthy, h.State, "each server on its own")

	h, err = targetHealth(call("s9"), servers, lbs, port)
	require.NoError(t, err)
	assert.Equal(t, targethealth.Unused, h.State, "a server the group does not hold")
	_, err = targetHealth(targethealth.Call{TargetGroupARN: "arn:other", ID: "s1", Port: port}, servers, lbs, port)
	assert.Error(t, err, "another target group")
}
