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
// TestInvariantReplicas (replicas_test.go) plays the same events against three hub replicas
// (package hub/replicas) in process instead of one hub: each with its own state directory
// and disk, gossip on loopback with short probes, the sequence's clock. The hub's process
// and disk events name a replica, and replicas are also killed (-9: the state file keeps
// what it committed, the membership is left without a word), started again on their state
// directory, addresses and name, restarted cleanly, and wiped (started with an empty state
// directory). Minions dial their list of the replicas' ingest addresses in turn, as the
// minion does, and fail over when theirs goes; sinks are behind a Service over the ready
// replicas (two per replica, one incremental, one full-state) and move only when their
// stream ends. Reloads go to every replica, one after the other; an operator's release goes
// to the replica holding the cluster, to each (a departed cluster's removal is confirmed per
// replica), or to one. After each step it waits, bounded, until every minion is answered
// (the only running minion of an identity: until it writes), every restarted replica whose
// peers offer what it waits for is ready, and every ready
// replica (probed) serves what the model allows, with every sink holding what its replica
// serves; the model adds per-replica confirmations of removals, held deletions as the
// holder's (followers keep the objects), and peers' copies as what a replica may also
// serve. Flags -invariant.replicas.seqs and -invariant.replicas.len size it; the other
// flags are TestInvariant's. FuzzInvariantReplicas is its fuzz target. Its scripts start
// with `replicas N` and replay with the others.
//
// Sequences found and not yet fixed are kept under testdata/open, each saying what it
// shows; make test does not replay them (they fail), -invariant.script does. A failure's
// report has the last lines of the log; -invariant.log appends all of it to a file, each
// step marked.
//
// It has no product code.
package invariant
