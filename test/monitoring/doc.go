// Package monitoring checks the monitoring pack in deploy/monitoring against meshfed itself:
// the PrometheusRule's rules load with Prometheus' own rule file parser (rulefmt) and
// every alert carries a severity, a summary, a description and a runbook that README.md
// has; the Grafana dashboard is valid JSON, asks for its data source through the
// ${datasource} variable only, and its every query parses with Prometheus' PromQL parser;
// and every metric an alert or a panel reads is one a running hub (or minion) exports.
//
// It is a module of its own (github.com/prometheus/prometheus is large, and only these
// tests need it), built against the repository's meshfed through a replace directive.
// It holds no product code.
package monitoring
