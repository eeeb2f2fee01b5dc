package hooks

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/infra"
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
		assert.Contains(t, res.stderr, "usage: remote-deploy VERSION | --status | --rollback VERSION | --attach VERSION", "%v", args)
	}
}

// shippedRelease is a release as a rollout ships it to a server (a
// directory of /opt/mythex/incoming): the scripts, and the definition,
// numbers and units rendered from tm.
func shippedRelease(t *testing.T, tm infra.Timing) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"remote-deploy", "deploy", "bootstrap", "watchdog", "lib.sh"} {
		fi, err := os.Stat(name)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), mustRead(t, name), fi.Mode().Perm()))
	}
	files, err := Generated(tm)
	require.NoError(t, err)
	for name, data := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o644))
	}
	return dir
}

// from is s running the scripts of the release in dir, with its numbers,
// as remote-deploy runs on a server from the directory it was shipped to.
func from(s Server, dir string) Server {
	s.HooksDir, s.ReleaseDir = dir, dir
	return s
}

// otherHooks is a timing whose hooks differ from dockerTiming's in their
// numbers and in the watchdog's timer.
func otherHooks() infra.Timing {
	tm := dockerTiming
	tm.WatchdogInterval += time.Second
	return tm
}

// releases lists the names of the releases kept on s.
func releases(t *testing.T, s Server) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(s.Root, "releases"))
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// Finding 2: a rollout run again over a server an earlier run left on the
// new release (unverified, or interrupted) deploys the release already
// current. deploy kept "the release deployed and the one before", and the
// one before was the current one: every other release went, the rollout's
// rollback target with it, and the hooks that deployed it too. Now the
// release before moves only when the version does, deploy never prunes it,
// nor bootstrap its hooks, and --status reports it from the link.
func TestRemoteDeployRerunKeepsTheReleaseBefore(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	next := tag + "-rerun"
	buildVersion(t, next)
	s := newServer(t, dockerTiming)
	first, second := shippedRelease(t, dockerTiming), shippedRelease(t, otherHooks())

	res := run(t, from(s, first), nil, "remote-deploy", tag)
	require.Equal(t, 0, res.code, "%s", res)
	firstHooks := installedHooks(t, s)
	for range 2 {
		res = run(t, from(s, second), nil, "remote-deploy", next)
		require.Equal(t, 0, res.code, "%s", res)
	}
	res = run(t, from(s, second), nil, "remote-deploy", "--status")
	require.Equal(t, 0, res.code, "%s", res)
	assert.Equal(t, "release="+next+" previous="+tag+" verified=yes\n", res.stdout, "%s", res)
	link, err := os.Readlink(filepath.Join(s.Root, "previous"))
	if assert.NoError(t, err, "the link to the release before") {
		assert.True(t, strings.HasPrefix(link, "releases/"+tag+"-"), link)
	}
	assert.Len(t, releases(t, s), 2, "the current release and the one before")

	old := containers(t, s)
	res = run(t, from(s, second), nil, "remote-deploy", "--rollback", tag)
	require.Equal(t, 0, res.code, "%s", res)
	assert.Contains(t, res.stdout, "rolling back to "+tag+" (release "+tag+"-")
	assert.Contains(t, res.stdout, "with the hooks that deployed it (hook-releases/")
	assert.Contains(t, res.stdout, "verified: api orchestrator gateway publish-worker")
	now := containers(t, s)
	for _, role := range Roles {
		assert.NotEqual(t, old[role], now[role], "%s was replaced", role)
		assert.Equal(t, tag, ask(t, now[role]).Version, role)
	}
	assert.Equal(t, firstHooks, installedHooks(t, s), "the hooks, numbers and units that deployed %s", tag)
	res = run(t, from(s, second), nil, "remote-deploy", "--status")
	require.Equal(t, 0, res.code, "%s", res)
	assert.Equal(t, "release="+tag+" previous="+next+" verified=yes\n", res.stdout, "%s", res)
}

