package admin_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/meshfed/meshfed/hub/admin"
	"github.com/meshfed/meshfed/hub/api"
)

// hub get and hub why against a running hub: a collection typed as users do lists what is
// served; one object shows its served content (decoded, as Kubernetes writes objects) and
// every cluster's copy; an object nobody published, or a collection the hub does not know,
// is an error (NotFound with kubectl's words for the former); a malformed name is refused
// before the hub is asked.
func TestGetAndWhyAgainstAHub(t *testing.T) {
	h := runHub(t, `
insecure: true
stateDir: `+t.TempDir()+`
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
http: 127.0.0.1:0
warmUp: 1h
collections: [vs]
clusters:
- {name: east, identities: [east], namespaces: [shop], hosts: ["*"]}
- {name: west, identities: [west], namespaces: [shop], hosts: ["*"]}
sharedNamespaces: [shop]
conflicts: {priority: [west]}
routing: {default: {name: all}}
`)
	_, _, addr := h.Addrs()
	if err := h.Apply("west", vsState(t, "shop/cart")); err != nil {
		t.Fatal(err)
	}
	// east's copy of shop/cart is held, not served (west has priority): the push is NACKed
	// saying so, and applied.
	if err := h.Apply("east", vsState(t, "shop/cart", "shop/only-east")); err == nil || !strings.Contains(err.Error(), "AlreadyExists") {
		t.Fatalf("east's push: %v, want its conflict", err)
	}

	list, err := hubCmd("get", "VirtualService", "--admin", addr)
	if err != nil || !regexp.MustCompile(`(?m)^NAMESPACE/NAME +ORIGIN CLUSTER +VERSION +AGE\nshop/cart +west +west/1 +- *\nshop/only-east +east +east/1 +- *$`).MatchString(list) {
		t.Errorf("hub get VirtualService: %v\n%s", err, list)
	}
	one, err := hubCmd("get", "vs", "shop/cart", "--admin", addr)
	if err != nil || !regexp.MustCompile(`(?m)^shop/cart +west +west/1 +yes +-\nshop/cart +east +east/1 +no +cluster "west"'s copy is served`).MatchString(one) {
		t.Errorf("hub get vs shop/cart: %v\n%s", err, one)
	}
	y, err := hubCmd("get", "networking.istio.io/v1/VirtualService", "shop/cart", "-o", "yaml", "--admin", addr)
	for _, want := range []string{"served:\n  apiVersion: networking.istio.io/v1alpha3\n  kind: VirtualService\n  metadata:\n", "    meshfed.io/origin-cluster: west\n",
		"    name: cart\n    namespace: shop\n    resourceVersion: west/1\n", "  spec:\n    hosts:\n    - cart\n", "candidates:\n- cluster: west\n"} {
		if err != nil || !strings.Contains(y, want) {
			t.Errorf("hub get -o yaml: %v: lacks %q:\n%s", err, want, y)
		}
	}
	j, err := hubCmd("get", "vs", "shop/cart", "-o", "json", "--admin", addr)
	var o api.Object
	if err != nil || json.Unmarshal([]byte(j), &o) != nil || o.Served == nil || len(o.Candidates) != 2 {
		t.Errorf("hub get -o json: %v\n%s", err, j)
	}

	var nf *admin.NotFoundError
	for _, args := range [][]string{{"get", "vs", "shop/nothing"}, {"why", "vs", "shop/nothing"}} {
		if _, err := hubCmd(append(args, "--admin", addr)...); !errors.As(err, &nf) ||
			err.Error() != `Error from server (NotFound): istio/networking/v1alpha3/virtualservices "shop/nothing" not found` {
			t.Errorf("hub %q: %v, want NotFound", args, err)
		}
	}
	for _, args := range [][]string{{"get", "vss"}, {"why", "vss", "shop/cart"}} {
		if _, err := hubCmd(append(args, "--admin", addr)...); err == nil || !strings.HasPrefix(err.Error(), `collection: unknown collection "vss": known: `) {
			t.Errorf("hub %q: %v", args, err)
		}
	}
	for _, args := range [][]string{{"get", "vs", "Shop/cart"}, {"why", "vs", "shop/cart/x"}, {"why", "vs", "/cart"}} {
		if _, err := hubCmd(append(args, "--admin", "127.0.0.1:1")...); err == nil || !strings.Contains(err.Error(), "want NAMESPACE/NAME") {
			t.Errorf("hub %q: %v, want a usage error", args, err)
		}
	}
	if out, err := hubCmd("why", "vs", "shop/cart", "--admin", addr); err != nil || !strings.Contains(out, "served from cluster west") {
		t.Errorf("hub why: %v\n%s", err, out)
	}
}
