package e2e

import (
	"fmt"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/testkit/browsertest"
	"github.com/meshfed/meshfed/routing"
)

// The fleet dashboard in a real headless browser (chromium, package browsertest) against a
// running hub with real minions on real files and real MCP sinks, all over mutual TLS. A
// JavaScript error, a console error, a failed request or a request to a host that is not
// loopback fails the test. Screenshots of each view are written to .cache/screenshots.

// pageWait bounds every wait for the page: the page polls every 2 s.
const pageWait = 15 * time.Second

// js quotes s as a JavaScript string.
func js(s string) string { return strconv.Quote(s) }

// cellText is a JavaScript expression: the text of the cell col of the row
// [attr="value"], or "".
func cellText(attr, value, col string) string {
	return fmt.Sprintf(`(document.querySelector('tr[%s=%s] td[data-col=%s]') || {}).textContent || ""`, attr, js(value), js(col))
}

// show opens the view of the hash (as a click on a link does: no reload).
func show(t *testing.T, b *browsertest.Browser, hash string) {
	t.Helper()
	b.Do(t, chromedp.Evaluate[chromedp.Void](`location.hash = `+js(hash)))
}

// A hub that is not in development mode, read over its plain http listener: the page shows
// the clusters (with west's breaker open), the refused objects with their reasons, who owns
// a host and who tried it, one object's story, the sink fleets and their sinks, the events
// and the conflicts; it offers no action; and it follows changes to a minion's files
// without a reload.
func TestDashboardInBrowser(t *testing.T) {
	p := newPKI(t)
	cfg := p.hubConfig(t)
	for i := range cfg.Clusters {
		cfg.Clusters[i].Namespaces = append(cfg.Clusters[i].Namespaces, "shared")
		cfg.Clusters[i].Hosts = append(cfg.Clusters[i].Hosts, "*.shared.example.com")
	}
	cfg.SharedNamespaces = []string{"shared"}
	cfg.Routing = routing.Config{Rules: []routing.Rule{
		{Name: "prod", Identities: []string{hub.SinkIdentity(td, "prod-*")}},
		{Name: "canary", Identities: []string{hub.SinkIdentity(td, "canary-*")}, Clusters: []string{"east"}},
	}}
	h := runHub(t, cfg)
	ingest, serve, admin := h.Addrs()

	east, west := t.TempDir(), t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, east, "pay/steal.yaml", vsYAML("steal", "pay", "", "steal.pay.example.com"))   // namespace not owned
	writeFile(t, east, "shop/hijack.yaml", vsYAML("hijack", "shop", "", "api.pay.example.com")) // host not owned
	writeFile(t, east, "shared/common.yaml", vsYAML("common", "shared", "2024-01-02T00:00:00Z", "c.shared.example.com"))
	writeFile(t, west, "shared/common.yaml", vsYAML("common", "shared", "2024-01-01T00:00:00Z", "c.shared.example.com")) // older: wins
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	var bulk []string
	for i := range 12 {
		rel := fmt.Sprintf("pay/bulk-%02d.yaml", i)
		writeFile(t, west, rel, vsYAML(fmt.Sprintf("bulk-%02d", i), "pay", "", "bulk.pay.example.com"))
		bulk = append(bulk, rel)
	}
	tlsMinion(t, p, "east", east, ingest)
	tlsMinion(t, p, "west", west, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)
	prod := tlsSink(t, p, serve, "prod-1")
	tlsSink(t, p, serve, "prod-2")
	tlsSink(t, p, serve, "canary-1")
	waitFor(t, 10*time.Second, "prod-1 has every object", func() bool { return strings.Count(prod.view(vs), "@") == 15 })
	// West's files emptied but for one: the breaker holds the 12 deletions.
	for _, rel := range bulk {
		if err := os.Remove(filepath.Join(west, rel)); err != nil {
			t.Fatal(err)
		}
	}

	b := browsertest.New(t) // after the hub, so that it stops first
	b.Do(t, chromedp.Navigate(browsertest.LoopbackURL(admin)+"/"))
	b.WaitFor(t, pageWait, "the clusters, live", `document.querySelector('#live.ok') && document.querySelector('tr[data-cluster="west"]')`)
	b.WaitFor(t, pageWait, "west's breaker open", cellText("data-cluster", "west", "breaker")+`.includes("open: holds 12 deletions")`)
	// Plain http on a hub that is not in development mode: read-only, no action offered.
	if who := browsertest.Eval[string](t, b, `document.getElementById("who").textContent`); !strings.Contains(who, "read-only") || !strings.Contains(who, "none (the http listener carries no certificate)") {
		t.Errorf("who: %q, want read-only for the http listener", who)
	}
	if n := browsertest.Eval[int](t, b, `document.querySelectorAll("button.action").length`); n != 0 {
		t.Errorf("%d action buttons on a read-only page", n)
	}
	if got := browsertest.Eval[string](t, b, cellText("data-cluster", "east", "refusals")); got != "2" {
		t.Errorf("east's refusals cell: %q, want 2", got)
	}
	b.Screenshot(t, "clusters")

	// The refused objects, with why.
	show(t, b, "#refusals")
	b.WaitFor(t, pageWait, "east's refused pay/steal with its reason", cellText("data-refusal", "east pay/steal", "reason")+`.includes('namespace "pay" is not owned by cluster "east"')`)
	b.Screenshot(t, "refusals")

	// The ledger: who owns a host, and who tried it.
	show(t, b, "#refusals?host=api.pay.example.com")
	b.WaitFor(t, pageWait, "the owner of api.pay.example.com and east's attempt", `document.querySelector('#owners [data-owners="west"]') && document.querySelector('tr[data-refusal="east shop/hijack"]') && !document.querySelector('tr[data-refusal="east pay/steal"]')`)
	b.Screenshot(t, "owners")

	// One object's story, from its link.
	b.Do(t, chromedp.Click(`tr[data-refusal="east shop/hijack"] a`))
	b.WaitFor(t, pageWait, "the story of shop/hijack", `document.querySelector('#why [data-served=""]') && document.querySelector('#why tr[data-refusal="east"]').textContent.includes('host "api.pay.example.com" is not owned')`)
	show(t, b, "#why?collection="+vs+"&name=shared/common")
	b.WaitFor(t, pageWait, "shared/common served from west", `document.querySelector('#why [data-served="west"]') && document.querySelector('#why').textContent.includes("older create_time")`)
	b.Screenshot(t, "why")

	// The fleets, and a fleet's sinks.
	show(t, b, "#fleets")
	b.WaitFor(t, pageWait, "fleets prod (2) and canary (1)", `document.querySelector('tr[data-fleet="default/prod"] td.num').textContent === "2" && document.querySelector('tr[data-fleet="default/canary"] td.num').textContent === "1"`)
	b.Screenshot(t, "fleets")
	b.Do(t, chromedp.Click(`tr[data-fleet="default/prod"] a`))
	b.WaitFor(t, pageWait, "prod's two sinks", `document.querySelectorAll('#sinks tr[data-stream]').length === 2 && document.getElementById('sinks-pager').textContent.includes("2 in all")`)
	b.Screenshot(t, "sinks")

	show(t, b, "#conflicts")
	b.WaitFor(t, pageWait, "the conflict on shared/common", `document.querySelector('tr[data-conflict="shared/common"]') && document.querySelector('tr[data-conflict="shared/common"]').textContent.includes("west")`)
	b.Screenshot(t, "conflicts")

	show(t, b, "#events")
	b.WaitFor(t, pageWait, "the refusal and breaker events", `document.querySelector('#events tr[data-kind="refusal"]') && document.querySelector('#events tr[data-kind="breaker"]')`)
	b.Screenshot(t, "events")

	// Live: a new object in west's directory and a new refusal in east's reach the page
	// without a reload (a reload would lose the marker).
	show(t, b, "#clusters")
	b.WaitFor(t, pageWait, "the clusters again", `document.querySelector('tr[data-cluster="west"]')`)
	b.Do(t, chromedp.Evaluate[chromedp.Void](`window.notReloaded = true`))
	before := browsertest.Eval[string](t, b, cellText("data-cluster", "west", "objects"))
	writeFile(t, west, "pay/new.yaml", vsYAML("new", "pay", "", "new.pay.example.com"))
	writeFile(t, east, "pay/late.yaml", vsYAML("late", "pay", "", "late.pay.example.com"))
	b.WaitFor(t, pageWait, "west's new object and east's new refusal, live", fmt.Sprintf(`window.notReloaded && %s !== %s && %s === "3"`,
		cellText("data-cluster", "west", "objects"), js(before), cellText("data-cluster", "east", "refusals")))
	show(t, b, "#events?kind=refusal")
	b.WaitFor(t, pageWait, "east's new refusal in the events", `window.notReloaded && document.querySelector('#events').textContent.includes("pay/late")`)
}

