// Package workflows holds the tests of .github/workflows: what the deploy
// and pull-request jobs trust, pin and measure, and the deploy job's own
// steps run with bash as the runner runs them.
package workflows
