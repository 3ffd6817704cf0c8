package hub

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/meshfed/meshfed/internal/testkit/browsertest"
)

// The dashboard at scale, in a real headless browser: 100 clusters and 10,000 sinks
// (scaleHub: registered through the sink registry's hooks, as real streams register, since
// 10,000 real streams under -race do not fit a 2-core machine), served by the admin
// handler on a real loopback listener. The first page renders, the lists page and search.
func TestDashboardAtScaleInBrowser(t *testing.T) {
	h := scaleHub(t)
	srv := httptest.NewServer(h.httpHandler())
	t.Cleanup(srv.Close)
	b := browsertest.New(t)       // after the server, so that it stops first
	const wait = 60 * time.Second // one overview of 10,000 sinks takes ~40 ms, more under -race
	b.Do(t, chromedp.Navigate(srv.URL+"/"))
	b.WaitFor(t, wait, "the first 50 of 100 clusters, and 9,000 of 10,000 sinks synced",
		`document.querySelectorAll('#clusters tr[data-cluster]').length === 50 && document.getElementById('clusters-pager').textContent.includes('1–50 of 100') && document.getElementById('totals').textContent.includes('9000/10000')`)
	b.Screenshot(t, "scale-clusters")
	b.Do(t, chromedp.Click(`#clusters-pager button:last-child`))
	b.WaitFor(t, wait, "the second page of clusters", `document.querySelector('tr[data-cluster="c99"]') && document.getElementById('clusters-pager').textContent.includes('51–100 of 100')`)

	b.Do(t, chromedp.Evaluate[chromedp.Void](`location.hash = "#fleets"`))
	b.WaitFor(t, wait, "20 fleets of 500; r07's all stale, r13's all NACKing",
		`document.querySelectorAll('#fleets tr[data-fleet]').length === 20 && document.querySelector('tr[data-fleet="default/r07"] td[data-col=stale]').textContent === "500" && document.querySelector('tr[data-fleet="default/r13"] td[data-col=nacked]').textContent === "500"`)
	b.Screenshot(t, "scale-fleets")
	b.Do(t, chromedp.Click(`tr[data-fleet="default/r07"] td[data-col=stale] a`))
	b.WaitFor(t, wait, "the first page of r07's stale sinks", `document.querySelectorAll('#sinks tr[data-stream]').length === 50 && document.getElementById('sinks-pager').textContent.includes('1–50 of 500')`)
	b.Do(t, chromedp.Click(`#sinks-pager button:last-child`))
	b.WaitFor(t, wait, "the second page", `document.getElementById('sinks-pager').textContent.includes('51–100 of 500')`)
	b.Screenshot(t, "scale-sinks")

	b.Do(t, chromedp.Evaluate[chromedp.Void](`location.hash = "#sinks?q=n14-1234"`))
	b.WaitFor(t, wait, "the one sink the search finds", `document.querySelectorAll('#sinks tr[data-stream]').length === 1 && document.querySelector('#sinks tr[data-stream]').textContent.includes('sink-1234')`)
}
