package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/mythex/infra/internal/cmdflag"
)

func TestHelpListsOnlyItsOwnFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"-h"}, &out, &errOut)
	assert.Equal(t, 0, code)
	assert.Empty(t, errOut.String())
	assert.Equal(t, []string{"elb-endpoint", "hooks", "image-prefix", "json", "max-unavailable", "no-rollback",
		"port", "remote-releases", "remote-sudo", "ssh-config", "target-group-arn"}, cmdflag.Listed(out.String()))
}

func TestBadInputNamesEveryProblemAndTouchesNothing(t *testing.T) {
	t.Setenv("MYTHEX_TARGET_GROUP_ARN", "")
	t.Setenv("MYTHEX_APP_PORT", "")
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"-max-unavailable", "2", "-hooks", "../../hooks", "v/1", "s1", "-s2"}, &out, &errOut)
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

func TestMaxUnavailable(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		k    int
		want int
		bad  bool
	}{
		{"1", 5, 1, false}, {"3", 5, 3, false}, {"50%", 5, 2, false}, {"10%", 5, 1, false},
		{"0", 5, 0, true}, {"0%", 5, 0, true}, {"101%", 5, 0, true}, {"x", 5, 0, true},
	} {
		n, err := maxUnavailable(tc.arg, tc.k)
		if tc.bad {
			assert.Error(t, err, tc.arg)
			continue
		}
		assert.NoError(t, err, tc.arg)
		assert.Equal(t, tc.want, n, tc.arg)
	}
}
