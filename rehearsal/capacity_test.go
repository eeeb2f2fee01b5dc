package rehearsal

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The capacity tests' fixture: two nodes before three servers, and moves
// given as seconds after t0.
var (
	t0    = time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	names = map[string]string{"a:1": "s1", "b:1": "s2", "c:1": "s3"}
)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

// nodeMove is a move on one node (0 or 1).
type nodeMove struct {
	node int
	Move
}

func out(node, s int, host string) nodeMove { return nodeMove{node, Move{At: at(s), Host: host}} }
func in(node, s int, host string) nodeMove {
	return nodeMove{node, Move{At: at(s), Host: host, In: true}}
}

// nodesWith returns nodes lb1 and lb2 whose logs hold moves.
func nodesWith(moves []nodeMove) []*Balancer {
	lbs := []*Balancer{{Name: "lb1", Health: NewHealthTracker(nil)}, {Name: "lb2", Health: NewHealthTracker(nil)}}
	for _, m := range moves {
		lbs[m.node].Health.moves = append(lbs[m.node].Health.moves, m.Move)
	}
	return lbs
}

func TestMostOut(t *testing.T) {
	tests := []struct {
		name  string
		moves []nodeMove
		since int
		want  OutAtOnce
	}{
		{"none moved", nil, 0, OutAtOnce{}},
		{"one at a time, each back on every node before the next", []nodeMove{
			out(0, 1, "a:1"), out(1, 2, "a:1"), in(0, 10, "a:1"), in(1, 11, "a:1"),
			out(1, 12, "b:1"), out(0, 13, "b:1"), in(0, 20, "b:1"), in(1, 21, "b:1"),
		}, 0, OutAtOnce{Most: 1, At: at(1), Servers: []string{"s1"}}},
		{"the next taken out while one node still holds the last out", []nodeMove{
			out(0, 1, "a:1"), out(1, 2, "a:1"), in(0, 10, "a:1"),
			out(0, 11, "b:1"), in(1, 12, "a:1"),
		}, 0, OutAtOnce{Most: 2, At: at(11), Servers: []string{"s1", "s2"}}},
		{"two nodes each holding a different server out", []nodeMove{
			out(0, 1, "a:1"), out(1, 2, "c:1"),
		}, 0, OutAtOnce{Most: 2, At: at(2), Servers: []string{"s1", "s3"}}},
		{"moves before since count for the state, not for the most", []nodeMove{
			out(0, 1, "a:1"), out(0, 2, "b:1"), in(0, 3, "a:1"), out(0, 5, "c:1"),
		}, 3, OutAtOnce{Most: 2, At: at(5), Servers: []string{"s2", "s3"}}},
		{"an upstream with no name is named by its address", []nodeMove{
			out(0, 1, "d:1"),
		}, 0, OutAtOnce{Most: 1, At: at(1), Servers: []string{"d:1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, MostOut(nodesWith(tt.moves), names, at(tt.since)))
		})
	}
}

func TestHealthTrackerRecordsEachMove(t *testing.T) {
	h := NewHealthTracker([]string{"a:1"})
	h.observe("a:1", true) // already in: no move
	h.observe("a:1", false)
	h.observe("a:1", false)
	h.observe("a:1", true)
	h.observe("z:1", false) // not an upstream
	moves := h.Moves()
	if assert.Len(t, moves, 2) {
		assert.Equal(t, Move{At: moves[0].At, Host: "a:1", In: false}, moves[0])
		assert.Equal(t, Move{At: moves[1].At, Host: "a:1", In: true}, moves[1])
		assert.False(t, moves[1].At.Before(moves[0].At))
	}
}

func TestFewestIn(t *testing.T) {
	// low is a node's expected minimum, its instant `s` seconds after t0.
	low := func(node string, fewest, of, s, since int, out ...string) NodeLow {
		return NodeLow{Node: node, Fewest: fewest, Servers: of, At: at(s), AtSeconds: float64(s - since), Out: out}
	}
	tests := []struct {
		name  string
		moves []nodeMove
		since int
		want  []NodeLow
	}{
		{"no moves: every server in service from the start", nil, 0,
			[]NodeLow{low("lb1", 3, 3, 0, 0), low("lb2", 3, 3, 0, 0)}},
		{"one node takes a server out and back; the other never moves", []nodeMove{
			out(0, 1, "a:1"), in(0, 5, "a:1"),
		}, 0, []NodeLow{low("lb1", 2, 3, 1, 0, "s1"), low("lb2", 3, 3, 0, 0)}},
		{"two nodes out of step: each counts its own, not the union", []nodeMove{
			out(0, 1, "a:1"), out(1, 2, "c:1"), out(0, 3, "b:1"), in(1, 4, "c:1"), in(0, 5, "a:1"), in(0, 6, "b:1"),
		}, 0, []NodeLow{low("lb1", 1, 3, 3, 0, "s1", "s2"), low("lb2", 2, 3, 2, 0, "s3")}},
		{"moves before since count for the state, not for the minimum", []nodeMove{
			out(0, 1, "a:1"), out(0, 2, "b:1"), in(0, 3, "a:1"), in(0, 6, "b:1"),
			out(1, 1, "c:1"), in(1, 2, "c:1"),
		}, 4, []NodeLow{low("lb1", 2, 3, 4, 4, "s2"), low("lb2", 3, 3, 4, 4)}},
		{"a server taken out twice counts once while it is out", []nodeMove{
			out(0, 1, "a:1"), in(0, 2, "a:1"), out(0, 3, "a:1"), out(0, 4, "a:1"), out(0, 5, "b:1"), in(0, 6, "a:1"),
		}, 0, []NodeLow{low("lb1", 1, 3, 5, 0, "s1", "s2"), low("lb2", 3, 3, 0, 0)}},
		{"an upstream with no name is a server, named by its address", []nodeMove{
			out(0, 1, "d:1"),
		}, 0, []NodeLow{low("lb1", 3, 4, 1, 0, "d:1"), low("lb2", 3, 3, 0, 0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, FewestIn(nodesWith(tt.moves), names, at(tt.since)))
		})
	}
}

// TestFewestInCountsServersNotSlots: in the slots design each server has
// two upstreams, and it is in service while a node routes to either.
func TestFewestInCountsServersNotSlots(t *testing.T) {
	slots := map[string]string{"a:1": "s1", "a:2": "s1", "b:1": "s2", "b:2": "s2"}
	low := func(node string, fewest, s int, out ...string) NodeLow {
		return NodeLow{Node: node, Fewest: fewest, Servers: 2, At: at(s), AtSeconds: float64(s - 2), Out: out}
	}
	// Every idle slot is down before the load starts (since = 2).
	idle := []nodeMove{out(0, 1, "a:2"), out(0, 1, "b:2"), out(1, 1, "a:2"), out(1, 1, "b:2")}
	tests := []struct {
		name  string
		moves []nodeMove
		want  []NodeLow
	}{
		{"idle slots down, nothing swapped", idle,
			[]NodeLow{low("lb1", 2, 2), low("lb2", 2, 2)}},
		{"the new slot in before the old goes out: the server stays", append(slices.Clone(idle),
			in(0, 3, "a:2"), in(1, 4, "a:2"), out(0, 5, "a:1"), out(1, 5, "a:1")),
			[]NodeLow{low("lb1", 2, 2), low("lb2", 2, 2)}},
		{"a node takes the old slot out before it routes to the new: the server is out there", append(slices.Clone(idle),
			in(0, 3, "a:2"), out(0, 5, "a:1"), out(1, 5, "a:1"), in(1, 6, "a:2")),
			[]NodeLow{low("lb1", 2, 2), low("lb2", 1, 5, "s1")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, FewestIn(nodesWith(tt.moves), slots, at(2)))
		})
	}
}
