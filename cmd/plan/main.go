// Command plan is the dry plan: it runs the stack's Pulumi program (the one
// `pulumi up` runs) under Pulumi's mock engine, with a stack's config read
// from its Pulumi.<stack>.yaml and the compiled timing contract, and prints
// every resource the program would create with its inputs, the
// timing-derived ones marked with the Timing field they come from, then the
// stack outputs and the contract, with the rollout of the stack's own
// servers (its instanceIds) at the default --max-unavailable. No AWS
// account, credentials or provider plugin are needed, and none is
// contacted: it is a plan, not a preview.
//
// An invalid timing or stack config exits 1 with every validation error.
//
// With -tf FILE it also writes the planned AWS resources as a Terraform
// configuration (infra.TerraformHCL), for trivy to scan: pulumi-aws is
// bridged from the Terraform provider, so its resources are Terraform's. An
// unmapped resource type fails the export by name, and no file is written.
//
// Usage, from the repository root:
//
//	go run ./cmd/plan [-stack-file Pulumi.prod.yaml] [-tf plan/main.tf]
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"

	"github.com/mythex/infra/contract"
	"github.com/mythex/infra/infra"
	"github.com/mythex/infra/internal/cmdflag"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := cmdflag.New("plan", "[-stack-file FILE] [-tf FILE]")
	stackFile := fs.String("stack-file", "Pulumi.prod.yaml",
		"the stack's Pulumi.<stack>.yaml; Pulumi.yaml must be beside it")
	tfFile := fs.String("tf", "",
		"also write the planned resources as Terraform to this file (a *.tf), for trivy")
	if code, exit := cmdflag.Parse(fs, args, stdout, stderr); exit {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "plan: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return 2
	}
	if *tfFile != "" && !strings.HasSuffix(*tfFile, ".tf") {
		fmt.Fprintf(stderr, "plan: -tf %q must end in .tf, or scanners skip it\n", *tfFile)
		return 2
	}
	stack, err := infra.LoadStackFile(*stackFile)
	if err == nil {
		err = writePlan(stdout, infra.Prod(), stack, *tfFile)
	}
	if err != nil {
		fmt.Fprintf(stderr, "plan: %v\n", err)
		return 1
	}
	return 0
}

// typeOrder is the order the plan lists resources in: the component, what
// guards the servers, the access-log bucket, then the balancer from the
// outside in.
var typeOrder = []string{
	infra.ComponentType,
	infra.TypeSecurityGroup,
	infra.TypeIngressRule,
	infra.TypeEgressRule,
	infra.TypeENIAttachment,
	infra.TypeBucket,
	infra.TypeBucketEncryption,
	infra.TypeBucketPublicAccess,
	infra.TypeBucketPolicy,
	infra.TypeLoadBalancer,
	infra.TypeTargetGroup,
	infra.TypeListener,
	infra.TypeAttachment,
}

// writePlan runs the stack's program with timing t and the config of stack
// under the mock engine and writes the plan to w, and, when tfFile is not
// empty, the Terraform export to that file. Nothing is written when the
// program or the export fails: the error carries every problem.
func writePlan(w io.Writer, t infra.Timing, stack infra.StackFile, tfFile string) error {
	rec := &infra.Recorder{}
	outputs := make(chan map[string]any, 1)
	var buildErr error // the program's own error, without the engine's wrapping
	err := pulumi.RunErr(func(ctx *pulumi.Context) error {
		lb, err := infra.Build(ctx, t)
		if err != nil {
			buildErr = err
			return err
		}
		lb.Outputs().ToMapOutput().ApplyT(func(m map[string]any) map[string]any {
			outputs <- m
			return m
		})
		return nil
	}, pulumi.WithMocks(infra.Project, stack.Stack, rec), infra.WithConfig(stack.Config))
	if buildErr != nil {
		return fmt.Errorf("stack %s: %w", stack.Stack, buildErr)
	}
	if err != nil {
		return fmt.Errorf("stack %s under the mock engine: %w", stack.Stack, err)
	}
	var out map[string]any
	select {
	case out = <-outputs:
	default:
		return errors.New("stack outputs did not resolve under the mock engine")
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "Dry plan of stack %s (project %s) under the Pulumi mock engine: no AWS calls, not a preview.\n",
		stack.Stack, infra.Project)
	fmt.Fprintf(&b, "It shows what this program asks AWS to create; ids, ARNs and DNS names are placeholders,\n")
	fmt.Fprintf(&b, "and AWS may still refuse what it asks. `pulumi preview --stack %s` checks against AWS.\n", stack.Stack)
	fmt.Fprintf(&b, "Its lookups (subnets, instances, the account, the region's log writer) get placeholder answers that pass.\n")
	fmt.Fprintf(&b, "Resources marked protected are never deleted or replaced until unprotected (docs/runbook.md: a deliberate destroy).\n")
	fmt.Fprintf(&b, "Timing is the compiled contract; no stack can override it. Inputs marked ← come from it.\n\n")

	resources := rec.Resources()
	var export []byte
	if tfFile != "" {
		if export, err = infra.TerraformHCL(resources); err != nil {
			return fmt.Errorf("stack %s: %w", stack.Stack, err)
		}
	}
	sortResources(resources)
	marks := timingMarks(t)
	aws := 0
	for _, r := range resources {
		if r.Custom {
			aws++
		}
		writeResource(&b, r, marks)
	}

	fmt.Fprintf(&b, "Stack outputs (main.go exports these; ids, ARNs and DNS names are placeholders here)\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, k := range slices.Sorted(maps.Keys(out)) {
		if m, ok := out[k].(map[string]any); ok {
			for _, kk := range slices.Sorted(maps.Keys(m)) {
				fmt.Fprintf(tw, "  %s.%s\t%v\n", k, kk, m[kk])
			}
			continue
		}
		fmt.Fprintf(tw, "  %s\t%v\n", k, out[k])
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write outputs: %w", err)
	}
	b.WriteString("\n")

	fleet, err := contract.StackFleet(stack)
	if err != nil {
		return err
	}
	if err := contract.Write(&b, t, fleet); err != nil {
		return fmt.Errorf("write the timing contract: %w", err)
	}
	fmt.Fprintf(&b, "\nPlan: %d resources to create in stack %s (%d AWS resources under 1 component). Dry plan only: nothing was sent to AWS.\n",
		len(resources), stack.Stack, aws)
	if export != nil {
		if err := writeFileAtomic(tfFile, export); err != nil {
			return err
		}
	}
	if _, err := io.WriteString(w, trimLines(b.String())); err != nil {
		return fmt.Errorf("write plan: %w", err)
	}
	return nil
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory, so a scanner never reads half an export.
func writeFileAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("write the Terraform export: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write the Terraform export: %w", err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write the Terraform export %s: %w", path, err)
	}
	return nil
}

