package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/internal/cmdflag"
	"github.com/mythex/infra/rollout"
)

func TestHelpListsOnlyItsOwnFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"-h"}, &out, &errOut, nil)
	assert.Equal(t, 0, code)
	assert.Empty(t, errOut.String())
	assert.Equal(t, []string{"elb-endpoint", "hooks", "image-prefix", "json", "max-unavailable", "no-rollback",
		"port", "remote-releases", "remote-sudo", "ssh-config", "target-group-arn"}, cmdflag.Listed(out.String()))
}

func TestBadInputNamesEveryProblemAndTouchesNothing(t *testing.T) {
	t.Setenv("MYTHEX_TARGET_GROUP_ARN", "")
	t.Setenv("MYTHEX_APP_PORT", "")
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"-max-unavailable", "2", "-hooks", "../../hooks", "v/1", "s1", "-s2"}, &out, &errOut, nil)
	assert.Equal(t, 2, code)
	for _, want := range []string{
		"nothing deployed",
		`VERSION "v/1" is not a valid image tag`,
		`SERVER "-s2"`,
		"-port",
		"-target-group-arn is not set",
		"maxUnavailable 2 must be below servers 2",
	} {
		assert.Contains(t, errOut.String(), want)
	}
	assert.Empty(t, out.String())
}

// Bad input is refused before any server is touched, with every problem
// named at once: a server name ssh would read as an option, one that would
// change which target describe-target-health is asked about, a VERSION
// that would leave the releases directory, a shape the contract refuses.
func TestRefusesBadInput(t *testing.T) {
	hooks := t.TempDir()
	for _, f := range rollout.ReleaseFiles {
		require.NoError(t, os.WriteFile(filepath.Join(hooks, f), []byte("# "+f+"\n"), 0o755))
	}
	for k, v := range map[string]string{"AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
		"MYTHEX_TARGET_GROUP_ARN": "", "MYTHEX_APP_PORT": ""} {
		t.Setenv(k, v)
	}
	// ssh is never run: a stub that would say so.
	bin := t.TempDir()
	touched := filepath.Join(t.TempDir(), "touched")
	require.NoError(t, os.WriteFile(filepath.Join(bin, "ssh"), []byte("#!/bin/sh\necho \"$*\" >>"+touched+"\nexit 255\n"), 0o755))
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	good := []string{"-hooks", hooks, "-port", "8080", "-target-group-arn", "arn:aws:elasticloadbalancing:eu-west-1:1:targetgroup/tg/1"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"hostile names", append(slices.Clone(good), "../../usr/local/bin", "i-1", "-oProxyCommand=touch /tmp/owned", "i-2,Port=1", "Id=i-3", "a b", ""),
			[]string{
				`VERSION "../../usr/local/bin" is not a valid image tag`,
				`SERVER "-oProxyCommand=touch /tmp/owned" may hold only letters, digits and _ . @ -, and not start with -`,
				`SERVER "i-2,Port=1" may hold only`,
				`SERVER "Id=i-3" may hold only`,
				`SERVER "a b" may hold only`,
				`SERVER "" may hold only`,
				"nothing deployed",
			}},
		{"the balancer's settings missing", []string{"-hooks", hooks, "-port", "http", "v1", "i-1"},
			[]string{"-target-group-arn is not set", `-port "http" must be a port number`, "nothing deployed"}},
		{"every server out at once", append(slices.Clone(good), "-max-unavailable", "2", "v1", "i-1", "i-2"),
			[]string{"maxUnavailable 2 must be below servers 2: an ALB whose targets are all unhealthy fails open", "nothing deployed"}},
		{"a percentage of every server", append(slices.Clone(good), "-max-unavailable", "100%", "v1", "i-1", "i-2", "i-3"),
			[]string{"maxUnavailable 3 must be below servers 3", "nothing deployed"}},
		{"not a count", append(slices.Clone(good), "-max-unavailable", "two", "v1", "i-1", "i-2"),
			[]string{`-max-unavailable "two" must be a count (1 or more) or a percentage (1% to 100%)`, "nothing deployed"}},
		{"a server named twice", append(slices.Clone(good), "v1", "i-1", "i-2", "i-1"),
			[]string{`SERVER "i-1" is named twice: it would count twice against -max-unavailable`, "nothing deployed"}},
		{"a relative releases directory", append(slices.Clone(good), "-remote-releases", "releases", "v1", "i-1"),
			[]string{`-remote-releases "releases" must be an absolute path`, "nothing deployed"}},
		{"-max-unavailable with no value", []string{"-max-unavailable"}, []string{"flag needs an argument: -max-unavailable", "usage: rollout"}},
		{"an unknown option", []string{"-canary", "v1", "i-1", "i-2"}, []string{"flag provided but not defined: -canary", "usage: rollout"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), tc.args, &out, &errOut, nil)
			assert.Equal(t, 2, code, "%s", errOut.String())
			for _, w := range tc.want {
				assert.Contains(t, errOut.String(), w)
			}
			assert.Empty(t, out.String())
			assert.NoFileExists(t, touched, "no server touched")
		})
	}
}

