package hooks

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stallingRegistry is a registry that accepts every connection and never
// answers: a pull from it runs until its bound cuts it, as a pull from a
// registry that has stopped answering does.
type stallingRegistry struct {
	ln       net.Listener
	accepted atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
}

func newStallingRegistry(t *testing.T) *stallingRegistry {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &stallingRegistry{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.accepted.Add(1)
			r.mu.Lock()
			r.conns = append(r.conns, c)
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, c := range r.conns {
			_ = c.Close()
		}
	})
	return r
}

// prefix is the image prefix of images on r.
func (r *stallingRegistry) prefix() string {
	return r.ln.Addr().String() + "/mythex"
}

// Finding 8: what deploy holds the server lock for is the contract's
// DeployHold, whatever its steps' own bounds add up to. The release's
// images come from a registry that accepts and never answers, so every
// pull runs to its bound.
//
// Before, the contract gave deploy no hold (timing.env had no such key, and
// the hooks refuse a key they do not know), and deploy fetched the images
// one after another, each within a start timeout: a release whose four
// images each took most of a start timeout to pull held the lock four of
// them, past what the contract said a deploy may take, and a release that
// adds a service longer still. Here, before, the first pull ran to its bound
// and the deploy gave up without trying the others: one connection to the
// registry, one image named. Now the images are fetched side by side within
// one start timeout together, every one that cannot be had is named, and
// the deploy cuts its run at DeployHold however long its steps would take.
func TestDeployHoldCutsTheRun(t *testing.T) {
	parallel(t, 1)
	tm := dockerTiming
	require.Greater(t, len(Roles), 1, "the side-by-side fetch needs more than one image to show")

	deployFrom := func(t *testing.T, r *stallingRegistry, envEdit func(string) string) (result, time.Duration) {
		t.Helper()
		s := newServer(t, tm)
		s.ImagePrefix = r.prefix()
		if envEdit != nil {
			path := filepath.Join(s.ReleaseDir, TimingEnvFile)
			require.NoError(t, os.WriteFile(path, []byte(envEdit(string(mustRead(t, path)))), 0o644))
		}
		start := time.Now()
		res := run(t, s, nil, "deploy", "v1")
		took := time.Since(start)
		// The lock is free once deploy has exited: nothing it left behind
		// (a pull it started) holds it.
		out, err := exec.Command("flock", "--nonblock", s.Lock(), "true").CombinedOutput()
		assert.NoError(t, err, "the server lock is free after the deploy: %s", out)
		assert.Equal(t, 1, res.code, "%s", res)
		assert.Contains(t, res.stderr, "cannot pull "+r.prefix()+"/")
		assert.Contains(t, res.stderr, "no container was replaced")
		assert.Contains(t, string(mustRead(t, filepath.Join(s.Root, "state", "last-deploy"))), "FAILED before changing anything")
		return res, took
	}

	t.Run("images side by side", func(t *testing.T) {
		r := newStallingRegistry(t)
		res, took := deployFrom(t, r, nil)
		assert.GreaterOrEqual(t, r.accepted.Load(), int64(len(Roles)), "every image's pull reached the registry")
		assert.Equal(t, len(Roles), strings.Count(res.stderr, "cannot pull "), "%s", res)
		// One start timeout for every image, and what staging, compose's
		// config and the engine take around it: not one per image.
		assert.Less(t, took, tm.StartTimeout+tm.EngineWork,
			"%d images fetched within one start timeout (%v), not %d × %v; took %v", len(Roles), tm.StartTimeout, len(Roles), tm.StartTimeout, took)
	})

	t.Run("the hold cuts every step", func(t *testing.T) {
		// A hold shorter than any one pull's bound, as no valid contract
		// has (deploy-hold-covers-steps), to see the deploy cut its run
		// there: the pulls are cut at the hold, not at their own bound.
		const hold = 3 * time.Second
		require.Less(t, hold, tm.StartTimeout)
		r := newStallingRegistry(t)
		res, took := deployFrom(t, r, func(env string) string {
			key := "MYTHEX_DEPLOY_HOLD_MS="
			old := fmt.Sprintf("%s%d\n", key, tm.DeployHold.Milliseconds())
			require.Contains(t, env, old, "timing.env has the deploy's hold")
			return strings.Replace(env, old, fmt.Sprintf("%s%d\n", key, hold.Milliseconds()), 1)
		})
		assert.GreaterOrEqual(t, took, hold, "%s", res)
		// The cut, then recording the outcome and releasing the lock.
		assert.Less(t, took, hold+tm.EngineWork/3, "the deploy ends at its hold (%v), not at a pull's bound (%v): took %v\n%s", hold, tm.StartTimeout, took, res)
	})
}
