package contract

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/mythex/infra/infra"
)

// ModulePath is the module whose infra package holds the contract.
const ModulePath = "github.com/mythex/infra"

// Source is what the contract says in words: the comments of package infra.
// The reasons are read from the source so that no explanation is typed twice.
type Source struct {
	// Meaning is each Timing field's doc comment: what the number is.
	Meaning map[string]string
	// Reason is the comment above each key of the literal in Prod(): why the
	// production value is what it is.
	Reason map[string]string
	// Derived lists Timing's methods that take nothing and return a
	// time.Duration, in source order.
	Derived []string
	// DerivedDoc is each derived method's doc comment.
	DerivedDoc map[string]string
	// Fleet lists Timing's methods that take a rollout's shape (servers,
	// maxUnavailable int) and return a time.Duration, in source order.
	Fleet []string
	// FleetDoc is each fleet method's doc comment.
	FleetDoc map[string]string
	// FuncDoc is the doc comment of each of package infra's exported
	// functions (RolloutBatches among them).
	FuncDoc map[string]string
	// Rules are the Rule constants, in declaration order.
	Rules []infra.Rule
	// ConstDoc is the doc comment of HealthPath and HealthyStatus.
	ConstDoc map[string]string
}

// FindModuleRoot walks up from dir to the directory whose go.mod declares
// ModulePath.
func FindModuleRoot(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for d := abs; ; d = filepath.Dir(d) {
		if path, err := modulePath(filepath.Join(d, "go.mod")); err == nil && path == ModulePath {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod for %s in %s or any parent: run this inside the repository", ModulePath, abs)
		}
	}
}

// modulePath reads the module line of a go.mod file.
func modulePath(gomod string) (string, error) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", fmt.Errorf("read module path: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", fmt.Errorf("%s has no module line", gomod)
}

// LoadSource parses package infra under the module root and checks that the
// words cover the compiled Timing: every field has a meaning and a reason,
// every derived value a doc comment. All gaps are reported at once.
func LoadSource(root string) (*Source, error) {
	dir := filepath.Join(root, "infra")
	paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	sort.Strings(paths)
	s := &Source{
		Meaning:    map[string]string{},
		Reason:     map[string]string{},
		DerivedDoc: map[string]string{},
		FleetDoc:   map[string]string{},
		FuncDoc:    map[string]string{},
		ConstDoc:   map[string]string{},
	}
	fset := token.NewFileSet()
	sawProd := false
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.GenDecl:
				s.readGenDecl(d)
			case *ast.FuncDecl:
				if d.Name.Name == "Prod" && d.Recv == nil {
					sawProd = true
					if err := s.readProd(fset, f, d); err != nil {
						return nil, fmt.Errorf("%s: %w", path, err)
					}
				}
				s.readMethod(d)
			}
		}
	}
	if !sawProd {
		return nil, fmt.Errorf("no func Prod in %s", dir)
	}
	if err := s.check(); err != nil {
		return nil, fmt.Errorf("contract source %s: %w", dir, err)
	}
	return s, nil
}

// LoadSourceHere finds the module root from the working directory and loads
// the source there.
func LoadSourceHere() (*Source, error) {
	root, err := FindModuleRoot(".")
	if err != nil {
		return nil, err
	}
	return LoadSource(root)
}

func docText(g *ast.CommentGroup) string {
	if g == nil {
		return ""
	}
	return strings.Join(strings.Fields(g.Text()), " ")
}

func (s *Source) readGenDecl(d *ast.GenDecl) {
	for _, spec := range d.Specs {
		switch sp := spec.(type) {
		case *ast.TypeSpec:
			st, ok := sp.Type.(*ast.StructType)
			if sp.Name.Name != "Timing" || !ok {
				continue
			}
			for _, field := range st.Fields.List {
				for _, name := range field.Names {
					s.Meaning[name.Name] = docText(field.Doc)
				}
			}
		case *ast.ValueSpec:
			if d.Tok != token.CONST {
				continue
			}
			if id, ok := sp.Type.(*ast.Ident); ok && id.Name == "Rule" {
				for _, v := range sp.Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s.Rules = append(s.Rules, infra.Rule(strings.Trim(lit.Value, "\"`")))
					}
				}
			}
			for _, name := range sp.Names {
				if name.Name == "HealthPath" || name.Name == "HealthyStatus" {
					doc := sp.Doc
					if doc == nil {
						doc = d.Doc
					}
					s.ConstDoc[name.Name] = docText(doc)
				}
			}
		}
	}
}

