package rollout_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/mythex/infra/rollout"
)

func TestMaxUnavailable(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		k    int
		want int
		bad  bool
	}{
		{"1", 5, 1, false}, {"3", 5, 3, false}, {"50%", 5, 2, false}, {"10%", 5, 1, false},
		{"50%", 6, 3, false}, {"67%", 3, 2, false}, {"10%", 3, 1, false},
		{"0", 5, 0, true}, {"0%", 5, 0, true}, {"101%", 5, 0, true}, {"150%", 5, 0, true}, {"x", 5, 0, true}, {"two", 5, 0, true},
	} {
		n, err := rollout.ParseMaxUnavailable(tc.arg, tc.k)
		if tc.bad {
			assert.Error(t, err, tc.arg)
			continue
		}
		assert.NoError(t, err, tc.arg)
		assert.Equal(t, tc.want, n, tc.arg)
	}
}