// The rollout and deploy apply the same rule to VERSION: the rollout
// refuses what deploy would refuse on the server, and nothing else.
func TestVersionRuleIsDeploys(t *testing.T) {
	for _, v := range []string{"v1", "2026.11.30-abc_1", "_x", "a..b", strings.Repeat("a", 128),
		strings.Repeat("a", 129), "../x", "..", ".hidden", "-v", "v 1", "v1;id", "v/1", ""} {
		t.Run(v, func(t *testing.T) {
			var out, errOut bytes.Buffer
			// "--": a VERSION starting with '-' is otherwise a flag.
			run(context.Background(), []string{"-hooks", t.TempDir(), "--", v, "i-1"}, &out, &errOut, nil)
			deploy := exec.Command("../../hooks/deploy", v)
			// Bad everything else, so deploy stops at its input check.
			deploy.Env = append(os.Environ(), "MYTHEX_APP_PORT=0", "MYTHEX_ROOT="+t.TempDir())
			deployOut, _ := deploy.CombinedOutput()
			require.Contains(t, string(deployOut), "MYTHEX_APP_PORT '0' must be a port number", "deploy got to its input check")
			assert.Equal(t, strings.Contains(string(deployOut), "is not a valid image tag"),
				strings.Contains(errOut.String(), "is not a valid image tag"), "rollout:\n%s\ndeploy:\n%s", errOut.String(), deployOut)
		})
	}
}

// Where a release is unpacked and how its commands become root come from
// the environment when no flag sets them, as the ssh configuration does:
// a test's servers are not production's.
func TestRemoteSettingsFromTheEnvironment(t *testing.T) {
	t.Setenv("MYTHEX_REMOTE_RELEASES", "releases")
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"-hooks", "../../hooks", "-port", "8080", "-target-group-arn", "arn:aws:elasticloadbalancing:eu-west-1:1:targetgroup/tg/1", "v1", "i-1"}, &out, &errOut, nil)
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut.String(), `-remote-releases "releases" must be an absolute path`)

	var usage bytes.Buffer
	t.Setenv("MYTHEX_REMOTE_SUDO", "")
	run(context.Background(), []string{"-h"}, &usage, &usage, nil)
	assert.Regexp(t, `-remote-sudo string\n\s+how the remote commands become root; empty runs them as the ssh user \(default \$MYTHEX_REMOTE_SUDO when set, even empty, else sudo\)\n`, usage.String(),
		"an empty MYTHEX_REMOTE_SUDO leaves no default")
	t.Setenv("MYTHEX_REMOTE_SUDO", "doas")
	usage.Reset()
	run(context.Background(), []string{"-h"}, &usage, &usage, nil)
	assert.Contains(t, usage.String(), `(default "doas")`)
}
