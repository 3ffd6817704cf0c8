package durable

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/mcp"
)

// The crash test: a child process (this test binary, re-executed) makes a deterministic
// sequence of write calls as fast as it can and is SIGKILLed at a random moment; the file
// must then open and hold exactly the state after some prefix of the sequence. Each call's
// put resources carry the call's number as their version and each SetMeta its number as
// the epoch, so the file says roughly where it stopped; the checker replays the sequence on
// a model and finds the prefix that matches. The next child continues the sequence from
// there on the same file, so later rounds also cover a file that was killed before.

const (
	crashChildEnv = "MESHFED_DURABLE_CRASH_CHILD" // the file the child writes
	crashFromEnv  = "MESHFED_DURABLE_CRASH_FROM"  // the first call it makes
	crashNames    = 40
)

var (
	crashClusters = []string{"east", "west", "north"}
	crashColls    = []string{vs, dr}
	crashEpoch    = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
)

// crashCall is call n of the sequence.
type crashCall struct {
	kind          string // apply, meta, drop, remove, put
	cluster, coll string
	put           []string // names put (version n)
	removed       []string
	meta          Meta
}

func crashName(i int) string { return fmt.Sprintf("ns%d/r%d", i%3, i%crashNames) }

func callAt(n int) crashCall {
	c := crashCall{cluster: crashClusters[(n/4)%3], coll: crashColls[(n/12)%2]}
	switch n % 4 {
	case 0:
		c.kind, c.put, c.removed = "apply", []string{crashName(n), crashName(7*n + 3)}, []string{crashName(n + 20)}
	case 1:
		c.kind, c.meta = "meta", Meta{Epoch: uint64(n), Synced: n%8 == 1, LastContact: crashEpoch.Add(time.Duration(n) * time.Millisecond)}
	case 2:
		if n%100 == 2 {
			c.kind = "drop"
		} else {
			c.kind, c.removed = "remove", []string{crashName(3*n + 1)}
		}
	case 3:
		c.kind, c.put = "put", []string{crashName(5 * n)}
	}
	return c
}

// crashEntry is the resource call n puts as name: 200 bytes of body, version n.
func crashEntry(name string, n int) *mcp.Entry {
	e, err := mcp.NewEntry(&mcpapi.Resource{
		Metadata: &mcpapi.Metadata{Name: name, Version: strconv.Itoa(n)},
		Body:     &anypb.Any{TypeUrl: "type.googleapis.com/x", Value: bytes.Repeat([]byte{byte(n)}, 200)},
	})
	if err != nil {
		panic(err)
	}
	return e
}

func (c crashCall) do(s *Store, n int) {
	switch c.kind {
	case "apply":
		put := make([]*mcp.Entry, len(c.put))
		for i, name := range c.put {
			put[i] = crashEntry(name, n)
		}
		s.Apply(c.cluster, c.coll, put, c.removed)
	case "meta":
		s.SetMeta(c.cluster, c.meta)
	case "drop":
		s.DropCluster(c.cluster)
	case "remove":
		s.Remove(c.cluster, c.coll, c.removed[0])
	case "put":
		s.Put(c.cluster, c.coll, c.put[0], crashEntry(c.put[0], n).Encoded)
	}
}

// crashChild is the child: it writes from call crashFromEnv on, says "flushed" once its
// first 200 calls are on disk, and goes on until it is killed. A line with a colon is an
// error.
func crashChild(path string) {
	from, err := strconv.Atoi(os.Getenv(crashFromEnv))
	if err != nil {
		fmt.Println("bad", crashFromEnv, err)
		os.Exit(2)
	}
	s, st, err := OpenState(path, nil, nil)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(2)
	}
	if st.Reset != nil || len(st.Damaged) > 0 {
		fmt.Printf("open: the file after a kill: reset %v, damaged %v\n", st.Reset, st.Damaged)
		os.Exit(2)
	}
	for n := from; ; n++ {
		callAt(n).do(s, n)
		if n == from+200 {
			if err := s.Flush(context.Background()); err != nil {
				fmt.Println("flush:", err)
				os.Exit(2)
			}
			fmt.Println("flushed")
		}
	}
}

// crashModel is the state the sequence gives: cluster → collection → name → version, and
// cluster → metadata.
type crashModel struct {
	res  map[string]map[string]map[string]int
	meta map[string]Meta
}

func (m *crashModel) apply(n int) {
	c := callAt(n)
	colls := m.res[c.cluster]
	if colls == nil {
		colls = map[string]map[string]int{}
		m.res[c.cluster] = colls
	}
	held := colls[c.coll]
	if held == nil {
		held = map[string]int{}
		colls[c.coll] = held
	}
	switch c.kind {
	case "meta":
		m.meta[c.cluster] = c.meta
	case "drop":
		delete(m.res, c.cluster)
		delete(m.meta, c.cluster)
	default: // apply, remove, put: removals first, as Apply does
		for _, name := range c.removed {
			delete(held, name)
		}
		for _, name := range c.put {
			held[name] = n
		}
	}
}

