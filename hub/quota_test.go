package hub

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	mcpapi "istio.io/api/mcp/v1alpha1"
	networking "istio.io/api/networking/v1alpha3"

	"github.com/meshfed/meshfed/mcp"
)

// bigVS is a VirtualService named name whose body is about size bytes.
func bigVS(t *testing.T, name, version string, size int) (*mcp.Entry, *mcpapi.Resource) {
	t.Helper()
	body, err := anypb.New(&networking.VirtualService{Hosts: []string{"reviews"}, Http: []*networking.HTTPRoute{{Name: strings.Repeat("r", size)}}})
	if err != nil {
		t.Fatal(err)
	}
	r := &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: version}, Body: body}
	e, err := mcp.NewEntry(r)
	if err != nil {
		t.Fatal(err)
	}
	return e, r
}

func incremental(t *testing.T, entries ...any) *mcp.Change {
	t.Helper()
	c := &mcp.Change{Collection: vsColl, Incremental: true}
	for i := 0; i < len(entries); i += 2 {
		c.Entries = append(c.Entries, entries[i].(*mcp.Entry))
		c.Resources = append(c.Resources, entries[i+1].(*mcpapi.Resource))
	}
	return c
}

func rejectionsOf(t *testing.T, err error) []mcp.Rejection {
	t.Helper()
	st, _ := status.FromError(err)
	return mcp.Rejections(st.Proto())
}

// An object larger than what a sink can receive in one push was accepted, and from then
// on every full-state sink stopped receiving the collection, another cluster's edits
// included. It is refused at ingest, naming the bound; the rest flows.
func TestObjectLargerThanASinkCanReceiveIsRefusedAtIngest(t *testing.T) {
	h := testHub(t, breakerHub)
	sink := watchAs(t, h, "", "istiod")
	mustApply(t, h, "west", push(t, vsColl, "pay/a"))
	e, r := bigVS(t, "shop/huge", "1", 5<<20)
	err := h.Apply("east", incremental(t, e, r))
	rj := rejectionsOf(t, err)
	if status.Code(err) != codes.ResourceExhausted || len(rj) != 1 || !strings.Contains(rj[0].Reason, "maxObjectBytes") {
		t.Fatalf("a 5 MB object: %v", err)
	}
	e2, r2 := bigVS(t, "pay/a", "2", 10)
	mustApply(t, h, "west", incremental(t, e2, r2))
	snap := sink.colls[vsColl].Snapshot()
	if len(snap.Entries) != 1 || snap.Entries[0].Version != "west/2" {
		t.Errorf("served: %+v, want west's edit", snap.Entries)
	}
	if got := h.Clusters()[0].Rejections[vsColl]["shop/huge"]; got == "" {
		t.Error("the refusal is not in the cluster's status")
	}
}

// A collection that would grow past what a sink can receive in one push, all clusters
// together, refuses the object that would make it so; a change that does not grow it
// still applies.
func TestCollectionLargerThanASinkCanReceiveIsRefused(t *testing.T) {
	h := testHub(t, breakerHub+"maxMessageSize: 8192\n")
	sink := watchAs(t, h, "", "istiod")
	for _, name := range []string{"shop/a", "shop/b", "shop/c"} {
		e, r := bigVS(t, name, "1", 2000)
		if err := h.Apply("east", incremental(t, e, r)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	e, r := bigVS(t, "pay/d", "1", 2000)
	err := h.Apply("west", incremental(t, e, r))
	if rj := rejectionsOf(t, err); len(rj) != 1 || !strings.Contains(rj[0].Reason, "more than its bound") {
		t.Fatalf("the fourth object: %v", err)
	}
	e, r = bigVS(t, "shop/a", "2", 1990)
	if err := h.Apply("east", incremental(t, e, r)); err != nil {
		t.Fatalf("an edit that shrinks: %v", err)
	}
	if got := sink.names(vsColl); got != "shop/a,shop/b,shop/c" {
		t.Errorf("served: %q", got)
	}
}

// maxObjects refuses new objects beyond it (the accepted ones, and their updates, stay);
// it is per cluster.
func TestMaxObjectsPerCluster(t *testing.T) {
	h := testHub(t, strings.Replace(breakerHub, `namespaces: [shop], hosts: ["*"]}`, `namespaces: [shop], hosts: ["*"], quotas: {maxObjects: 3}}`, 1))
	sink := watchAs(t, h, "", "istiod")
	err := h.Apply("east", push(t, vsColl, objects("shop", 5)...))
	if rj := rejectionsOf(t, err); status.Code(err) != codes.ResourceExhausted || len(rj) != 2 || !strings.Contains(rj[0].Reason, "maxObjects") {
		t.Fatalf("5 objects with maxObjects 3: %v", err)
	}
	if err := h.Apply("west", push(t, vsColl, objects("pay", 5)...)); err != nil {
		t.Fatalf("another cluster: %v", err)
	}
	if got := countNames(sink.names(vsColl)); got != 8 {
		t.Errorf("served %d objects, want 3 of east's and 5 of west's", got)
	}
}

// A cluster pushing faster than its rate waits on its own stream; another cluster does not.
func TestPushRateIsPerCluster(t *testing.T) {
	h := testHub(t, strings.Replace(breakerHub, `namespaces: [shop], hosts: ["*"]}`, `namespaces: [shop], hosts: ["*"], quotas: {pushesPerSecond: 0.001, pushBurst: 1}}`, 1))
	east, west := ownSession(t, h, "east", "e"), ownSession(t, h, "west", "w")
	if err := h.applyPaced(context.Background(), east.s, push(t, vsColl, "shop/a")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := h.applyPaced(ctx, east.s, push(t, vsColl, "shop/b")); err == nil {
		t.Error("east's second push within its rate was applied")
	}
	// With the same deadline, west (default rate) is not held back by east's limit: a
	// limiter shared between clusters would refuse these as east's second push was.
	for i := range 5 {
		if err := h.applyPaced(ctx, west.s, push(t, vsColl, objects("pay", i+1)...)); err != nil {
			t.Fatalf("west's push %d: %v", i, err)
		}
	}
}
