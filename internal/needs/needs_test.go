package needs

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDecide(t *testing.T) {
	missing := func(name string) Need {
		return Need{Name: name, Install: "apt-get install " + name, check: func() error { return errors.New("not found") }}
	}
	present := Need{Name: "present", check: func() error { return nil }}
	for _, tc := range []struct {
		name       string
		short      bool
		needs      []Need
		skip, fail string
	}{
		{name: "-short skips whatever is there, naming the full command", short: true, needs: []Need{present, Scanner},
			skip: "-short: needs present, the trivy scanner; go test -timeout 40m ./... runs it"},
		{name: "-short skips a missing need too", short: true, needs: []Need{missing("a")},
			skip: "-short: needs a; go test -timeout 40m ./... runs it"},
		{name: "the full run runs what it has", needs: []Need{present, Scanner}},
		{name: "the full run fails naming every missing need and its install", needs: []Need{missing("a"), present, missing("b")},
			fail: "this test needs what is missing here:\n  a (not found): apt-get install a\n  b (not found): apt-get install b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			skip, fail := decide(tc.short, tc.needs)
			assert.Equal(t, tc.skip, skip)
			assert.Equal(t, tc.fail, fail)
		})
	}
}
