package e2e

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/hub/tenancy"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/mcp"
	mcppb "github.com/meshfed/meshfed/mcp/v1alpha1"
	"github.com/meshfed/meshfed/minion"
	"github.com/meshfed/meshfed/routing"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Two tenants on one hub, over real mutual TLS under a trust domain, each with a real minion
// publishing real files. acme has cluster east (namespace shop), sinks acme-* and operator
// ann; globex has cluster north (namespaces bank and edge), sinks globex-*, operator gus, and
// exports its edge namespace to acme. vera is the vendor's operator (operators); mallory, an
// operator listed nowhere, gets nothing.
//
// globex's routing is written so that a hub routing every sink by every tenant's rules would
// hand acme's sinks globex's objects: rule fleet selects by node id (globex-*), rule team by
// any sink identity that claims annotation tenant=globex; acme's only rule selects any sink
// identity. So every "acme gets exactly this" below fails on a hub that does not decide the
// tenant first (by the authenticated identity) and then route within it.
func TestTenantIsolation(t *testing.T) {
	p := newPKI(t)
	h, cfg := runTenantsHub(t, p, true)
	ingest, serve, _ := h.Addrs()

	east, north := t.TempDir(), t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	// east's intrusions, each beside a twin aimed where nobody owns anything: a refusal that
	// says more for globex's namespace or host than for nobody's tells acme globex is there.
	writeFile(t, east, "bank/steal.yaml", vsYAML("steal", "bank", "", "cart.shop.example.com"))
	writeFile(t, east, "edge/steal.yaml", vsYAML("steal", "edge", "", "cart.shop.example.com"))
	writeFile(t, east, "nobody/steal.yaml", vsYAML("steal", "nobody", "", "cart.shop.example.com"))
	writeFile(t, east, "shop/hijack.yaml", vsYAML("hijack", "shop", "", "api.bank.example.com"))
	writeFile(t, east, "shop/astray.yaml", vsYAML("astray", "shop", "", "api.nowhere.example.com"))
	writeFile(t, north, "bank/vault.yaml", vsYAML("vault", "bank", "", "vault.bank.example.com"))
	writeFile(t, north, "edge/gw.yaml", vsYAML("gw", "edge", "", "gw.edge.example.com"))
	nacks := tlsMinionNACKs(t, p, "east", east, ingest)
	tlsMinion(t, p, "north", north, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)

	const acmeSees, globexSees = "edge/gw@north,shop/cart@east", "bank/vault@north,edge/gw@north"
	// Long-lived sinks, for the reload at the end.
	acmeLive, globexLive := tlsSink(t, p, serve, "acme-live"), tlsSink(t, p, serve, "globex-live")

	t.Run("sinks", func(t *testing.T) {
		if got := received(subscribeAs(t, serve, p, "acme-istiod", nil), vs); got != acmeSees {
			t.Errorf("acme's sink received %q, want %q: its cluster's and what globex exports to acme, nothing else", got, acmeSees)
		}
		if got := received(subscribeAs(t, serve, p, "globex-istiod", nil), vs); got != globexSees {
			t.Errorf("globex's sink received %q, want %q (none of acme's)", got, globexSees)
		}
	})

	t.Run("identity tricks", func(t *testing.T) {
		// The minion heard, in the hub's NACKs, why each intrusion was refused.
		intrusions := []string{"bank/steal", "edge/steal", "nobody/steal", "shop/astray", "shop/hijack"}
		waitFor(t, 10*time.Second, "east's minion told why each intrusion was refused", func() bool {
			return slices.Equal(slices.Sorted(maps.Keys(nacks.get())), intrusions)
		})
		reasons := nacks.get()
		for name, reason := range reasons {
			noneOfGlobex(t, "the NACK reason for east's "+name, reason)
		}
		for _, ns := range []string{"bank", "edge"} {
			if got, want := strings.ReplaceAll(reasons[ns+"/steal"], `"`+ns+`"`, `"nobody"`), reasons["nobody/steal"]; got != want {
				t.Errorf("east pushing into globex's namespace %s was told %q; into nobody's %q: want the same words", ns, reasons[ns+"/steal"], want)
			}
		}
		if got, want := strings.ReplaceAll(reasons["shop/hijack"], "api.bank.example.com", "api.nowhere.example.com"), reasons["shop/astray"]; got != want {
			t.Errorf("east claiming globex's host was told %q; claiming nobody's %q: want the same words", reasons["shop/hijack"], want)
		}
		// What the hub keeps of them is what it told the minion.
		cl := adminGet[[]api.ClusterStatus](adminAs(t, h, p, "ann"), "/api/clusters")
		if len(cl) != 1 || !maps.Equal(cl[0].Rejections[vs], reasons) {
			t.Errorf("ann's /api/clusters: %+v, want east alone with the rejections its minion was told %v", cl, reasons)
		}

		// acme's sink claiming globex's sink's node id and globex's annotation: routed by its
		// certificate, within acme.
		claimer := subscribeAs(t, serve, p, "acme-claimer", &mcppb.SinkNode{Id: "globex-istiod", Annotations: map[string]string{"tenant": "globex"}})
		if got := received(claimer, vs); got != acmeSees {
			t.Errorf("acme's sink claiming node globex-istiod and tenant=globex received %q, want acme's %q", got, acmeSees)
		}
		// A sink identity no tenant lists, claiming the same: nothing, in either collection.
		stranger := subscribeAs(t, serve, p, "initech-istiod", &mcppb.SinkNode{Id: "globex-istiod", Annotations: map[string]string{"tenant": "globex"}})
		if v, d := stranger.Versions(vs), stranger.Versions(dr); len(v)+len(d) != 0 {
			t.Errorf("a sink no tenant lists received %v and %v, want nothing", v, d)
		}

		// The wrong kind of certificate on each listener, refused before anything is routed.
		err := openStream(t, serve, p.creds(t, "east-as-sink", hub.ClusterIdentity(td, "east")), true)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "is not a sink identity") {
			t.Errorf("east's minion certificate subscribing: %v, want PermissionDenied (not a sink identity)", err)
		}
		noneOfGlobex(t, "the refusal of east's certificate as a sink", status.Convert(err).Message())
		err = openStream(t, ingest, p.creds(t, "acme-sink-pushing", hub.SinkIdentity(td, "acme-istiod")), false)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "is not a cluster identity") {
			t.Errorf("acme's sink certificate pushing: %v, want PermissionDenied (not a cluster identity)", err)
		}
		noneOfGlobex(t, "the refusal of acme's sink certificate pushing", status.Convert(err).Message())
	})

	t.Run("operators", func(t *testing.T) {
		// A sink of each tenant with its stream open, for why and the sink list to show or
		// to leave out.
		subscribeAs(t, serve, p, "globex-istiod", nil)
		subscribeAs(t, serve, p, "acme-istiod", nil)
		ann, gus, vera := adminAs(t, h, p, "ann"), adminAs(t, h, p, "gus"), adminAs(t, h, p, "vera")

		if names := clusterNames(adminGet[[]api.ClusterStatus](ann, "/api/clusters")); names != "east" {
			t.Errorf("ann's clusters: %s, want east alone", names)
		}
		if names := clusterNames(adminGet[[]api.ClusterStatus](gus, "/api/clusters")); names != "north" {
			t.Errorf("gus's clusters: %s, want north alone", names)
		}
		if names := clusterNames(adminGet[[]api.ClusterStatus](vera, "/api/clusters")); names != "east,north" {
			t.Errorf("vera's (the vendor's) clusters: %s, want east,north", names)
		}

		// globex's object: the vendor sees it served to globex's sinks; ann learns nothing,
		// not even that it exists.
		const vault = "/api/why?collection=" + vs + "&name=bank/vault"
		w := adminGet[api.Why](vera, vault)
		if w.Served == nil || w.Served.Cluster != "north" || !slices.Contains(whySinks(w), hub.SinkIdentity(td, "globex-istiod")) {
			t.Errorf("vera's why bank/vault: %+v, want served by north to globex-istiod", w)
		}
		w = adminGet[api.Why](ann, vault)
		if w.Served != nil || len(w.Candidates) != 0 || len(w.Rejected) != 0 || len(w.Sinks) != 0 || w.Conflict != "" {
			t.Errorf("ann's why bank/vault: %+v, want no candidate, no rejection, no sink", w)
		}
		// An exported object: ann sees it served, to acme's sinks only.
		w = adminGet[api.Why](vera, "/api/why?collection="+vs+"&name=edge/gw")
		if ids := whySinks(w); !slices.Contains(ids, hub.SinkIdentity(td, "globex-istiod")) || !slices.Contains(ids, hub.SinkIdentity(td, "acme-istiod")) {
			t.Errorf("vera's why edge/gw lists sinks %v, want globex's and acme's", ids)
		}
		w = adminGet[api.Why](ann, "/api/why?collection="+vs+"&name=edge/gw")
		if ids := whySinks(w); w.Served == nil || !slices.Contains(ids, hub.SinkIdentity(td, "acme-istiod")) || slices.ContainsFunc(ids, notAcme) {
			t.Errorf("ann's why edge/gw: served %+v to %v, want served to acme's sinks only", w.Served, ids)
		}
		if ids := sinkIdentities(adminGet[[]api.SinkStatus](ann, "/api/sinks")); !slices.Contains(ids, hub.SinkIdentity(td, "acme-istiod")) || slices.ContainsFunc(ids, notAcme) {
			t.Errorf("ann's sinks: %v, want acme's only", ids)
		}
		if ids := sinkIdentities(adminGet[[]api.SinkStatus](vera, "/api/sinks")); !slices.Contains(ids, hub.SinkIdentity(td, "globex-istiod")) {
			t.Errorf("vera's sinks: %v, want globex's among them", ids)
		}

		// Who owns globex's host and namespace: not ann's, said as of a host nobody owns.
		o := adminGet[api.Owners](vera, "/api/owners?host=api.bank.example.com")
		if strings.Join(o.Clusters, ",") != "north" || o.Tenant != "globex" {
			t.Errorf("vera's owners of api.bank.example.com: %+v, want north of globex", o)
		}
		for _, q := range []struct{ theirs, nobodys string }{
			{"host=api.bank.example.com", "host=api.nowhere.example.com"},
			{"namespace=bank", "namespace=nobody"},
		} {
			o, nobody := adminGet[api.Owners](ann, "/api/owners?"+q.theirs), adminGet[api.Owners](ann, "/api/owners?"+q.nobodys)
			if !o.NotYours || len(o.Clusters) != 0 || o.Tenant != "" {
				t.Errorf("ann's owners?%s: %+v, want notYours and no cluster", q.theirs, o)
			}
			o.Host, o.Namespace = nobody.Host, nobody.Namespace
			if !reflectEqualJSON(o, nobody) {
				t.Errorf("ann's owners?%s = %+v, owners?%s = %+v: want the same answer", q.theirs, o, q.nobodys, nobody)
			}
		}
		o = adminGet[api.Owners](ann, "/api/owners?host=cart.shop.example.com")
		if strings.Join(o.Clusters, ",") != "east" || o.NotYours {
			t.Errorf("ann's owners of her own host: %+v, want east", o)
		}

		// Dry runs: of globex's sink, "not yours", as of a sink nobody's; of her own sink
		// claiming to be globex's, acme's objects.
		code, theirs := ann.do(http.MethodGet, "/api/dryrun?identity="+hub.SinkIdentity(td, "globex-istiod"), nil)
		_, nobodys := ann.do(http.MethodGet, "/api/dryrun?identity="+hub.SinkIdentity(td, "initech-istiod"), nil)
		if code != http.StatusNotFound || !strings.Contains(theirs, "not yours") || strings.ReplaceAll(theirs, "globex-istiod", "initech-istiod") != nobodys {
			t.Errorf("ann's dry run of globex's sink: %d %q; of a sink nobody's: %q; want 404 not yours, the same words", code, theirs, nobodys)
		}
		d := adminGet[api.DryRun](ann, "/api/dryrun?identity="+hub.SinkIdentity(td, "acme-istiod")+"&node=globex-istiod&annotation=tenant=globex")
		if got := dryRunView(d.Resources[vs]); got != acmeSees || d.Tenant != "acme" {
			t.Errorf("ann's dry run of acme-istiod claiming globex's node: tenant %q, %q; want acme, %q", d.Tenant, got, acmeSees)
		}
		// A candidate configuration in which globex shares everything with acme: the vendor
		// sees what it would add; ann may not dry-run a candidate at all (it is the whole
		// hub's file, the vendor's: what acme would receive is not hers to learn before it is
		// hers, nor which of the vendor's fields it changes).
		cand := *cfg
		cand.Tenants = twoTenants(true)
		cand.Tenants[1].Exports = append(cand.Tenants[1].Exports, tenancy.Export{Name: "everything", To: []string{"acme"}})
		body, err := json.Marshal(&cand)
		if err != nil {
			t.Fatal(err)
		}
		dry := "/api/dryrun?identity=" + hub.SinkIdentity(td, "acme-istiod")
		d = adminPost[api.DryRun](vera, dry, string(body))
		if !slices.Contains(d.Added[vs], "bank/vault") {
			t.Errorf("vera's dry run of the candidate: added %v, want bank/vault", d.Added)
		}
		if code, msg := ann.do(http.MethodPost, dry, strings.NewReader(string(body))); code != http.StatusForbidden || strings.Contains(msg, "bank/vault") ||
			!strings.Contains(msg, "a dry run of a candidate configuration is the vendor's") {
			t.Errorf("ann's dry run of the candidate: %d %q, want 403 (the vendor's), nothing of what it would add", code, msg)
		}

		// Acting: on globex's cluster, as on a cluster that does not exist; on her own, she
		// may (nothing is held: 409). The vendor may act on north.
		code, theirs = ann.do(http.MethodPost, "/api/clusters/north/breaker/release", nil)
		_, nobodys = ann.do(http.MethodPost, "/api/clusters/nosuch/breaker/release", nil)
		if code != http.StatusNotFound || strings.ReplaceAll(theirs, `"north"`, `"nosuch"`) != nobodys {
			t.Errorf("ann releasing north's breaker: %d %q; an unknown cluster's: %q; want 404, the same words", code, theirs, nobodys)
		}
		if code, msg := ann.do(http.MethodPost, "/api/clusters/east/breaker/release", nil); code != http.StatusConflict {
			t.Errorf("ann releasing east's breaker: %d %q, want 409 (hers, nothing held)", code, msg)
		}
		if code, msg := vera.do(http.MethodPost, "/api/clusters/north/breaker/release", nil); code != http.StatusConflict {
			t.Errorf("vera releasing north's breaker: %d %q, want 409 (the vendor's, nothing held)", code, msg)
		}

		// The vendor's paths.
		for _, path := range []string{"/metrics", "/api/state"} {
			if code, msg := ann.do(http.MethodGet, path, nil); code != http.StatusForbidden {
				t.Errorf("ann reading %s: %d %q, want 403", path, code, msg)
			}
			if code, msg := vera.do(http.MethodGet, path, nil); code != http.StatusOK {
				t.Errorf("vera reading %s: %d %q, want 200", path, code, msg)
			}
		}
		ts := adminGet[[]api.Tenant](ann, "/api/tenants")
		if len(ts) != 1 || ts[0].Name != "acme" || strings.Join(ts[0].Clusters, ",") != "east" || len(ts[0].Exports) != 1 ||
			ts[0].Exports[0].From != "globex" || strings.Join(ts[0].Exports[0].To, ",") != "acme" {
			t.Errorf("ann's tenants: %+v, want acme with globex's export to it", ts)
		}
		ts = adminGet[[]api.Tenant](vera, "/api/tenants")
		if len(ts) != 2 || ts[0].Name != "acme" || ts[1].Name != "globex" {
			t.Errorf("vera's tenants: %+v, want acme and globex", ts)
		}

		// Certificates that are no operator's read nothing.
		for _, c := range []struct{ cert, id string }{
			{"reader-acme-istiod", hub.SinkIdentity(td, "acme-istiod")},
			{"reader-east", hub.ClusterIdentity(td, "east")},
			// An operator listed nowhere: neither the vendor's nor a tenant's (as one of a
			// tenant a reload removed would be).
			{"mallory", meshtls.ID(td, meshtls.KindOperator, "mallory")},
		} {
			r := adminWith(t, h, p, c.cert, c.id)
			if code, msg := r.do(http.MethodGet, "/api/clusters", nil); code != http.StatusForbidden {
				t.Errorf("%s reading /api/clusters over adminTLS: %d %q, want 403", c.id, code, msg)
			}
		}
	})

	// A reload that withdraws globex's export: acme's sink loses the exported object on its
	// open stream (its route did not change), globex's keeps its own, and ann no longer sees
	// it.
	t.Run("reload withdraws the export", func(t *testing.T) {
		waitFor(t, 10*time.Second, "the live sinks' views", func() bool {
			return acmeLive.view(vs) == acmeSees && globexLive.view(vs) == globexSees
		})
		next := *cfg
		next.Tenants = twoTenants(false)
		res, err := h.Reload(&next)
		if err != nil || res.ClosedSinks != 0 || res.ClosedIngest != 0 || res.Views == 0 {
			t.Fatalf("reload: %+v, %v; want views recomputed and no stream closed", res, err)
		}
		waitFor(t, 10*time.Second, "acme's sink without edge/gw", func() bool { return acmeLive.view(vs) == "shop/cart@east" })
		if got := globexLive.view(vs); got != globexSees {
			t.Errorf("globex's sink after the reload: %q, want %q", got, globexSees)
		}
		w := adminGet[api.Why](adminAs(t, h, p, "ann"), "/api/why?collection="+vs+"&name=edge/gw")
		if w.Served != nil || len(w.Candidates) != 0 || len(w.Sinks) != 0 {
			t.Errorf("ann's why edge/gw after the export is withdrawn: %+v, want nothing", w)
		}
	})
}

