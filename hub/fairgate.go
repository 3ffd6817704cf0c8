package hub

import (
	"runtime"
	"sync"
)

// fairGate lets one writer at a time through, and when writers wait, takes them in turns
// by key (a tenant): the keys with writers waiting are served round-robin, and within a
// key its writers in the order they came. A key with many writers waiting therefore delays
// a writer of another key by at most one write beyond the one in progress, where a mutex
// would make it wait behind every one of them (sync.Mutex queues its waiters in order of
// arrival). A free gate is taken at once: uncontended it costs one uncontended mutex
// lock and unlock to enter and one to leave.
type fairGate struct {
	mu     sync.Mutex // guards the following fields
	busy   bool
	queues map[string][]chan struct{} // waiting writers by key, first come first
	turns  []string                   // the keys with writers waiting, the next to go first
}

func newFairGate() *fairGate { return &fairGate{queues: map[string][]chan struct{}{}} }

// enter returns once the caller holds the gate; it must leave it.
func (g *fairGate) enter(key string) {
	g.mu.Lock()
	if !g.busy {
		g.busy = true
		g.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	q := g.queues[key]
	if len(q) == 0 {
		g.turns = append(g.turns, key)
	}
	g.queues[key] = append(q, ch)
	g.mu.Unlock()
	<-ch // leave handed the gate over: it is still busy, and ours
}

// leave hands the gate to the first writer of the key whose turn it is (that key goes to
// the back of the turns if it has more), or frees it.
func (g *fairGate) leave() {
	g.mu.Lock()
	if len(g.turns) == 0 {
		g.busy = false
		g.mu.Unlock()
		return
	}
	key := g.turns[0]
	g.turns = g.turns[1:]
	q := g.queues[key]
	next := q[0]
	q[0] = nil
	if q = q[1:]; len(q) == 0 {
		delete(g.queues, key)
	} else {
		g.queues[key] = q
		g.turns = append(g.turns, key)
	}
	g.mu.Unlock()
	close(next)
	// The writer handed the gate runs next on this P (runnext), but only once this one
	// blocks: meanwhile the store would sit idle while this one prepares its next write.
	// Yielding runs it now.
	runtime.Gosched()
}

// waiting returns how many writers wait (for tests, which wait for a writer to queue).
func (g *fairGate) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, q := range g.queues {
		n += len(q)
	}
	return n
}
