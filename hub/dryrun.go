package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/meshfed/meshfed/hub/acl"
	"github.com/meshfed/meshfed/hub/api"
)

// Dry runs (/api/dryrun): what a sink would receive, now or under a candidate
// configuration.
//
// Without a candidate it is a read, answered for the viewer like the rest of the API. With
// one (POST) it is an operator's action (Hub.action: an operator's certificate on adminTLS,
// or loopback in development mode; logged with who asked), and the vendor's only: the
// candidate is the whole hub's file (listeners, TLS, every tenant), which only the vendor
// applies, and evaluating it compiles a whole configuration on the hub's CPU. So it is
// bounded: a body of at most api.MaxCandidateBytes (413), one evaluated at a time (429 with
// Retry-After while one is) and each followed by a pause as long as it took (a request
// arriving then waits for its end), each within dryRunTimeout (503), and stopped when its
// request ends (the client gone): compile and the store's walk watch the request's context.

// dryRunTimeout is the longest a dry run of a candidate may take, reading its body
// included. A candidate of api.MaxCandidateBytes compiles in well under a second (the
// overlap checks are O(n log n)); the bound is for what that leaves out, and stays below
// the CLI's 10 s, so that it is the hub that says why.
const dryRunTimeout = 5 * time.Second

// dryRunSlots is how many dry runs of a candidate are evaluated at once: one takes one CPU
// while it lasts, and the hub's writers need the others (the machine the hub is measured on
// has two). After an evaluation its slot stays taken for as long again, so that clients
// looping dry runs take at most half of one CPU however many they are.
const dryRunSlots = 1

// statusClientClosed records, in the action's log line, a dry run stopped because its client
// went away (nginx's "client closed request"; nobody receives it).
const statusClientClosed = 499

// DryRun returns what a sink with this identity and SinkNode receives now, or, given a
// candidate configuration, what it would receive under it (its routing and ownership; the
// stored resources and the running conflict order) and how that differs from now. A
// candidate that does not validate is an error naming the field.
func (h *Hub) DryRun(identity, nodeID string, annotations map[string]string, candidate *Config) (api.DryRun, error) {
	return h.dryRun(context.Background(), vendor(h.current().comp), identity, nodeID, annotations, candidate)
}

// errNotYours answers a tenant's operator asking about what is not the tenant's.
var errNotYours = errors.New("not yours")

// errVendorsCandidate refuses a tenant's operator a dry run of a candidate.
var errVendorsCandidate = errors.New("a dry run of a candidate configuration is the vendor's: a candidate is the whole hub's file (its listeners, TLS and every tenant), which only the vendor applies")

// dryRun is DryRun for v until ctx ends: a tenant's operator asks about the tenant's sinks
// only, and of the running configuration only (a candidate is the vendor's: what a
// candidate changes outside the tenant, needsRestart first, is not the tenant's to learn).
func (h *Hub) dryRun(ctx context.Context, v viewer, identity, nodeID string, annotations map[string]string, candidate *Config) (api.DryRun, error) {
	if candidate != nil && !v.isVendor() {
		return api.DryRun{}, errVendorsCandidate
	}
	now := v.comp.routeOf(identity, nodeID, annotations)
	if !v.seesRoute(now) {
		return api.DryRun{}, fmt.Errorf("identity %q: %w: it is not one of tenant %q's sinks", identity, errNotYours, v.tenant)
	}
	served, err := h.store.servedWith(ctx, now, nil)
	if err != nil {
		return api.DryRun{}, err
	}
	d := api.DryRun{Identity: identity, NodeID: nodeID, Annotations: annotations, Tenant: now.tenant, Rules: now.sub.Rules(), Resources: served}
	if candidate == nil {
		return d, nil
	}
	comp, err := candidate.compileCtx(ctx)
	if err != nil {
		return d, err
	}
	rt := comp.routeOf(identity, nodeID, annotations)
	would, err := h.store.servedWith(ctx, rt, func(r *resource) bool {
		return comp.configured(r.cluster) && comp.check(r.cluster, acl.Object{Collection: r.collection, Name: r.name, Hosts: r.hosts}) == nil
	})
	if err != nil {
		return d, err
	}
	d.Candidate, d.Rules, d.Tenant = true, rt.sub.Rules(), rt.tenant
	d.NeedsRestart = restartFields(h.cfg, candidate) // as Reload would refuse it
	d.Added, d.Removed, d.Changed = map[string][]string{}, map[string][]string{}, map[string][]string{}
	for coll, names := range would {
		for n, v := range names {
			switch was, ok := d.Resources[coll][n]; {
			case !ok:
				d.Added[coll] = append(d.Added[coll], n)
			case was != v:
				d.Changed[coll] = append(d.Changed[coll], n)
			}
		}
		for n := range d.Resources[coll] {
			if _, ok := names[n]; !ok {
				d.Removed[coll] = append(d.Removed[coll], n)
			}
		}
	}
	for _, m := range []map[string][]string{d.Added, d.Removed, d.Changed} {
		for coll := range m {
			sort.Strings(m[coll])
		}
	}
	d.Resources = would
	return d, nil
}

// dryRunSink reads the sink a dry run is about from r's query.
func dryRunSink(r *http.Request) (identity, node string, annotations map[string]string, err error) {
	q := r.URL.Query()
	annotations = map[string]string{}
	for _, a := range q["annotation"] {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return "", "", nil, fmt.Errorf("annotation %q: want key=value", a)
		}
		annotations[k] = v
	}
	return q.Get("identity"), q.Get("node"), annotations, nil
}

