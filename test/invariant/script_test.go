package invariant

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// An event is one step of a sequence; its text form is one line of a script:
//
//	put MINION COLL NAME     the minion's source gets a new version of NAME (COLL: vs, dr)
//	del MINION COLL NAME     the minion's source deletes NAME
//	empty MINION             the minion's source reads empty (a directory moved away)
//	restore MINION           what it held before `empty` is back (added to what it holds now)
//	stop MINION              the minion's process stops
//	start MINION             the minion's process starts (a new process: its source as it is now)
//	cut MINION               the minion's stream to the hub is cut; it redials
//	second MINION SEED       a second minion with MINION's certificate starts (SEED picks what it
//	                         publishes: a copied Secret in another deployment), or stops
//	crash                    the hub is killed (-9) and started again on its state directory
//	restart                  the hub stops cleanly and starts again
//	damage KIND SEED         with the hub stopped: its state file is damaged, then it starts
//	disk full|ok             the state file's disk starts or stops failing every write
//	readonly on|off          the state file's file system is read-only (from the next start)
//	reload base              the configuration the sequence started with
//	reload remove CLUSTER    a configuration without CLUSTER
//	reload rename CLUSTER TO CLUSTER's entry renamed TO (identities and ownership kept)
//	reload reown CLUSTER NS  CLUSTER owns NS instead of what it owned
//	release CLUSTER          an operator releases CLUSTER's breaker, applying the diff it saw
//	advance DURATION         the hub's clock moves on, and its periodic work runs
//
// A script that starts with `replicas N` plays in the replica world (replicas_test.go): N
// hub replicas named a, b, c, ... instead of the hub. The minions' events, reload and
// advance (every replica's clock and periodic work) are as above; the hub's process and
// disk events name a replica R:
//
//	replicas N               (first line only) the world has N hub replicas
//	kill R                   R is killed (-9: its state file keeps what it had committed, it
//	                         leaves the membership without a word); it stays down until boot
//	boot R                   R starts on its state directory, its addresses and gossip name
//	restart R                R stops cleanly (it leaves the membership) and starts again
//	wipe R                   R is killed if up and starts with an empty state directory (a pod
//	                         rescheduled with a new volume)
//	damage R KIND SEED       R is killed if up, its state file damaged, and it starts
//	disk R full|ok           R's state file's disk starts or stops failing every write
//	readonly R on|off        R's state file's file system is read-only (from its next start)
//	release R CLUSTER        an operator releases CLUSTER's breaker at R, applying the diff it
//	                         saw there; R `holder`: at the replica holding CLUSTER (hub status
//	                         HELD BY; none: the first up), `each`: at every replica up in turn
type event struct {
	op   string
	args []string
}

func (e event) String() string { return strings.Join(append([]string{e.op}, e.args...), " ") }

// arity is how many arguments each operation takes.
var arity = map[string]int{
	"put": 3, "del": 3, "empty": 1, "restore": 1, "stop": 1, "start": 1, "cut": 1,
	"crash": 0, "restart": 0, "damage": 2, "disk": 1, "readonly": 1, "release": 1, "advance": 1, "second": 2,
}

// replicaArity is how many arguments the replica world's forms take (see event).
var replicaArity = map[string]int{"replicas": 1, "kill": 1, "boot": 1, "restart": 1, "wipe": 1, "damage": 3, "disk": 2, "readonly": 2, "release": 2}

func replicaForm(e event) bool {
	n, ok := replicaArity[e.op]
	return ok && n == len(e.args)
}

// parseScript reads a script: one event per line; blank lines and lines starting with #
// are skipped.
func parseScript(text string) ([]event, error) {
	var out []event
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		e := event{op: f[0], args: f[1:]}
		if e.op == "reload" {
			want := map[string]int{"base": 1, "remove": 2, "rename": 3, "reown": 3}
			if len(e.args) == 0 || want[e.args[0]] != len(e.args) {
				return nil, fmt.Errorf("line %d: %q: want reload base|remove C|rename C TO|reown C NS", i+1, line)
			}
		} else if n, ok := arity[e.op]; (!ok || n != len(e.args)) && !replicaForm(e) {
			return nil, fmt.Errorf("line %d: %q: unknown event or wrong number of arguments", i+1, line)
		}
		if e.op == "advance" {
			if _, err := time.ParseDuration(e.args[0]); err != nil {
				return nil, fmt.Errorf("line %d: %v", i+1, err)
			}
		}
		out = append(out, e)
	}
	return out, nil
}

