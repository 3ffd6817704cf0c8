package load

import (
	"sync/atomic"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	mcpapi "istio.io/api/mcp/v1alpha1"

	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
)

// TestFrameScan: what a sink keeps of a message is its counts, nonce, incremental flag and
// whether it carries the armed resource at the armed version, whatever the field order.
func TestFrameScan(t *testing.T) {
	body, _ := anypb.New(wrapperspb.String("x"))
	res := func(name, version string) *mcpapi.Resource {
		return &mcpapi.Resource{Metadata: &mcpapi.Metadata{Name: name, Version: version, Annotations: map[string]string{"a": "b"}}, Body: body}
	}
	m := &mcppb.Resources{Collection: "c", Nonce: "7", Incremental: true, RemovedResources: []string{"ns/gone"},
		Resources: []*mcpapi.Resource{res("ns/a", "1"), res("ns/b", "c000/2")}}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var w atomic.Pointer[Watch]
	for _, c := range []struct {
		w    *Watch
		want bool
	}{
		{nil, false},
		{&Watch{Name: "ns/b", Version: "c000/2"}, true},
		{&Watch{Name: "ns/b", Version: "2"}, false},
		{&Watch{Name: "ns/c", Version: "c000/2"}, false},
	} {
		w.Store(c.w)
		f := Frame{watch: &w}
		f.scan(b)
		if f.Added != 2 || f.Removed != 1 || f.Nonce != "7" || !f.Incremental || f.Bytes != len(b) || f.At <= 0 {
			t.Errorf("scanned %+v", f)
		}
		if got := f.Matched != nil; got != c.want || got && f.Matched != c.w {
			t.Errorf("watch %+v: matched %v, want %v", c.w, f.Matched, c.want)
		}
	}
	m.Nonce = ""
	b, _ = proto.Marshal(m)
	if n := ScanNonce(append(b, NonceField("8")...)); n != "8" {
		t.Errorf("ScanNonce of a body and its appended nonce = %q, want 8", n)
	}
}
