// Package docs holds the tests of the repository's documentation: every
// relative link and anchor in README.md and docs/*.md resolves, every
// mention of a docs/ page elsewhere in the repository names one that exists,
// and the README stays short enough to read in five minutes.
package docs
