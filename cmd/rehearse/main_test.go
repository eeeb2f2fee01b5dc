package main

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/internal/cmdflag"
	"github.com/mythex/infra/internal/dockerlock"
)

func TestRunRefusesBadInputBeforeTouchingAnything(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"scale Docker cannot take", []string{"-scale", "0.33"}, []string{"StopGracePeriod 40s × 0.33 = 13.2s", "one-second resolution"}},
		{"unknown profile", []string{"-profiles", "prod,staging"}, []string{`profile "staging": unknown`}},
		{"every problem at once", []string{"-servers", "0", "-deploys", "0", "-rate", "0", "-path", "/healthz"}, []string{
			"Servers 0", "Deploys 0", "Rate 0", `Path "/healthz" is the health endpoint`,
		}},
		{"stray argument", []string{"now"}, []string{`unexpected arguments ["now"]`}},
		{"every server at once", []string{"-servers", "2", "-max-unavailable", "100%"}, []string{"maxUnavailable 2 must be below servers 2"}},
		{"no count", []string{"-max-unavailable", "two"}, []string{`-max-unavailable "two" must be a count (1 or more) or a percentage`}},
		{"one node", []string{"-nodes", "1"}, []string{"Nodes 1 must be at least 2"}},
		{"transition with what it does not take", []string{"-transition", "-deploys", "3", "-matrix", "-profiles", "prod"},
			[]string{"-transition rolls one change out once per order; it does not take -matrix, -profiles, -deploys"}},
		{"transition at a scale Docker cannot take", []string{"-transition", "-scale", "0.33", "-nodes", "1"}, []string{
			"old timing: scale 0.33 makes StopGracePeriod 40s × 0.33 = 13.2s", "Nodes 1 must be at least 2",
		}},
		{"transition over ssh", []string{"-transition", "-ssh"}, []string{"it does not take -ssh"}},
		{"unknown flag", []string{"-k", "3"}, []string{"flag provided but not defined: -k"}},
		{"fleet with what it does not take", []string{"-fleet", "-deploys", "2", "-ssh"},
			[]string{"-fleet rolls each scenario's release out once; it does not take -deploys, -ssh"}},
		{"fleet with every server at once", []string{"-fleet", "-servers", "2", "-max-unavailable", "2"},
			[]string{"maxUnavailable 2 must be below servers 2"}},
		{"fleet at a scale with no room for the crash", []string{"-fleet", "-scale", "0.2"}, []string{"no crash fits between"}},
		{"fleet and transition", []string{"-fleet", "-transition"}, []string{"each a rehearsal of its own; run one at a time"}},
		{"slots and fleet", []string{"-slots", "-fleet"}, []string{"each a rehearsal of its own; run one at a time"}},
		{"slots with what it does not take", []string{"-slots", "-deploys", "2", "-ssh"},
			[]string{"-slots swaps each server once; it does not take -deploys, -ssh"}},
		{"slots with the article's profile", []string{"-slots", "-profiles", "before"}, []string{"the slots prototype runs one profile, prod or evidence"}},
		{"slots without a server after the canary", []string{"-slots", "-servers", "1", "-rate", "0"},
			[]string{"Servers 1: the slots prototype needs a canary and at least one server after it", "Rate 0"}},
		{"the lagging rows with too thin a load", []string{"-matrix", "-servers", "6", "-rate", "100"},
			[]string{"evidence drain needs 10 requests per server", "100 requests/s over 6 servers bring 3.3: raise Rate to 300"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"-repo", t.TempDir()}, tt.args...), &stdout, &stderr)
			assert.Equal(t, 2, code)
			assert.Empty(t, stdout.String())
			for _, w := range tt.want {
				assert.Contains(t, stderr.String(), w)
			}
		})
	}
}

func TestFindRepo(t *testing.T) {
	wd, err := os.Getwd()
	require.NoError(t, err)
	root, err := findRepo()
	require.NoError(t, err)
	assert.Equal(t, filepath.Dir(filepath.Dir(wd)), root, "two levels up from cmd/rehearse")

	t.Chdir(t.TempDir())
	_, err = findRepo()
	assert.ErrorContains(t, err, "use -repo")
}

func TestHelpExitsZeroWithTheRehearsalsFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 0, run([]string{"-h"}, &stdout, &stderr))
	assert.Empty(t, stderr.String())
	assert.Equal(t, []string{"deploys", "fleet", "haproxy", "json", "matrix", "max-unavailable", "nodes", "path",
		"profiles", "rate", "repo", "scale", "servers", "slots", "ssh", "transition", "workdir"}, cmdflag.Listed(stdout.String()))
}

// childArgs, when set in the environment, makes this test binary the
// command itself, with these arguments (one a line): a test runs it as a
// process of its own, to send it signals.
const childArgs = "MYTHEX_REHEARSE_CHILD_ARGS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(childArgs); ok {
		os.Exit(run(strings.Split(args, "\n"), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// Every rehearsal takes the machine-wide Docker lock the test suites take
// turns on before it touches Docker: run while a suite holds it, the
// command says it waits and waits, and an interrupt ends the wait (exit 1)
// without a rehearsal having started.
func TestEveryRehearsalWaitsForTheDockerSuites(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"profiles", nil},
		{"matrix", []string{"-matrix"}},
		{"transition", []string{"-transition"}},
		{"fleet", []string{"-fleet"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The lock lives in the temp directory; this one is the child's
			// alone. An empty PATH: were the wait skipped, the rehearsal
			// would find no docker and stop before building anything.
			tmp := t.TempDir()
			lock, err := os.OpenFile(filepath.Join(tmp, filepath.Base(dockerlock.Path)), os.O_CREATE|os.O_RDWR, 0o666)
			require.NoError(t, err)
			defer func() { require.NoError(t, lock.Close()) }()
			require.NoError(t, syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))

			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "PATH="+t.TempDir(),
				childArgs+"="+strings.Join(append([]string{"-repo", t.TempDir()}, tt.args...), "\n"))
			var stdout bytes.Buffer
			cmd.Stdout = &stdout
			stderr, err := cmd.StderrPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			var said []string
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				said = append(said, sc.Text())
				if strings.Contains(sc.Text(), "waiting for "+lock.Name()) {
					break
				}
			}
			require.NotEmpty(t, said)
			require.Contains(t, said[len(said)-1], "drives Docker on this machine; waiting for", "the command says it waits: %q", said)
			require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
			rest, err := io.ReadAll(stderr)
			require.NoError(t, err)
			var exit *exec.ExitError
			require.ErrorAs(t, cmd.Wait(), &exit)
			assert.Equal(t, 1, exit.ExitCode())
			assert.Equal(t, "rehearse: the machine-wide Docker lock: waiting for "+lock.Name()+": context canceled\n", string(rest),
				"the wait ended, and nothing else happened")
			assert.Empty(t, stdout.String())
		})
	}
}
