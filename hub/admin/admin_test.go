package admin

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfed/meshfed/mcp/kinds"
)

// The operator's commands link the admin API's contract, not the server: neither the hub's
// core nor its replica layer (memberlist).
func TestLinksOnlyTheContract(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case dep == "github.com/meshfed/meshfed/hub", strings.HasPrefix(dep, "github.com/meshfed/meshfed/hub/replicas"),
			strings.Contains(dep, "hashicorp/memberlist"), dep == "github.com/meshfed/meshfed/routing", dep == "github.com/meshfed/meshfed/hub/acl":
			t.Errorf("hub/admin links %s", dep)
		}
	}
}

// subscribe's -collections are typed as users type them; without -admin they resolve
// against the built-in kinds, and an unknown one is an error listing the known names.
func TestSubscribeCollections(t *testing.T) {
	ctx := context.Background()
	got, err := subscribeCollections(ctx, "", "vs, TrafficExtension,networking.istio.io/v1/DestinationRule")
	if err != nil || strings.Join(got, ",") != "istio/networking/v1alpha3/virtualservices,istio/extensions/v1alpha1/trafficextensions,istio/networking/v1alpha3/destinationrules" {
		t.Errorf("subscribeCollections = %v, %v", got, err)
	}
	if got, err := subscribeCollections(ctx, "", ""); err != nil || !slices.Equal(got, kinds.Collections()) {
		t.Errorf("default = %v, %v", got, err)
	}
	for typed, want := range map[string]string{
		"vs,vss":             `--collections[1]: unknown collection "vss": known: `,
		"vs,,dr":             "--collections[1]: empty collection name: known: ",
		"vs,Virtual":         `--collections[1]: unknown collection "Virtual"`,
		"dr,DestinationRule": `--collections[1]: "DestinationRule" is istio/networking/v1alpha3/destinationrules, already listed as --collections[0] ("dr")`,
	} {
		if _, err := subscribeCollections(ctx, "", typed); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", typed, err, want)
		}
	}
}

// A plaintext subscribe to a TLS listener (a newcomer's first try at the development hub)
// is told to give a certificate, not only that the stream ended.
func TestSubscribePlaintextToTLSSaysWhy(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- subscribe(ctx, &out, srv.Listener.Addr().String(), "", "", "", "n", "vs", "") }()
	for !strings.Contains(out.String(), "(retrying") {
		select {
		case err := <-done:
			t.Fatalf("subscribe ended: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	cancel()
	<-done
	if !strings.Contains(out.String(), "give --cert, --key and --ca") {
		t.Errorf("a plaintext stream to a TLS listener ended without the hint:\n%s", out.String())
	}
}

// syncBuffer is a bytes.Buffer written by one goroutine and read by another.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// --admin takes HOST:PORT, and a URL of the scheme the connection speaks, as people paste
// them; anything else says what to give.
func TestAdminAddr(t *testing.T) {
	for _, tc := range []struct{ given, scheme, want, err string }{
		{"", "http", "127.0.0.1:9990", ""},
		{"10.0.0.1:9990", "http", "10.0.0.1:9990", ""},
		{"http://127.0.0.1:1", "http", "127.0.0.1:1", ""},
		{"http://hub.example.com:9990/", "http", "hub.example.com:9990", ""},
		{"https://hub:9991", "https", "hub:9991", ""},
		{"https://hub:9991", "http", "", "without --cert the hub's http listener is asked over http"},
		{"http://hub:9990", "https", "", "with --cert the hub's adminTLS listener is asked over https"},
		{"hub", "http", "", "want HOST:PORT"},
		{"http://hub:9990/api", "http", "", "want HOST:PORT"},
	} {
		got, err := adminAddr(tc.given, tc.scheme, "127.0.0.1:9990")
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("adminAddr(%q, %s) = %q, %v; want %q, %q", tc.given, tc.scheme, got, err, tc.want, tc.err)
		}
	}
}

// adminAddr takes anything: an address it returns is a HOST:PORT without a path.
func FuzzAdminAddr(f *testing.F) {
	for _, s := range []string{"", "h:1", "http://h:1/", "https://[::1]:9991", "://", "http://"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, given string) {
		for _, scheme := range []string{"http", "https"} {
			addr, err := adminAddr(given, scheme, "127.0.0.1:9990")
			if err != nil {
				continue
			}
			if _, _, err := net.SplitHostPort(addr); err != nil || strings.Contains(addr, "/") {
				t.Errorf("adminAddr(%q, %s) = %q", given, scheme, addr)
			}
		}
	})
}
