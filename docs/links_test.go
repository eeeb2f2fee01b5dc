package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readmeMaxLines keeps the README a page a newcomer reads in five minutes;
// everything longer belongs in docs/, one subject a file.
const readmeMaxLines = 200

// TestReadmeIsShort: the README is under readmeMaxLines lines.
func TestReadmeIsShort(t *testing.T) {
	lines := readLines(t, filepath.Join(repoRoot(t), "README.md"))
	assert.Less(t, len(lines), readmeMaxLines,
		"README.md has %d lines; it must stay under %d: move the detail to a file in docs/ and link it", len(lines), readmeMaxLines)
}

// TestLinksResolve: every relative link in README.md and docs/*.md names a
// file or directory of the repository, and every #anchor a heading of the
// Markdown file it points into, slugged as GitHub slugs it. Every broken
// link is reported, with its file and line.
func TestLinksResolve(t *testing.T) {
	root := repoRoot(t)
	files := markdownFiles(t, root)
	require.NotEmpty(t, files)
	anchors := map[string]map[string]bool{} // file → its headings' slugs
	checked := 0
	for _, file := range files {
		for _, l := range links(t, file) {
			checked++
			if problem := resolve(root, file, l.dest, anchors); problem != "" {
				rel, _ := filepath.Rel(root, file)
				t.Errorf("%s:%d: link %q: %s", rel, l.line, l.dest, problem)
			}
		}
	}
	assert.Positive(t, checked, "no link found: the link parser reads nothing")
}

// TestReadmeLinksEveryDoc: a page in docs/ that the README does not link is
// a page a newcomer never finds.
func TestReadmeLinksEveryDoc(t *testing.T) {
	root := repoRoot(t)
	linked := map[string]bool{}
	readme := filepath.Join(root, "README.md")
	for _, l := range links(t, readme) {
		path, _, _ := strings.Cut(l.dest, "#")
		if !isExternal(path) && path != "" {
			linked[filepath.Join(root, filepath.FromSlash(path))] = true
		}
	}
	for _, page := range markdownFiles(t, root)[1:] {
		rel, _ := filepath.Rel(root, page)
		assert.True(t, linked[page], "README.md does not link %s: add it to the README's Documentation table", rel)
	}
}

