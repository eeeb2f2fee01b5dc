// Command timing shows the deploy timing contract (infra.Prod) to people.
//
//	timing [show]                      values with reasons, margins, the prod
//	                                   fleet's rollout, drain timeline
//	timing markdown [-o FILE]          TIMING.md (go run ./cmd/timing markdown -o TIMING.md)
//	timing diff [-o FILE] [-old-name NAME] [-new-name NAME] [-gate] REV [REV2]
//	                                   the contract at REV against the working
//	                                   tree (or against REV2), as markdown,
//	                                   with the rollout order the change needs
//	timing order REV [REV2]            the rollout order alone, for the deploy
//	timing diff|order -prod FILE [REV] the same against production: the prod
//	                                   stack's timing output in FILE
//
// show and markdown exit 1 when the contract breaks a rule, after printing
// it; diff exits 0 whenever it could compare, since a broken side is what it
// is there to show, unless -gate is given and the change has no safe rollout
// order. order exits 1 unless the change has a safe order. Usage errors
// exit 2.
package main

//go:generate go run . markdown -o ../../TIMING.md

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/cmdflag"
)

const usage = `usage:
  timing [show]                     print the contract: values with reasons, the rollout of
                                    Pulumi.prod.yaml's servers, invariants with margins, the
                                    drain timeline
  timing markdown [-o FILE]         print TIMING.md, or write it to FILE
  timing diff [-o FILE] [-old-name NAME] [-new-name NAME] [-gate] REV [REV2]
                                    compare the contract at git revision REV with the working
                                    tree (or with REV2), as markdown; e.g. timing diff origin/main.
                                    -old-name and -new-name say what the two sides are called
                                    in the output (CI names the base branch and the pull request).
                                    Under the diff: the rollout order the change needs (servers
                                    first, balancer first, any order, or unsafe with a two-step
                                    split); -gate exits 1 after writing it when no order is safe
  timing order REV [REV2]           the rollout order of the change from REV to the working tree
                                    (or REV2) as lines for $GITHUB_OUTPUT: verdict=any-order,
                                    servers-first, balancer-first, unsafe or not-judged, and
                                    pulumi-up=before or after the rollout; the reason and any
                                    proposal on standard error. Exits 1 unless an order is safe
  timing diff|order -prod FILE [REV] the same against what production runs: FILE is the prod
                                    stack's outputs (pulumi stack output --json), whose timing
                                    output holds every field of the last pulumi up; the new side
                                    is the working tree, or REV. The deploy judges this way
`

// errUsage marks a command line that cannot be run; it exits 2.
var errUsage = errors.New("usage")

// errHelped marks a command line that asked for -h and got it: it exits 0.
var errHelped = errors.New("help shown")

// parseFlags parses a subcommand's flags: -h shows them on stdout, a bad
// flag shows them on stderr (internal/cmdflag).
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) error {
	switch code, exit := cmdflag.Parse(fs, args, stdout, stderr); {
	case !exit:
		return nil
	case code == 0:
		return errHelped
	default:
		return fmt.Errorf("%w: %s: bad flags (above)", errUsage, fs.Name())
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmd := "show"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "show":
		err = show(args, stdout)
	case "markdown":
		err = markdown(args, stdout, stderr)
	case "diff":
		err = diff(ctx, args, stdout, stderr)
	case "order":
		err = order(ctx, args, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = fmt.Errorf("%w: unknown command %q", errUsage, cmd)
	}
	switch {
	case err == nil, errors.Is(err, errHelped):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "timing: %v\n%s", err, usage)
		return 2
	default:
		fmt.Fprintf(stderr, "timing: %v\n", err)
		return 1
	}
}

func show(args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("%w: show takes no arguments, got %q", errUsage, args)
	}
	fleet, err := contract.LoadProdFleetHere()
	if err != nil {
		return err
	}
	t := infra.Prod()
	if err := contract.Write(stdout, t, fleet); err != nil {
		return err
	}
	return t.Validate()
}

// parse reads flags for a subcommand; -o is the output file. extra adds the
// subcommand's own flags before parsing.
func parse(name, synopsis string, args []string, stdout, stderr io.Writer, extra func(*flag.FlagSet)) (*flag.FlagSet, string, error) {
	fs := cmdflag.New("timing "+name, synopsis)
	out := fs.String("o", "", "write to `FILE` (atomically) instead of standard output")
	if extra != nil {
		extra(fs)
	}
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return nil, "", err
	}
	return fs, *out, nil
}

func markdown(args []string, stdout, stderr io.Writer) error {
	fs, out, err := parse("markdown", "[-o FILE]", args, stdout, stderr, nil)
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: markdown takes no arguments, got %q", errUsage, fs.Args())
	}
	src, err := contract.LoadSourceHere()
	if err != nil {
		return err
	}
	fleet, err := contract.LoadProdFleetHere()
	if err != nil {
		return err
	}
	t := infra.Prod()
	var buf bytes.Buffer
	if err := contract.WriteMarkdown(&buf, t, src, fleet); err != nil {
		return err
	}
	// The file is written even for a broken contract: it shows the broken
	// rules, and the exit status says so.
	if err := emit(out, buf.Bytes(), stdout); err != nil {
		return err
	}
	return t.Validate()
}

