// Package invariant holds the model-based test of the hub's safety invariant:
//
//	An object that a cluster's current writer publishes is never withdrawn from any sink.
//	An object is withdrawn only when its cluster's writer deletes it and the breaker does
//	not hold that, an operator decides it (a release, a confirmed removal), or its staleness
//	TTL, set by the operator, expires. What the hub does not know (a state file it cannot
//	read, a cluster it does not recognise) is unknown and kept, never empty.
//
// A generator makes random sequences of the events a hub meets in production: minions
// publishing, deleting, their sources emptied and restored, stopped and started, their
// streams cut; the hub killed (-9: its state file keeps what it had committed) and
// restarted, its state file damaged, its disk full or read-only; reloads that remove,
// rename and re-own clusters; operators releasing breakers; time passing. Each sequence
// runs against the real hub, in process, over real gRPC on loopback, with its real state
// file, minions that publish through the engine's Source as the minion does, and real MCP
// sinks (incremental and full-state). A small reference model says what each sink may hold
// after every step; the sinks are checked against it, and every deletion and every change
// of version a sink receives is checked against what the model protected before and after
// the step.
//
// TestInvariant runs a bounded number of sequences (flags -invariant.seqs, -invariant.seed);
// FuzzInvariant drives the generator from the fuzzer's bytes for longer runs. A failing
// sequence is printed as a script, one event per line; kept under testdata/regressions, it
// is replayed by TestInvariantRegressions.
//
// It has no product code.
package invariant
