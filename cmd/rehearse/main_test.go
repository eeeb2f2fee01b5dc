package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mythex/infra/internal/cmdflag"
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
		{"fleet and transition", []string{"-fleet", "-transition"}, []string{"two rehearsals; run one at a time"}},
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
		"profiles", "rate", "repo", "scale", "servers", "ssh", "transition", "workdir"}, cmdflag.Listed(stdout.String()))
}
