package monitoring

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// datasourceVar is how every panel and query names its data source: the dashboard's
// variable, so that whoever imports it picks their Prometheus.
const datasourceVar = "${datasource}"

// grafanaVars are the variables a panel's query may use, with a value of the right type for
// PromQL (a duration, a regular expression), so that it parses as Grafana would send it.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
	"${job}", ".+", "$job", ".+",
)

// The dashboard is valid JSON whose every data source is the ${datasource} variable (of
// type datasource, for Prometheus), whose panels have unique ids and queries, and whose
// every query parses once its variables are filled in.
func TestDashboard(t *testing.T) {
	d := dashboard(t)
	if d["title"] == "" || d["uid"] == "" {
		t.Errorf("dashboard title %v, uid %v: want both", d["title"], d["uid"])
	}
	var dsVar map[string]any
	for _, v := range list(d["templating"], "list") {
		if v["name"] == "datasource" {
			dsVar = v
		}
	}
	if dsVar == nil || dsVar["type"] != "datasource" || dsVar["query"] != "prometheus" {
		t.Errorf("templating: variable datasource %v, want one of type datasource with query prometheus", dsVar)
	}
	walkDatasources(t, "", d)

	ids := map[float64]bool{}
	queries := 0
	for _, p := range list(d, "panels") {
		title := fmt.Sprint(p["title"])
		id, _ := p["id"].(float64)
		if ids[id] {
			t.Errorf("panel %q: id %v used twice", title, id)
		}
		ids[id] = true
		if p["type"] == "row" {
			continue
		}
		targets := list(p, "targets")
		if len(targets) == 0 {
			t.Errorf("panel %q: no queries", title)
		}
		for _, tg := range targets {
			queries++
			expr, _ := tg["expr"].(string)
			if _, err := dashboardExpr(expr); err != nil {
				t.Errorf("panel %q: %v", title, err)
			}
		}
	}
	if queries == 0 {
		t.Error("the dashboard has no queries")
	}
}

// dashboardExpr is a panel's query as PromQL: its Grafana variables filled in, then parsed.
func dashboardExpr(expr string) (string, error) {
	if strings.TrimSpace(expr) == "" {
		return "", fmt.Errorf("empty query")
	}
	filled := grafanaVars.Replace(expr)
	if i := strings.Index(filled, "$"); i >= 0 {
		return "", fmt.Errorf("query %q: unknown variable at %q", expr, filled[i:])
	}
	if _, err := promql().ParseExpr(filled); err != nil {
		return "", fmt.Errorf("query %q: %v", expr, err)
	}
	return filled, nil
}

// walkDatasources fails on any data source in v that is not the variable: a panel's or a
// query's, as the string or as {type, uid}. Grafana's built-in annotation source is the
// one exception.
func walkDatasources(t *testing.T, path string, v any) {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		for k, c := range v {
			if k == "datasource" && !variableSource(c) {
				t.Errorf("%s.datasource = %v, want %q", path, c, datasourceVar)
				continue
			}
			walkDatasources(t, path+"."+k, c)
		}
	case []any:
		for i, c := range v {
			walkDatasources(t, fmt.Sprintf("%s[%d]", path, i), c)
		}
	}
}

func variableSource(ds any) bool {
	switch ds := ds.(type) {
	case string:
		return ds == datasourceVar
	case map[string]any:
		if ds["type"] == "grafana" && ds["uid"] == "-- Grafana --" { // the built-in annotations
			return true
		}
		return ds["uid"] == datasourceVar && (ds["type"] == nil || ds["type"] == "prometheus")
	}
	return false
}

// list returns v[key] as a list of objects (nil if it is not one).
func list(v any, key string) []map[string]any {
	m, _ := v.(map[string]any)
	items, _ := m[key].([]any)
	var out []map[string]any
	for _, it := range items {
		if o, ok := it.(map[string]any); ok {
			out = append(out, o)
		}
	}
	return out
}

// labelValues matches a query variable's label_values(METRIC, LABEL) and captures METRIC.
var labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)$`)

// dashboardQueries returns every PromQL query of the dashboard, filled in, by where it is,
// and the metrics its query variables read.
func dashboardQueries(t *testing.T) (exprs map[string]string, varMetrics map[string]string) {
	t.Helper()
	d := dashboard(t)
	exprs, varMetrics = map[string]string{}, map[string]string{}
	for _, p := range list(d, "panels") {
		for i, tg := range list(p, "targets") {
			expr, _ := tg["expr"].(string)
			filled, err := dashboardExpr(expr)
			if err != nil {
				continue // TestDashboard reports it
			}
			exprs[fmt.Sprintf("panel %v %q query %d", p["id"], p["title"], i)] = filled
		}
	}
	for _, v := range list(d["templating"], "list") {
		if v["type"] != "query" {
			continue
		}
		q, _ := v["definition"].(string)
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %v: query %q, want label_values(METRIC, LABEL)", v["name"], q)
			continue
		}
		varMetrics[fmt.Sprintf("variable %v", v["name"])] = m[1]
	}
	return exprs, varMetrics
}