// serveDryRun is GET /api/dryrun: what a sink receives under the running configuration, as
// the viewer may see it (a read).
func (h *Hub) serveDryRun(w http.ResponseWriter, r *http.Request) {
	identity, node, ann, err := dryRunSink(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	d, err := h.dryRun(r.Context(), h.viewerOf(r), identity, node, ann, nil)
	switch {
	case errors.Is(err, errNotYours):
		http.Error(w, err.Error(), http.StatusNotFound)
	case err != nil: // the request ended
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	default:
		WriteJSON(w, d)
	}
}

// takeDryRunSlot takes the slot for a dry run of a candidate: at once if it is free; if it
// is in the pause after an evaluation, once the pause is over (the request waits rather
// than being refused, so an operator's dry runs one after another go through). It fails,
// for a 429, while an evaluation holds the slot, when another request took it at the
// pause's end, or when ctx ends.
func (h *Hub) takeDryRunSlot(ctx context.Context) bool {
	select {
	case h.dryRuns <- struct{}{}:
		return true
	default:
	}
	at := h.dryRunFreeAt.Load()
	if at == 0 { // being evaluated: when it ends is unknown
		return false
	}
	// The pause ends by a timer of its own: wait for it, and a little more for that timer.
	t := time.NewTimer(time.Until(time.Unix(0, at)) + 100*time.Millisecond)
	defer t.Stop()
	select {
	case h.dryRuns <- struct{}{}:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// dryRunCandidate is POST /api/dryrun, an action (registered through Hub.action, which has
// found the operator): a candidate configuration in the body, evaluated within the bounds
// above.
func (h *Hub) dryRunCandidate(w http.ResponseWriter, r *http.Request, operator string) {
	v, timeout := h.viewerOf(r), time.Duration(h.dryRunTimeout.Load())
	if !v.isVendor() {
		http.Error(w, fmt.Sprintf("%v; operator %q of tenant %q may ask what its sinks receive now (GET /api/dryrun)", errVendorsCandidate, operator, v.tenant), http.StatusForbidden)
		return
	}
	identity, node, ann, err := dryRunSink(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tooLarge := fmt.Sprintf("candidate configuration: larger than %d bytes (1 MiB), the most a dry run takes (and a Kubernetes ConfigMap holds)", api.MaxCandidateBytes)
	// When the evaluation began (the body read): the slot's pause is measured from it.
	var evaluated time.Time
	if r.ContentLength > api.MaxCandidateBytes { // said before it is sent: refused unread
		http.Error(w, tooLarge, http.StatusRequestEntityTooLarge)
		return
	}
	if !h.takeDryRunSlot(r.Context()) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, fmt.Sprintf("another dry run of a candidate is being evaluated: the hub evaluates %d at a time (each for up to %v, then a pause as long); retry after 1s", dryRunSlots, timeout), http.StatusTooManyRequests)
		return
	}
	// The evaluation (decoding included) is what takes a CPU: once it has begun, the slot is
	// released as long after it ends as it took, whatever its outcome.
	h.dryRunFreeAt.Store(0)
	defer func() {
		if evaluated.IsZero() {
			<-h.dryRuns
			return
		}
		took := time.Since(evaluated)
		h.dryRunFreeAt.Store(time.Now().Add(took).UnixNano())
		time.AfterFunc(took, func() { <-h.dryRuns })
	}()
	// The slot is held from here: the body must arrive, and the dry run end, in time.
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(timeout))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, api.MaxCandidateBytes))
	var over *http.MaxBytesError
	var nerr net.Error
	switch {
	case errors.As(err, &over):
		http.Error(w, tooLarge, http.StatusRequestEntityTooLarge)
		return
	case errors.As(err, &nerr) && nerr.Timeout():
		http.Error(w, fmt.Sprintf("candidate configuration: not received within %v, the most a dry run may take", timeout), http.StatusRequestTimeout)
		return
	case err != nil:
		http.Error(w, "candidate configuration: "+err.Error(), http.StatusBadRequest)
		return
	}
	// Read: from here the server watches the connection for the client going away (which
	// ends r's context), and must not take a read deadline for that.
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	evaluated = time.Now()
	// Decoded without validating: compileCtx below validates it, once, under the deadline.
	candidate, err := decodeConfig(body)
	if err != nil {
		http.Error(w, "candidate configuration: "+err.Error(), http.StatusBadRequest)
		return
	}
	started := time.Now()
	d, err := h.dryRun(ctx, v, identity, node, ann, candidate)
	switch {
	case err == nil:
		WriteJSON(w, d)
	case errors.Is(err, context.Canceled): // the client went away: nobody reads an answer
		h.log.Info("dry run stopped: its client went away", "operator", operator, "peer", r.RemoteAddr, "after", time.Since(started))
		w.WriteHeader(statusClientClosed)
	case errors.Is(err, context.DeadlineExceeded):
		http.Error(w, fmt.Sprintf("the dry run was stopped after %v, the most one may take: a candidate that takes longer to evaluate cannot be dry-run", timeout), http.StatusServiceUnavailable)
	case errors.Is(err, errNotYours):
		http.Error(w, err.Error(), http.StatusNotFound)
	default:
		http.Error(w, "candidate configuration: "+err.Error(), http.StatusBadRequest)
	}
}
