package rehearsal

import (
	"slices"
	"sort"
	"time"
)

// OutAtOnce is the most servers the balancer held out of service at one
// instant, as its nodes' own logs tell it, and the first instant it did.
type OutAtOnce struct {
	Most    int
	At      time.Time
	Servers []string
}

// MostOut reads every node's verdicts since `since` and returns the most
// servers out of service at once. A server counts as out from the moment
// any node takes it out of rotation until every node has it back: the
// rollout's "back in service" is every node routing to it (the target
// group's healthy), so a server one node still holds out is not yet back.
// names maps an upstream's address to its server's name. Every upstream
// starts in service, as a node's tracker does.
func MostOut(lbs []*Balancer, names map[string]string, since time.Time) OutAtOnce {
	type move struct {
		Move
		node int
	}
	var all []move
	for i, b := range lbs {
		for _, m := range b.Health.Moves() {
			all = append(all, move{m, i})
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].At.Before(all[j].At) })
	// outOn[host] is the set of nodes holding host out.
	outOn := map[string]map[int]bool{}
	var most OutAtOnce
	for _, m := range all {
		if outOn[m.Host] == nil {
			outOn[m.Host] = map[int]bool{}
		}
		if m.In {
			delete(outOn[m.Host], m.node)
		} else {
			outOn[m.Host][m.node] = true
		}
		if m.At.Before(since) {
			continue
		}
		var out []string
		for host, nodes := range outOn {
			if len(nodes) > 0 {
				name := names[host]
				if name == "" {
					name = host
				}
				out = append(out, name)
			}
		}
		if len(out) > most.Most {
			slices.Sort(out)
			most = OutAtOnce{Most: len(out), At: m.At, Servers: out}
		}
	}
	return most
}
