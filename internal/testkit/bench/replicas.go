package bench

import (
	"errors"
	"fmt"
	"time"

	rt "github.com/meshfed/meshfed/internal/testkit/replicatest"
)

// run runs f with a runner as its TB and turns a Fatal into an error.
func run(f func(r *runner)) (err error) {
	r := &runner{}
	defer r.close()
	defer func() {
		if v := recover(); v != nil {
			if ft, ok := v.(fatal); ok {
				err = errors.New(string(ft))
				return
			}
			panic(v)
		}
	}()
	f(r)
	return nil
}

// KillResult is the replica-kill scenario's figures.
type KillResult struct {
	Sinks, Moved int
	// Initial is how long the sinks took to subscribe and converge at the start (the
	// baseline); Recovery how long after the kill every sink was connected again with the
	// complete view and the killed replica's cluster held again.
	Initial, Recovery time.Duration
	// Removals is how many deletions the sinks received (must be 0).
	Removals int
}

// ReplicaKill runs three replica processes with four minion processes and n sinks spread
// over the replicas, kills (SIGKILL) the replica holding c2 and measures the recovery.
func ReplicaKill(n int) (res KillResult, err error) {
	err = run(func(r *runner) {
		w := rt.New(r, rt.Options{Clusters: 4, Objects: 5, WarmUp: 30 * time.Second})
		a := w.StartHub("a", nil, true)
		b := w.StartHub("b", nil, true, a.Gossip)
		c := w.StartHub("c", nil, true, a.Gossip)
		hubs := []*rt.Hub{a, b, c}
		order := func(first int) []*rt.Hub { return []*rt.Hub{hubs[first%3], hubs[(first+1)%3], hubs[(first+2)%3]} }
		for i, home := range []int{0, 1, 2, 0} {
			w.StartMinion(rt.ClusterName(i+1), order(home)...)
		}
		want := ""
		w.Eventually(60*time.Second, "every replica serving", func() bool {
			for _, h := range hubs {
				held, err := h.HeldBy()
				if err != nil || len(held) != 4 {
					return false
				}
			}
			return true
		})
		for i := range n {
			w.SinkCert(fmt.Sprintf("global-%04d", i)) // not timed
		}
		start := time.Now()
		sinks := make([]*rt.Sink, n)
		for i := range sinks {
			sinks[i] = w.StartSink(fmt.Sprintf("global-%04d", i), i%2 == 0, order(i)...)
		}
		converged := func() bool {
			for _, s := range sinks {
				if _, up := s.Streams(); !up {
					return false
				}
				v := s.Names()
				if want == "" {
					want = v
				}
				if v != want || v == "" {
					return false
				}
			}
			return true
		}
		w.Eventually(5*time.Minute, "sinks converge", converged)
		res.Initial = time.Since(start)
		res.Sinks = n
		for _, s := range sinks {
			if s.Target() == b.Serve {
				res.Moved++
			}
		}
		start = time.Now()
		b.Kill()
		w.Eventually(5*time.Minute, "recovery", func() bool {
			held, err := a.HeldBy()
			if err != nil || held["c2"] == "" || held["c2"] == "b" {
				return false
			}
			return converged()
		})
		res.Recovery = time.Since(start)
		for _, s := range sinks {
			res.Removals += len(s.Removed())
		}
	})
	return res, err
}

// CostResult is the CPU all replica processes spend per change.
type CostResult struct {
	Replicas     int
	CPUPerChange time.Duration
	// Latency is the mean time for a change to reach a sink on every replica.
	Latency time.Duration
}

// ReplicaChangeCost runs `replicas` replica processes, one cluster published to replica a
// by a source in this process and one sink per replica, and measures the CPU time of the
// replica processes (all of them) per change, each change waited for at every sink.
func ReplicaChangeCost(replicas, changes int) (res CostResult, err error) {
	err = run(func(r *runner) {
		w := rt.New(r, rt.Options{Clusters: 1, WarmUp: 30 * time.Second})
		names := []string{"a", "b", "c", "d", "e"}[:replicas]
		var hubs []*rt.Hub
		for i, name := range names {
			var seeds []string
			if i > 0 {
				seeds = []string{hubs[0].Gossip}
			}
			hubs = append(hubs, w.StartHub(name, nil, true, seeds...))
		}
		pub := w.Publish("c1", hubs[0])
		for i := 0; i < 10; i++ {
			if err := pub.Put(fmt.Sprintf("vs-%d", i), "init"); err != nil {
				r.Fatal(err)
			}
		}
		var sinks []*rt.Sink
		for i, h := range hubs {
			sinks = append(sinks, w.StartSink(fmt.Sprintf("global-%d", i), true, h))
		}
		reached := func(name, marker string) func() bool {
			return func() bool {
				for _, s := range sinks {
					if !s.Contains(name, marker) {
						return false
					}
				}
				return true
			}
		}
		w.Eventually(60*time.Second, "initial state everywhere", reached("ns-c1/vs-9", "init"))
		cpu := func() time.Duration {
			var sum time.Duration
			for _, h := range hubs {
				c, err := h.CPU()
				if err != nil {
					r.Fatal(err)
				}
				sum += c
			}
			return sum
		}
		before, start := cpu(), time.Now()
		for i := 0; i < changes; i++ {
			name, marker := fmt.Sprintf("vs-%d", i%10), fmt.Sprintf("gen-%06d", i)
			if err := pub.Put(name, marker); err != nil {
				r.Fatal(err)
			}
			for !reached("ns-c1/"+name, marker)() {
				time.Sleep(200 * time.Microsecond)
			}
		}
		res.Latency = time.Since(start) / time.Duration(changes)
		res.CPUPerChange = (cpu() - before) / time.Duration(changes)
		res.Replicas = replicas
	})
	return res, err
}
