package cmdflag

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name             string
		args             []string
		code             int
		exit             bool
		stdout, stderr   []string
		notOnOut, notErr bool
	}{
		{name: "flags parse", args: []string{"-n", "3", "rest"}, code: 0, exit: false},
		{name: "-h", args: []string{"-h"}, code: 0, exit: true,
			stdout: []string{"usage: cmd [-n N]", "-n int", "how many times, a sentence"}, notErr: true},
		{name: "-help", args: []string{"-help"}, code: 0, exit: true,
			stdout: []string{"usage: cmd [-n N]", "-n int"}, notErr: true},
		{name: "bad flag", args: []string{"-x"}, code: 2, exit: true,
			stderr: []string{"flag provided but not defined: -x", "usage: cmd [-n N]", "-n int"}, notOnOut: true},
		{name: "bad value", args: []string{"-n", "many"}, code: 2, exit: true,
			stderr: []string{`invalid value "many" for flag -n`, "usage: cmd"}, notOnOut: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := New("cmd", "[-n N]")
			n := fs.Int("n", 1, "how many times, a sentence")
			var out, errb bytes.Buffer
			code, exit := Parse(fs, tc.args, &out, &errb)
			assert.Equal(t, tc.code, code)
			assert.Equal(t, tc.exit, exit)
			for _, s := range tc.stdout {
				assert.Contains(t, out.String(), s)
			}
			for _, s := range tc.stderr {
				assert.Contains(t, errb.String(), s)
			}
			if tc.notOnOut {
				assert.Empty(t, out.String(), "an error's usage goes to stderr")
			}
			if tc.notErr {
				assert.Empty(t, errb.String(), "asked-for help goes to stdout")
			}
			if tc.name == "-h" {
				assert.Equal(t, []string{"n"}, Listed(out.String()))
			}
			if !exit {
				assert.Equal(t, 3, *n)
				assert.Equal(t, []string{"rest"}, fs.Args())
			}
		})
	}
}
