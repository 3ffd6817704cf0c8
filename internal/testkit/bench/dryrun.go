package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/mcp"
)

// The dry-run row (issue 25): operators' clients looping dry runs of a large candidate
// configuration against a hub while another cluster's changes are measured on their way to
// the sinks, against the same changes with no dry run, alternating in the same run.

// DryRunConfig sizes the dry-run row.
type DryRunConfig struct {
	// Clusters, Sinks: the measured path (HubLatency's): each change goes to every sink.
	Clusters, Sinks int
	// Changes measured per condition and round; Rounds alternate no dry runs and the loop.
	Changes, Rounds int
	// Clients loop POST /api/dryrun of Candidate, each as soon as the last answer came, or
	// after the Retry-After of a 429 (as hub whatif does).
	Clients   int
	Candidate []byte
	// Gap is the pause between two measured changes.
	Gap time.Duration
}

// DryRunResult is the row's two conditions and what the dry runs were answered.
type DryRunResult struct {
	Idle, Looping Latencies
	// Answers counts the loop's answers by HTTP status; Took is the mean time of the 200s.
	Answers map[int]int
	Errors  int // requests that got no answer (cut at a round's end)
	Took    time.Duration
	// Cores is the process's CPU per second of wall time in each condition.
	IdleCores, LoopCores float64
	LoopSeconds          float64
	// Settle is the longest the process went on using CPU (over 0.1 of a core) after the
	// clients had gone, before the next idle condition (a quarter second when it stops at
	// once).
	Settle time.Duration
}

// DryRunCandidate is a valid configuration of the hub's default shape (development mode,
// VirtualServices) with clusters clusters, each owning patterns namespace patterns (half
// exact, half prefixes) and as many host patterns (half exact, half "*."), none overlapping
// another cluster's: what the namespace overlap check compares pairwise.
func DryRunCandidate(clusters, patterns int) []byte {
	var b strings.Builder
	b.WriteString("insecure: true\ningest: 127.0.0.1:0\nserve: 127.0.0.1:0\nhttp: 127.0.0.1:0\ncollections: [istio/networking/v1alpha3/virtualservices]\nrouting: {default: {name: all}}\nclusters:\n")
	for i := range clusters {
		fmt.Fprintf(&b, "- name: c%04d\n  identities: [c%04d]\n  namespaces: [", i, i)
		for j := range patterns {
			if j > 0 {
				b.WriteString(", ")
			}
			if j%2 == 0 {
				fmt.Fprintf(&b, "c%04d-n%04d", i, j)
			} else {
				fmt.Fprintf(&b, "c%04d-p%04d-*", i, j)
			}
		}
		b.WriteString("]\n  hosts: [")
		for j := range patterns {
			if j > 0 {
				b.WriteString(", ")
			}
			if j%2 == 0 {
				fmt.Fprintf(&b, "h%04d.c%04d.example.com", j, i)
			} else {
				fmt.Fprintf(&b, "\"*.w%04d.c%04d.example.com\"", j, i)
			}
		}
		b.WriteString("]\n")
	}
	return []byte(b.String())
}

