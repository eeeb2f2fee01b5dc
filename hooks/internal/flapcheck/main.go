// Command flapcheck is a health check that flaps, for the deploy's tests: an
// image runs the real service and this in place of `service check`. The
// first check passes, the next FailFor fail, and every later one passes: a
// container Docker sees healthy, then unhealthy, then healthy again for good,
// as a service that crashes and recovers looks from outside. It counts its
// runs in a file of the container's own writable layer, so the schedule
// follows Docker's checks whatever their pace.
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// FailFor is how many checks fail after the first: more than Docker's
// retries, so the container is marked unhealthy.
const FailFor = 4

// countFile holds how many checks ran before this one. The image runs as
// root, so / is writable.
const countFile = "/flapcheck.count"

func main() {
	n, err := next()
	if err != nil {
		fmt.Println("flapcheck:", err)
		os.Exit(1)
	}
	if n > 1 && n <= 1+FailFor {
		fmt.Printf("flapcheck: check %d fails\n", n)
		os.Exit(1)
	}
	fmt.Printf("flapcheck: check %d passes\n", n)
}

// next records one more check and returns its number, from 1. Docker runs
// one check at a time per container, so nothing races here.
func next() (int, error) {
	n := 0
	if b, err := os.ReadFile(countFile); err == nil {
		if n, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			return 0, fmt.Errorf("%s: %w", countFile, err)
		}
	} else if !os.IsNotExist(err) {
		return 0, err
	}
	n++
	if err := os.WriteFile(countFile, []byte(strconv.Itoa(n)), 0o644); err != nil {
		return 0, err
	}
	return n, nil
}