// runTenantsHub runs p's hub of acme and globex (twoTenants), vera the vendor's operator,
// with its adminTLS listening, and returns it with its configuration.
func runTenantsHub(t *testing.T, p *pki, export bool) (*hub.Hub, *hub.Config) {
	t.Helper()
	cfg := p.hubConfig(t)
	cfg.Clusters = nil // with tenants every cluster is a tenant's
	cfg.AdminTLS = "127.0.0.1:0"
	cfg.Tenants = twoTenants(export)
	cfg.Operators = []string{"vera"}
	h := runHub(t, cfg)
	waitFor(t, 10*time.Second, "adminTLS listening", func() bool { return h.AdminTLSAddr() != "" })
	return h, cfg
}

// twoTenants is acme and globex (see TestTenantIsolation), with globex's export of its edge
// namespace to acme or without it.
func twoTenants(export bool) []hub.TenantConfig {
	globex := hub.TenantConfig{
		Name: "globex", Sinks: []string{hub.SinkIdentity(td, "globex-*")}, Operators: []string{"gus"},
		Clusters: []hub.ClusterConfig{{Name: "north", Namespaces: []string{"bank", "edge"}, Hosts: []string{"*.bank.example.com", "*.edge.example.com"}}},
		Routing: routing.Config{Rules: []routing.Rule{
			{Name: "fleet", NodeIDs: []string{"globex-*"}},
			{Name: "team", Identities: []string{hub.SinkIdentity(td, "*")}, Annotations: map[string]string{"tenant": "globex"}},
		}},
	}
	if export {
		globex.Exports = []tenancy.Export{{Name: "edge", To: []string{"acme"}, Namespaces: []string{"edge"}}}
	}
	return []hub.TenantConfig{{
		Name: "acme", Sinks: []string{hub.SinkIdentity(td, "acme-*")}, Operators: []string{"ann"},
		Clusters: []hub.ClusterConfig{{Name: "east", Namespaces: []string{"shop"}, Hosts: []string{"*.shop.example.com"}}},
		Routing:  routing.Config{Rules: []routing.Rule{{Name: "fleet", Identities: []string{hub.SinkIdentity(td, "*")}}}},
	}, globex}
}

