package hooks

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// buildVersion builds the reference service images for another release,
// with that release built in, as a release pipeline would; they are
// removed when the test binary ends. Re-tagging the test images instead
// would make mis-tagged images, which a deploy refuses.
func buildVersion(t *testing.T, version string) {
	t.Helper()
	images(t)
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	require.NoError(t, BuildImages(context.Background(), root, version), "build images %s", version)
	tagsMu.Lock()
	defer tagsMu.Unlock()
	for _, role := range Roles {
		extraTags = append(extraTags, ImageName(DefaultImagePrefix, role, version))
	}
}

// An image tagged with a release it is not (here: last release's image
// re-tagged as the new one) starts and is healthy, but reports the version
// built into it: the deploy's verification names every such service and
// fails.
func TestDeployCatchesMisTaggedImage(t *testing.T) {
	parallel(t, 1)
	tag := images(t)
	misTagged := tag + "-mistagged"
	for _, role := range Roles {
		tagImage(t, ImageName(DefaultImagePrefix, role, tag), ImageName(DefaultImagePrefix, role, misTagged))
	}
	s := newServer(t, dockerTiming)
	res := run(t, s, nil, "deploy", misTagged)
	require.Equal(t, 1, res.code, "a mis-tagged release must fail the deploy: %s", res)
	for _, role := range Roles {
		assert.Regexp(t, `\n  `+regexp.QuoteMeta(role)+`: /about at \S+ says version '`+regexp.QuoteMeta(tag)+`', not '`+
			regexp.QuoteMeta(misTagged)+`'`, res.stderr, role)
		assert.Equal(t, 1, strings.Count(res.stderr, "\n  "+role+": "), "%s named once: %s", role, res)
	}
	assert.NotContains(t, res.stdout, "verified:")
}