// trimLines drops the padding tabwriter leaves after a line's last value.
func trimLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	return strings.Join(lines, "\n")
}

func sortResources(rs []infra.PlannedResource) {
	rank := func(typ string) int {
		if i := slices.Index(typeOrder, typ); i >= 0 {
			return i
		}
		return len(typeOrder)
	}
	sort.SliceStable(rs, func(i, j int) bool {
		if a, b := rank(rs[i].Type), rank(rs[j].Type); a != b {
			return a < b
		}
		return rs[i].Name < rs[j].Name
	})
}

// timingMarks maps "type input" to the note printed beside a
// timing-derived input: the Timing field (or infra constant) and its value.
func timingMarks(t infra.Timing) map[string]string {
	marks := map[string]string{}
	tv := reflect.ValueOf(t)
	for _, ti := range infra.TimingInputs() {
		note := "← " + ti.From
		if field, ok := strings.CutPrefix(ti.From, "Timing."); ok {
			switch v := tv.FieldByName(field).Interface().(type) {
			case time.Duration:
				note += " = " + contract.FormatDuration(v)
			default:
				note += fmt.Sprintf(" = %v", v)
			}
		}
		marks[ti.Type+" "+ti.Input] = note
	}
	return marks
}

func writeResource(w io.Writer, r infra.PlannedResource, marks map[string]string) {
	kind := "AWS resource"
	if !r.Custom {
		kind = "component"
	}
	parent := "the stack"
	if r.Parent != "" {
		parent = r.Parent[strings.LastIndex(r.Parent, "::")+2:]
	}
	opts := ""
	if r.Protect {
		opts += ", protected"
	}
	if r.RetainOnDelete {
		opts += ", retained on delete"
	}
	fmt.Fprintf(w, "+ %s %s (%s, parent %s%s)\n", r.Type, r.Name, kind, parent, opts)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, line := range flatten("", resource.NewObjectProperty(r.Inputs)) {
		mark := marks[r.Type+" "+line.path]
		fmt.Fprintf(tw, "    %s\t%s\t%s\n", line.path, line.value, mark)
	}
	_ = tw.Flush() // w is the plan's buffer, which cannot fail
	fmt.Fprintln(w)
}

type inputLine struct {
	path, value string
}

// flatten lists every leaf input under a dot-separated path, keys sorted,
// list elements by index.
func flatten(path string, v resource.PropertyValue) []inputLine {
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	switch {
	case v.IsSecret():
		return []inputLine{{path, "[secret]"}}
	case v.IsOutput():
		return flatten(path, v.OutputValue().Element)
	case v.IsObject():
		obj := v.ObjectValue()
		var lines []string
		for k := range obj {
			lines = append(lines, string(k))
		}
		sort.Strings(lines)
		var out []inputLine
		for _, k := range lines {
			out = append(out, flatten(join(k), obj[resource.PropertyKey(k)])...)
		}
		return out
	case v.IsArray():
		var out []inputLine
		for i, e := range v.ArrayValue() {
			out = append(out, flatten(join(strconv.Itoa(i)), e)...)
		}
		if len(out) == 0 {
			return []inputLine{{path, "[]"}}
		}
		return out
	case v.IsString():
		return []inputLine{{path, strconv.Quote(v.StringValue())}}
	case v.IsNumber():
		return []inputLine{{path, strconv.FormatFloat(v.NumberValue(), 'f', -1, 64)}}
	case v.IsNull():
		return nil
	default:
		return []inputLine{{path, fmt.Sprint(v.Mappable())}}
	}
}
