package load

import (
	"encoding/json"
	"io"
	"sync"
	"time"
)

// Command is one line the controller writes to the load process's stdin.
//
// Sinks mode: "connect" opens the sinks and times them until each holds Expect resources;
// "arm" makes resource Name at Version the change ID (answered "armed": nothing is timed
// yet); "start" starts change ID's clock: the controller makes the change right after.
// Bare mode: "stage" gives the next full-state and incremental messages (encoded
// Resources without a nonce; answered "staged"), "publish" serves them as the next version.
type Command struct {
	Op      string `json:"op"`
	ID      int    `json:"id,omitempty"`
	Expect  int    `json:"expect,omitempty"`
	Name    string `json:"name,omitempty"`
	Version string `json:"version,omitempty"`
	Full    []byte `json:"full,omitempty"`
	Delta   []byte `json:"delta,omitempty"`
}

// Event is one line the load process writes to stdout.
type Event struct {
	// Event is "ready" (sinks mode started; NoFile is its descriptor limit), "listening"
	// (bare mode; Addr), "connected", "armed", "started" (the change's start time is
	// taken: make the change now), "change", "staged", "published" or "error".
	Event string `json:"event"`
	ID    int    `json:"id,omitempty"`
	Addr  string `json:"addr,omitempty"`
	// Sinks is how many sinks had the change (or the full initial state).
	Sinks int `json:"sinks,omitempty"`
	// Last and P50 are over the sinks, from the start (connect or "start") to the message
	// that brought it, received whole.
	Last time.Duration `json:"last,omitempty"`
	P50  time.Duration `json:"p50,omitempty"`
	// Bytes is the mean size of that message.
	Bytes   int    `json:"bytes,omitempty"`
	NoFile  uint64 `json:"nofile,omitempty"`
	Message string `json:"message,omitempty"`
}

// emitter writes events as JSON lines, one at a time.
type emitter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func newEmitter(w io.Writer) *emitter { return &emitter{enc: json.NewEncoder(w)} }

func (e *emitter) emit(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_ = e.enc.Encode(ev)
}
