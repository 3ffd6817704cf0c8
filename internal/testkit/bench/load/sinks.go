package load

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// Options say what the sinks subscribe to.
type Options struct {
	// Addr is the ResourceSource's address.
	Addr string
	// Collection is the one collection each sink requests.
	Collection string
	// Sinks is how many: each has a connection of its own.
	Sinks int
	// Incremental sinks ask for incremental responses.
	Incremental bool
}

// sinks is the load: its sinks and what is being timed.
type sinks struct {
	opts  Options
	out   *emitter
	watch atomic.Pointer[Watch]

	mu    sync.Mutex // guards round and errors
	round *round
	errs  int
}

// round is one timed event: the sinks' connect (expect > 0) or one armed change (w).
type round struct {
	id     int
	expect int
	w      *Watch
	t0     time.Duration   // 0: not started yet
	at     []time.Duration // per sink, when it had it (since base); 0: not yet
	bytes  int
	left   int
}

// RunSinks runs the sinks mode: commands from in, events to out, until in ends (then the
// sinks close and it returns).
func RunSinks(opts Options, in io.Reader, out io.Writer) error {
	l := &sinks{opts: opts, out: newEmitter(out)}
	nofile, err := RaiseNoFile()
	if err != nil {
		return err
	}
	l.out.emit(Event{Event: "ready", NoFile: nofile})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var c Command
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			l.out.emit(Event{Event: "error", Message: fmt.Sprintf("bad command: %v", err)})
			continue
		}
		switch c.Op {
		case "connect":
			l.begin(&round{expect: max(c.Expect, 1)})
			for i := range opts.Sinks {
				wg.Add(1)
				go func() { defer wg.Done(); l.sink(ctx, i) }()
			}
		case "arm":
			w := &Watch{Name: c.Name, Version: c.Version}
			l.watch.Store(w)
			l.mu.Lock()
			l.round = &round{id: c.ID, w: w, at: make([]time.Duration, opts.Sinks), left: opts.Sinks}
			l.mu.Unlock()
			l.out.emit(Event{Event: "armed", ID: c.ID})
		case "start":
			t0 := now()
			l.mu.Lock()
			if r := l.round; r != nil && r.id == c.ID {
				r.t0 = t0
				l.finish(r) // every sink had it already: event reports that as an error
			}
			l.mu.Unlock()
			// The controller makes the change once it reads this: every arrival is after t0.
			l.out.emit(Event{Event: "started", ID: c.ID})
		default:
			l.out.emit(Event{Event: "error", Message: fmt.Sprintf("unknown op %q", c.Op)})
		}
	}
	return sc.Err()
}

// begin starts timing a connect round.
func (l *sinks) begin(r *round) {
	r.at, r.left, r.t0 = make([]time.Duration, l.opts.Sinks), l.opts.Sinks, now()
	l.mu.Lock()
	l.round = r
	l.mu.Unlock()
}

// sink runs sink i until ctx ends: one connection, one stream, an ACK for every response.
func (l *sinks) sink(ctx context.Context, i int) {
	cc, err := grpc.NewClient(l.opts.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(RawCodec{}), grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		l.fail(i, err)
		return
	}
	defer cc.Close()
	st, err := cc.NewStream(ctx, &mcppb.ResourceSource_ServiceDesc.Streams[0], mcppb.ResourceSource_EstablishResourceStream_FullMethodName)
	if err != nil {
		l.fail(i, err)
		return
	}
	req := &mcppb.RequestResources{SinkNode: &mcppb.SinkNode{Id: fmt.Sprintf("load-%05d", i)}, Collection: l.opts.Collection, Incremental: l.opts.Incremental}
	if err := st.SendMsg(req); err != nil {
		l.fail(i, err)
		return
	}
	held := 0
	for {
		f := Frame{watch: &l.watch}
		if err := st.RecvMsg(&f); err != nil {
			if ctx.Err() == nil {
				l.fail(i, err)
			}
			return
		}
		req.ResponseNonce = f.Nonce
		if err := st.SendMsg(req); err != nil {
			l.fail(i, err)
			return
		}
		if f.Incremental {
			held += f.Added - f.Removed
		} else {
			held = f.Added
		}
		l.note(i, &f, held)
	}
}

// note records sink i's arrival in the round if f completes it for that sink.
func (l *sinks) note(i int, f *Frame, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.round
	if r == nil || r.at[i] != 0 {
		return
	}
	switch {
	case r.w == nil && held >= r.expect:
	case r.w != nil && f.Matched == r.w:
	default:
		return
	}
	r.at[i] = f.At
	r.bytes += f.Bytes
	r.left--
	l.finish(r)
}

// finish reports r once every sink had it and it has started (l.mu held).
func (l *sinks) finish(r *round) {
	if r.left > 0 || r.t0 == 0 {
		return
	}
	l.round = nil
	l.out.emit(r.event())
}

func (r *round) event() Event {
	at := make([]time.Duration, len(r.at))
	early := 0
	for i, a := range r.at {
		if a < r.t0 {
			early++ // the change was made before "started": the controller's mistake
		}
		at[i] = a - r.t0
	}
	if early > 0 {
		return Event{Event: "error", ID: r.id, Message: fmt.Sprintf("%d of %d sinks had change %d before its start", early, len(at), r.id)}
	}
	slices.Sort(at)
	n := len(at)
	ev := Event{Event: "change", ID: r.id, Sinks: n, Last: at[n-1], P50: at[n/2], Bytes: r.bytes / n}
	if r.w == nil {
		ev.Event = "connected"
	}
	return ev
}

// fail reports a sink's failure: the first few in full, then every 100th, counted.
func (l *sinks) fail(i int, err error) {
	l.mu.Lock()
	l.errs++
	n := l.errs
	l.mu.Unlock()
	if n <= 5 || n%100 == 0 {
		l.out.emit(Event{Event: "error", Message: fmt.Sprintf("sink %d (%d failed so far): %v", i, n, err)})
	}
}