// noneOfGlobex fails t if s names anything of globex's: its name, cluster, operator, or an
// object or host only globex publishes.
func noneOfGlobex(t *testing.T, what, s string) {
	t.Helper()
	for _, word := range []string{"globex", "north", "gus", "vault", "gw.edge"} {
		if strings.Contains(s, word) {
			t.Errorf("%s names %q of globex's: %q", what, word, s)
		}
	}
}

func notAcme(identity string) bool {
	return !strings.HasPrefix(identity, hub.SinkIdentity(td, "acme-"))
}

// received renders what sink holds of collection as "name@cluster", sorted (a served
// version is <cluster>/<version>).
func received(sink *mcp.Sink, collection string) string {
	return dryRunView(sink.Versions(collection))
}

// dryRunView renders name -> served version as received does.
func dryRunView(versions map[string]string) string {
	out := make([]string, 0, len(versions))
	for name, v := range versions {
		cluster, _, _ := strings.Cut(v, "/")
		out = append(out, name+"@"+cluster)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func clusterNames(cl []api.ClusterStatus) string {
	var names []string
	for _, c := range cl {
		names = append(names, c.Name)
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

func whySinks(w api.Why) []string {
	var ids []string
	for _, s := range w.Sinks {
		ids = append(ids, s.Identity)
	}
	return ids
}

func sinkIdentities(sinks []api.SinkStatus) []string {
	var ids []string
	for _, s := range sinks {
		ids = append(ids, s.Identity)
	}
	return ids
}

// reflectEqualJSON compares two answers as the admin API writes them.
func reflectEqualJSON(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// adminClient asks the hub's adminTLS listener with one certificate.
type adminClient struct {
	t    *testing.T
	c    *http.Client
	base string
}

// adminAs is an adminTLS client with operator name's certificate.
func adminAs(t *testing.T, h *hub.Hub, p *pki, name string) adminClient {
	return adminWith(t, h, p, "operator-"+name, meshtls.ID(td, meshtls.KindOperator, name))
}

// adminWith is an adminTLS client presenting a certificate for identity (issued as cert).
func adminWith(t *testing.T, h *hub.Hub, p *pki, cert, identity string) adminClient {
	t.Helper()
	c, k, _ := p.ca.Issue(t, p.dir, cert, identity)
	src, err := meshtls.NewSource(meshtls.Files{Cert: c, Key: k, CA: p.bundle}, logger(t))
	if err != nil {
		t.Fatal(err)
	}
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: src.ClientConfig("")}, Timeout: 10 * time.Second}
	t.Cleanup(cl.CloseIdleConnections)
	return adminClient{t: t, c: cl, base: "https://" + h.AdminTLSAddr()}
}

// do sends a request and returns the status and the body.
func (a adminClient) do(method, path string, body io.Reader) (int, string) {
	a.t.Helper()
	req, err := http.NewRequest(method, a.base+path, body)
	if err != nil {
		a.t.Fatal(err)
	}
	resp, err := a.c.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// adminGet reads path, which must answer 200, as a T (a fresh one: decoding into a value
// already filled would merge maps).
func adminGet[T any](a adminClient, path string) T {
	a.t.Helper()
	return adminDecode[T](a, http.MethodGet, path, nil)
}

// adminPost posts body to path, which must answer 200, and reads the answer as a T.
func adminPost[T any](a adminClient, path, body string) T {
	a.t.Helper()
	return adminDecode[T](a, http.MethodPost, path, strings.NewReader(body))
}

func adminDecode[T any](a adminClient, method, path string, body io.Reader) T {
	a.t.Helper()
	var v T
	code, b := a.do(method, path, body)
	if code != http.StatusOK {
		a.t.Fatalf("%s %s: %d %s", method, path, code, b)
	}
	if err := json.Unmarshal([]byte(b), &v); err != nil {
		a.t.Fatalf("%s %s: %v: %s", method, path, err, b)
	}
	return v
}

// tlsMinionNACKs runs cluster's minion over mutual TLS, as tlsMinion does, and returns what
// the hub's NACKs told it: the reason per refused resource, as the minion logs it (the
// minion's own account of a NACK, which a Kubernetes source turns into Events).
func tlsMinionNACKs(t *testing.T, p *pki, cluster, root, ingest string) *nackLog {
	t.Helper()
	c, k, _ := p.ca.Issue(t, p.dir, "minion-"+cluster, hub.ClusterIdentity(td, cluster))
	cfg := minionConfig(cluster, "fs://"+root, ingest)
	cfg.TLS, cfg.Insecure = &meshtls.Config{Files: meshtls.Files{Cert: c, Key: k, CA: p.bundle}}, false
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	n := &nackLog{Handler: logger(t).With("side", "minion-"+cluster).Handler(), state: &nackState{reasons: map[string]string{}}}
	m, err := minion.New(cfg, slog.New(n), minion.NewTelemetry())
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "minion Run", m.Run)
	return n
}

// nackLog passes a minion's log on and keeps the reason of each resource the hub rejected.
type nackLog struct {
	slog.Handler
	state *nackState
}

type nackState struct {
	mu      sync.Mutex
	reasons map[string]string // resource -> reason
}

func (n *nackLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "hub rejected a resource" {
		var resource, reason string
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "resource":
				resource = a.Value.String()
			case "reason":
				reason = a.Value.String()
			}
			return true
		})
		n.state.mu.Lock()
		n.state.reasons[resource] = reason
		n.state.mu.Unlock()
	}
	return n.Handler.Handle(ctx, r)
}

func (n *nackLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &nackLog{Handler: n.Handler.WithAttrs(as), state: n.state}
}

func (n *nackLog) WithGroup(g string) slog.Handler {
	return &nackLog{Handler: n.Handler.WithGroup(g), state: n.state}
}

// get returns the reasons heard so far.
func (n *nackLog) get() map[string]string {
	n.state.mu.Lock()
	defer n.state.mu.Unlock()
	return maps.Clone(n.state.reasons)
}