// Finding 5: remote-deploy runs the new release's bootstrap before its
// deploy; a deploy that then fails before switching (here: an image it
// cannot pull) leaves the release before running, verified, with the new
// release's hooks, numbers and watchdog units installed. --rollback answered
// "already running …, nothing to roll back" and left them. Now the
// release's own bootstrap puts its hooks back, and no container is
// replaced.
func TestRemoteDeployRollbackRestoresTheHooksAfterAFailedSwitch(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	s := newServer(t, dockerTiming)
	good, broken := shippedRelease(t, dockerTiming), shippedRelease(t, otherHooks())

	res := run(t, from(s, good), nil, "remote-deploy", tag)
	require.Equal(t, 0, res.code, "%s", res)
	want := installedHooks(t, s)
	running := containers(t, s)

	// The registry refuses at once: the deploy stops at the pull.
	b := from(s, broken)
	b.ImagePrefix = "127.0.0.1:1/mythex"
	res = run(t, b, nil, "remote-deploy", tag+"-next")
	require.Equal(t, 1, res.code, "%s", res)
	assert.Contains(t, res.stdout, "cannot pull 127.0.0.1:1/mythex/")
	assert.Contains(t, res.stdout, "installed hooks into "+filepath.Join(s.Root, "hooks"), "the new release's bootstrap ran")
	require.NotEqual(t, want, installedHooks(t, s), "the new release's hooks are installed")
	assert.Equal(t, running, containers(t, s), "no container replaced")

	res = run(t, from(s, broken), nil, "remote-deploy", "--rollback", tag)
	require.Equal(t, 0, res.code, "%s", res)
	assert.Regexp(t, "already running "+regexp.QuoteMeta(tag)+
		`, verified; putting back the hooks that deployed it \(hook-releases/[0-9a-f]{16}, installed: hook-releases/[0-9a-f]{16}\) by their own bootstrap; no container is replaced`, res.stdout)
	assert.Equal(t, want, installedHooks(t, s), "the hooks, numbers and units that deployed %s", tag)
	assert.Equal(t, running, containers(t, s), "no container replaced")

	res = run(t, from(s, broken), nil, "remote-deploy", "--status")
	require.Equal(t, 0, res.code, "%s", res)
	assert.Equal(t, "release="+tag+" previous= verified=yes\n", res.stdout, "%s", res)
	res = run(t, from(s, broken), nil, "remote-deploy", "--rollback", tag)
	require.Equal(t, 0, res.code, "%s", res)
	assert.Contains(t, res.stdout, "already running "+tag+", verified; nothing to roll back", "nothing left to put back")
	assert.Equal(t, running, containers(t, s))
}

// Finding 6: --status and --rollback judged the release a server runs by
// the numbers of the release that calls them. A release that adds a
// service made the release before, rolled back to soundly, look
// unverified (the new service has no container there), and a second
// rollback replaced its containers again. Now each release is judged by
// the numbers of the hooks that deployed it.
func TestRemoteDeployJudgesAReleaseByItsOwnNumbers(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	next := tag + "-more"
	buildVersion(t, next)
	s := newServer(t, dockerTiming)
	good, more := shippedRelease(t, dockerTiming), shippedRelease(t, dockerTiming)
	env := filepath.Join(more, TimingEnvFile)
	services := `MYTHEX_SERVICES="` + strings.Join(Roles, " ") + `"`
	numbers := string(mustRead(t, env))
	require.Contains(t, numbers, services)
	require.NoError(t, os.WriteFile(env, []byte(strings.Replace(numbers, services, `MYTHEX_SERVICES="`+strings.Join(Roles, " ")+` search"`, 1)), 0o644))

	res := run(t, from(s, good), nil, "remote-deploy", tag)
	require.Equal(t, 0, res.code, "%s", res)
	// Its definition has no such service yet: the deploy fails after it
	// switched, and the rollback is a whole one, by the hooks before.
	res = run(t, from(s, more), nil, "remote-deploy", next)
	require.Equal(t, 1, res.code, "%s", res)
	assert.Contains(t, res.stdout, "search: no container")
	res = run(t, from(s, more), nil, "remote-deploy", "--rollback", tag)
	require.Equal(t, 0, res.code, "%s", res)
	assert.Contains(t, res.stdout, "with the hooks that deployed it (hook-releases/")
	assert.Contains(t, res.stdout, "verified: api orchestrator gateway publish-worker")

	res = run(t, from(s, more), nil, "remote-deploy", "--status")
	require.Equal(t, 0, res.code, "%s", res)
	assert.Equal(t, "release="+tag+" previous="+next+" verified=yes\n", res.stdout, "%s", res)
	running := containers(t, s)
	res = run(t, from(s, more), nil, "remote-deploy", "--rollback", tag)
	require.Equal(t, 0, res.code, "%s", res)
	assert.Contains(t, res.stdout, "already running "+tag+", verified; nothing to roll back")
	assert.Equal(t, running, containers(t, s), "no container replaced")
}