// DryRunLoop measures cfg: a development-mode hub (its http listener on loopback, where
// development mode takes operators' actions), cfg.Clusters clusters of ten resources, and
// cfg.Sinks ACKing sinks; per round, cfg.Changes changes with no dry run, then as many
// while cfg.Clients clients loop dry runs.
func DryRunLoop(cfg DryRunConfig) (DryRunResult, error) {
	res := DryRunResult{Answers: map[int]int{}}
	b, err := startHub(cfg.Clusters, func(c *hub.Config) { c.HTTP = "127.0.0.1:0" })
	if err != nil {
		return res, err
	}
	defer b.stop()
	var httpAddr string
	for i := 0; httpAddr == ""; i++ { // startHub waits for the gRPC listeners only
		if i > 1000 {
			return res, fmt.Errorf("the hub's http listener did not open")
		}
		time.Sleep(5 * time.Millisecond)
		_, _, httpAddr = b.h.Addrs()
	}
	caches := make([]*mcp.Cache, cfg.Clusters)
	for i := range cfg.Clusters {
		caches[i] = mcp.NewCache(hubCollection)
		name := clusterName(i)
		for j := range 10 {
			r := Resource(j, 0, 256)
			r.Metadata.Name = fmt.Sprintf("%s/r%02d", name, j)
			if _, err := caches[i].PutResources(hubCollection, r); err != nil {
				return res, err
			}
		}
		cl, err := b.connect(name, caches[i], mcp.Hooks{})
		if err != nil {
			return res, err
		}
		defer cl.stop()
	}
	if err := b.waitReady(); err != nil {
		return res, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan int, cfg.Sinks)
	wait, err := ackClientsFor(ctx, b.serve, hubCollection, cfg.Sinks, true, got)
	if err != nil {
		cancel()
		return res, err
	}
	defer func() { cancel(); wait() }()
	for range cfg.Sinks {
		<-got
	}
	seq := 0
	measure := func(lat *[]time.Duration) error {
		for range cfg.Changes {
			seq++
			c := seq % cfg.Clusters
			r := Resource(seq, seq+1, 256)
			r.Metadata.Name = fmt.Sprintf("%s/r%02d", clusterName(c), seq%10)
			e, err := mcp.NewEntry(r)
			if err != nil {
				return err
			}
			t0 := time.Now()
			caches[c].Put(hubCollection, e)
			for range cfg.Sinks {
				select {
				case <-got:
				case <-time.After(time.Minute):
					return fmt.Errorf("a change did not reach every sink in a minute")
				}
				*lat = append(*lat, time.Since(t0))
			}
			time.Sleep(cfg.Gap)
		}
		return nil
	}
	var idle, looping []time.Duration
	var idleCPU, loopCPU, idleWall, loopWall time.Duration
	var mu sync.Mutex
	var okTook time.Duration
	client := &http.Client{Timeout: 5 * time.Minute}
	url := "http://" + httpAddr + "/api/dryrun?node=bench"
	for range cfg.Rounds {
		c0, w0 := cpuTime(), time.Now()
		if err := measure(&idle); err != nil {
			return res, err
		}
		idleCPU, idleWall = idleCPU+cpuTime()-c0, idleWall+time.Since(w0)

		lctx, stop := context.WithCancel(ctx)
		var lwg sync.WaitGroup
		for range cfg.Clients {
			lwg.Add(1)
			go func() {
				defer lwg.Done()
				for lctx.Err() == nil {
					req, err := http.NewRequestWithContext(lctx, http.MethodPost, url, bytes.NewReader(cfg.Candidate))
					if err != nil {
						return
					}
					t0 := time.Now()
					resp, err := client.Do(req)
					if err != nil {
						mu.Lock()
						res.Errors++ // cancelled at the round's end (the hub may go on: that is the point)
						mu.Unlock()
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mu.Lock()
					res.Answers[resp.StatusCode]++
					if resp.StatusCode == http.StatusOK {
						okTook += time.Since(t0)
					}
					mu.Unlock()
					// As hub whatif does: wait as the hub says before asking again.
					if after, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && resp.StatusCode == http.StatusTooManyRequests {
						select {
						case <-time.After(time.Duration(after) * time.Second):
						case <-lctx.Done():
						}
					}
				}
			}()
		}
		c0, w0 = cpuTime(), time.Now()
		err := measure(&looping)
		loopCPU, loopWall = loopCPU+cpuTime()-c0, loopWall+time.Since(w0)
		stop()
		lwg.Wait()
		if err != nil {
			return res, err
		}
		// The clients have gone: the next idle condition starts once the process is idle
		// (what it went on doing for them is the Settle column).
		s0 := time.Now()
		for time.Since(s0) < 2*time.Minute {
			c0, w0 := cpuTime(), time.Now()
			time.Sleep(250 * time.Millisecond)
			if (cpuTime()-c0).Seconds()/time.Since(w0).Seconds() < 0.1 {
				break
			}
		}
		res.Settle = max(res.Settle, time.Since(s0))
	}
	res.Idle, res.Looping = distribution(idle), distribution(looping)
	res.IdleCores, res.LoopCores = idleCPU.Seconds()/idleWall.Seconds(), loopCPU.Seconds()/loopWall.Seconds()
	res.LoopSeconds = loopWall.Seconds()
	if n := res.Answers[http.StatusOK]; n > 0 {
		res.Took = okTook / time.Duration(n)
	}
	return res, nil
}
