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
				out = append(out, serverName(names, host))
			}
		}
		if len(out) > most.Most {
			slices.Sort(out)
			most = OutAtOnce{Most: len(out), At: m.At, Servers: out}
		}
	}
	return most
}

// NodeLow is the fewest servers one balancer node routed to, as its own
// log tells it, and the first instant it did.
type NodeLow struct {
	Node string `json:"node"`
	// Fewest is the servers the node had in service then, of Servers.
	Fewest  int `json:"fewest"`
	Servers int `json:"servers"`
	// At is the instant; AtSeconds is how long after `since` it came.
	At        time.Time `json:"at"`
	AtSeconds float64   `json:"at_s"`
	// Out names the servers the node held out of service then.
	Out []string `json:"out,omitempty"`
}

// FewestIn reads each node's verdicts and returns, node by node, the fewest
// servers it routed to since `since`. Each node is judged on its own log,
// not on the fleet's union as MostOut does: capacity is what one node can
// send to, and two nodes holding different servers out each still route to
// the rest. The state at `since` is the first sample, so a server already
// out then counts; moves before it shape that state but are not samples.
// names maps an upstream's address to its server's name; an upstream it
// does not name counts as a server, named by its address. A server with
// several upstreams (the slots design's two slots) is in service while any
// of them is. Every upstream starts in service, as a node's tracker does.
func FewestIn(lbs []*Balancer, names map[string]string, since time.Time) []NodeLow {
	lows := make([]NodeLow, 0, len(lbs))
	for _, b := range lbs {
		moves := b.Health.Moves()
		// slots[server] is how many of its upstreams the node knows.
		slots := map[string]int{}
		seen := map[string]bool{}
		count := func(host string) {
			if !seen[host] {
				seen[host] = true
				slots[serverName(names, host)]++
			}
		}
		for host := range names {
			count(host)
		}
		for _, m := range moves {
			count(m.Host)
		}
		// outSlots[server] is how many of its upstreams the node holds out.
		outSlots := map[string]int{}
		low := NodeLow{Node: b.Name, Fewest: len(slots) + 1, Servers: len(slots)}
		sample := func(at time.Time) {
			var out []string
			for server, n := range outSlots {
				if n == slots[server] {
					out = append(out, server)
				}
			}
			if in := len(slots) - len(out); in < low.Fewest {
				low.Fewest, low.At, low.AtSeconds = in, at, at.Sub(since).Seconds()
				slices.Sort(out)
				low.Out = out
			}
		}
		out := map[string]bool{}
		sampled := false
		for _, m := range moves {
			if !sampled && !m.At.Before(since) {
				sample(since)
				sampled = true
			}
			switch server := serverName(names, m.Host); {
			case m.In && out[m.Host]:
				delete(out, m.Host)
				outSlots[server]--
			case !m.In && !out[m.Host]:
				out[m.Host] = true
				outSlots[server]++
			}
			if sampled {
				sample(m.At)
			}
		}
		if !sampled {
			sample(since)
		}
		lows = append(lows, low)
	}
	return lows
}

// serverName is the server an upstream's address belongs to, or the
// address when names does not say.
func serverName(names map[string]string, host string) string {
	if n := names[host]; n != "" {
		return n
	}
	return host
}