func diff(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var oldName, newName, prod string
	var gate bool
	fs, out, err := parse("diff", "[-o FILE] [-old-name NAME] [-new-name NAME] [-gate] [-prod FILE] REV [REV2]", args, stdout, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&prod, "prod", "", prodUsage)
		fs.StringVar(&oldName, "old-name", "", "call the first revision `NAME` in the output")
		fs.StringVar(&newName, "new-name", "", "call the other side `NAME` in the output")
		fs.BoolVar(&gate, "gate", false, "exit 1, after writing the diff, when the change has no safe rollout order")
	})
	if err != nil {
		return err
	}
	oldSide, newSide, err := sides(ctx, fs, "diff", prod)
	if err != nil {
		return err
	}
	if oldName != "" {
		oldSide.Label = oldName
		if oldSide.Commit != "" {
			oldSide.Label = fmt.Sprintf("%s (%.7s)", oldName, oldSide.Commit)
		}
	}
	if newName != "" {
		newSide.Label = newName
	}
	var buf bytes.Buffer
	if err := contract.WriteDiff(&buf, oldSide, newSide); err != nil {
		return err
	}
	if err := emit(out, buf.Bytes(), stdout); err != nil {
		return err
	}
	if v := contract.DiffVerdict(oldSide, newSide); gate && v.Judged() && !v.Safe() {
		return fmt.Errorf("the timing change has no safe rollout order: %s (the diff proposes a two-step split)", v.Reason())
	}
	return nil
}

// prodUsage documents -prod, the deploy's baseline.
const prodUsage = "judge against production: `FILE` holds the prod stack's outputs (pulumi stack output --json); then REV, if given, is the new side"

// sides reads the two revisions a diff or order compares: REV, and REV2 or
// the working tree; or, with prod, production's timing and REV or the
// working tree.
func sides(ctx context.Context, fs *flag.FlagSet, name, prod string) (oldSide, newSide contract.Side, err error) {
	if prod != "" {
		if fs.NArg() > 1 {
			return oldSide, newSide, fmt.Errorf("%w: %s -prod takes at most one revision, got %d", errUsage, name, fs.NArg())
		}
		if oldSide, err = contract.AtProduction(prod); err != nil {
			return oldSide, newSide, err
		}
		newSide = contract.Current()
		if fs.NArg() == 1 {
			root, err := contract.FindModuleRoot(".")
			if err != nil {
				return oldSide, newSide, err
			}
			if newSide, err = contract.AtRevision(ctx, root, fs.Arg(0)); err != nil {
				return oldSide, newSide, err
			}
		}
		return oldSide, newSide, nil
	}
	if fs.NArg() < 1 || fs.NArg() > 2 {
		return oldSide, newSide, fmt.Errorf("%w: %s takes one or two revisions, got %d", errUsage, name, fs.NArg())
	}
	root, err := contract.FindModuleRoot(".")
	if err != nil {
		return oldSide, newSide, err
	}
	if oldSide, err = contract.AtRevision(ctx, root, fs.Arg(0)); err != nil {
		return oldSide, newSide, err
	}
	newSide = contract.Current()
	if fs.NArg() == 2 {
		if newSide, err = contract.AtRevision(ctx, root, fs.Arg(1)); err != nil {
			return oldSide, newSide, err
		}
	}
	return oldSide, newSide, nil
}

// order prints the rollout order for the deploy workflow: key=value lines
// for $GITHUB_OUTPUT on standard output, the reason on standard error. A
// change with no safe order, or one that cannot be judged, fails: the
// deploy never runs it.
func order(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdflag.New("timing order", "[-prod FILE] REV [REV2]")
	prod := fs.String("prod", "", prodUsage)
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	oldSide, newSide, err := sides(ctx, fs, "order", *prod)
	if err != nil {
		return err
	}
	v := contract.DiffVerdict(oldSide, newSide)
	lines := "verdict=" + v.Slug() + "\n"
	if up := v.PulumiUp(); up != "" {
		lines += "pulumi-up=" + up + "\n"
	}
	if _, err := io.WriteString(stdout, lines); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	fmt.Fprintf(stderr, "timing: %s → %s: ", oldSide.Label, newSide.Label)
	if v.Safe() {
		fmt.Fprintf(stderr, "%s\n", v.Reason())
		return nil
	}
	fmt.Fprintln(stderr)
	if err := contract.WriteVerdict(stderr, v); err != nil {
		return err
	}
	return fmt.Errorf("not deployable: %s", v.Reason())
}

// emit writes data to stdout, or atomically to path: a temporary file in the
// same directory renamed over it, so a reader never sees half a file.
func emit(path string, data []byte, stdout io.Writer) error {
	if path == "" {
		if _, err := stdout.Write(data); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // a no-op once renamed
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