// In development mode a loopback page may act: it says so, offers the breaker's release,
// and the release (two clicks: it deletes objects) is taken as the development operator.
func TestDashboardActsInDevelopmentMode(t *testing.T) {
	east, west := t.TempDir(), t.TempDir()
	var files []string
	for i := range 12 {
		rel := fmt.Sprintf("shop/vs-%02d.yaml", i)
		writeFile(t, east, rel, vsYAML(fmt.Sprintf("vs-%02d", i), "shop", "", "x.shop.example.com"))
		files = append(files, rel)
	}
	writeFile(t, west, "pay/api.yaml", vsYAML("api", "pay", "", "api.pay.example.com"))
	h := federate(t, east, west)
	_, _, admin := h.Addrs()
	for _, rel := range files {
		if err := os.Remove(filepath.Join(east, rel)); err != nil {
			t.Fatal(err)
		}
	}
	b := browsertest.New(t)
	b.Do(t, chromedp.Navigate(browsertest.LoopbackURL(admin)+"/"))
	b.WaitFor(t, pageWait, "east's breaker open, with its release offered", cellText("data-cluster", "east", "breaker")+`.includes("open") && document.querySelector('tr[data-cluster="east"] button[data-action="release"]')`)
	if who := browsertest.Eval[string](t, b, `document.getElementById("who").textContent`); !strings.Contains(who, "may act") || !strings.Contains(who, hub.DevOperator) {
		t.Errorf("who: %q, want the development operator, who may act", who)
	}
	b.Screenshot(t, "clusters-development-mode")
	b.Do(t, chromedp.Click(`tr[data-cluster="east"] button[data-action="release"]`))
	b.WaitFor(t, pageWait, "the release to confirm", `document.querySelector('button[data-action="release"]').textContent.includes("confirm: delete 12 objects")`)
	b.Do(t, chromedp.Click(`tr[data-cluster="east"] button[data-action="release"]`))
	b.WaitFor(t, pageWait, "the release done and east's breaker gone", cellText("data-cluster", "east", "breaker")+` === "" && `+cellText("data-cluster", "east", "objects")+` === "0"`)
	b.WaitFor(t, pageWait, "the release's notice", `document.getElementById("notice").textContent === `+js("Released 12 held deletions of cluster east (by "+hub.DevOperator+")."))
	for _, c := range h.Clusters() {
		if c.Breaker != nil {
			t.Errorf("cluster %s still holds %+v", c.Name, c.Breaker)
		}
	}
}

