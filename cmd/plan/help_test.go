package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/mythex/infra/internal/cmdflag"
)

// TestHelpListsOnlyThePlansFlags: the Pulumi SDK's glog registers ten
// logging flags on the flag package's global set; -h shows none of them.
func TestHelpListsOnlyThePlansFlags(t *testing.T) {
	var out, errb bytes.Buffer
	assert.Equal(t, 0, run([]string{"-h"}, &out, &errb), "stderr: %s", errb.String())
	assert.Equal(t, []string{"stack-file", "tf"}, cmdflag.Listed(out.String()))
	assert.Empty(t, errb.String())

	out.Reset()
	errb.Reset()
	assert.Equal(t, 2, run([]string{"-log_dir", "x"}, &out, &errb), "a logging flag is not the plan's")
	assert.Contains(t, errb.String(), "flag provided but not defined: -log_dir")
}
