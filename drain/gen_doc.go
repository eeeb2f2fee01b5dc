//go:build ignore

// gen_doc writes doc.go, the drain package's doc comment, from the
// production timing: go generate ./drain.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/mythex/infra/drain/internal/gendoc"
	"github.com/mythex/infra/infra"
)

func main() {
	if err := write("doc.go"); err != nil {
		fmt.Fprintln(os.Stderr, "gen_doc:", err)
		os.Exit(1)
	}
}

// write replaces path atomically, so an interrupted run never leaves a
// half-written doc.go behind.
func write(path string) error {
	src, err := gendoc.Render(infra.Prod())
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".doc-*.go.tmp")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(src); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