// TestReferencesResolve: every mention of a docs/ page anywhere in the
// repository — a comment, an error message, a script — names a page that
// exists, and its #anchor, if any, a heading of that page.
func TestReferencesResolve(t *testing.T) {
	root := repoRoot(t)
	anchors := map[string]map[string]bool{}
	self, err := filepath.Abs("links_test.go")
	require.NoError(t, err)
	found := 0
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || path == self {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(data, 0) >= 0 {
			return nil // binary
		}
		rel, _ := filepath.Rel(root, path)
		for i, line := range strings.Split(string(data), "\n") {
			for _, sub := range docsMention.FindAllStringSubmatch(line, -1) {
				m := sub[1]
				found++
				if problem := resolve(root, filepath.Join(root, "README.md"), m, anchors); problem != "" {
					t.Errorf("%s:%d: mentions %s: %s", rel, i+1, m, problem)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	assert.Positive(t, found, "no mention of a docs/ page found: the search reads nothing")
}

// docsMention is a path to a page of docs/ from the repository's root, with
// its anchor if it has one.
var docsMention = regexp.MustCompile(`(?:^|[^\w./-])(docs/[\w.-]+\.md(?:#[\w-]+)?)`)

// TestSlug pins the heading slugs against GitHub's (github-slugger: lower
// case; letters, marks, decimal and letter numbers, `_`, `-` kept; each
// space a `-`; everything else dropped; a repeated slug numbered).
func TestSlug(t *testing.T) {
	tests := []struct {
		name     string
		headings []string
		want     []string
	}{
		{"plain", []string{"The two commands"}, []string{"the-two-commands"}},
		{"code and colon", []string{"Fleet rollouts: `rehearse -fleet`"}, []string{"fleet-rollouts-rehearse--fleet"}},
		{"apostrophe", []string{"Where the last deploy's 502 count is read"}, []string{"where-the-last-deploys-502-count-is-read"}},
		{"parentheses", []string{"Scanning the program (trivy)"}, []string{"scanning-the-program-trivy"}},
		{"symbols between spaces", []string{"A & B — c"}, []string{"a--b--c"}},
		{"emphasis and link", []string{"**Bold** and [a link](x.md)"}, []string{"bold-and-a-link"}},
		{"underscore kept", []string{"max_unavailable"}, []string{"max_unavailable"}},
		{"non-ASCII letters kept", []string{"Überblick, ça va"}, []string{"überblick-ça-va"}},
		{"repeats numbered", []string{"Tests", "Tests", "Tests"}, []string{"tests", "tests-1", "tests-2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			seen := map[string]bool{}
			var got []string
			for _, h := range tt.headings {
				got = append(got, uniqueSlug(slug(h), seen))
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestLinkParser: what counts as a link, and what does not.
func TestLinkParser(t *testing.T) {
	md := "# T\n" +
		"See [a](docs/a.md) and ![img](x.png \"title\"), [b](<b c.md#d>).\n" +
		"`[not](inline-code.md)` and [ext](https://example.com).\n" +
		"```sh\n[not](in-a-fence.md)\n```\n" +
		"[ref]: docs/ref.md\n"
	path := filepath.Join(t.TempDir(), "x.md")
	require.NoError(t, os.WriteFile(path, []byte(md), 0o644))
	var got []string
	for _, l := range links(t, path) {
		got = append(got, fmt.Sprintf("%d %s", l.line, l.dest))
	}
	assert.Equal(t, []string{"2 docs/a.md", "2 x.png", "2 b c.md#d", "3 https://example.com", "7 docs/ref.md"}, got)
}

// resolve says what is wrong with dest, a link in file, or "" when it
// resolves.
func resolve(root, file, dest string, anchors map[string]map[string]bool) string {
	if isExternal(dest) {
		return ""
	}
	path, frag, _ := strings.Cut(dest, "#")
	target := file
	if path != "" {
		if filepath.IsAbs(path) || strings.HasPrefix(path, "/") {
			return "absolute paths do not resolve on GitHub; link relative to the file"
		}
		target = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
		rel, err := filepath.Rel(root, target)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return "points outside the repository"
		}
		if _, err := os.Stat(target); err != nil {
			return fmt.Sprintf("%s does not exist", rel)
		}
	}
	if frag == "" {
		return ""
	}
	if !strings.HasSuffix(target, ".md") {
		if regexp.MustCompile(`^L\d+(-L\d+)?$`).MatchString(frag) {
			return "" // a line of a source file, as GitHub shows it
		}
		return "an anchor into a file that is not Markdown"
	}
	slugs, ok := anchors[target]
	if !ok {
		slugs = headingSlugs(target)
		anchors[target] = slugs
	}
	if !slugs[frag] {
		return fmt.Sprintf("no heading of %s has the anchor #%s", filepath.Base(target), frag)
	}
	return ""
}

func isExternal(dest string) bool {
	return regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`).MatchString(dest)
}

type link struct {
	line int
	dest string
}

var (
	// [text](dest) and ![alt](dest), dest optionally in <> and followed by
	// a title. Link text holding brackets of its own is not used here.
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*(<[^>]*>|[^)\s]*)(\s+"[^"]*")?\s*\)`)
	// [label]: dest, a reference definition.
	refDefinition = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)`)
	inlineCode    = regexp.MustCompile("`+[^`]*`+")
	fence         = regexp.MustCompile("^ {0,3}(```|~~~)")
)

// links lists the links of a Markdown file outside code blocks and code
// spans, with their lines.
func links(t *testing.T, file string) []link {
	t.Helper()
	var out []link
	inFence := false
	for i, line := range readLines(t, file) {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		if m := refDefinition.FindStringSubmatch(line); m != nil {
			out = append(out, link{i + 1, strings.Trim(m[1], "<>")})
			continue
		}
		for _, m := range inlineLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
			out = append(out, link{i + 1, strings.Trim(m[1], "<>")})
		}
	}
	return out
}

var atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)(\s+#+)?\s*$`)

// headingSlugs lists the anchors GitHub gives a Markdown file's headings.
func headingSlugs(file string) map[string]bool {
	slugs := map[string]bool{}
	data, err := os.ReadFile(file)
	if err != nil {
		return slugs
	}
	inFence := false
	for _, line := range strings.Split(string(data), "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if m := atxHeading.FindStringSubmatch(line); m != nil && !inFence {
			uniqueSlug(slug(m[1]), slugs)
		}
	}
	return slugs
}

var (
	mdLink     = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	mdEmphasis = regexp.MustCompile(`\*+|` + "`+")
	htmlTag    = regexp.MustCompile(`<[^>]+>`)
)

// slug is GitHub's anchor for a heading: the heading's text as rendered
// (links, code and emphasis markers dropped), lower-cased, with letters,
// marks, decimal and letter numbers, connector punctuation and `-` kept,
// each space turned into `-`, and everything else dropped.
func slug(heading string) string {
	text := mdLink.ReplaceAllString(heading, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	text = mdEmphasis.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-', unicode.IsLetter(r), unicode.IsMark(r),
			unicode.In(r, unicode.Nd, unicode.Nl, unicode.Pc, unicode.Other_Alphabetic):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// uniqueSlug numbers a slug already taken in the same file, as GitHub does
// (x, x-1, x-2), and records it.
func uniqueSlug(s string, taken map[string]bool) string {
	u := s
	for n := 1; taken[u]; n++ {
		u = fmt.Sprintf("%s-%d", s, n)
	}
	taken[u] = true
	return u
}

func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	return append([]string{filepath.Join(root, "README.md")}, docs...)
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	require.NoError(t, sc.Err(), "reading %s", path)
	return lines
}

// repoRoot is the module's root: this package's directory's parent.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err, "the docs tests run from docs/, below the module's root")
	return root
}