// operatorProxy serves plain http on loopback and forwards every request to the hub's
// adminTLS listener with operator name's client certificate (adminAs's), so that a browser
// sees the dashboard as that operator: chromium presents a client certificate only from an
// NSS store chosen by a system-wide policy, which a test should not write.
func operatorProxy(t *testing.T, h *hub.Hub, p *pki, name string) string {
	t.Helper()
	target := &url.URL{Scheme: "https", Host: h.AdminTLSAddr()}
	srv := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport: adminAs(t, h, p, name).c.Transport,
	})
	t.Cleanup(srv.Close)
	return srv.URL
}

// A tenant's operator, over adminTLS, sees its tenant in every view of the page (its
// cluster, fleets, refusals and events; of another tenant's host, only that it is not
// theirs) and nothing of the other tenant's, and may act.
func TestDashboardTenantOperatorInBrowser(t *testing.T) {
	p := newPKI(t)
	h, _ := runTenantsHub(t, p, false)
	ingest, serve, _ := h.Addrs()
	east, north := t.TempDir(), t.TempDir()
	writeFile(t, east, "shop/cart.yaml", vsYAML("cart", "shop", "", "cart.shop.example.com"))
	writeFile(t, east, "bank/steal.yaml", vsYAML("steal", "bank", "", "cart.shop.example.com")) // globex's namespace
	writeFile(t, north, "bank/vault.yaml", vsYAML("vault", "bank", "", "vault.bank.example.com"))
	writeFile(t, north, "edge/intrude.yaml", vsYAML("intrude", "shop", "", "gw.edge.example.com")) // acme's namespace
	tlsMinion(t, p, "east", east, ingest)
	tlsMinion(t, p, "north", north, ingest)
	waitFor(t, 20*time.Second, "hub ready", h.Ready)
	tlsSink(t, p, serve, "acme-1")
	tlsSink(t, p, serve, "globex-1")
	proxy := operatorProxy(t, h, p, "ann")

	b := browsertest.New(t)
	b.Do(t, chromedp.Navigate(proxy+"/"))
	b.WaitFor(t, pageWait, "ann's clusters", `document.querySelector('#live.ok') && document.querySelector('tr[data-cluster="east"]')`)
	if who := browsertest.Eval[string](t, b, `document.getElementById("who").textContent`); !strings.Contains(who, "spiffe://"+td+"/operator/ann") || !strings.Contains(who, "tenant acme") || !strings.Contains(who, "may act") {
		t.Errorf("who: %q, want ann, of tenant acme, who may act", who)
	}
	b.Screenshot(t, "tenant-operator")
	pages := map[string]string{"#clusters": `document.querySelectorAll('#clusters tr[data-cluster]').length === 1`}
	pages["#fleets"] = `document.querySelectorAll('#fleets tr[data-fleet]').length === 1 && document.querySelector('tr[data-fleet="acme/fleet"]')`
	pages["#sinks"] = `document.querySelectorAll('#sinks tr[data-stream]').length === 1`
	pages["#refusals"] = `document.querySelector('tr[data-refusal="east bank/steal"]') && document.querySelectorAll('#refusals tr[data-refusal]').length === 1`
	pages["#refusals?host=api.bank.example.com"] = `document.getElementById('owners').textContent.includes("is not owned by any of your clusters")`
	pages["#events"] = `document.querySelector('#events tr[data-kind="refusal"]')`
	pages["#conflicts"] = `document.querySelector('#conflicts td.empty')`
	for hash, ready := range pages {
		show(t, b, hash)
		b.WaitFor(t, pageWait, "ann's "+hash, ready)
		noneOfGlobex(t, "ann's page "+hash, browsertest.Eval[string](t, b, `document.body.innerText`))
	}
}