func formatScript(events []event) string {
	var b strings.Builder
	for _, e := range events {
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// The world a sequence plays in: two minions, each publishing objects of its own namespace
// in two collections.
var (
	minionNames = []string{"east", "west"}
	homeNS      = map[string]string{"east": "shop", "west": "pay"}
	collNames   = []string{"vs", "dr"}
	objectNames = 6 // per namespace and collection
	damageKinds = []string{"bitflip", "record", "truncate", "zero", "garbage"}
	advances    = []string{"1s", "3s", "11s"}
)

// generator makes a random sequence, weighted towards the events that interact: sources
// emptied and restored around stops and starts, releases, crashes with a minion away.
type generator struct {
	r *rand.Rand
	// what the generator believes, to keep sequences meaningful (starting what is stopped)
	running  map[string]bool
	emptied  map[string]bool
	clusters []string // configured cluster names
	disk     bool     // failing
	readonly bool
}

func newGenerator(r *rand.Rand) *generator {
	return &generator{r: r, running: map[string]bool{}, emptied: map[string]bool{}, clusters: slices.Clone(minionNames)}
}

// prelude starts both minions with some objects: a sequence starts from a populated hub.
func (g *generator) prelude() []event {
	var out []event
	for _, m := range minionNames {
		for _, c := range collNames {
			for i := range objectNames {
				if g.r.IntN(4) > 0 {
					out = append(out, event{"put", []string{m, c, fmt.Sprintf("%s/o%d", homeNS[m], i)}})
				}
			}
		}
		out = append(out, event{"start", []string{m}})
		g.running[m] = true
	}
	return out
}

func (g *generator) pick(s []string) string { return s[g.r.IntN(len(s))] }

func (g *generator) next() event {
	m := g.pick(minionNames)
	name := func() string {
		ns := homeNS[m]
		if g.r.IntN(12) == 0 { // now and then an object the minion does not own
			ns = homeNS[g.pick(minionNames)]
		}
		return fmt.Sprintf("%s/o%d", ns, g.r.IntN(objectNames))
	}
	switch n := g.r.IntN(100); {
	case n < 22:
		return event{"put", []string{m, g.pick(collNames), name()}}
	case n < 32:
		return event{"del", []string{m, g.pick(collNames), name()}}
	case n < 38:
		g.emptied[m] = true
		return event{"empty", []string{m}}
	case n < 44:
		g.emptied[m] = false
		return event{"restore", []string{m}}
	case n < 52:
		if g.running[m] {
			g.running[m] = false
			return event{"stop", []string{m}}
		}
		g.running[m] = true
		return event{"start", []string{m}}
	case n < 55:
		if g.r.IntN(2) == 0 {
			return event{"second", []string{m, strconv.Itoa(g.r.IntN(1 << objectNames))}}
		}
		return event{"cut", []string{m}}
	case n < 61:
		return event{"crash", nil}
	case n < 63:
		return event{"restart", nil}
	case n < 67:
		return event{"damage", []string{g.pick(damageKinds), strconv.Itoa(g.r.IntN(1 << 20))}}
	case n < 70:
		g.disk = !g.disk
		if g.disk {
			return event{"disk", []string{"full"}}
		}
		return event{"disk", []string{"ok"}}
	case n < 72:
		g.readonly = !g.readonly
		if g.readonly {
			return event{"readonly", []string{"on"}}
		}
		return event{"readonly", []string{"off"}}
	case n < 80:
		return g.reload()
	case n < 88:
		return event{"release", []string{g.pick(append(slices.Clone(minionNames), "wset", "east2"))}}
	default:
		return event{"advance", []string{g.pick(advances)}}
	}
}

func (g *generator) reload() event {
	c := g.pick(minionNames)
	switch g.r.IntN(4) {
	case 0:
		return event{"reload", []string{"base"}}
	case 1:
		return event{"reload", []string{"remove", c}}
	case 2:
		to := map[string]string{"east": "east2", "west": "wset"}[c]
		return event{"reload", []string{"rename", c, to}}
	default:
		return event{"reload", []string{"reown", c, homeNS[c] + "x"}}
	}
}

// sequence returns a random sequence of n events after the prelude, none of whose
// operations is in without.
func sequence(r *rand.Rand, n int, without []string) []event {
	g := newGenerator(r)
	out := g.prelude()
	for added := 0; added < n; {
		if e := g.next(); !slices.Contains(without, e.op) {
			out = append(out, e)
			added++
		}
	}
	return out
}
