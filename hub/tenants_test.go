package hub

import (
	"github.com/meshfed/meshfed/mcp"
	"strings"
	"testing"
	"time"
)

// twoTenants is a hub of two tenants, acme (east, west) and globex (north).
const twoTenants = `
insecure: true
collections: [istio/networking/v1alpha3/virtualservices]
tenants:
- name: acme
  sinks: ["acme-*"]
  clusters:
  - {name: east, identities: [east], namespaces: [shop], hosts: ["*.shop.example.com"]}
  - {name: west, identities: [west], namespaces: [cart], hosts: ["*.cart.example.com"]}
  routing: {rules: [{name: all, identities: ["*"]}]}
- name: globex
  sinks: ["globex-*"]
  clusters:
  - {name: north, identities: [north], namespaces: [bank], hosts: ["*.bank.example.com"]}
  routing: {rules: [{name: all, identities: ["*"]}]}
`

// A sink refused during the warm-up is told why; with tenants, the clusters still awaited
// may be another tenant's, so it is told how many, not which.
func TestWarmUpRefusalNamesNoCluster(t *testing.T) {
	h := testHub(t, twoTenants+"warmUp: 1m\n")
	h.started = time.Now()
	_, why, ok := h.readyToServe(mcp.NewStreamInfo("", nil, nil))
	if ok {
		t.Fatal("ready before any cluster synced")
	}
	for _, c := range []string{"east", "west", "north"} {
		if strings.Contains(why, c) {
			t.Errorf("the warm-up refusal %q names cluster %s", why, c)
		}
	}
	if !strings.Contains(why, "3 clusters") {
		t.Errorf("the warm-up refusal %q does not say how many clusters are awaited", why)
	}

	single := testHub(t, twoClusters)
	single.started = time.Now()
	if _, why, _ := single.readyToServe(mcp.NewStreamInfo("", nil, nil)); !strings.Contains(why, "east") {
		t.Errorf("without tenants the refusal %q no longer names the clusters awaited", why)
	}
}

// The vendor's operators are listed: one a tenant also names is refused, and so is a name
// that is not one.
func TestVendorOperatorsListed(t *testing.T) {
	for _, tc := range []struct{ ops, want string }{
		{"operators: [alice]\n", ""},
		{"operators: [ann]\n", `operators[0]: operator "ann" is also tenant "acme"'s: the vendor's operators see every tenant`},
		{"operators: [a/b]\n", `operators[0]: "a/b" is not an operator's name`},
	} {
		_, err := ParseConfig([]byte(strings.Replace(twoTenants, `sinks: ["acme-*"]`, `sinks: ["acme-*"]`+"\n  operators: [ann]", 1) + tc.ops))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.ops, err)
		case tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)):
			t.Errorf("%s: %v, want %s", tc.ops, err, tc.want)
		}
	}
}

// A departed cluster kept from a replica's peer (Hub.KeepDeparted) is kept under the tenant
// it belongs to there: its copy reaches that tenant's open views, not another's; one whose
// tenant is not configured here has no place.
func TestKeepDepartedUnderItsTenant(t *testing.T) {
	h := testHub(t, twoTenants)
	acme, globex := watchAs(t, h, "acme-1", ""), watchAs(t, h, "globex-1", "")
	if h.KeepDeparted("south", "initech", "a") {
		t.Error("kept under a tenant that is not configured")
	}
	if !h.KeepDeparted("south", "acme", "a") {
		t.Fatal("not kept")
	}
	cp, err := h.OpenSession("south", SessionOptions{Away: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.apply(cp, push(t, vsColl, "shop/x")); err != nil {
		t.Fatal(err)
	}
	if got := acme.names(vsColl); got != "shop/x" {
		t.Errorf("acme's sink has %q, want south's shop/x", got)
	}
	if got := globex.names(vsColl); got != "" {
		t.Errorf("globex's sink has %q", got)
	}
}