// equal reports whether state is the model's, resources (by version and bytes) and metadata.
func (m *crashModel) equal(state map[string]*Cluster) bool {
	want := map[string]string{}
	for c, colls := range m.res {
		for coll, held := range colls {
			for name, n := range held {
				want[c+"|"+coll+"|"+name] = strconv.Itoa(n)
			}
		}
	}
	got, meta := flat(state)
	if !maps.Equal(got, want) {
		return false
	}
	for c, cl := range state {
		mm, ok := m.meta[c]
		if !ok && len(cl.Collections) == 0 {
			return false // a cluster with neither resources nor metadata is not in the file
		}
		if !mm.LastContact.Equal(meta[c].LastContact) || mm.Synced != meta[c].Synced || mm.Epoch != meta[c].Epoch {
			return false
		}
		for coll, held := range cl.Collections {
			for name, e := range held {
				if !bytes.Equal(e.Encoded, crashEntry(name, m.res[c][coll][name]).Encoded) {
					return false
				}
			}
		}
	}
	for c := range m.meta {
		if state[c] == nil {
			return false
		}
	}
	return true
}

// highest is the highest call number the state carries (-1: none).
func highest(state map[string]*Cluster) int {
	top := -1
	for _, cl := range state {
		top = max(top, int(cl.Epoch))
		for _, held := range cl.Collections {
			for _, e := range held {
				n, _ := strconv.Atoi(e.Version)
				top = max(top, n)
			}
		}
	}
	return top
}

func TestCrashLeavesAPrefix(t *testing.T) {
	if testing.Short() {
		t.Skip("runs child processes")
	}
	path := statePath(t)
	model := &crashModel{res: map[string]map[string]map[string]int{}, meta: map[string]Meta{}}
	at := -1 // the model is the state after calls 0..at
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for round := range 4 {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+path, crashFromEnv+"="+strconv.Itoa(at+1))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = testlog.Writer(t, fmt.Sprintf("writer %d: ", round))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		killed := false
		kill := func() {
			if !killed {
				killed = true
				_ = cmd.Process.Kill() // SIGKILL where there are signals
				_ = cmd.Wait()
			}
		}
		t.Cleanup(kill)
		said := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if line := sc.Text(); line == "flushed" || strings.Contains(line, ":") {
					said <- line
					break
				}
			}
			_, _ = io.Copy(io.Discard, out)
		}()
		select {
		case line := <-said:
			if line != "flushed" {
				t.Fatalf("the writer: %s", line)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("the writer did not flush within a minute")
		}
		time.Sleep(time.Duration(r.IntN(200)) * time.Millisecond)
		kill()

		// What the next start is told: the last run was killed (the run marker says
		// "open"), its writes were not failing, and nothing in the file is damaged.
		s, st := openStateT(t, path, testConfig())
		if !st.Unclean || st.Failing || st.Reset != nil || len(st.Damaged) != 0 || st.Migrated {
			t.Fatalf("round %d: OpenState after the kill: unclean %v (want true), failing %v, reset %v, damaged %v, migrated %v",
				round, st.Unclean, st.Failing, st.Reset, st.Damaged, st.Migrated)
		}
		state := st.Clusters
		if _, err := s.Load(); err != nil { // the strict load agrees
			t.Fatalf("round %d: Load: %v", round, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		// The state is that after some call k, at+200 <= k (the child flushed its first 200
		// calls); k is at least the highest call the file carries, and a few calls that
		// leave no trace (a removal, a drop) may follow it: the highest call carried may be
		// below at+200 when the last flushed ones left none.
		flushed := at + 200
		top := highest(state)
		for at < top {
			at++
			model.apply(at)
		}
		found := false
		for range 16 {
			if model.equal(state) {
				found = true
				break
			}
			at++
			model.apply(at)
		}
		if !found {
			res, meta := flat(state)
			t.Fatalf("round %d: the file after the kill is no prefix of the calls (highest call %d):\nresources %v\nmetadata %v", round, top, res, meta)
		}
		for at < flushed { // the calls up to the flush must be in it: any left must leave no trace
			at++
			model.apply(at)
			if !model.equal(state) {
				t.Fatalf("round %d: the file holds the state after call %d; the child had flushed up to %d", round, at-1, flushed)
			}
		}
		t.Logf("round %d: killed after call %d or so; the file holds the state after call %d", round, top, at)
	}
}
