package bench

import (
	"encoding/json"
	"time"

	"github.com/meshfed/meshfed/internal/testkit/bench/load"
	"github.com/meshfed/meshfed/internal/testkit/testproc"
)

// procTB is what the versus scenarios need of a test (the runner outside `go test`):
// testproc's and testbin's.
type procTB interface {
	testproc.TB
	Fatal(args ...any)
}

// jproc is a child process that answers JSON lines on its output: the load process, the
// bare source, Istio's peer. Events whose "event" field is set are queued for next; other
// lines go to onLine (nil: none), on the output's reader.
type jproc struct {
	t      procTB
	p      *testproc.Proc
	events chan load.Event
}

func startJSON(t procTB, path string, args []string, env []string, onLine func(string)) *jproc {
	t.Helper()
	j := &jproc{t: t, events: make(chan load.Event, 1024)}
	j.p = testproc.Start(t, testproc.Options{Path: path, Args: args, Env: env, Stdin: true, OnLine: func(line string) {
		var ev load.Event
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Event != "" {
			select {
			case j.events <- ev:
			default: // never block the reader: nobody is waiting for that many
			}
			return
		}
		if onLine != nil {
			onLine(line)
		}
	}})
	return j
}

// send writes v as one JSON line to the process's input.
func (j *jproc) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		j.t.Fatal(err)
	}
	j.write(append(b, '\n'))
}

// write writes line (with its newline) to the process's input.
func (j *jproc) write(line []byte) {
	if _, err := j.p.Stdin().Write(line); err != nil {
		j.t.Fatalf("write to the process: %v\n%s", err, j.p.Tail(20))
	}
}

// next waits up to limit for the next event named want; an "error" event or another
// process's exit fails t.
func (j *jproc) next(want string, limit time.Duration) load.Event {
	j.t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case ev := <-j.events:
			switch ev.Event {
			case want:
				return ev
			case "error":
				j.t.Fatalf("%s: %s\n%s", want, ev.Message, j.p.Tail(20))
			}
		case <-j.p.Done():
			j.t.Fatalf("waiting for %q: %s", want, j.p.Tail(20))
		case <-deadline:
			j.t.Fatalf("no %q within %v: %s", want, limit, j.p.Tail(20))
		}
	}
}

// stop ends the process: its input closed, then killed (by its PID, through testproc).
func (j *jproc) stop() { j.p.Stdin().Close(); j.p.Kill() }
