// Package durable keeps, in one file, the state the hub last accepted from each cluster, so
// that a hub restarted while a minion is down serves that cluster's last state instead of
// serving without it once the warm-up ends (which makes istiod delete the cluster's objects).
// It knows nothing of sessions or of serving: the hub decides what to write and what to do
// with what it loads.
//
// # Use
//
// At start, OpenState(<stateDir>/clusters.db) opens the file and returns what it holds and
// what is known to be wrong with it (State: see "A file that cannot be trusted whole");
// while running, the hub reports each change of a cluster's state (Apply, with exactly what
// Layer.StateChanged reports; or Put and Remove), the cluster's metadata (SetMeta: last
// contact, synced, epoch) and a cluster leaving the configuration (DropCluster), and, for a
// cluster State named damaged, that its own session has replaced its state (Repaired); at
// stop, Close. Stats feeds status and metrics (Failures: a counter of failed commits;
// Failing and ReadOnly: gauges).
//
// OpenOrReset is the previous entry point, kept as it was: any damage it finds, in any
// record, is a *CorruptError, and the whole file is moved aside.
//
// # The file
//
// A bbolt file: a bucket per cluster holding a bucket per collection holding each resource,
// keyed by its name, as the bytes of the istio.mcp.v1alpha1.Resource as the cluster sent it
// (mcp.Entry.Encoded: nothing is re-encoded on the way in or out); a bucket of each
// cluster's Meta as small versioned JSON; and a format bucket holding the format marker
// (FormatVersion) and the file's integrity records: per cluster and collection (and per
// cluster's metadata) a digest, the commit they are the digests of, the clusters marked
// damaged, and the quarantine (integrity.go has the layout). Nothing else may be at the top
// level: a file of another format version, or another program's bbolt file, is refused
// rather than misread, so a future change of layout refuses or migrates explicitly. The
// integrity records are inside the format bucket, not beside it, because the release before
// them reads only the marker there: a rollback still opens the file (a rollback that moved a
// good file aside would be the fleet-wide deletion this package exists to prevent). The
// format version is unchanged (1): what was added is optional to a reader, and its absence
// is handled (a migration), not refused.
//
// The file is created whole: a temporary file beside it gets bbolt's pages and the layout in
// one fsynced commit and is then linked into place (a link, which never replaces a file
// another process made meanwhile), so a zero-length or half-initialized file is never one
// this package made, and is reported rather than silently taken as new. It is created 0600,
// its directory 0700.
//
// # Writing
//
// The hub writes on its push path, under its store's lock, in order, so the write methods
// never touch the disk: each updates an in-memory batch under a mutex, in O(its arguments)
// (DropCluster: O(what is pending for the cluster)) with no allocation in the steady state,
// and wakes the writer goroutine. The batch keeps the latest write of each key
// (cluster/collection/name, a cluster's metadata, a cluster's drop): a later write of a key
// replaces the earlier one (coalescing). The writer takes the whole batch in O(1) — cutting
// the sequence of calls at that point — commits it in one bbolt transaction (bbolt's two
// fsyncs), and then takes what arrived meanwhile, starting at most one commit every
// CommitInterval (100 ms): a change after a quiet spell is committed at once, and under a
// steady stream each commit carries what arrived in that time. Each commit costs the kernel
// page writes and two fsyncs on the machine's cores: with a commit per change the hub's
// bench measured its CPU per change at 1.6–2.0× and minion → hub → sink p99 at up to 1.8×
// the same hub without the file; at 100 ms both are within this machine's noise
// (0.8–1.3× and 1.04–1.24×). A transaction puts each collection's names in key order:
// bbolt keeps a node's keys in a slice until the commit splits it, so names in map order
// would shift half of it per insert, quadratic in a large first push (100,000 new names:
// 13 s of loading in map order, 1 s sorted; BenchmarkCommitByStored, which also shows a
// one-name commit costing the same from 1,000 to 1,000,000 names stored). Each put or
// delete also reads the key's old value, in the same transaction, to move its collection's
// digest by the old and new value's hash; the digest is written once per collection per
// commit, with the commit's transaction id.
//
// Guarantees:
//
//   - Prefix. The file always holds the state after some prefix of the sequence of write
//     calls, the same prefix for every cluster: never a state the calls did not produce.
//     Coalescing does not weaken this: it merges only writes that are not on disk yet and
//     that reach it in the same transaction, so it skips intermediate states but cannot make
//     one up. Each call is one unit — Apply's removals and puts are all in the file or none
//     is, as the hub's store applied them in one step — so, for example, metadata saying a
//     cluster was synced is only on disk with the resources enqueued before it.
//   - Crash safety. A crash (or SIGKILL) at any moment leaves the file at the last committed
//     batch: bbolt's copy-on-write pages and its meta page, written and fsynced after them,
//     switch the file from one state to the next atomically. What was enqueued after that
//     batch is lost; the writer commits continuously, so that is at most CommitInterval
//     plus a commit under load (a quiet commit takes about a millisecond here). A minion
//     that reconnects resends what the hub then lacks, and the hub flushes the file when a
//     cluster's minion goes away (Flush does not wait for the interval).
//   - Durability on request. Flush returns once everything enqueued before it is on disk.
//   - The caller never waits for the disk, and never sees a write error.
//   - Bounded memory. The batch holds at most one entry per key (its bytes are the caller's,
//     not copied: the queue costs map entries, not resources). While the disk fails, each
//     failed attempt also drops deletions of names the file does not hold, so what is queued
//     stays within the names held (in the hub or in the file) plus one retry interval's
//     churn, however long the failure lasts.
//   - A failing disk (full, I/O errors, a handle gone bad, a read-only file system) is
//     reported — Stats (Failing, LastError, Failures counting every failed attempt,
//     ReadOnly), a log line at the first failure and at each new kind of error in a failure
//     episode, a reminder every ten minutes while it lasts, one line when writes recover,
//     and the run marker (below) — and the batch is retried with backoff (100 ms to 5 s), merged
//     under what was enqueued since (newer writes win), the file closed and reopened first:
//     a failed commit can leave the file ahead of what bbolt believes (etcd-io/bbolt#233),
//     and since every write sets a key's final state, retrying on either state gives the
//     same file. A reopen must find the same file (not a new or emptied one): writing the
//     latest changes alone into another file would make it claim a state it does not hold.
//   - Writes bbolt cannot store (an empty key, a key over 32 KiB, an empty value; metadata
//     whose time cannot be encoded) are refused on entry, counted and logged once per kind:
//     in a batch they would fail it on every retry and take every other write with them.
//
// What it does not guarantee: power-loss safety rests on bbolt's fsync ordering and on the
// disk honoring fsync (the tests kill the process; they do not cut power). Close writes what
// is queued with one attempt; if it fails, its error says how many writes did not reach the
// file.
//
// # A file that cannot be trusted whole
//
// The product's invariant is that an object a cluster's current writer publishes is never
// withdrawn from a sink, and what the hub does not know is unknown, never empty. A state
// file is what the hub knows of a cluster whose minion is away, so OpenState says, per
// cluster, what it could read and whether that is the whole of what was written, and leaves
// what to serve to the hub. Before, one flipped bit anywhere in a record moved the whole
// file aside, and the hub then served every away cluster as empty: 300 runs of one random
// bit flipped in a file of 3 clusters × 50 resources (TestRandomBitFlips, and the same
// procedure on the release before, three runs) lost the whole file 6–7 times, and — worse —
// returned a cluster whose bytes differed from what was written, with nothing said, 85–92
// times (a flip in a body still decodes); with OpenState, 0 and 0 (in one file layout of
// several, one flip in the clusters bucket's own page header was a Reset).
//
// What OpenState does with each kind of damage:
//
//   - A record that is not whole — it does not decode as the hub decodes one at ingest
//     (the Resource's wire format and UTF-8, its metadata, its name equal to its key), a
//     bucket where a record belongs or a value where a bucket belongs, keys out of order
//     or stored twice (a damaged key), metadata that does not decode, a subtree bbolt
//     panics or faults on — is left out of State.Clusters, and its cluster is named in
//     State.Damaged with what is wrong (collection, record, check). The rest of the file
//     is read.
//   - Silent damage: bbolt checksums only its meta pages, so a flipped bit in a data page
//     can leave a record that still decodes, with a changed body. Each cluster's
//     collections, and its metadata, have a digest — how many records, and the sum mod
//     2^64 of a 64-bit hash of each one's name and value (CRC-32C and CRC-32 side by side,
//     both in hardware: a CRC detects every error of a few bits, which is what this is
//     for; it is no defence against a forged file). Commits keep it in the same
//     transaction as the records (the sum is order-independent: each write moves it by
//     the old and new value); OpenState recomputes it, and a mismatch names the cluster
//     and collection in Damaged. Records under a cluster name the file has neither
//     metadata nor digests for are not the writer's (a damaged cluster key): they are left
//     out, and the real cluster's digests no longer match.
//   - The digests are valid only if the file's last commit kept them: each commit writes
//     its bbolt transaction id beside them. A file last written by something else (the
//     release before digests, or after a rollback; bbolt's tools) has none or stale ones:
//     State.Migrated, logged, nothing checked on that open, and the first commit (at once,
//     for OpenState) recomputes them. A flipped bit in that one marker has the same effect
//     for one open.
//   - A loop of pages: bbolt follows every page id it reads, and a flipped bit in a branch
//     element can make a tree point back into itself; bbolt then loops forever, which no
//     guard can catch. At the first open every bucket's tree is walked with plain reads
//     (boltfile.WalkTree: each page in the file, a branch or leaf naming its own id, its elements in
//     it, linked once) and bbolt is never let into a damaged one: that cluster or
//     collection is unreadable, the rest is read.
//   - The repair: when the file is writable, the first commit (at once, before any write)
//     moves each damaged cluster's bucket as it is into the quarantine — bbolt's
//     MoveBucket relinks it without reading it — and writes back what could be read; a
//     damaged meta bucket, digests or marks likewise as a whole; then it recomputes the
//     digests and marks each damaged cluster in the file. The mark is why a second start
//     is told again (the quarantined record is no longer there to be found): State.Damaged
//     names the cluster ("marked: since ...") on every open until the hub calls
//     Repaired(cluster) — its own session has replaced its state — or drops it. The hub can
//     mark clusters itself (MarkDamaged) for what it knows and the file cannot: after a
//     Reset or a Failing state, the clusters whose kept state is missing or may be old, so
//     that a hub restarted again before they resync is told too. The quarantine keeps the
//     newest 16 entries (16 repairs' evidence, for bbolt's own tools) and deletes older
//     ones — never one holding a damaged tree, whose deletion would walk it. A repair that
//     fails by itself is dropped (logged; the next start finds the same damage) rather than
//     failing every commit; if damaged trees are still linked then, nothing more is
//     written.
//   - A freelist that names a page a tree links (the freelist is not checksummed either):
//     bbolt would hand the page out and overwrite it. The file is readable but must not be
//     written as it is, so it is opened read-only, read, and rebuilt: a new file with
//     everything read (and its marks) is written beside it, the old one moved aside, the
//     new one linked into place. Nothing read is lost: not a Reset.
//   - A damaged meta page: bbolt keeps two, checksummed, and when one is invalid reads the
//     other without a word. If the invalid one was the newer, the file is at the commit
//     before its last — a valid state, older than what was served, and what that commit
//     wrote (one batch, of any size) is missing. The invalid page's own transaction id
//     tells which it was when it is readable; unless it names the older one,
//     State.LastCommitLost says so, with Failing and Unclean (the same consequence for the
//     hub). In 30 file layouts × 300 random flips this was the only way a cluster came
//     back different from what was written without its name in Damaged.
//   - What makes the file unreadable as a whole is a Reset, as before: not a bbolt file,
//     both meta pages bad, truncated (shorter than its metadata says), zero length, no
//     layout (half-initialized), another format version or another program's file, a
//     damaged root, format or clusters tree, a panic or fault in the top-level buckets'
//     own pages. The file is moved aside to <path>.corrupt-<UTC time> (the evidence), an
//     empty one is created, and State.Reset says why and where: every cluster's state is
//     unknown to the hub. A missing file whose run marker says it was in use is a Reset
//     too (deleted under the hub: nothing to move).
//
// Every bbolt call on a file read from disk runs under the guard that turns a panic or a
// memory fault into a *CorruptError (a bad file must not take the hub down, on every
// restart); the file's meta and freelist pages, and its trees, are checked with plain reads
// before bbolt maps or walks them (a panic inside bbolt's Open would leave the file mapped,
// and locked). Those checks are bbolt's format's, not the hub's: they are package
// internal/boltfile's, which the minion's relay opens its file with too. A damaged element can claim a key or value of gigabytes: such an entry is a
// finding, never copied or printed. FuzzOpenState and TestMutatedFiles hold the loader to
// this on arbitrary bytes and on mutations of a good file.
//
// # Read-only
//
// A file that cannot be opened for writing (EROFS, EACCES, EPERM: a read-only file system,
// permissions) is opened read-only and loaded whole, with the same checks: State.ReadOnly.
// The Store then writes nothing — not the repair, not the marks, not the run marker — and
// each attempt to commit is a failure (Stats: ReadOnly, Failing, LastError says why,
// Failures counts it), which first tries to open the file for writing again: once it can (a
// file system remounted read-write), what was queued meanwhile is written and the store is
// writable. A file that is unreadable and read-only cannot be moved aside: State.Reset with
// no MovedTo, and a Store with no file, that writes nothing.
//
// # The run marker
//
// <path>.run is one fixed-size line saying how the last process left the file: "open"
// while a writable Store has it, "failing" from a commit failing until one succeeds again,
// "closed" after a Close that wrote everything. OpenState reads it before writing "open":
// "open" is State.Unclean (killed or crashed: the file holds a prefix of the writes, and
// what was enqueued in the last moments, at most a commit interval and a commit, may be
// missing), "failing" is State.Failing as well (any cluster's state may be older than what
// was served, by as long as the failure lasted — after a kill -9 on a full disk, the
// issue's 30 deletions and 20 reverted versions). A missing marker beside an existing file
// is Unclean (conservative: the release before did not write one). It must say "failing"
// on a full disk, so it is never grown: created at its full size and fsynced once, then
// overwritten in place (pwrite at offset 0, fsync), which needs no free blocks on ext4, xfs
// and the like. Its limits: a copy-on-write file system (btrfs, zfs) allocates even to
// overwrite, and there a full disk leaves it at "open" (Unclean without Failing); a process
// killed between its first failed commit and the marker's write (a few milliseconds) leaves
// "open"; and a marker that cannot be written at all is logged and taken as unclean at the
// next start.
//
// Open and Load (and OpenOrReset) keep their contract: any damage Load finds — a record, a
// digest that does not match, a mark — is a *CorruptError naming the file and what is wrong,
// and OpenOrReset moves such a file aside. Other errors are not resets: a file another
// process holds is ErrLocked after LockTimeout (a second hub on the same state directory
// fails instead of hanging), and a permission or I/O error with no way to read the file is
// returned as it is.
//
// # Why bbolt
//
// It is already the minion relay's state file (go.etcd.io/bbolt, in go.mod), and it gives
// what this needs without code of our own for it: atomic, crash-safe transactions of many
// keys (copy-on-write B+tree, a meta page switched after fsync) so a batch is one unit; one
// commit per batch, which is what amortizes fsync; an exclusive lock on the file; and reads
// at start straight from the mapped file. The alternatives cost more: a snapshot file
// rewritten on each change is O(state) per commit; an append-only log needs its own
// recovery and compaction; SQLite brings cgo or a large dependency. bbolt's costs, measured
// below: a changed key rewrites its page and the path to it, and the file grows to hold the
// old and new pages of the largest transaction and never shrinks (freed pages are reused).
//
// # Measured
//
// On the development machine (2 cores shared with other work, so ranges over several runs;
// ext4 on a virtual disk; go test -bench): Put 90–165 ns/op and 0 allocs/op on the caller's
// side with the writer committing concurrently (BenchmarkPut; hashing the three keys is most
// of it); Apply of a 10-resource change 1.0–2.5 µs/op, 0 allocs/op; sustained throughput to
// disk of 1 KB resources 63,000–91,000 resources/s (63–91 MB/s), in batches of about 6,000
// that the writer forms by itself (BenchmarkDiskThroughput: nothing coalesced, every write
// on disk); one commit when the hub is quiet 0.7–1.1 ms (BenchmarkCommitLatency). A file
// holding 10,000 resources of 1 KB, each rewritten in large batches, grew to 58 MB: bbolt's
// leaf pages are half full after splits, and a transaction rewriting every key needs old and
// new pages at once.
//
// The integrity digests, measured with and without them in the same runs (config.noDigests,
// the benchmarks' digests=false; a busier machine than the figures above, so lower and
// wider): sustained throughput to disk 43–51 MB/s with them, 48–59 MB/s without (about 15%
// less: each key written reads its old value and hashes it and the new one); a one-name
// commit the same either way within the fsync's noise (0.9–2.8 ms with, 1.0–3.0 ms without,
// from 1,000 to 1,000,000 names stored); a first push of 1,000,000 names 15.4–15.8 s with,
// 13.8 s without. A start (open and load; BenchmarkLoad, 100,000 resources of 256 bytes)
// takes 0.45–0.63 s against 0.28–0.32 s for the release before, in alternating runs: the
// tree walk (one read per page, 0.1 s of it) and hashing each record (0.04 s); decoding the
// records is still most of it.
package durable
