package monitoring

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/meshfed/meshfed/hub"
	"github.com/meshfed/meshfed/internal/procmetrics"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/minion"
)

func promql() parser.Parser { return parser.NewParser(parser.Options{}) }

// Every metric an alert or the dashboard reads is one meshfed exports: a running hub (with
// the Go and process collectors its command registers), or a minion. A histogram's series
// (_bucket, _sum, _count) count as its family's.
func TestMetricNamesAreExported(t *testing.T) {
	exported := exportedNames(t)
	read := map[string]string{} // where -> expression
	for _, g := range loadRules(t).Groups {
		for i, r := range g.Rules {
			read[fmt.Sprintf("rule %s/%s (%d)", g.Name, r.Alert+r.Record, i)] = r.Expr
		}
	}
	exprs, varMetrics := dashboardQueries(t)
	for where, e := range exprs {
		read[where] = e
	}
	for where, name := range varMetrics {
		if !known(exported, name) {
			t.Errorf("%s reads %s, which meshfed does not export", where, name)
		}
	}
	for where, e := range read {
		names, err := metricNames(e)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		for _, name := range names {
			if !known(exported, name) {
				t.Errorf("%s reads %s, which meshfed does not export (expression %q)", where, name, e)
			}
		}
	}
}

// known reports whether name is an exported family, one of a histogram's or summary's
// series, or Prometheus' own up.
func known(exported map[string]bool, name string) bool {
	if exported[name] || name == "up" { // up: Prometheus' own series of every target it scrapes
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
			return true
		}
	}
	return false
}

// metricNames returns the metric names expr's selectors read; a selector that names no
// metric (only a regular expression on __name__) is an error, as it could not be checked.
func metricNames(expr string) ([]string, error) {
	node, err := promql().ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	var errs []error
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			errs = append(errs, fmt.Errorf("selector %s names no metric", vs))
			return nil
		}
		names = append(names, name)
		return nil
	})
	return names, errors.Join(errs...)
}

// exportedNames returns the metric families a hub and a minion export: every family their
// registries describe (a vector without series included), and every family a scrape of a
// running hub's /metrics shows.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	cfg, err := hub.ParseConfig([]byte(`
insecure: true
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
http: 127.0.0.1:0
persist: false
warmUp: 1s
clusters: [{name: east, identities: [east], namespaces: [shop], hosts: ["*"]}]
routing: {default: {name: all}}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = t.TempDir()
	reg := procmetrics.NewRegistry() // as the hub command's
	h, err := hub.New(cfg, slog.New(slog.DiscardHandler), hub.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	stop := testrun.Start(t, "hub", h.Run)
	defer stop()

	out := map[string]bool{}
	for _, r := range []prometheus.Collector{reg, minion.NewTelemetry().Registry} {
		for name := range described(r) {
			out[name] = true
		}
	}
	for name := range scrape(t, h) {
		out[name] = true
	}
	if len(out) < 50 {
		names := make([]string, 0, len(out))
		for n := range out {
			names = append(names, n)
		}
		sort.Strings(names)
		t.Fatalf("only %d metric names found (%v): reading them is broken", len(out), names)
	}
	return out
}

// fqName reads a Desc's name from its String: client_golang exposes it no other way.
var fqName = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

// described returns the names of the families c describes.
func described(c prometheus.Collector) map[string]bool {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	out := map[string]bool{}
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			out[m[1]] = true
		}
	}
	return out
}

// scrape returns the families a running hub's /metrics shows, once it listens.
func scrape(t *testing.T, h *hub.Hub) map[string]bool {
	t.Helper()
	var addr string
	for deadline := time.Now().Add(10 * time.Second); addr == ""; time.Sleep(10 * time.Millisecond) {
		if _, _, addr = h.Addrs(); addr == "" && time.Now().After(deadline) {
			t.Fatal("the hub's http listener did not open")
		}
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	out := map[string]bool{}
	for name := range fams {
		out[name] = true
	}
	return out
}
