// Package docs holds the test of the repository's documentation: every
// relative link and anchor in README.md and docs/*.md resolves, and the
// README stays short enough to read in five minutes.
package docs
