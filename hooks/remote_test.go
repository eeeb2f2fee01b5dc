package hooks

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// remote-deploy's two questions and answers for the rollout, on a real
// server: what it runs and ran before, and a return to the release before,
// from the copy deploy keeps, through the same drain as any deploy.
func TestRemoteDeployStatusAndRollback(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	next := tag + "-next"
	buildVersion(t, next)
	s := newServer(t, dockerTiming)
	// remote-deploy keeps the log of a deploy or rollback beside itself, in
	// the release directory on a server: here a copy of the scripts.
	s.HooksDir = t.TempDir()
	for _, name := range []string{"remote-deploy", "deploy", "lib.sh"} {
		fi, err := os.Stat(name)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(s.HooksDir, name), mustRead(t, name), fi.Mode().Perm()))
	}

	fresh := newServer(t, dockerTiming)
	res := run(t, fresh, nil, "remote-deploy", "--status")
	require.Equal(t, 0, res.code, "%s", res)
	assert.Equal(t, "release= previous= verified=no\n", res.stdout, "a server never deployed")
	assert.NoDirExists(t, fresh.Root, "asking created nothing")

	deploy(t, s, tag)
	deploy(t, s, next)
	res = run(t, s, nil, "remote-deploy", "--status")
	require.Equal(t, 0, res.code, "%s", res)
	assert.Equal(t, "release="+next+" previous="+tag+" verified=yes\n", res.stdout)

	old := containers(t, s)
	res = run(t, s, nil, "remote-deploy", "--rollback", tag)
	require.Equal(t, 0, res.code, "%s", res)
	assert.Contains(t, res.stdout, "rolling back to "+tag+" (release "+tag+"-")
	// Deployed without bootstrap, the releases name no hooks: this
	// release's deploy runs, and says the installed hooks stay.
	assert.Contains(t, res.stdout, "no hooks it was deployed with are recorded: the installed hooks stay")
	assert.Contains(t, res.stdout, "verified: api orchestrator gateway publish-worker")
	fresh2 := containers(t, s)
	for _, role := range Roles {
		assert.NotEqual(t, old[role], fresh2[role], "%s was replaced", role)
		assert.Contains(t, res.stdout, role+": old container "+old[role][:12]+" drained and exited 0", "the same drain as any deploy")
		assert.Equal(t, tag, ask(t, fresh2[role]).Version, role)
	}
	assert.True(t, strings.HasPrefix(string(mustRead(t, filepath.Join(s.Root, "current", "deployed.env"))), "MYTHEX_VERSION="+tag+"\n"))
	res = run(t, s, nil, "remote-deploy", "--status")
	require.Equal(t, 0, res.code, "%s", res)
	assert.Equal(t, "release="+tag+" previous="+next+" verified=yes\n", res.stdout, "the release rolled back from is kept in turn")

	// Again: already there, nothing is replaced.
	res = run(t, s, nil, "remote-deploy", "--rollback", tag)
	require.Equal(t, 0, res.code, "%s", res)
	assert.Contains(t, res.stdout, "already running "+tag+", verified; nothing to roll back")
	assert.Equal(t, fresh2, containers(t, s))

	res = run(t, s, nil, "remote-deploy", "--rollback", "v0-never")
	assert.Equal(t, 1, res.code, "%s", res)
	// The detached half's messages come back with its log, on stdout.
	assert.Contains(t, res.stdout, "no release kept in "+filepath.Join(s.Root, "releases")+" runs v0-never; nothing changed")
	assert.Contains(t, res.stderr, "rollback to v0-never on this server ended with exit status 1")
	assert.Equal(t, fresh2, containers(t, s))

	// A release whose recorded hooks are gone (pruned, or not whole): this
	// release's deploy runs, and says which hooks it could not use.
	deploy(t, s, next)
	all, err := filepath.Glob(filepath.Join(s.Root, "releases", tag+"-*"))
	require.NoError(t, err)
	var kept []string
	for _, dir := range all {
		if !strings.HasPrefix(filepath.Base(dir), next+"-") {
			kept = append(kept, dir)
		}
	}
	require.Len(t, kept, 1, "the release before, beside %s's", next)
	require.NoError(t, os.WriteFile(filepath.Join(kept[0], "hooks.ref"), []byte("hook-releases/0123456789abcdef\n"), 0o444))
	res = run(t, s, nil, "remote-deploy", "--rollback", tag)
	require.Equal(t, 0, res.code, "%s", res)
	assert.Contains(t, res.stdout, "its hooks (hook-releases/0123456789abcdef) are no longer whole on this server: the installed hooks stay")
	assert.Contains(t, res.stdout, "verified: api orchestrator gateway publish-worker")
	fresh2 = containers(t, s)
	for _, role := range Roles {
		assert.Equal(t, tag, ask(t, fresh2[role]).Version, role)
	}

	for _, args := range [][]string{{"--rollback"}, {"--status", "x"}, {"--rollback", "../x"}, {"--bogus"}} {
		res = run(t, s, nil, "remote-deploy", args...)
		assert.Equal(t, 2, res.code, "%v: %s", args, res)
		assert.Contains(t, res.stderr, "usage: remote-deploy VERSION | --status | --rollback VERSION", "%v", args)
	}
}
