package replicas

import (
	"context"
	"time"
)

// RunTask runs run, one of the hub's dial-outs (a sink that only listens, a minion the hub
// polls), while this replica is the one of the live replicas assigned key, stopping it when
// membership gives key to another replica and starting it again when it comes back: each
// listening sink is pushed to, and each listening minion polled, by one replica at a time.
func (l *Layer) RunTask(ctx context.Context, key string, run func(ctx context.Context)) {
	changed, stop := l.members().Watch()
	defer stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		case <-tick.C:
		}
		return true
	}
	for {
		for !l.assigned(key) {
			if !wait() {
				return
			}
		}
		l.log.Info("this replica runs the dial-out", "task", key)
		l.running(key, true)
		tctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); run(tctx) }()
		for l.assigned(key) && wait() {
		}
		cancel()
		<-done
		l.running(key, false)
		if ctx.Err() != nil {
			return
		}
		l.log.Info("another replica runs the dial-out now", "task", key)
	}
}

// assigned reports whether this replica is the one of the live replicas to run key:
// rendezvous hashing, so every replica computes the same answer from the same membership
// and a departure moves only the departed replica's tasks.
func (l *Layer) assigned(key string) bool {
	best, bestScore := "", uint64(0)
	for _, r := range l.members().Replicas() {
		if s := rendezvous(r.Name, key); best == "" || s > bestScore || (s == bestScore && r.Name < best) {
			best, bestScore = r.Name, s
		}
	}
	return best == l.cfg.Name
}

// running records the dial-out tasks this replica runs, for /api/replicas.
func (l *Layer) running(key string, on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if on {
		l.runs[key] = true
	} else {
		delete(l.runs, key)
	}
}