// readProd takes each key's reason from the comment group that ends on the
// line just above the key.
func (s *Source) readProd(fset *token.FileSet, f *ast.File, fn *ast.FuncDecl) error {
	var lit *ast.CompositeLit
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if c, ok := n.(*ast.CompositeLit); ok && lit == nil {
			if id, ok := c.Type.(*ast.Ident); ok && id.Name == "Timing" {
				lit = c
				return false
			}
		}
		return true
	})
	if lit == nil {
		return errors.New("Prod() has no Timing{...} literal")
	}
	above := map[int]*ast.CommentGroup{}
	for _, g := range f.Comments {
		if g.Pos() > fn.Body.Lbrace && g.End() < fn.Body.Rbrace {
			above[fset.Position(g.End()).Line] = g
		}
	}
	for _, elt := range lit.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		if !ok {
			return errors.New("Prod() literal must use field: value keys")
		}
		key, ok := kv.Key.(*ast.Ident)
		if !ok {
			continue
		}
		s.Reason[key.Name] = docText(above[fset.Position(kv.Pos()).Line-1])
	}
	return nil
}

func (s *Source) readMethod(fn *ast.FuncDecl) {
	if !fn.Name.IsExported() {
		return
	}
	if fn.Recv == nil {
		s.FuncDoc[fn.Name.Name] = docText(fn.Doc)
		return
	}
	if len(fn.Recv.List) != 1 {
		return
	}
	if id, ok := fn.Recv.List[0].Type.(*ast.Ident); !ok || id.Name != "Timing" {
		return
	}
	ft := fn.Type
	if ft.Results.NumFields() != 1 || !isDuration(ft.Results.List[0].Type) {
		return
	}
	switch {
	case ft.Params.NumFields() == 0:
		s.Derived = append(s.Derived, fn.Name.Name)
		s.DerivedDoc[fn.Name.Name] = docText(fn.Doc)
	case ft.Params.NumFields() == 2 && isIdent(ft.Params.List[0].Type, "int") && isIdent(ft.Params.List[len(ft.Params.List)-1].Type, "int"):
		s.Fleet = append(s.Fleet, fn.Name.Name)
		s.FleetDoc[fn.Name.Name] = docText(fn.Doc)
	}
}

// isDuration reports whether a type expression is time.Duration.
func isDuration(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Duration" && isIdent(sel.X, "time")
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// check compares the parsed words with the compiled type, so a field or
// method without its explanation fails loudly instead of printing a blank.
func (s *Source) check() error {
	var errs []error
	typ := reflect.TypeOf(infra.Timing{})
	for i := 0; i < typ.NumField(); i++ {
		name := typ.Field(i).Name
		if s.Meaning[name] == "" {
			errs = append(errs, fmt.Errorf("field %s has no doc comment in type Timing", name))
		}
		if s.Reason[name] == "" {
			errs = append(errs, fmt.Errorf("field %s has no reason: put a comment directly above its key in Prod()", name))
		}
	}
	for name := range s.Reason {
		if _, ok := typ.FieldByName(name); !ok {
			errs = append(errs, fmt.Errorf("Prod() sets %s, which the compiled Timing does not have: the source and the binary differ", name))
		}
	}
	derived := TakeSnapshot(infra.Timing{}).Derived
	if len(derived) != len(s.Derived) {
		errs = append(errs, fmt.Errorf("the source declares %d derived durations %v, the compiled Timing has %d", len(s.Derived), s.Derived, len(derived)))
	}
	for _, name := range s.Derived {
		if s.DerivedDoc[name] == "" {
			errs = append(errs, fmt.Errorf("method Timing.%s has no doc comment", name))
		}
	}
	if compiled := fleetMethods(); !slices.Equal(compiled, sortedCopy(s.Fleet)) {
		errs = append(errs, fmt.Errorf("the source declares fleet durations %v, the compiled Timing has %v", s.Fleet, compiled))
	}
	for _, name := range s.Fleet {
		if s.FleetDoc[name] == "" {
			errs = append(errs, fmt.Errorf("method Timing.%s has no doc comment", name))
		}
	}
	for _, c := range BatchCounts {
		if s.FuncDoc[c.Name] == "" {
			errs = append(errs, fmt.Errorf("func %s has no doc comment", c.Name))
		}
	}
	for _, name := range []string{"HealthPath", "HealthyStatus"} {
		if s.ConstDoc[name] == "" {
			errs = append(errs, fmt.Errorf("const %s has no doc comment", name))
		}
	}
	if len(s.Rules) == 0 {
		errs = append(errs, errors.New("no Rule constants found"))
	}
	return errors.Join(errs...)
}
