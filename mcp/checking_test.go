package mcp

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// checkedCache refuses subscriptions to one collection.
type checkedCache struct {
	*Cache
	refuse string
}

func (c checkedCache) Check(_ *StreamInfo, collection string) error {
	if collection == c.refuse {
		return status.Errorf(codes.FailedPrecondition, "%s is not here", collection)
	}
	return nil
}

// A CheckingWatcher's refusal ends the stream with its status and sends nothing for the
// refused collection (an empty state would read as deletions at the sink).
func TestCheckingWatcherRefusesWithItsStatus(t *testing.T) {
	cache := NewCache("a", "b")
	cache.Put("a", entry(t, "x", "1"))
	src := newTestSource(t, checkedCache{Cache: cache, refuse: "b"})
	r := newRawSink(t, src, sourceServes)
	r.request("a", false, nil)
	if m := r.next(); m.Collection != "a" || len(m.Resources) != 1 {
		t.Fatalf("push of %s with %d resources", m.Collection, len(m.Resources))
	}
	r.request("b", false, nil)
	select {
	case m := <-r.recv:
		t.Fatalf("a push of %s after the refusal", m.Collection)
	case err := <-r.errc:
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "b is not here") {
			t.Fatalf("stream ended with %v, want FailedPrecondition naming the collection", err)
		}
	case <-time.After(waitFor):
		t.Fatal("the stream did not end")
	}
}
