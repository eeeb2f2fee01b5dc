// Package cmdflag parses a command's own flags the same way in every
// command: -h prints the usage line and only the command's flags, each
// with its sentence, on standard output and exits 0; a bad flag prints the
// error and the same usage on standard error and exits 2.
//
// The commands do not use the flag package's global set: a dependency of
// the Pulumi SDK (glog) registers ten logging flags there that are not
// the commands' own, and `plan -h` listed them all.
package cmdflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// New returns an empty flag set for the command name; usage is its
// synopsis after the name, e.g. "[-stack-file FILE] [-tf FILE]".
func New(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() { Usage(fs.Output(), fs, usage) }
	return fs
}

// Usage writes "usage: NAME SYNOPSIS" and every flag of fs with its
// sentence.
func Usage(w io.Writer, fs *flag.FlagSet, usage string) {
	fmt.Fprintf(w, "usage: %s %s\n", fs.Name(), usage)
	out := fs.Output()
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(out)
}

// Parse parses args with fs (made by New). When the command must end at
// once it returns exit true and the status: 0 after -h or -help (usage on
// stdout), 2 after a bad flag (the error and usage on stderr).
func Parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, exit bool) {
	usage := fs.Usage
	// The flag package calls Usage on -h and on a bad flag alike; which
	// stream the usage belongs on is known only from the error.
	fs.Usage = func() {}
	fs.SetOutput(stderr)
	err := fs.Parse(args)
	fs.Usage = usage
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		fs.SetOutput(stderr)
		return 0, true
	default:
		fs.Usage()
		return 2, true
	}
}

// Listed returns the flags a usage text lists, in order: what a command's
// test compares with the flags it means to have.
func Listed(usage string) []string {
	var names []string
	for _, line := range strings.Split(usage, "\n") {
		// PrintDefaults starts each flag's line with "  -NAME".
		rest, ok := strings.CutPrefix(line, "  -")
		if !ok {
			continue
		}
		name, _, _ := strings.Cut(rest, " ")
		names = append(names, strings.TrimSuffix(name, "\t"))
	}
	return names
}
